"""A Python client of ``dpfusion serve``: differentially private SQL over Arrow Flight SQL.

Pure Python over the ADBC Flight SQL driver::

    import dpfusion

    conn = dpfusion.connect("grpc://127.0.0.1:50051", token="...")
    r = conn.sql("SELECT dp_count(id, 0.5) AS n FROM people")
    r.to_pandas()      # or r.to_arrow(), r.to_polars()
    r.receipt          # what the query was charged (parsed JSON), None if nothing was
    conn.budget()      # SHOW BUDGET as a DataFrame

Every error of a statement is one of :class:`BudgetExceeded`, :class:`Refused`,
:class:`InvalidQuery` and :class:`ExecutionFailed` (all :class:`Error`), chosen by the
machine-readable code the server sends with it (the gRPC status details and the response
metadata ``x-dpfusion-code``); other failures (connection, authentication) are :class:`Error`.
"""

from __future__ import annotations

import json
import re as _re
from typing import Any, Mapping, Optional, Sequence

import adbc_driver_flightsql.dbapi as _flight_sql
import pyarrow as _pa
from adbc_driver_flightsql import DatabaseOptions as _DatabaseOptions

__all__ = [
    "connect",
    "Connection",
    "Result",
    "Error",
    "BudgetExceeded",
    "Refused",
    "InvalidQuery",
    "ExecutionFailed",
    "Failed",
    "RECEIPT_KEY",
    "CODE_HEADER",
]

__version__ = "0.1.0"

#: The result schema's metadata key holding the statement's receipt document (JSON).
RECEIPT_KEY = b"dpfusion.receipt"
#: The response metadata key holding an error's code.
CODE_HEADER = b"x-dpfusion-code"


