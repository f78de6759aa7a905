"""PostgreSQL's driver, psycopg 3: opening a connection (timeouts, TLS), and its cursor, which sends
the store's ``%s`` statements as ``$n`` text made once per statement (`dollar_params`).
"""

from __future__ import annotations

import functools
import inspect
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import URL

from store.exceptions import BackendError, ConfigError
from store.green import active as on_the_loop
from store.green import await_, wait_fd
from store.tls import postgres_tls

__all__ = [
    "ANSWER_MARGIN_S",
    "DOLLAR_CACHE_SIZE",
    "GENERIC_PLANS",
    "dollar_params",
    "postgres_connector",
    "run_pipeline",
]


def postgres_connector(
    url: URL, *, connect_timeout_s: float = 5.0, query_timeout_s: float = 60.0
) -> Callable[[], Any]:
    """A function that opens an autocommit psycopg connection to ``url``.

    Its cursors take the store's ``%s`` statements and send them as ``$n``
    text (`dollar_params`, kept per statement): psycopg's own cursor parses a
    statement of over 50 parameters or 4,096 characters in Python on every
    call (about 1 ms for 1,000 parameters).

    A statement runs at most ``query_timeout_s`` on the server; data the
    server does not acknowledge for that long breaks the connection; and the
    client waits for any answer at most ``query_timeout_s`` plus
    `ANSWER_MARGIN_S` (`_deadline_connection`): a server that acknowledges
    but does not answer (a hung backend) costs that long, and the
    connection is closed and the call fails as a lost connection. The
    URL's ``sslmode``, ``sslrootcert``, ``sslcert`` and ``sslkey`` go to libpq
    (`store.tls.postgres_tls`); `ConfigError` if they are wrong.

    The session plans each statement it has prepared once (`GENERIC_PLANS`): the store's
    statements are key lookups whose best plan does not depend on the values.
    """
    import psycopg

    tls = postgres_tls(url)

    ms = int(query_timeout_s * 1000)
    kwargs: dict[str, Any] = {
        "host": url.host or "127.0.0.1",
        "port": url.port or 5432,
        "user": url.username or "postgres",
        "dbname": url.database,
        "connect_timeout": max(2, math.ceil(connect_timeout_s)),  # libpq: whole seconds, at least 2
        "options": f"-c statement_timeout={ms} {GENERIC_PLANS}",
        "tcp_user_timeout": ms,
        "autocommit": True,
        # The store prepares its statements itself (`run_pipeline`); psycopg preparing its own
        # would deallocate the store's after every ROLLBACK.
        "prepare_threshold": None,
        "cursor_factory": _dollar_cursor(),
    }
    if url.password:
        kwargs["password"] = url.password
    kwargs.update(tls)

    connection = _deadline_connection()
    answer_s = query_timeout_s + ANSWER_MARGIN_S

    def connect() -> Any:
        try:
            conn = connection.connect(**kwargs)
            conn.answer_s = answer_s
            return conn
        except psycopg.OperationalError as exc:
            if f'database "{url.database}" does not exist' in str(exc):
                raise ConfigError(
                    f"PostgreSQL has no database {url.database!r} at {kwargs['host']}:{kwargs['port']}: "
                    f"create it (CREATE DATABASE {url.database}), then run store init"
                ) from exc
            raise

    return connect


#: How much longer than ``query_timeout_s`` (the server's statement_timeout, which answers first
#: when the server is alive) the client waits for an answer before it gives the connection up.
ANSWER_MARGIN_S = 0.5


def _no_answer(limit: float | None) -> Exception:
    """The lost-connection error of a wait for the server that ran past ``limit`` seconds."""
    import psycopg

    return psycopg.OperationalError(
        f"PostgreSQL did not answer within {limit:g} s (query_timeout_s plus "
        f"{ANSWER_MARGIN_S:g} s): connection closed"
    )


@functools.cache
def _deadline_connection() -> type[Any]:
    """psycopg's `Connection`, every wait for the server bounded by its ``answer_s``."""
    import psycopg
    from psycopg import errors, waiting

    if "timeout" not in inspect.signature(psycopg.Connection.wait).parameters:
        # psycopg before 3.3.9 (below the stated requirement) bounds no wait: the server's
        # statement_timeout and tcp_user_timeout are all there is.
        return psycopg.Connection

    class DeadlineConnection(psycopg.Connection):
        #: Seconds any one wait for the server may take (set by the connector).
        answer_s: float | None = None

        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            limit = self.answer_s if timeout is None else timeout
            try:
                if on_the_loop():  # an event loop's call: the loop waits for the socket
                    return await_(waiting.wait_async(gen, self.pgconn.socket, timeout=limit))
                return super().wait(gen, interval, limit)
            except errors._WaitTimeout:
                # A reply may be half read, the server may still run the statement: this
                # connection cannot be used again.
                self.close()
                raise _no_answer(limit) from None

    return DeadlineConnection


