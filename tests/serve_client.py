"""A third-party client of `dpfusion serve`: the ADBC Flight SQL driver (driven by dpfusion-cli/tests/it/serve.rs).

    python tests/serve_client.py grpc://127.0.0.1:PORT [CA.crt]    (token in $DPFUSION_TOKEN)

With CA.crt the URL is grpc+tls://localhost:PORT and the script trusts that authority.

Connects with no warning (the server answers the driver's transaction questions), runs a DP
query (its receipt in the result's schema metadata), a refused query (its code in the error's
details), SHOW BUDGET, `?` parameters and executemany, a bulk ingest into the analyst's schema
`mine` (queried, then replaced), then the same DP query until the budget runs out (an
OperationalError with the code budget_exceeded, not an InternalError); prints "all ok" when every
check passes.
"""
import os
import sys
import warnings
import signal

# Bounded: a client that hangs fails the test instead of holding it up.
signal.alarm(120)

# Any warning fails the test: the driver used to warn on connect that it could not leave
# autocommit mode.
warnings.simplefilter("error")

import adbc_driver_flightsql.dbapi as flight_sql
from adbc_driver_flightsql import DatabaseOptions

uri = sys.argv[1]
token = os.environ["DPFUSION_TOKEN"]
options = {DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {token}"}
if len(sys.argv) > 2:
    # grpc+tls://: trust the authority that signed the server's certificate.
    with open(sys.argv[2]) as f:
        options[DatabaseOptions.TLS_ROOT_CERTS.value] = f.read()
conn = flight_sql.connect(uri, db_kwargs=options)
cur = conn.cursor()


def code(e):
    """The dpfusion code of an ADBC error: the response metadata x-dpfusion-code, which the
    driver lists in e.details (the gRPC status details are there too)."""
    found = [bytes(v).decode() for k, v in e.details if k in ("x-dpfusion-code", b"x-dpfusion-code")]
    assert any(k in ("grpc-status-details-bin", b"grpc-status-details-bin") for k, _ in e.details), e.details
    return found[0] if found else None


import json

# A DP query, its receipt in the schema metadata.
cur.execute("SELECT dp_count(id, 0.5) AS n FROM people")
t = cur.fetch_arrow_table()
assert t.num_rows == 1 and t.column_names == ["n"], t
doc = json.loads(t.schema.metadata[b"dpfusion.receipt"])
assert doc["receipt"]["tables"][0]["name"] == "people", doc
print("dp query:", t.to_pylist(), doc["receipt_text"])

# `?` parameters, and executemany (one run, and one charge, per row).
cur.execute("SELECT dp_count(id, ?) AS n FROM people WHERE dept = ?", (0.01, "ops"))
assert cur.fetch_arrow_table().num_rows == 1
cur.executemany("SELECT dp_count(id, ?) AS n FROM people", [(0.01,), (0.01,)])
assert cur.rowcount == 2, cur.rowcount
conn.commit()

# A refused query, with its message.
try:
    cur.execute("SELECT age FROM people")
    cur.fetch_arrow_table()
    raise SystemExit("a raw read of a private table was not refused")
except flight_sql.Error as e:
    msg = str(e)
    assert "refused" in msg and "people" in msg, msg
    # The ADBC driver maps the gRPC code to an ADBC status and names it in the message.
    assert "(InvalidArgument;" in msg and isinstance(e, flight_sql.ProgrammingError), (type(e), msg)
    assert code(e) == "refused", e.details
    print("refused:", type(e).__name__, msg.splitlines()[0][:200])

# SHOW BUDGET.
cur.execute("SHOW BUDGET")
t = cur.fetch_arrow_table()
assert t.num_rows >= 1, t
print("budget:", t.to_pylist())

# Bulk ingest: the analyst's own public data, into their schema `mine` (no path on the server).
import pyarrow as pa
bonus = pa.table({"dept": ["ops", "sales"], "bonus": [1.0, 2.0]})
assert cur.adbc_ingest("bonus", bonus, mode="create") in (2, -1)
cur.execute("SELECT dept, bonus FROM mine.bonus ORDER BY dept")
t = cur.fetch_arrow_table()
assert t.to_pylist() == [{"dept": "ops", "bonus": 1.0}, {"dept": "sales", "bonus": 2.0}], t
cur.adbc_ingest("bonus", bonus.slice(0, 1), mode="replace")
cur.execute("SELECT dept FROM mine.bonus")
assert cur.fetch_arrow_table().num_rows == 1
print("ingest: ok")

# Budget exhaustion.
for i in range(50):
    try:
        cur.execute("SELECT dp_count(id, 0.5) AS n FROM people")
        cur.fetch_arrow_table()
    except flight_sql.Error as e:
        msg = str(e)
        assert "budget" in msg, msg
        # FailedPrecondition: an OperationalError in Python, never the InternalError of a crash.
        assert "(FailedPrecondition;" in msg, msg
        assert isinstance(e, flight_sql.OperationalError), type(e)
        assert not isinstance(e, flight_sql.InternalError), type(e)
        assert code(e) == "budget_exceeded", e.details
        print("exhausted after", i + 1, "more queries:", type(e).__name__, msg.splitlines()[0][:200])
        break
else:
    raise SystemExit("the budget never ran out")

cur.close()
conn.close()
print("all ok")