class Error(Exception):
    """An error from the server or the connection.

    ``code`` is the server's machine-readable code (``budget_exceeded``, ``refused``,
    ``invalid``, ``execution_failed``, ``failed``) or None; ``message`` the server's message, which says
    what to do. The ADBC error is the ``__cause__``.
    """

    code: Optional[str] = None

    def __init__(self, message: str, code: Optional[str] = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class BudgetExceeded(Error):
    """Admitting the query would exceed a table's privacy budget. Nothing was charged."""

    code = "budget_exceeded"


class Refused(Error):
    """The server refused the statement (outside the private fragment, or a statement or quota
    the server does not allow). Nothing was charged."""

    code = "refused"


class InvalidQuery(Error):
    """The SQL or an argument is invalid. Nothing was charged."""

    code = "invalid"


class ExecutionFailed(Error):
    """The query failed after it was admitted: its charge stands, no detail is shown."""

    code = "execution_failed"


class Failed(Error):
    """The statement failed as it ran and nothing was charged (a statement that reads no private
    table, or one stopped by its memory or spill bound): the message says why."""

    code = "failed"


_BY_CODE = {
    c.code: c for c in (BudgetExceeded, Refused, InvalidQuery, ExecutionFailed, Failed)
}


def _code_of(e: BaseException) -> Optional[str]:
    """The dpfusion code an ADBC error carries, if any."""
    details = getattr(e, "details", None) or []
    for key, value in details:
        key = key.encode() if isinstance(key, str) else key
        if key == CODE_HEADER:
            return bytes(value).decode("ascii", "replace")
    # The gRPC status details: a google.rpc.ErrorInfo whose metadata maps "code" to the code.
    for key, value in details:
        for code in _BY_CODE:
            if code.encode() in bytes(value) and b"dpfusion" in bytes(value):
                return code
    return None


def _message_of(e: BaseException) -> str:
    msg = str(e)
    # The driver's decorations: "STATUS: [FlightSQL] message (GrpcCode; Call)".
    if "[FlightSQL] " in msg:
        msg = msg.split("[FlightSQL] ", 1)[1]
    return _re.sub(r"\s*\(\w+; \w+\)\s*$", "", msg)


def _translate(e: BaseException) -> Error:
    code = _code_of(e)
    klass = _BY_CODE.get(code, Error) if code else Error
    return klass(_message_of(e), code)


class Result:
    """One statement's result: its rows (an Arrow table) and its receipt."""

    def __init__(self, table: "_pa.Table"):
        self._table = table
        raw = (table.schema.metadata or {}).get(RECEIPT_KEY)
        doc = json.loads(raw) if raw else {}
        #: The receipt document: ``receipt``, ``receipt_text``, ``tables``.
        self.metadata: Mapping[str, Any] = doc
        #: What the statement was charged, per private table (parsed JSON); None if nothing.
        self.receipt: Optional[Mapping[str, Any]] = doc.get("receipt")
        #: The receipt as the REPL prints it.
        self.receipt_text: Optional[str] = doc.get("receipt_text")
        #: The private tables the statement used.
        self.tables: Sequence[str] = doc.get("tables", [])

    def to_arrow(self) -> "_pa.Table":
        """The rows, as a pyarrow Table (its schema metadata still holds the receipt)."""
        return self._table

    def to_pandas(self):
        """The rows, as a pandas DataFrame (``pip install 'dpfusion[pandas]'``)."""
        return self._table.to_pandas()

    def to_polars(self):
        """The rows, as a polars DataFrame (``pip install 'dpfusion[polars]'``)."""
        try:
            import polars
        except ImportError as e:
            raise ImportError("to_polars needs polars: pip install 'dpfusion[polars]'") from e
        return polars.from_arrow(self._table)

    def __len__(self) -> int:
        return self._table.num_rows

    def __repr__(self) -> str:
        receipt = f", {self.receipt_text}" if self.receipt_text else ""
        return f"<dpfusion.Result {self._table.num_rows} rows{receipt}>"


class Connection:
    """A connection to ``dpfusion serve`` (see :func:`connect`)."""

    def __init__(self, conn):
        self._conn = conn

    def sql(self, query: str, params: Optional[Sequence[Any]] = None) -> Result:
        """Runs one statement (``?`` placeholders take ``params``, bound by the server as
        literals before its guard sees the statement) and fetches its result."""
        cur = self._conn.cursor()
        try:
            if params is None:
                cur.execute(query)
            else:
                cur.execute(query, params)
            return Result(cur.fetch_arrow_table())
        except _flight_sql.Error as e:
            raise _translate(e) from e
        finally:
            cur.close()

    def executemany(self, query: str, seq_of_params) -> int:
        """Runs ``query`` once per row of parameters (each run admitted and charged on its own,
        its result dropped); returns the number of runs."""
        cur = self._conn.cursor()
        try:
            cur.executemany(query, seq_of_params)
            return cur.rowcount
        except _flight_sql.Error as e:
            raise _translate(e) from e
        finally:
            cur.close()

    def budget(self):
        """``SHOW BUDGET``: per private table, its budget, what is spent and what is left (a
        pandas DataFrame)."""
        return self.sql("SHOW BUDGET").to_pandas()

    def tables(self):
        """The tables this analyst can query (``SHOW TABLES``), as a pandas DataFrame."""
        return self.sql("SHOW TABLES").to_pandas()

    def cursor(self):
        """The underlying DB-API cursor (ADBC), for what this class does not cover."""
        return self._conn.cursor()

    @property
    def adbc(self):
        """The underlying DB-API connection (ADBC)."""
        return self._conn

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(
    url: str,
    token: str,
    *,
    tls_root_certs: Optional[str] = None,
    db_kwargs: Optional[Mapping[str, str]] = None,
) -> Connection:
    """Connects to ``dpfusion serve`` at ``url`` (``grpc://host:port``, or ``grpc+tls://…``)
    with the bearer ``token`` the data owner gave you. ``tls_root_certs``: PEM text of the
    authority that signed the server's certificate, when it is not a public one."""
    options = {_DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {token}"}
    if tls_root_certs is not None:
        options[_DatabaseOptions.TLS_ROOT_CERTS.value] = tls_root_certs
    options.update(db_kwargs or {})
    try:
        # Statements run one at a time, each charged when admitted: autocommit is what the
        # server does (and asking for it leaves the driver nothing to warn about).
        conn = _flight_sql.connect(url, db_kwargs=options, autocommit=True)
    except _flight_sql.Error as e:
        raise _translate(e) from e
    return Connection(conn)
