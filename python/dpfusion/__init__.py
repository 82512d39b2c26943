"""A Python client of ``dpfusion serve``: differentially private SQL over Arrow Flight SQL.

Pure Python over the ADBC Flight SQL driver::

    import dpfusion

    conn = dpfusion.connect("grpc://127.0.0.1:50051", token="...")
    r = conn.sql("SELECT dp_count(id, 0.5) AS n FROM people")
    r.to_pandas()      # or r.to_arrow(), r.to_polars()
    r.receipt          # what the query was charged (parsed JSON), None if nothing was
    conn.budget()      # SHOW BUDGET as a DataFrame

Every error of a statement is one of :class:`BudgetExceeded`, :class:`Refused`,
:class:`InvalidQuery`, :class:`ExecutionFailed` and :class:`Failed` (all :class:`Error`), chosen
by the machine-readable code the server sends with it (the gRPC status details and the response
metadata ``x-dpfusion-code``); other failures (connection, authentication) are :class:`Error`.
Every failure the package raises is an :class:`Error`, a connection lost mid-statement and a
parameter it cannot send included.

An error of a statement that was admitted (it failed as it ran, its result was over the server's
bound, it ran out of time or the server stopped) was charged: the exception carries the
statement's receipt as a result does (``e.receipt``, ``e.receipt_text``, ``e.tables``, read from
the response metadata ``x-dpfusion-receipt-bin``; None when nothing was charged), so adding up
the receipts of results and errors follows the budget (round 50). ``SHOW BUDGET`` and
``dp_ledger()`` show every charge.
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
    "RECEIPT_HEADER",
    "MAX_MESSAGE_BYTES",
]

__version__ = "0.1.0"

#: The result schema's metadata key holding the statement's receipt document (JSON).
RECEIPT_KEY = b"dpfusion.receipt"
#: The response metadata key holding an error's code.
CODE_HEADER = b"x-dpfusion-code"
#: The response metadata key holding the receipt document of a charged statement's error
#: (docs/SQL.md, "Receipts and error codes over Flight SQL").
RECEIPT_HEADER = b"x-dpfusion-receipt-bin"
#: The largest gRPC message the client accepts: the largest the server sends (its encoding
#: limit, ``ByMethod::new`` in src/serve/mod.rs). The driver's default, 16 MiB, lost a charged
#: result with a row wider than that (round 50, review python F3). ``db_kwargs`` may set
#: another (``adbc.flight.sql.client_option.with_max_msg_size``).
MAX_MESSAGE_BYTES = 64 << 20


def _receipt_document(raw: Optional[bytes]) -> Optional[Mapping[str, Any]]:
    """The receipt document (JSON: ``receipt``, ``receipt_text``, ``tables``) in ``raw``; None
    when there is none or it is not a JSON object."""
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except (ValueError, TypeError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


class _Receipted:
    """What a statement was charged, from its receipt document."""

    #: The receipt document: ``receipt``, ``receipt_text``, ``tables``.
    metadata: Optional[Mapping[str, Any]] = None
    #: What the statement was charged, per private table (parsed JSON); None if nothing.
    receipt: Optional[Mapping[str, Any]] = None
    #: The receipt as the REPL prints it.
    receipt_text: Optional[str] = None
    #: The private tables the statement used.
    tables: Optional[Sequence[str]] = None

    def _read_receipt(self, doc: Optional[Mapping[str, Any]]) -> None:
        if doc is None:
            return
        self.metadata = doc
        receipt = doc.get("receipt")
        self.receipt = receipt if isinstance(receipt, dict) else None
        text = doc.get("receipt_text")
        self.receipt_text = text if isinstance(text, str) else None
        tables = doc.get("tables")
        self.tables = (
            [t for t in tables if isinstance(t, str)] if isinstance(tables, list) else []
        )


class Error(_Receipted, Exception):
    """An error from the server or the connection.

    ``code`` is the server's machine-readable code (``budget_exceeded``, ``refused``,
    ``invalid``, ``execution_failed``, ``failed``) or None; ``message`` the server's message,
    which says what to do. The ADBC error is the ``__cause__``.

    What the statement was charged, when it was admitted (round 50): ``receipt`` (parsed JSON,
    as :attr:`Result.receipt`), ``receipt_text`` (as the REPL prints it, also the last line of
    ``str(e)``), ``tables`` and ``metadata`` (the whole receipt document); all None when the
    server sent none (nothing was charged; or, rarely, a statement stopped by the time limit or
    a shutdown as it was being admitted) or one that cannot be read. The server sends it with
    the error of every admitted statement whatever the code (a server before round 50 sent a
    timed-out statement's error without a code: an :class:`Error` with its receipt); a receipt
    too long for an error's headers is a ``receipt_text`` alone that says so. ``SHOW BUDGET``
    and ``dp_ledger()`` show every charge.

    ``rows_done`` (from :meth:`Connection.executemany` only, else None): how many rows ran
    before the one that failed; each was admitted and charged on its own, and those charges
    stand.
    """

    code: Optional[str] = None
    rows_done: Optional[int] = None

    def __init__(
        self,
        message: str,
        code: Optional[str] = None,
        receipt: Optional[Mapping[str, Any]] = None,
    ):
        self._read_receipt(receipt)
        super().__init__(f"{message}\n{self.receipt_text}" if self.receipt_text else message)
        self.message = message
        if code is not None:
            self.code = code


class BudgetExceeded(Error):
    """Admitting the statement would exceed a table's privacy budget: this statement (this row,
    for :meth:`Connection.executemany`) was not charged; the rows before it were
    (``rows_done``)."""

    code = "budget_exceeded"


class Refused(Error):
    """The server refused the statement (outside the private fragment, or a statement or quota
    the server does not allow): this statement (this row, for :meth:`Connection.executemany`)
    was not charged; the rows before it were (``rows_done``)."""

    code = "refused"


class InvalidQuery(Error):
    """The SQL or an argument is invalid (the server's code ``invalid``), or the package cannot
    send a parameter (an int outside 64 bits, a value of no Arrow type: nothing ran). This
    statement (this row, for :meth:`Connection.executemany`) was not charged; the rows before
    it were (``rows_done``)."""

    code = "invalid"


class ExecutionFailed(Error):
    """The statement failed after it was admitted (as it ran, or its result was over the
    server's ``max_result_bytes``, or it ran out of time or the server stopped): it was charged,
    and the charge stands (a failure can depend on the data, so it is not refunded). No detail
    of the failure is shown; ``receipt``/``receipt_text`` say what was charged (None only when
    the receipt did not reach the client: ``dp_ledger()`` lists every charge)."""

    code = "execution_failed"


class Failed(Error):
    """The statement failed as it ran and nothing was charged (a statement that reads no private
    table, or one stopped by its memory or spill bound): the message says why."""

    code = "failed"


_BY_CODE = {
    c.code: c for c in (BudgetExceeded, Refused, InvalidQuery, ExecutionFailed, Failed)
}


def _details(e: BaseException):
    """An ADBC error's details (the response metadata), as ``(key, value)`` bytes."""

    def as_bytes(v) -> bytes:
        return v.encode() if isinstance(v, str) else bytes(v)

    return [(as_bytes(k), as_bytes(v)) for k, v in getattr(e, "details", None) or []]


def _detail(e: BaseException, key: bytes) -> Optional[bytes]:
    """The value of ``key`` in an ADBC error's details, if any."""
    return next((value for k, value in _details(e) if k == key), None)


def _code_of(e: BaseException) -> Optional[str]:
    """The dpfusion code an ADBC error carries, if any."""
    value = _detail(e, CODE_HEADER)
    if value is not None:
        return value.decode("ascii", "replace")
    # The gRPC status details: a google.rpc.ErrorInfo whose metadata maps "code" to the code.
    for _key, value in _details(e):
        for code in _BY_CODE:
            if code.encode() in value and b"dpfusion" in value:
                return code
    return None


# The driver's decorations after the message: " (GrpcCode; Call…)" (the call may go on, as in
# "DoGet: endpoint 0: []"), then sometimes ". Vendor code: N" (round 50: both were left on
# connection errors).
_DRIVER_SUFFIX = _re.compile(
    r"(?:\s*\([A-Za-z]+; [A-Za-z][^()]*\))?(?:\.?\s*Vendor code: -?\d+)?\s*$"
)


def _message_of(e: BaseException) -> str:
    msg = str(e)
    # The driver's prefix: "STATUS: [FlightSQL] message".
    if "[FlightSQL] " in msg:
        msg = msg.split("[FlightSQL] ", 1)[1]
    return _DRIVER_SUFFIX.sub("", msg, count=1)


def _translate(e: BaseException, rows_done: Optional[int] = None) -> Error:
    """The package's exception for an ADBC error: its class from the code, the server's
    message, and the receipt of a charged statement (round 50, review python F1)."""
    code = _code_of(e)
    klass = _BY_CODE.get(code, Error) if code else Error
    err = klass(_message_of(e), code, _receipt_document(_detail(e, RECEIPT_HEADER)))
    err.rows_done = rows_done
    return err


#: What the driver raises for a statement or parameter it cannot send: converting a value to
#: Arrow (an int of 2**63 is an OverflowError), before the statement runs (round 50, review
#: python F5).
_UNSENDABLE = (OverflowError, TypeError, ValueError, _pa.ArrowException)


def _unsendable(e: BaseException, rows_done: Optional[int] = None) -> InvalidQuery:
    return _refused_here(
        f"the statement or its parameters cannot be sent ({type(e).__name__}: {e}), so it did "
        "not run: give the SQL as a str and each parameter as a bool, an int within 64 bits, a "
        "float, a Decimal, a str or a date (docs/SQL.md, \"Parameters\")",
        rows_done,
    )


def _refused_here(message: str, rows_done: Optional[int]) -> InvalidQuery:
    """An :class:`InvalidQuery` the package raises before sending the statement."""
    err = InvalidQuery(message, InvalidQuery.code)
    err.rows_done = rows_done
    return err


def _close(cur) -> None:
    """Closes an ADBC cursor. Its error (the server is gone) must not replace the statement's
    own, nor escape as a driver error (round 50, review python F5)."""
    try:
        cur.close()
    except _flight_sql.Error:
        # The driver released the statement even so: marked closed, the cursor's finalizer does
        # not release it again ("Underflow in closing this AdbcStatement").
        cur._closed = True


def _need(module: str, what: str):
    """Imports an optional dependency, or says which extra installs it."""
    try:
        return __import__(module)
    except ImportError as e:
        raise ImportError(f"{what} needs {module}: pip install 'dpfusion[{module}]'") from e


class Result(_Receipted):
    """One statement's result: its rows (an Arrow table) and its receipt (``receipt``,
    ``receipt_text``, ``tables``, ``metadata``: see :class:`Error`; ``metadata`` is ``{}`` and
    ``tables`` is ``[]`` when the result carries no receipt document)."""

    def __init__(self, table: "_pa.Table"):
        self._table = table
        self.metadata = {}
        self.tables = []
        self._read_receipt(_receipt_document((table.schema.metadata or {}).get(RECEIPT_KEY)))

    def to_arrow(self) -> "_pa.Table":
        """The rows, as a pyarrow Table (its schema metadata still holds the receipt)."""
        return self._table

    def to_pandas(self):
        """The rows, as a pandas DataFrame (``pip install 'dpfusion[pandas]'``)."""
        _need("pandas", "to_pandas (and budget(), tables())")
        return self._table.to_pandas()

    def to_polars(self):
        """The rows, as a polars DataFrame (``pip install 'dpfusion[polars]'``)."""
        return _need("polars", "to_polars").from_arrow(self._table)

    def __len__(self) -> int:
        return self._table.num_rows

    def __repr__(self) -> str:
        receipt = f", {self.receipt_text}" if self.receipt_text else ""
        return f"<dpfusion.Result {self._table.num_rows} rows{receipt}>"


def _one_row_each(seq_of_params) -> list:
    """:meth:`Connection.executemany`'s rows, each as the driver's ``executemany`` takes one
    row: Arrow data one row a slice, a Python row in a list of its own."""
    if hasattr(seq_of_params, "__arrow_c_stream__") or hasattr(
        seq_of_params, "__arrow_c_array__"
    ):
        table = _pa.table(seq_of_params)
        return [(table.num_columns, table.slice(i, 1)) for i in range(table.num_rows)]
    return [(len(row), [row]) for row in seq_of_params]


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
        except _UNSENDABLE as e:
            raise _unsendable(e) from e
        finally:
            _close(cur)

    def executemany(self, query: str, seq_of_params) -> int:
        """Runs ``query`` once per row of ``seq_of_params`` (rows of ``?`` values, or Arrow data
        whose rows are), in order, and returns the number of runs (0 for no rows).

        Each run is admitted and charged on its own, and its result is dropped with its receipt
        (``SHOW BUDGET`` and ``dp_ledger()`` show the charges). The first row that fails stops
        the rest: its exception's ``rows_done`` is the number of rows that ran before it, whose
        charges stand, and its receipt is that row's own (None unless that row was charged).
        A row without values is refused (:class:`InvalidQuery`): a statement without
        placeholders runs with :meth:`sql`."""
        cur = self._conn.cursor()
        done = 0
        try:
            try:
                rows = _one_row_each(seq_of_params)
            except _UNSENDABLE as e:
                raise _unsendable(e, 0) from e
            for width, row in rows:
                if width == 0:
                    raise _refused_here(
                        f"row {done} of executemany has no values, so it did not run: each "
                        "row holds the values of the statement's placeholders (run a statement "
                        "without placeholders with sql())",
                        done,
                    )
                try:
                    # One call a row (round 50, review python F1): the driver's one call for
                    # all rows could not say which row failed, so what was charged.
                    cur.executemany(query, row)
                except _flight_sql.Error as e:
                    raise _translate(e, done) from e
                except _UNSENDABLE as e:
                    raise _unsendable(e, done) from e
                done += 1
            return done
        finally:
            _close(cur)

    def budget(self):
        """``SHOW BUDGET``: per private table, its budget, what is spent and what is left (a
        pandas DataFrame: ``pip install 'dpfusion[pandas]'``)."""
        return self.sql("SHOW BUDGET").to_pandas()

    def tables(self):
        """The tables this analyst can query (``SHOW TABLES``), as a pandas DataFrame (``pip
        install 'dpfusion[pandas]'``)."""
        return self.sql("SHOW TABLES").to_pandas()

    def cursor(self):
        """The underlying DB-API cursor (ADBC), for what this class does not cover."""
        return self._conn.cursor()

    @property
    def adbc(self):
        """The underlying DB-API connection (ADBC)."""
        return self._conn

    def close(self) -> None:
        try:
            self._conn.close()
        except _flight_sql.Error as e:
            raise _translate(e) from e

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.close()
        except Error:
            # An error of the block is the one to see, not the close's.
            if exc[0] is None:
                raise


#: The driver's options that ask for TLS. With a URL that is not ``grpc+tls://`` the driver
#: ignores them and connects in clear (round 50, review python F4).
_TLS_OPTIONS = frozenset(
    o.value
    for o in (
        _DatabaseOptions.TLS_ROOT_CERTS,
        _DatabaseOptions.TLS_SKIP_VERIFY,
        _DatabaseOptions.TLS_OVERRIDE_HOSTNAME,
        _DatabaseOptions.MTLS_CERT_CHAIN,
        _DatabaseOptions.MTLS_PRIVATE_KEY,
    )
)


def connect(
    url: str,
    token: str,
    *,
    tls_root_certs: Optional[str] = None,
    db_kwargs: Optional[Mapping[str, str]] = None,
) -> Connection:
    """Connects to ``dpfusion serve`` at ``url`` (``grpc://host:port``, or ``grpc+tls://…``)
    with the bearer ``token`` the data owner gave you. ``tls_root_certs``: PEM text of the
    authority that signed the server's certificate, when it is not a public one.

    TLS options (``tls_root_certs``, or the driver's TLS and mTLS options in ``db_kwargs``)
    need a ``grpc+tls://`` URL: with another, :class:`Error` is raised before anything is sent,
    as ``dpfusion --connect`` refuses ``--tls-ca`` with ``grpc://`` (the driver would ignore
    them and send the token in clear). The client accepts messages up to
    :data:`MAX_MESSAGE_BYTES`, the largest the server sends."""
    options = {
        _DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {token}",
        _DatabaseOptions.WITH_MAX_MSG_SIZE.value: str(MAX_MESSAGE_BYTES),
    }
    if tls_root_certs is not None:
        options[_DatabaseOptions.TLS_ROOT_CERTS.value] = tls_root_certs
    options.update(db_kwargs or {})
    scheme = str(url).partition("://")[0].lower()
    if scheme != "grpc+tls" and options.keys() & _TLS_OPTIONS:
        raise Error(
            f"TLS options (tls_root_certs, or TLS in db_kwargs) are for grpc+tls:// servers, "
            f"and this URL's scheme is {scheme[:32]!r}: the token and results would cross the "
            "network in clear. Connect to grpc+tls://host:port, or drop the TLS options for a "
            "plain server on this machine"
        )
    try:
        # Statements run one at a time, each charged when admitted: autocommit is what the
        # server does (and asking for it leaves the driver nothing to warn about).
        conn = _flight_sql.connect(url, db_kwargs=options, autocommit=True)
    except _flight_sql.Error as e:
        raise _translate(e) from e
    return Connection(conn)