#: The most statements whose ``$n`` text is kept; past it the kept ones are dropped and made again.
DOLLAR_CACHE_SIZE = 8192
_dollar_texts: dict[str, str] = {}
_PERCENT = re.compile(r"%(.)", re.DOTALL)


def dollar_params(sql: str) -> str:
    """``sql`` with its ``%s`` placeholders numbered ``$1, $2, ...`` and each ``%%`` a ``%``.

    What psycopg's cursor does to a statement with parameters, made once per
    statement text and kept. ``%b`` and ``%t`` count as ``%s`` (the driver
    picks text or binary by the value). Named placeholders are refused.
    """
    out = _dollar_texts.get(sql)
    if out is not None:
        return out
    n = 0

    def number(m: re.Match[str]) -> str:
        nonlocal n
        kind = m.group(1)
        if kind == "%":
            return "%"
        if kind not in ("s", "b", "t"):
            raise BackendError(f"only %s placeholders are sent as $n, not %{kind}: {sql[:200]}")
        n += 1
        return f"${n}"

    out = _PERCENT.sub(number, sql)
    if len(_dollar_texts) >= DOLLAR_CACHE_SIZE:
        _dollar_texts.clear()
    _dollar_texts[sql] = out
    return out


#: The session setting that plans a prepared statement once, for any parameters, where PostgreSQL
#: would plan each of its first five runs for their values and keep the generic plan only after.
#: A store connection serves every schema shard of its host, so it prepares each statement text
#: of each shard: most of them run a few times on one connection, and each run planned anew cost
#: half the server's time on the mix's statements (BENCHMARKS.md). Every statement the store
#: prepares reads or writes rows by key, the same plan whatever the key.
GENERIC_PLANS = "-c plan_cache_mode=force_generic_plan"

#: Statements a connection keeps prepared for `run_pipeline` (about 40 KB of the server's memory
#: each). Past it, the one least recently run is closed to make room (where libpq can close a
#: prepared statement, version 17 and later: psycopg's binary package has it); else the rest go
#: unprepared. A host of a thousand schemas has tens of thousands of statement texts: the ones
#: its traffic runs stay prepared.
PREPARED_PER_CONNECTION = 512


def run_pipeline(
    cursor: Any, statements: Sequence[tuple[str, Sequence[Any] | None]]
) -> list[tuple[int, list[Any] | None]]:
    """`_run_pipeline`; run once more if a statement the connection had prepared is gone (a
    ``DEALLOCATE ALL`` sent by someone else on it) or stale (its table altered since), and the
    request began outside a transaction:
    everything it did was rolled back (a pipeline up to its sync is one transaction), so nothing
    is done twice."""
    from psycopg import errors, pq

    conn = cursor.connection
    idle = conn.pgconn.transaction_status == pq.TransactionStatus.IDLE
    try:
        return _run_pipeline(conn, statements)
    except (errors.InvalidSqlStatementName, errors.FeatureNotSupported) as exc:
        # (FeatureNotSupported: "cached plan must not change result type", a table a statement
        # was prepared on altered since)
        if isinstance(exc, errors.FeatureNotSupported) and "cached plan" not in str(exc):
            raise
        conn.__dict__.get("_store_prepared", {}).clear()
        if not idle:
            raise
        if conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
            _run_pipeline(conn, [("ROLLBACK", None)])
        return _run_pipeline(conn, statements)


@functools.cache
def _can_close() -> bool:
    """Whether this libpq closes a prepared statement in a pipeline (`send_close_prepared`, 17+)."""
    from psycopg import pq

    return pq.version() >= 170000


