"""The dpfusion Python package against a real `dpfusion serve` (driven by
dpfusion-cli/tests/it/serve.rs).

    python python/tests/test_client.py grpc://127.0.0.1:PORT    (token in $DPFUSION_TOKEN)

Runs with the package installed into the venv by scripts/setup-venv-serve.sh (`pip install
./python`). Checks, first without the server: how an error is read (its class, its message
without the driver's decorations, a charged statement's receipt, None when absent or
malformed); TLS options with a grpc:// URL refused; a server gone mid-statement is one
dpfusion.Error (round 50). Then against the server: no warning on connect; a DP query's rows
and receipt; a row wider than the driver's default message limit received; pandas (and polars
when installed), and what to install without pandas; `?` parameters, and one the package
cannot send; budget() and tables(); a charged failure's receipt adding up with SHOW BUDGET;
executemany's count and the rows charged before a failing one; a refusal, an invalid query and
budget exhaustion, each its own exception class from the server's code, none taken for a
crash. Prints "all ok" when every check passes.
"""
import json
import os
import signal
import sys
import warnings

# Bounded: a client that hangs fails the test instead of holding it up.
signal.alarm(120)
# Any warning (the driver's autocommit warning on connect included) fails the test.
warnings.simplefilter("error")

import adbc_driver_manager
import adbc_driver_flightsql.dbapi as flight_sql

import dpfusion

url = sys.argv[1]
token = os.environ["DPFUSION_TOKEN"]


def adbc_error(klass, message, details):
    """An ADBC error as the driver raises it (its decorations around the message included)."""
    return klass(
        f"INTERNAL: [FlightSQL] {message} (Internal; ExecuteQuery)",
        status_code=adbc_driver_manager.AdbcStatusCode.INTERNAL,
        details=details,
    )


# How an error is read (round 50, review python F1): a charged failure's receipt, from
# x-dpfusion-receipt-bin, on the exception of its class.
doc = {
    "receipt": {"tables": [{"name": "people", "native": {"share": 12}}]},
    "receipt_text": "charged people: cost 0.0012% of the budget",
    "tables": ["people"],
}
coded = [(b"x-dpfusion-code", b"execution_failed"), (b"date", b"now")]
e = dpfusion._translate(
    adbc_error(
        flight_sql.InternalError,
        "the query failed",
        coded + [(b"x-dpfusion-receipt-bin", json.dumps(doc).encode())],
    )
)
assert type(e) is dpfusion.ExecutionFailed and e.code == "execution_failed", e
assert e.message == "the query failed", repr(e.message)
assert e.receipt == doc["receipt"] and e.tables == ["people"] and e.metadata == doc, e.metadata
assert e.receipt_text == doc["receipt_text"] and str(e).endswith(doc["receipt_text"]), str(e)
assert e.rows_done is None
# Keys as str, as another driver version may give them; an error without a code keeps it too.
RECEIPT = "x-dpfusion-receipt-bin"
e = dpfusion._translate(
    adbc_error(flight_sql.OperationalError, "timed out", [(RECEIPT, json.dumps(doc))])
)
assert type(e) is dpfusion.Error and e.code is None and e.receipt == doc["receipt"], e
# The form too long for an error's headers: a text alone, no receipt.
note = {"receipt": None, "receipt_text": "charged; the receipt is too long", "tables": []}
e = dpfusion._translate(
    adbc_error(flight_sql.InternalError, "x", coded + [(RECEIPT, json.dumps(note).encode())])
)
assert e.receipt is None and e.receipt_text == note["receipt_text"] and e.tables == [], e
# Absent, malformed, not an object, of the wrong types: None (never an exception of its own).
for raw in [
    None, b"", b"{", b"\xff\xfe", b"[1, 2]", b"null", b"[" * 100000,
    b'{"receipt": 5, "receipt_text": [1], "tables": "people"}',
]:
    details = coded if raw is None else coded + [(RECEIPT, raw)]
    e = dpfusion._translate(adbc_error(flight_sql.InternalError, "x", details))
    assert type(e) is dpfusion.ExecutionFailed, (raw, e)
    assert e.receipt is None and e.receipt_text is None and str(e) == "x", (raw, str(e))
    assert e.tables in (None, []) and (raw is not None or e.metadata is None), (raw, e.tables)
