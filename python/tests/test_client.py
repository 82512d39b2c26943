"""The dpfusion Python package against a real `dpfusion serve` (driven by dpfusion-cli/tests/it/serve.rs).

    python python/tests/test_client.py grpc://127.0.0.1:PORT    (token in $DPFUSION_TOKEN)

Runs with the package installed into the venv by scripts/setup-venv-serve.sh (`pip install
./python`). Checks: no warning on connect; a DP query's rows and receipt; pandas (and polars
when installed); `?` parameters; budget() and tables(); a refusal, an invalid query and budget
exhaustion, each its own exception class from the server's code, none taken for a crash.
Prints "all ok" when every check passes.
"""
import os
import signal
import sys
import warnings

# Bounded: a client that hangs fails the test instead of holding it up.
signal.alarm(120)
# Any warning (the driver's autocommit warning on connect included) fails the test.
warnings.simplefilter("error")

import dpfusion

url = sys.argv[1]
token = os.environ["DPFUSION_TOKEN"]

with dpfusion.connect(url, token=token) as conn:
    # A DP query: rows and receipt.
    r = conn.sql("SELECT dp_count(id, 0.25) AS n FROM people")
    assert r.to_arrow().column_names == ["n"] and len(r) == 1, r.to_arrow()
    charge = r.receipt["tables"][0]
    assert charge["name"] == "people", r.receipt
    # The fields are the accountant's (docs/ACCOUNTING.md): some positive cost is among them.
    assert any(isinstance(v, float) and v > 0 for v in charge.values()), charge
    assert "people" in r.receipt_text, r.receipt_text
    assert r.tables == ["people"], r.tables
    df = r.to_pandas()
    assert list(df.columns) == ["n"] and len(df) == 1, df
    print("receipt:", r.receipt_text)
    try:
        import polars  # optional
    except ImportError:
        pass
    else:
        assert r.to_polars().shape == (1, 1)

    # Nothing charged: no receipt.
    r = conn.sql("SELECT dept FROM depts ORDER BY dept")
    assert r.receipt is None and len(r) > 0, r

    # Parameters, bound by the server as literals before its guard sees the statement.
    r = conn.sql("SELECT dp_count(id, ?) AS n FROM people WHERE dept = ?", (0.25, "ops"))
    assert len(r) == 1 and r.receipt["tables"][0]["name"] == "people", r
    # A parameter is a value, never SQL.
    r = conn.sql("SELECT count(*) AS n FROM depts WHERE dept = ?", ("x' OR 'a'='a",))
    assert r.to_arrow().column("n").to_pylist() == [0], r.to_arrow()

    # budget() and tables() as DataFrames.
    b = conn.budget()
    assert "people" in list(b["table"]), b
    t = conn.tables()
    assert {"people", "depts"} <= set(t["table"]), t
    print("budget:", b.to_dict("records"))

    # Refusal and invalid input: their own classes, nothing charged.
    try:
        conn.sql("SELECT age FROM people")
        raise SystemExit("a raw read of a private table was not refused")
    except dpfusion.Refused as e:
        assert e.code == "refused" and "people" in e.message, e
    try:
        conn.sql("SELECT nosuch FROM depts")
        raise SystemExit("an unknown column was not refused")
    except dpfusion.InvalidQuery as e:
        assert e.code == "invalid" and "nosuch" in e.message, e

    # Budget exhaustion: BudgetExceeded, told apart from a crash (ExecutionFailed).
    for i in range(50):
        try:
            conn.sql("SELECT dp_count(id, 0.5) AS n FROM people")
        except dpfusion.BudgetExceeded as e:
            assert e.code == "budget_exceeded" and "budget" in e.message, e
            assert not isinstance(e, dpfusion.ExecutionFailed)
            print("exhausted after", i + 1, "more queries:", e.message.splitlines()[0][:160])
            break
    else:
        raise SystemExit("the budget never ran out")

print("all ok")