def _run_pipeline(
    conn: Any, statements: Sequence[tuple[str, Sequence[Any] | None]]
) -> list[tuple[int, list[Any] | None]]:
    """Run ``statements`` (the store's ``%s`` texts) in one libpq pipeline on ``cursor``'s
    connection; (rowcount, rows) of each, in order (rows None: the statement returns none). An
    error of any statement raises (psycopg's error for its SQLSTATE) once every result is read:
    a transaction is then in error.

    Every statement of a store connection goes this way (`_dollar_cursor`), one request at a
    time or several in one: psycopg's own pipeline costs its caller about three times the CPU
    (a cursor, a generator and a result set per statement: 130-190 us a request of four
    statements, against 45-60 here). Each statement with parameters is prepared on first use
    (by its text and parameter types, once per connection: the connection's psycopg prepares
    nothing itself, as it would deallocate every statement of the session after a ROLLBACK);
    parameters are dumped as text and rows loaded by psycopg's adapters. Every wait for the
    server is bounded by the connection's ``answer_s``, as `_deadline_connection`'s are.
    """
    import select

    from psycopg import errors, pq
    from psycopg.adapt import PyFormat, Transformer

    pg = conn.pgconn
    state = conn.__dict__
    prepared: dict[tuple[str, tuple[int, ...]], bytes] = state.setdefault("_store_prepared", {})
    made: list[tuple[str, tuple[int, ...]]] = []  # prepared by this pipeline: forgotten if it fails
    tx = Transformer(conn)
    answer_s = getattr(conn, "answer_s", None)
    out: list[tuple[int, list[Any] | None]] = []
    failed: BaseException | None = None
    with conn.lock:
        pg.enter_pipeline_mode()
        try:
            for sql, params in statements:
                if not params:  # (BEGIN, COMMIT, a statement with no parameter: its text as written)
                    pg.send_query_params((sql if params is None else dollar_params(sql)).encode(), None)
                    continue
                values = tx.dump_sequence(params, [PyFormat.TEXT] * len(params))
                types = tuple(tx.types or ())
                text = dollar_params(sql)
                key = (text, types)
                name = prepared.pop(key, None)
                if name is not None:
                    prepared[key] = name  # (the most recently run last: a dict keeps its order)
                else:
                    if len(prepared) >= PREPARED_PER_CONNECTION and _can_close():
                        # The least recently run goes (its Close answers as a Prepare does: no
                        # result of its own is read below).
                        pg.send_close_prepared(prepared.pop(next(iter(prepared))))
                    if len(prepared) < PREPARED_PER_CONNECTION:
                        number = state["_store_prepares"] = state.get("_store_prepares", 0) + 1
                        name = prepared[key] = b"_store_%d" % number
                        made.append(key)
                        pg.send_prepare(name, text.encode(), param_types=types)
                if name is None:
                    pg.send_query_params(text.encode(), values, param_types=types)
                else:
                    pg.send_query_prepared(name, values)
            pg.pipeline_sync()
            deadline = None if answer_s is None else time.monotonic() + answer_s

            def wait(write: bool) -> None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError
                if on_the_loop():  # an event loop's call: the loop waits for the socket
                    wait_fd(pg.socket, writing=write, timeout=left)
                    return
                ready = select.select([] if write else [pg.socket], [pg.socket] if write else [], [], left)
                if not any(ready):
                    raise TimeoutError

            try:
                while pg.flush():
                    wait(True)
                while True:
                    while pg.is_busy():
                        wait(False)
                        pg.consume_input()
                    res = pg.get_result()
                    if res is None:
                        continue
                    status = res.status
                    if status == pq.ExecStatus.PIPELINE_SYNC:
                        break
                    if status == pq.ExecStatus.TUPLES_OK:
                        tx.set_pgresult(res)
                        n = res.ntuples
                        out.append((n, tx.load_rows(0, n, tuple) if n else []))
                    elif status == pq.ExecStatus.COMMAND_OK:
                        if res.command_status:  # (a statement prepared has none: not one of ours)
                            count = res.command_tuples
                            out.append((-1 if count is None else count, None))
                    elif status == pq.ExecStatus.PIPELINE_ABORTED:
                        out.append((-1, None))
                    elif failed is None:
                        failed = errors.error_from_result(res, encoding=conn.info.encoding)
                        out.append((-1, None))
            except TimeoutError:
                conn.close()  # (as `_deadline_connection` does)
                raise _no_answer(answer_s) from None
        finally:
            if not conn.closed and pg.status != pq.ConnStatus.BAD:
                pg.exit_pipeline_mode()
    if failed is not None:
        for key in made:  # (perhaps never made: made again under a new name when next used)
            prepared.pop(key, None)
        raise failed
    return out


@functools.cache
def _dollar_cursor() -> type[Any]:
    """psycopg's `RawCursor` (``$n`` placeholders, no parsing) fed the store's ``%s`` statements."""
    import psycopg

    class DollarCursor(psycopg.RawCursor):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            if params is not None and type(query) is str:
                query = dollar_params(query)
            return super().execute(query, params, **kwargs)

        def executemany(self, query: Any, params_seq: Any, **kwargs: Any) -> None:
            if type(query) is str:
                query = dollar_params(query)
            super().executemany(query, params_seq, **kwargs)

        def run_pipeline(
            self, statements: Sequence[tuple[str, Sequence[Any] | None]]
        ) -> list[tuple[int, list[Any] | None]]:
            """`run_pipeline` on this cursor's connection."""
            return run_pipeline(self, statements)

    return DollarCursor