# Each code its class; nothing charged, no receipt.
for code, klass in [
    (b"budget_exceeded", dpfusion.BudgetExceeded),
    (b"refused", dpfusion.Refused),
    (b"invalid", dpfusion.InvalidQuery),
    (b"failed", dpfusion.Failed),
]:
    e = dpfusion._translate(
        adbc_error(flight_sql.ProgrammingError, "m", [(b"x-dpfusion-code", code)])
    )
    assert type(e) is klass and e.receipt is None and e.metadata is None, (code, e)
# The driver's decorations are not part of the message (round 50, minor note).
for text, message in [
    (
        'IO: [FlightSQL] connection error: desc = "refused" '
        "(Unavailable; ClosePreparedStatement). Vendor code: 14",
        'connection error: desc = "refused"',
    ),
    (
        "INTERNAL: [FlightSQL] received message larger than max (20000849 vs. 16777216) "
        "(ResourceExhausted; DoGet: endpoint 0: [])",
        "received message larger than max (20000849 vs. 16777216)",
    ),
    (
        "INVALID_ARGUMENT: [FlightSQL] a (b) c\nline two (InvalidArgument; ExecuteQuery)",
        "a (b) c\nline two",
    ),
]:
    e = dpfusion._translate(
        flight_sql.OperationalError(text, status_code=adbc_driver_manager.AdbcStatusCode.IO)
    )
    assert e.message == message, (e.message, message)

# TLS options with a URL that is not grpc+tls:// are refused before anything is sent, as
# `dpfusion --connect` refuses --tls-ca with grpc:// (round 50, review python F4).
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "../../tests/data/tls/ca.crt")) as f:
    ca = f.read()
tls_option = "adbc.flight.sql.client_option.tls_skip_verify"
for target, kwargs in [
    (url, {"tls_root_certs": ca}),
    (url.upper(), {"db_kwargs": {tls_option: "false"}}),
    ("127.0.0.1:1", {"tls_root_certs": ca}),
]:
    try:
        dpfusion.connect(target, token=token, **kwargs)
        raise SystemExit(f"TLS options with {target} were not refused")
    except dpfusion.Error as e:
        assert "grpc+tls://" in e.message and "clear" in e.message and token not in e.message, e
# With grpc+tls:// the same options are taken (the driver connects when a statement runs).
dpfusion.connect(url.replace("grpc://", "grpc+tls://"), token=token, tls_root_certs=ca).close()


# A server gone mid-statement (round 50, review python F5): the statement's error, translated,
# is what the caller sees, not the close's; the cursor is not closed again by its finalizer.
class GoneCursor:
    closed_as = None

    def __init__(self):
        self._closed = False

    def gone(self, call):
        return flight_sql.OperationalError(
            f"IO: [FlightSQL] connection refused (Unavailable; {call}). Vendor code: 14",
            status_code=adbc_driver_manager.AdbcStatusCode.IO,
        )

    def execute(self, *args):
        raise self.gone("ExecuteQuery")

    executemany = execute

    def close(self):
        GoneCursor.closed_as = self
        raise self.gone("ClosePreparedStatement")


class GoneConnection:
    def cursor(self):
        return GoneCursor()

    def close(self):
        raise GoneCursor().gone("CloseSession")


gone = dpfusion.Connection(GoneConnection())
for run in [lambda: gone.sql("SELECT 1"), lambda: gone.executemany("SELECT ?", [(1,)])]:
    try:
        run()
        raise SystemExit("a lost server raised nothing")
    except dpfusion.Error as e:
        assert e.message == "connection refused" and e.code is None, e
        assert isinstance(e.__cause__, flight_sql.OperationalError), e.__cause__
        assert GoneCursor.closed_as._closed, "the cursor would be closed again"
try:
    with gone:
        raise KeyError("the block's own")
except KeyError:
    pass
try:
    gone.close()
    raise SystemExit("a failed close raised nothing")
