# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # From a catalog to a DP answer: a dpfusion tutorial
#
# An analyst's session against `dpfusion serve`, from Python. The data owner serves the example
# catalog (`examples/catalog/dpfusion.toml`: `salaries`, one row per employee, and `purchases`,
# many rows per customer, both private; `jobs` and `shops`, public) and gave you a token. You
# will look at the tables and your budget, ask for a mean with error bars and a grouped count,
# fit a logistic model and apply it, run out of budget, and plot what each query cost.
#
# This file is a plain Python script in the jupytext "percent" format: run it with
# `python docs/tutorial.py`, or open it as a notebook (`jupytext --to notebook docs/tutorial.py`).
# It needs `pip install './python[pandas]'` and a running server: the README's "Serving
# analysts" section starts one on the example catalog. CI runs it against a fresh copy of the
# catalog (dpfusion-cli/tests/it/tutorial.rs).
#
# Configuration, from the environment:
#
# - `DPFUSION_URL`: the server (default `grpc://127.0.0.1:50051`);
# - `DPFUSION_TOKEN`: your token (or `DPFUSION_TOKEN_FILE`, a file holding it; default `token`);
# - `DPFUSION_TUTORIAL_PLOT`: where to write the budget plot (default `budget.svg`).

# %%
import html
import os

import dpfusion

url = os.environ.get("DPFUSION_URL", "grpc://127.0.0.1:50051")
token = os.environ.get("DPFUSION_TOKEN")
if token is None:
    with open(os.environ.get("DPFUSION_TOKEN_FILE", "token")) as f:
        token = f.read().strip()
plot_path = os.environ.get("DPFUSION_TUTORIAL_PLOT", "budget.svg")

conn = dpfusion.connect(url, token=token)

# %% [markdown]
# ## 1. The catalog: tables and budgets
#
# `conn.tables()` is `SHOW TABLES`: every table you may query, with the policy the owner set
# (visibility, neighbour relation, public columns, budget, filter). `conn.budget()` is
# `SHOW BUDGET`: per private table, the share of its budget used and left.

# %%
tables = conn.tables()
print(tables[["table", "visibility", "budget_epsilon", "budget_delta", "filter"]].to_string(index=False))
budget = conn.budget()
print(budget[["table", "epsilon", "filter", "used_pct", "left_pct"]].to_string(index=False))
private_tables = list(budget["table"])
assert {"salaries", "purchases"} <= set(private_tables), private_tables

# %% [markdown]
# Every query below is charged to the tables it reads. Its result carries a *receipt*: what it
# cost, as a share of each table's budget, and what is left. We keep them to plot at the end.

# %%
history = []  # (label, table, cost in % of the budget, used in % after the charge)


def run(label, query):
    """Runs a query, prints its receipt and records its charge."""
    r = conn.sql(query)
    if r.receipt is not None:
        for t in r.receipt["tables"]:
            native = t["native"]
            # Shares are sent in millionths of the budget.
            history.append((label, t["name"], native["share"] / 1e4, native["used_share"] / 1e4))
        print(f"[{label}] {r.receipt_text}")
    return r


# %% [markdown]
# ## 2. A mean with error bars
#
# `dp_mean_ci` releases the same noisy mean as `dp_mean` (same charge) together with a 90%
# confidence interval for it. The bounds 0 and 400,000 are public and cover every salary
# (surgeons earn up to about 333,000): a bound below the data would clamp it, and the interval
# would cover the clamped mean, not the true one. `job` is a public column, so grouping by it
# needs no partition selection.

# %%
means = run(
    "mean salary per job",
    """
    SELECT job, r['value'] AS mean, r['lower'] AS lower, r['upper'] AS upper
    FROM (SELECT job, dp_mean_ci(salary, 0, 400000, epsilon => 0.5, confidence => 0.9) AS r
          FROM salaries GROUP BY job)
    ORDER BY job
    """,
).to_pandas()
print(means.round(0).to_string(index=False))
assert len(means) == 5 and (means["lower"] <= means["upper"]).all(), means

