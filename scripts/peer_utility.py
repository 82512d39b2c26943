#!/usr/bin/env python3
"""Utility against the peers (issue 18): dpfusion's dp_mean (Laplace), dp_median / dp_quantile and
dp_variance against OpenDP's Laplace mean, OpenDP's quantile and diffprivlib's tools.var, on the
same data, the same bounds and the same ε.

Needs: the project's venv with opendp and diffprivlib (`scripts/setup-venv.sh` installs the pinned
versions; it needs PyPI), and a dpfusion binary (`cargo build --bin dpfusion`; a dev build is
enough). Not part of `cargo nextest`.
Takes: 5 to 12 minutes on a shared 2-core machine with the dev (opt-level 0) binary (dpfusion:
one process running 900 statements over the CSVs, 2 to 4 minutes; the peers 3 to 8 minutes,
mostly OpenDP's quantile scoring with 8192 candidates).

    scripts/setup-venv.sh
    CARGO_TARGET_DIR=... cargo build --bin dpfusion
    .venv/bin/python scripts/peer_utility.py --dpfusion $CARGO_TARGET_DIR/debug/dpfusion

Data: n = 100,000 incomes in k$ drawn from a lognormal (median 45, σ_log = 0.6; seed 18), rounded
to 0.01, bounds [0, 200] for everyone (0.6% of the rows lie above 200 and are clamped by every
method; the truth is computed on the clamped values). ε ∈ {0.1, 0.5, 1}, 100 runs each. δ is
dpfusion's default (1e-7) where a call uses one (the Gaussian dp_variance only). The quantiles are
also run on a second, small table (n = 1,000, seed 19), where the noise rather than the 1024-bin
resolution dominates, and OpenDP's quantile also with 8192 candidates, against both our default
1024 bins and `bins => 8192`.

Prints a Markdown table: mean absolute error (MAE) of each method over the runs ± its standard
error, and the ratio ours/peer (± from the two standard errors, delta method).
"""

import argparse
import csv
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

LOWER, UPPER = 0.0, 200.0
EPSILONS = (0.1, 0.5, 1.0)
QUANTILES = (0.5, 0.9)


def make_data(n, seed):
    rng = np.random.default_rng(seed)
    x = np.round(np.exp(rng.normal(math.log(45.0), 0.6, n)), 2)
    return x


def dpfusion_sql(runs):
    """The statements, in order, and what each column of each statement is."""
    stmts, cols = [], []
    for eps in EPSILONS:
        for _ in range(runs):
            # add/remove table: unknown n
            calls = [
                (f"dp_mean(income, 0, 200, epsilon => {eps}, mechanism => 'laplace')", ("mean_ar", eps)),
                (f"dp_median(income, 0, 200, {eps})", ("q0.5_ar", eps)),
                (f"dp_quantile(income, 0, 200, 0.9, {eps})", ("q0.9_ar", eps)),
                (f"dp_median(income, 0, 200, {eps}, bins => 8192)", ("q0.5_ar_fine", eps)),
                (f"dp_quantile(income, 0, 200, 0.9, {eps}, bins => 8192)", ("q0.9_ar_fine", eps)),
                (f"dp_variance(income, 0, 200, epsilon => {eps})", ("var_gauss_ar", eps)),
                (f"dp_variance(income, 0, 200, epsilon => {eps}, mechanism => 'laplace')", ("var_lap_ar", eps)),
            ]
            stmts.append("SELECT " + ", ".join(c for c, _ in calls) + " FROM income")
            cols.append([k for _, k in calls])
            # replace table, no filter, no GROUP BY: the session sets replace_public_n (public n)
            calls = [
                (f"dp_mean(income, 0, 200, epsilon => {eps}, mechanism => 'laplace')", ("mean_pubn", eps)),
                (f"dp_variance(income, 0, 200, epsilon => {eps}, mechanism => 'laplace')", ("var_lap_r", eps)),
            ]
            stmts.append("SELECT " + ", ".join(c for c, _ in calls) + " FROM income_r")
            cols.append([k for _, k in calls])
            # the quantiles on a small table, where the noise, not the resolution, dominates
            calls = [
                (f"dp_median(income, 0, 200, {eps})", ("q0.5_small", eps)),
                (f"dp_quantile(income, 0, 200, 0.9, {eps})", ("q0.9_small", eps)),
            ]
            stmts.append("SELECT " + ", ".join(c for c, _ in calls) + " FROM income_small")
            cols.append([k for _, k in calls])
    return stmts, cols