except dpfusion.Error as e:
    assert e.message == "connection refused", e

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

    # A result whose one row is wider than the driver's default message limit (16 MiB): the
    # client takes what the server sends (round 50, review python F3).
    wide = ", ".join(f"repeat('{c}', 4000000) AS {c}" for c in "abcde")
    r = conn.sql(f"SELECT dp_count(id, 0.01) AS n, {wide} FROM people")
    assert len(r) == 1 and len(r.to_arrow().column("e")[0].as_py()) == 4000000, r
    assert r.receipt["tables"][0]["name"] == "people", r.receipt
    del r, wide

    # Without pandas, what to install (round 50, minor note).
    saved = sys.modules.get("pandas")
    sys.modules["pandas"] = None
    try:
        conn.sql("SELECT 1 AS one").to_pandas()
        raise SystemExit("to_pandas without pandas raised nothing")
    except ImportError as e:
        assert "dpfusion[pandas]" in str(e), e
    finally:
        sys.modules["pandas"] = saved

    # Nothing charged: no receipt.
    r = conn.sql("SELECT dept FROM depts ORDER BY dept")
    assert r.receipt is None and len(r) > 0, r

    # Parameters, bound by the server as literals before its guard sees the statement.
    r = conn.sql("SELECT dp_count(id, ?) AS n FROM people WHERE dept = ?", (0.25, "ops"))
    assert len(r) == 1 and r.receipt["tables"][0]["name"] == "people", r
    # A parameter is a value, never SQL.
    r = conn.sql("SELECT count(*) AS n FROM depts WHERE dept = ?", ("x' OR 'a'='a",))
    assert r.to_arrow().column("n").to_pylist() == [0], r.to_arrow()

    # A parameter the package cannot send: InvalidQuery, nothing ran (round 50, review python F5).
    try:
        conn.sql("SELECT count(*) AS n FROM depts WHERE ? > 0", (2**63,))
        raise SystemExit("an int of 2**63 was sent")
    except dpfusion.InvalidQuery as e:
        assert "64 bits" in e.message and e.receipt is None, e

    def people_budget():
        rows = conn.sql("SHOW BUDGET").to_arrow().to_pylist()
        return next(row for row in rows if row["table"] == "people")

    # A charged failure (after admission, the division by zero): ExecutionFailed with the
    # statement's receipt, which adds up with SHOW BUDGET (round 50, review python F1).
    before = people_budget()
    try:
        conn.sql("SELECT 1 / (n - n) AS x FROM (SELECT dp_count(id, 0.01) AS n FROM people)")
        raise SystemExit("a division by zero after admission did not fail")
    except dpfusion.ExecutionFailed as e:
        assert e.code == "execution_failed" and e.tables == ["people"], e
        charge = e.receipt["tables"][0]
        assert charge["name"] == "people" and charge["native"]["cost"] > 0, e.receipt
        assert "people" in e.receipt_text and str(e).endswith(e.receipt_text), str(e)
        after = people_budget()
        assert after["queries"] == before["queries"] + 1, (before, after)
        used = charge["native"]["used"]
        assert abs(after["used"] - used) <= 1e-5 * used, (after, charge)
        print("charged failure:", e.receipt_text)

    # executemany: one run a row, each charged; the count of runs; a failing row says how many
    # ran before it, whose charges stand (round 50, review python F1).
    q = "SELECT dp_count(id, ?) AS n FROM people WHERE dept = ?"
    before = people_budget()
    assert conn.executemany(q, [(0.01, "ops"), (0.01, "eng")]) == 2
    assert conn.executemany(q, []) == 0
    assert people_budget()["queries"] == before["queries"] + 2
    try:
        conn.executemany(q, [(0.01, "ops"), (60.0, "ops")])
        raise SystemExit("a row over the budget was admitted")
    except dpfusion.BudgetExceeded as e:
        assert e.rows_done == 1 and e.receipt is None, e
        assert people_budget()["queries"] == before["queries"] + 3
    try:
        conn.executemany("SELECT dp_count(id, 0.01) AS n FROM people", [()])
        raise SystemExit("a row without values ran")
    except dpfusion.InvalidQuery as e:
        assert e.rows_done == 0 and "sql()" in e.message, e
    assert people_budget()["queries"] == before["queries"] + 3

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