# %% [markdown]
# ## 3. A grouped query over a join with a public table
#
# Purchases protect each *customer* with all their purchases (the owner's privacy unit). A join
# with the public `shops` table (its key is unique) groups them by region; a RIGHT JOIN releases
# every region, even one without purchases. A noisy count near zero can come out negative:
# clamping it at 0 afterwards is post-processing, free.

# %%
regions = run(
    "customers per region",
    """
    SELECT s.region, GREATEST(dp_count_distinct(p.customer, epsilon => 0.5), 0) AS customers
    FROM purchases p RIGHT JOIN shops s ON p.store = s.store
    GROUP BY s.region ORDER BY s.region
    """,
).to_pandas()
print(regions.round(1).to_string(index=False))
assert len(regions) > 0, regions

# %% [markdown]
# ## 4. A model: logistic regression by DP-AGD
#
# Does an employee's salary tell their job? We fit the probability that someone is an engineer
# or a surgeon (`job` is a public column) from their salary
# and age. `dp_logreg_agd` fits P(label = 1) = sigmoid(intercept + coefficients · features)
# under zCDP, which the `salaries` table's `rdp` filter accounts for (a `zcdp` table takes it
# too; a `gdp` table, like `purchases`, accepts Gaussian releases only and refuses the fit with
# what the owner can do). Features
# should have comparable scales set by public constants, never by the data: salary centred at
# 100,000 in units of 50,000, age centred at 40 in units of 20. Rows with a NULL feature are
# skipped.

# %%
FEATURES = "[(salary - 100000) / 50000.0, (age - 40) / 20.0]"
LABEL = "CASE WHEN job IN ('engineer', 'surgeon') THEN 1 ELSE 0 END"
model_r = run(
    "logistic model",
    f"""
    SELECT dp_logreg_agd({LABEL}, {FEATURES}, epsilon => 1.0, delta => 1e-7) AS model
    FROM salaries
    """,
)
model = model_r.to_arrow().column("model")[0].as_py()
coefficients, intercept = model["coefficients"], model["intercept"]
print(f"coefficients {[round(c, 3) for c in coefficients]}, intercept {intercept:.3f}, "
      f"{model['iterations']} accepted steps")
assert len(coefficients) == 2, model

# %% [markdown]
# The same fit on `purchases` (a `gdp` table) is refused before anything runs: nothing is
# charged, and the message says what would work. Every error of a statement is a
# `dpfusion.Error`; its `code` tells which kind.

# %%
try:
    conn.sql(
        "SELECT dp_logreg_agd(CASE WHEN amount > 50 THEN 1 ELSE 0 END, [amount / 100.0],"
        " epsilon => 0.5) AS model FROM purchases"
    )
    raise SystemExit("a zCDP fit on a gdp table was not refused")
except dpfusion.Error as e:
    print(f"refused ({e.code}): {e.message[:300]}…")

# %% [markdown]
# The released model is public: applying it is post-processing, free. `logreg_predict_proba`
# takes any struct with `coefficients` and `intercept`, so we pass the model back as a literal
# and score a few new (public) people: nothing is charged.

# %%
model_sql = (
    f"named_struct('coefficients', make_array({', '.join(repr(float(c)) for c in coefficients)}),"
    f" 'intercept', {float(intercept)!r})"
)
scored = run(
    "scoring new people (free)",
    f"""
    SELECT salary, age, logreg_predict_proba({model_sql}, {FEATURES}) AS p_engineer_or_surgeon
    FROM (VALUES (45000.0, 30), (80000.0, 50), (120000.0, 35), (250000.0, 55)) AS t(salary, age)
    """,
)
assert scored.receipt is None, scored.receipt
print(scored.to_pandas().round(3).to_string(index=False))

# %% [markdown]
# Its accuracy on the private table is a statistic of private rows: itself a DP release (a mean
# of 0/1 hits, bounds 0 and 1), charged like any other.

# %%
accuracy = run(
    "model accuracy",
    f"""
    SELECT dp_mean(CASE WHEN (logreg_predict_proba({model_sql}, {FEATURES}) >= 0.5)
                             = ({LABEL} = 1) THEN 1.0 ELSE 0.0 END,
                   0, 1, epsilon => 0.2) AS accuracy
    FROM salaries
    """,
).to_pandas()
print(f"accuracy (DP): {accuracy['accuracy'][0]:.3f}")

