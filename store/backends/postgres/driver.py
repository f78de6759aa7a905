"""PostgreSQL's driver, psycopg 3: opening a connection (timeouts, TLS), and its cursor, which sends
the store's ``%s`` statements as ``$n`` text made once per statement (`dollar_params`).
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import URL

from store.exceptions import BackendError, ConfigError
from store.tls import postgres_tls

__all__ = ["ANSWER_MARGIN_S", "DOLLAR_CACHE_SIZE", "dollar_params", "postgres_connector"]


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
        "options": f"-c statement_timeout={ms}",
        "tcp_user_timeout": ms,
        "autocommit": True,
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


@functools.cache
def _deadline_connection() -> type[Any]:
    """psycopg's `Connection`, every wait for the server bounded by its ``answer_s``."""
    import psycopg
    from psycopg import errors

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
                return super().wait(gen, interval, limit)
            except errors._WaitTimeout:
                # A reply may be half read, the server may still run the statement: this
                # connection cannot be used again.
                self.close()
                raise psycopg.OperationalError(
                    f"PostgreSQL did not answer within {limit:g} s (query_timeout_s plus "
                    f"{ANSWER_MARGIN_S:g} s): connection closed"
                ) from None

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

    return DollarCursor
