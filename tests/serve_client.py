"""A third-party client of `dpfusion serve`: the ADBC Flight SQL driver (driven by tests/it/serve.rs).

    python tests/serve_client.py grpc://127.0.0.1:PORT [CA.crt]    (token in $DPFUSION_TOKEN)

With CA.crt the URL is grpc+tls://localhost:PORT and the script trusts that authority.

Runs a DP query, a refused query, SHOW BUDGET, a bulk ingest into the analyst's schema `mine`
(queried, then replaced), then the same DP query until the budget runs out;
prints "all ok" when every check passes.
"""
import os
import sys
import warnings
import signal

# Bounded: a client that hangs fails the test instead of holding it up.
signal.alarm(120)

# The driver warns that Flight SQL connections cannot leave autocommit mode; dpfusion has no
# transactions.
warnings.simplefilter("ignore")

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

# A DP query.
cur.execute("SELECT dp_count(id, 0.5) AS n FROM people")
t = cur.fetch_arrow_table()
assert t.num_rows == 1 and t.column_names == ["n"], t
print("dp query:", t.to_pylist())

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
        assert "(ResourceExhausted;" in msg, msg
        print("exhausted after", i + 1, "more queries:", type(e).__name__, msg.splitlines()[0][:200])
        break
else:
    raise SystemExit("the budget never ran out")

cur.close()
conn.close()
print("all ok")