# %% [markdown]
# ## 5. Running out of budget
#
# Every charge is durable before any result is released, and a query that would overspend a
# table's budget is refused *before* it runs: `dpfusion.BudgetExceeded`, nothing charged, the
# message says what is left. `remaining_epsilon` in `conn.budget()` is the largest ε one more
# query could use; here we spend ε = 3 per count until the server says no. (A query the server refuses for another reason is
# `dpfusion.Refused`; a bad argument `InvalidQuery`; a failure after admission `ExecutionFailed`.)

# %%
print(conn.budget()[["table", "used_pct", "left_pct", "remaining_epsilon"]].to_string(index=False))
exhausted = None
for i in range(30):
    try:
        run(f"count #{i + 1}", "SELECT dp_count(age, epsilon => 3.0) AS n FROM salaries")
    except dpfusion.BudgetExceeded as e:
        exhausted = e
        print(f"refused after {i} more counts ({e.code}): {e.message.splitlines()[0]}")
        break
assert exhausted is not None, "the budget never ran out"
left = conn.budget().set_index("table")
print(left[["used_pct", "left_pct", "remaining_epsilon"]].to_string())

# %% [markdown]
# ## 6. The budget used, query by query
#
# From the receipts: each query's cost as a share of its table's budget (bars) and the share
# used after it (line). A hand-written SVG keeps the tutorial free of plotting libraries (it
# opens in any browser); with matplotlib installed, `plt.bar`/`plt.step` over `history` does the
# same.


# %%
def budget_svg(history, tables):
    """An SVG: per table, the cost of each charge (bars) and the share used after it (line)."""
    width, height, pad = 720, 320, 50
    colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"]
    n = max(len(history), 1)
    step = (width - 2 * pad) / n
    y = lambda pct: height - pad - (height - 2 * pad) * min(max(pct, 0.0), 100.0) / 100.0  # noqa: E731
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="11">',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">'
        "Privacy budget used, per query (bars: its cost; line: used after it)</text>",
    ]
    for pct in (0, 25, 50, 75, 100):
        out.append(f'<line x1="{pad}" x2="{width - pad}" y1="{y(pct)}" y2="{y(pct)}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{pad - 6}" y="{y(pct) + 4}" text-anchor="end">{pct}%</text>')
    for k, table in enumerate(tables):
        colour = colours[k % len(colours)]
        points = []
        for i, (label, name, cost, used) in enumerate(history):
            if name != table:
                continue
            label, name = html.escape(label), html.escape(name)
            x = pad + i * step
            out.append(
                f'<rect x="{x + step * 0.15:.1f}" y="{y(cost):.1f}" width="{step * 0.7:.1f}" '
                f'height="{y(0) - y(cost):.1f}" fill="{colour}" fill-opacity="0.4">'
                f"<title>{label}: {cost:.2f}% of {name}</title></rect>"
            )
            points.append(f"{x + step / 2:.1f},{y(used):.1f}")
            out.append(f'<circle cx="{x + step / 2:.1f}" cy="{y(used):.1f}" r="3" '
                       f'fill="{colour}"><title>{name}: {used:.2f}% used after {label}</title>'
                       "</circle>")
            out.append(f'<text x="{x + step / 2:.1f}" y="{y(0) + 14}" '
                       f'text-anchor="middle">{i + 1}</text>')
        if points:
            out.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="{colour}" '
                       'stroke-width="2"/>')
        out.append(f'<text x="{pad + 10}" y="{45 + 14 * k}" fill="{colour}">{html.escape(table)}</text>')
    out.append(f'<text x="{width / 2}" y="{height - 15}" text-anchor="middle">'
               f"query (in order, {len(history)} charges)</text>")
    out.append("</svg>")
    return "\n".join(out)


with open(plot_path, "w") as f:
    f.write(budget_svg(history, private_tables))
print(f"wrote {plot_path}: {len(history)} charges")
assert any(used > 0 for (_, _, _, used) in history), history

conn.close()
print("tutorial done")