def run_dpfusion(binary, paths, workdir, runs):
    """`paths`: the CSV of the add/remove table, its copy for the replace table (the ledger keeps
    one policy per file), and the small table's."""
    csv_path, csv_r_path, small_path = paths
    catalog = os.path.join(workdir, "peers.toml")
    with open(catalog, "w") as f:
        f.write(
            f"""[session]
ledger = "ledger.jsonl"

[[table]]
name = "income"
path = "{csv_path}"
filter = "zcdp"
epsilon = 1000000.0
delta = 1e-3

[[table]]
name = "income_r"
path = "{csv_r_path}"
neighbours = "replace"
filter = "zcdp"
epsilon = 1000000.0
delta = 1e-3

[[table]]
name = "income_small"
path = "{small_path}"
filter = "zcdp"
epsilon = 1000000.0
delta = 1e-3
"""
        )
    stmts, cols = dpfusion_sql(runs)
    sql = os.path.join(workdir, "peers.sql")
    with open(sql, "w") as f:
        f.write(";\n".join(stmts) + ";\n")
    t = time.time()
    out = subprocess.run(
        [binary, "--catalog", catalog, "-f", sql, "--format", "json", "-q"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    took = time.time() - t
    results = {}
    rows = parse_json_stream(out)
    if len(rows) != len(stmts):
        sys.exit(f"expected {len(stmts)} results from dpfusion, got {len(rows)}:\n{out[:2000]}")
    for row, keys in zip(rows, cols):
        vals = list(row.values())
        for k, v in zip(keys, vals):
            results.setdefault(k, []).append(float(v))
    return results, took


def parse_json_stream(out):
    """One JSON value per statement (an array of row objects); returns the first row of each."""
    dec = json.JSONDecoder()
    i, rows = 0, []
    while i < len(out):
        while i < len(out) and out[i].isspace():
            i += 1
        if i >= len(out):
            break
        v, i = dec.raw_decode(out, i)
        rows.append(v[0] if isinstance(v, list) else v)
    return rows


def run_peers(x, x_small, runs):
    import opendp.prelude as dp
    from diffprivlib import tools

    dp.enable_features("contrib")
    n = len(x)
    xl = [float(v) for v in x]
    res = {}
    unsized = dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.symmetric_distance()
    sized = dp.vector_domain(dp.atom_domain(T=float, nan=False), size=n), dp.symmetric_distance()
    cands = [LOWER + (b + 0.5) * (UPPER - LOWER) / 1024 for b in range(1024)]
    fine = [LOWER + (b + 0.5) * (UPPER - LOWER) / 8192 for b in range(8192)]
    xs = [float(v) for v in x_small]
    for eps in EPSILONS:
        # OpenDP's Laplace mean: the known-n form (sized domain; one changed row is d_in = 2
        # under the symmetric distance, i.e. replace neighbours).
        t_mean = sized >> dp.t.then_clamp((LOWER, UPPER)) >> dp.t.then_mean()
        s = dp.binary_search_param(lambda s: t_mean >> dp.m.then_laplace(scale=s), d_in=2, d_out=eps)
        m_mean = t_mean >> dp.m.then_laplace(scale=s)
        assert m_mean.map(2) <= eps
        res[("opendp_mean_known_n", eps)] = [m_mean(xl) for _ in range(runs)]
        # Unknown n: OpenDP's sum and count, each a Laplace measurement at ε/2 (d_in = 1:
        # add/remove one row), composed; the ratio clamped to the bounds (post-processing).
        t_sum = unsized >> dp.t.then_clamp((LOWER, UPPER)) >> dp.t.then_sum()
        s_sum = dp.binary_search_param(lambda s: t_sum >> dp.m.then_laplace(scale=s), d_in=1, d_out=eps / 2)
        m_sum = t_sum >> dp.m.then_laplace(scale=s_sum)
        t_cnt = unsized >> dp.t.then_count()
        s_cnt = dp.binary_search_param(lambda s: t_cnt >> dp.m.then_laplace(scale=s), d_in=1, d_out=eps / 2)
        m_cnt = t_cnt >> dp.m.then_laplace(scale=s_cnt)
        assert m_sum.map(1) + m_cnt.map(1) <= eps
        res[("opendp_mean_unknown_n", eps)] = [
            min(max(m_sum(xl) / max(m_cnt(xl), 1), LOWER), UPPER) for _ in range(runs)
        ]
        # OpenDP's quantile: the candidates are our 1024 bin midpoints (the same resolution);
        # unknown n (d_in = 1), pure ε (max_divergence).
        # Also with 8192 candidates (8× finer than our fixed 1024 bins), and on the small table.
        for q in QUANTILES:
            for tag, cs, data in [("", cands, xl), ("_fine", fine, xl), ("_small", cands, xs)]:
                mk = lambda s, q=q, cs=cs: dp.m.make_private_quantile(
                    unsized[0], unsized[1], dp.max_divergence(), cs, q, s
                )
                s = dp.binary_search_param(mk, d_in=1, d_out=eps)
                m_q = mk(s)
                assert m_q.map(1) <= eps
                res[(f"opendp_q{q}{tag}", eps)] = [m_q(data) for _ in range(runs)]
        # diffprivlib's tools.var: Laplace (bounded domain) on the variance, n treated as public.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res[("dpl_var", eps)] = [
                float(tools.var(x, epsilon=eps, bounds=(LOWER, UPPER))) for _ in range(runs)
            ]
    return res


def mae(values, truth):
    e = np.abs(np.asarray(values) - truth)
    return e.mean(), e.std(ddof=1) / math.sqrt(len(e))


def fmt(m, se):
    digits = max(0, 2 - int(math.floor(math.log10(se)))) if se > 0 else 4
    return f"{m:.{digits}f} ± {se:.{digits}f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dpfusion", required=True, help="path of the dpfusion binary")
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--n-small", type=int, default=1_000, help="rows of the small quantile table")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--out", help="also write the Markdown table to this file")
    a = ap.parse_args()

    x = make_data(a.n, a.seed)
    x_small = make_data(a.n_small, a.seed + 1)
    xc = np.clip(x, LOWER, UPPER)
    xsc = np.clip(x_small, LOWER, UPPER)
    truth = {
        "mean": xc.mean(),
        "var": xc.var(),
        "q0.5": float(np.quantile(xc, 0.5)),
        "q0.9": float(np.quantile(xc, 0.9)),
        "q0.5 (n small)": float(np.quantile(xsc, 0.5)),
        "q0.9 (n small)": float(np.quantile(xsc, 0.9)),
    }
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for name, data in [("income.csv", x), ("income_r.csv", x), ("income_small.csv", x_small)]:
            paths.append(os.path.join(d, name))
            with open(paths[-1], "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["income"])
                w.writerows([[f"{v:.2f}"] for v in data])
        ours, took = run_dpfusion(os.path.abspath(a.dpfusion), paths, d, a.runs)
    t = time.time()
    peers = run_peers(x, x_small, a.runs)
    took_peers = time.time() - t

    comparisons = [
        ("mean", "dp_mean laplace, add/remove (noisy n)", "mean_ar", "OpenDP sum/count, Laplace ε/2 each (unknown n)", "opendp_mean_unknown_n"),
        ("mean", "dp_mean laplace, replace table (public n)", "mean_pubn", "OpenDP make_mean + Laplace (known n)", "opendp_mean_known_n"),
        ("q0.5", "dp_median, add/remove", "q0.5_ar", "OpenDP make_private_quantile α = 0.5, 1024 candidates", "opendp_q0.5"),
        ("q0.9", "dp_quantile q = 0.9, add/remove", "q0.9_ar", "OpenDP make_private_quantile α = 0.9, 1024 candidates", "opendp_q0.9"),
        ("q0.5", "dp_median, add/remove", "q0.5_ar", "OpenDP make_private_quantile α = 0.5, 8192 candidates", "opendp_q0.5_fine"),
        ("q0.9", "dp_quantile q = 0.9, add/remove", "q0.9_ar", "OpenDP make_private_quantile α = 0.9, 8192 candidates", "opendp_q0.9_fine"),
        ("q0.5", "dp_median, add/remove, bins => 8192", "q0.5_ar_fine", "OpenDP make_private_quantile α = 0.5, 8192 candidates", "opendp_q0.5_fine"),
        ("q0.9", "dp_quantile q = 0.9, add/remove, bins => 8192", "q0.9_ar_fine", "OpenDP make_private_quantile α = 0.9, 8192 candidates", "opendp_q0.9_fine"),
        ("q0.5 (n small)", f"dp_median, add/remove, n = {a.n_small:,}", "q0.5_small", "OpenDP make_private_quantile α = 0.5, 1024 candidates", "opendp_q0.5_small"),
        ("q0.9 (n small)", f"dp_quantile q = 0.9, add/remove, n = {a.n_small:,}", "q0.9_small", "OpenDP make_private_quantile α = 0.9, 1024 candidates", "opendp_q0.9_small"),
        ("var", "dp_variance laplace, add/remove (noisy n)", "var_lap_ar", "diffprivlib tools.var (Laplace, known n)", "dpl_var"),
        ("var", "dp_variance laplace, replace table", "var_lap_r", "diffprivlib tools.var (Laplace, known n)", "dpl_var"),
        ("var", "dp_variance gaussian (default, δ = 1e-7), add/remove", "var_gauss_ar", "diffprivlib tools.var (Laplace, known n)", "dpl_var"),
    ]
    lines = [
        f"n = {a.n}, {a.runs} runs per ε, bounds [{LOWER:g}, {UPPER:g}], seed {a.seed}; truth (clamped data): "
        + ", ".join(f"{k} = {v:.4f}" for k, v in truth.items()),
        f"opendp {importlib.metadata.version('opendp')}, diffprivlib {importlib.metadata.version('diffprivlib')}, "
        f"numpy {np.__version__}; dpfusion {took:.0f} s, peers {took_peers:.0f} s",
        "",
        "| statistic | ours | peer | ε | MAE ours | MAE peer | ratio ours/peer |",
        "|---|---|---|---|---|---|---|",
    ]
    for stat, our_name, our_key, peer_name, peer_key in comparisons:
        for eps in EPSILONS:
            m1, s1 = mae(ours[(our_key, eps)], truth[stat])
            m2, s2 = mae(peers[(peer_key, eps)], truth[stat])
            if m1 > 0 and m2 > 0:
                r = m1 / m2
                rs = r * math.sqrt((s1 / m1) ** 2 + (s2 / m2) ** 2)
                ratio = f"{r:.2f} ± {rs:.2f}"
            else:
                ratio = "–"
            lines.append(
                f"| {stat} | {our_name} | {peer_name} | {eps:g} | {fmt(m1, s1)} | {fmt(m2, s2)} | {ratio} |"
            )
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
