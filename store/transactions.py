"""Transactions on one shard's connection: the cursor that `store` writes through.

`Cursor` and `DBAPIConnection` are the parts of a DBAPI cursor and
connection that `store` uses. `_Txn` is a transaction's cursor: where the
backend's connections take several statements per request (MariaDB), the
BEGIN goes with the transaction's first statement and statements whose
results are not read go with the next one or with the COMMIT; where the
driver pipelines (PostgreSQL), they go in one pipeline. Invalidation log
entries wait for the COMMIT and go as one row. A transaction that hit a
deadlock or a lock wait timeout is run again (`_retrying`). Checking
connections out of their pools, and running transactions on one shard or
two, is `store.engines`'s.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from store import green
from store.backends import Backend
from store.cache.follower import merged_entries
from store.exceptions import BackendError, StaleMapError, StoreError

__all__ = ["Cursor", "DBAPIConnection"]

T = TypeVar("T")

#: Attempts of a transaction rolled back whole (deadlock, lock wait timeout). A deadlock's
#: loser is rolled back at once, so attempts are cheap; many writers of one key (a pair
#: linked at a sequence while it is absent takes a gap lock before its insert) can lose
#: several times in a row on a loaded host.
_TXN_ATTEMPTS = 10
#: The backoff before attempt n+1: min(cap, first * 2**(n-1)) seconds times a uniformly random
#: factor from 1/4 to 1, so the writers that deadlocked together do not meet again in step.
_BACKOFF_FIRST_S = 0.004
_BACKOFF_CAP_S = 0.1


class Cursor(Protocol):
    """The part of a DBAPI cursor that `store` uses."""

    @property
    def lastrowid(self) -> int | None:
        """The id the last INSERT made."""

    @property
    def rowcount(self) -> int:
        """Rows the last statement changed (or returned)."""

    def execute(self, sql: str, params: Any = ..., /) -> Any:
        """Run one statement."""

    def executemany(self, sql: str, params: Any, /) -> Any:
        """Run one statement for many parameter sets."""

    def batch(self, statements: Sequence[tuple[str, Sequence[Any]]], /) -> list[tuple[int, int]]:
        """Run several statements (in one request where the backend can); (rowcount, lastrowid) of each."""

    def batch_rows(self, statements: Sequence[tuple[str, Sequence[Any]]], /) -> list[tuple[int, list[Any]]]:
        """`batch`, reading each statement's rows: (rowcount, rows) of each ([] if it returns none)."""

    def commit_with(
        self, statements: Sequence[tuple[str, Sequence[Any]]], /, rows: list[list[Any]] | None = None
    ) -> list[tuple[int, int]]:
        """Run ``statements``, then COMMIT (in one request where the backend can); (rowcount,
        lastrowid) of each (``rows``, if given, gets each one's rows). What the cursor runs
        next is a new transaction."""

    def again(self) -> None:
        """Roll the transaction back and begin a new one: with the next request where the
        backend takes several statements a request, else now."""

    def defer(self, sql: str, params: Sequence[Any], /, seen: Callable[[int], None] | None = None) -> None:
        """Run a statement whose rows are not read (in a transaction: possibly with the next request);
        ``seen`` is told its ``lastrowid`` once its result is in."""

    def defer_log(self, sql: str, at_ms: int, entries: str, /) -> None:
        """Log ``entries`` (`store.cache.follower`) with the transaction's COMMIT, one row for all of them."""

    def defer_log_version(
        self, sql: str, at_ms: int, entry: str, version: str, params: Sequence[Any], /
    ) -> None:
        """Log a list's ``entry`` in the same row, followed by its version as the transaction leaves it."""

    def fetchone(self) -> Any:
        """The next row or None."""

    def fetchall(self) -> Any:
        """Every remaining row."""

    def close(self) -> Any:
        """Release the cursor."""


class DBAPIConnection(Protocol):
    """The part of a DBAPI connection that `store` uses."""

    def cursor(self) -> Cursor:
        """A new cursor."""

    def close(self) -> Any:
        """Close the connection."""


class _LogRow:
    """A transaction's pending log row: the host's plain log INSERT, the time, plain entries, and
    lists to name with their versions (entry, version query, its parameters)."""

    __slots__ = ("at_ms", "entries", "sql", "versions")

    def __init__(self, sql: str, at_ms: int) -> None:
        self.sql = sql
        self.at_ms = at_ms
        self.entries: list[str] = []
        self.versions: list[tuple[str, str, Sequence[Any]]] = []


#: A driver cursor's ``run_pipeline``: statements in one request, (rowcount, rows or None) of each.
_Runner = Callable[[Sequence[tuple[str, Sequence[Any] | None]]], list[tuple[int, list[Any] | None]]]


def _reported(rows: list[Any] | None) -> int:
    """A pipelined statement's ``lastrowid``: PostgreSQL has none, so a statement that reports a
    number returns it as its first row's first column (a counted write's list version,
    `store.backends.COUNTED_TAIL`); 0 where it returned no integer there."""
    if not rows:
        return 0
    value = rows[0][0] if rows[0] else None
    return value if type(value) is int else 0


def _answer(cursor: Any) -> tuple[int, int]:
    """(rowcount, lastrowid) of the statement ``cursor`` last ran (a PostgreSQL cursor has no lastrowid)."""
    return int(cursor.rowcount), int(getattr(cursor, "lastrowid", 0) or 0)


class _Txn:
    """A transaction's cursor: fewer round trips where the backend takes several statements a request.

    There (`Backend.begin_with_first_statement`), ``BEGIN`` goes out with the
    first statement, and statements whose results the transaction does not
    read (`defer`: the count updates) go out with the next statement or with
    ``COMMIT``, in order. Elsewhere every statement is its own request.
    Invalidation log entries (`defer_log`, `defer_log_version`) wait for the
    COMMIT and go as one row, however many writes of the transaction named keys.
    """

    __slots__ = ("_backend", "_batch", "_begin", "_c", "_deferred", "_log", "_pipe", "_seen")

    def __init__(self, cursor: Any, backend: Backend) -> None:
        self._c = cursor
        self._batch = backend.begin_with_first_statement
        # Where the driver pipelines (`Backend.pipelines`, the cursor's ``run_pipeline``): BEGIN and
        # the deferred statements go out in one pipeline with the next statement.
        pipe: _Runner | None = getattr(cursor, "run_pipeline", None)
        self._pipe = pipe if backend.pipelines and not self._batch else None
        self._begin: str | None = backend.begin
        self._deferred: list[tuple[str, Sequence[Any]]] = []
        #: (index in ``_deferred``, told the statement's ``lastrowid`` once its result is read).
        self._seen: list[tuple[int, Callable[[int], None]]] = []
        self._backend = backend
        #: The pending log row; None if nothing to log.
        self._log: _LogRow | None = None
        if not self._batch and not self._pipe:
            self._open()

    def _send(
        self,
        own: Sequence[tuple[str, Sequence[Any] | None]],
        *,
        rowless: bool = False,
        rows: list[list[Any]] | None = None,
    ) -> list[tuple[int, int]]:
        """BEGIN (if not yet sent), the deferred statements, then ``own``, in one request;
        (rowcount, lastrowid) of each of ``own`` (the cursor is left on the last one's rows).

        ``rowless``: no statement of ``own`` returns rows, so where the driver's cursor reads
        such a request's answers in one go (``execute_oks``, the store's PyMySQL cursor), it does.
        ``rows``, if given, gets each of ``own``'s rows ([] for a statement that returns none),
        read in one go where the driver's cursor can (``execute_rows``).
        """
        if self._pipe:
            return self._pipelined(own, rows)
        parts: list[str] = []
        args: list[Any] = []
        if self._begin is not None:
            parts.append(self._begin)
            self._begin = None
        first = len(parts)  # the index of the first deferred statement's result
        for text, given in self._deferred:
            parts.append(text)
            args.extend(given)
        self._deferred.clear()
        seen = {first + i: tell for i, tell in self._seen}
        self._seen.clear()
        mine = len(parts)
        for text, values in own:
            parts.append(text)
            if values is not None:
                args.extend(values)
        if args and len(parts) > 1:  # the driver interpolates the whole text: a literal % must be doubled
            parts = [p if "%s" in p else p.replace("%", "%%") for p in parts]
        text = parts[0] if len(parts) == 1 else "; ".join(parts)
        fast = getattr(self._c, "execute_oks", None) if rowless else None
        if fast is not None:
            answers: list[tuple[int, int]] = fast(text, tuple(args) if args else None)
            for i, told in seen.items():
                told(answers[i][1])
            return answers[mine:]
        reader = getattr(self._c, "execute_rows", None) if rows is not None else None
        if reader is not None and rows is not None:
            got: list[tuple[int, int, list[Any]]] = reader(text, tuple(args) if args else None)
            for i, told in seen.items():
                told(got[i][1])
            rows += [r for _n, _id, r in got[mine:]]
            return [(n, last) for n, last, _r in got[mine:]]
        self._c.execute(text, tuple(args) if args else None)
        results: list[tuple[int, int]] = []
        for i in range(len(parts)):
            if i:
                self._c.nextset()  # on to the next statement's result; an error of any of them raises here
            tell = seen.get(i)
            if tell is not None:
                tell(int(self._c.lastrowid or 0))
            if i >= mine:
                results.append(_answer(self._c))
                if rows is not None:
                    rows.append(list(self._c.fetchall()) if self._c.description else [])
        return results

    def _pipelined(
        self, own: Sequence[tuple[str, Sequence[Any] | None]], rows: list[list[Any]] | None = None
    ) -> list[tuple[int, int]]:
        """`_send` where the driver pipelines: BEGIN (if not yet sent), the deferred statements and
        ``own`` in one pipeline; (rowcount, lastrowid) of each of ``own``, the cursor left holding
        the last one's rows (``rows``, if given, gets each one's rows). An error of any statement
        in the pipeline raises once every result is read."""
        assert self._pipe is not None
        first = self._opening()
        if not first and not own:
            return []
        mine = self._pipe([*first, *own])[len(first) :]
        if mine:
            self._c.hold(*mine[-1])
        if rows is not None:
            rows += [[] if r is None else list(r) for _n, r in mine]
        return [(n, _reported(r)) for n, r in mine]

    def execute(self, sql: str, params: Any = None, /) -> Any:
        """Run ``sql`` (with BEGIN and deferred statements before it, in the same request)."""
        if self._pipe:
            self._pipelined([(sql, params)])
            return None
        if not self._batch:
            self._open()
            return self._c.execute(sql, params)
        self._send([(sql, params)])
        return None

    def _opening(self) -> list[tuple[str, Sequence[Any] | None]]:
        """What must go before the next statements, taken: BEGIN (if not yet sent) and the deferred
        statements, in order."""
        first: list[tuple[str, Sequence[Any] | None]] = []
        if self._begin is not None:
            first.append((self._begin, None))
            self._begin = None
        first += self._deferred
        self._deferred.clear()
        return first

    def _open(self) -> None:
        """BEGIN, where statements go one by one and the transaction has not begun (`commit_with`)."""
        if self._begin is not None:
            self._c.execute(self._begin)
            self._begin = None

    def batch(self, statements: Sequence[tuple[str, Sequence[Any]]], /) -> list[tuple[int, int]]:
        """Run ``statements`` in one request where the backend can (with BEGIN and anything
        deferred before them), else one by one; (rowcount, lastrowid) of each, in order."""
        return self._run(statements, None)

    def _run(
        self, statements: Sequence[tuple[str, Sequence[Any]]], rows: list[list[Any]] | None
    ) -> list[tuple[int, int]]:
        """`batch`; ``rows``, if given, gets each statement's rows ([] for one that returns none)."""
        if self._batch or self._pipe:
            return self._send(statements, rowless=rows is None, rows=rows)
        self._open()
        out: list[tuple[int, int]] = []
        for sql, params in statements:
            self._c.execute(sql, params)
            out.append(_answer(self._c))
            if rows is not None:
                rows.append(list(self._c.fetchall()) if self._c.description else [])
        return out

    def batch_rows(self, statements: Sequence[tuple[str, Sequence[Any]]], /) -> list[tuple[int, list[Any]]]:
        """`batch`, reading each statement's rows: (rowcount, rows) of each ([] if it returns none)."""
        if self._batch or self._pipe:
            rows: list[list[Any]] = []
            answers = self._send(statements, rows=rows)
            return [(n, r) for (n, _id), r in zip(answers, rows, strict=True)]
        out: list[tuple[int, list[Any]]] = []
        for sql, params in statements:
            self.execute(sql, params)
            out.append((self.rowcount, list(self._c.fetchall()) if self._c.description else []))
        return out

    def commit_with(
        self, statements: Sequence[tuple[str, Sequence[Any]]], /, rows: list[list[Any]] | None = None
    ) -> list[tuple[int, int]]:
        """Run ``statements`` and COMMIT: one request with BEGIN and anything deferred where the
        backend can (and no log row waits: that one goes with a COMMIT of its own); (rowcount,
        lastrowid) of each (``rows``, if given, gets each one's rows: [] for a statement that
        returns none). The next statement begins a new transaction, which `commit` ends
        (nothing is sent if none does)."""
        if self._batch and self._log is None:
            read: list[list[Any]] = []
            sent = [*statements, ("COMMIT", None)]
            out = self._send(sent, rowless=rows is None, rows=None if rows is None else read)[
                : len(statements)
            ]
            if rows is not None:
                rows += read[: len(statements)]
        elif self._pipe:
            out = self._pipelined_commit(statements, rows)
        else:
            out = self._run(statements, rows)
            self.commit()
        self._begin = self._backend.begin  # (one by one: sent before the next statement, `_open`)
        return out

    def _pipelined_commit(
        self, statements: Sequence[tuple[str, Sequence[Any]]], rows: list[list[Any]] | None = None
    ) -> list[tuple[int, int]]:
        """`commit_with` where the driver pipelines: BEGIN (if not yet sent), the deferred
        statements, ``statements``, the log row and COMMIT in one pipeline; (rowcount, lastrowid)
        of each of ``statements`` (``rows``, if given, gets each one's rows). An error of any
        statement raises once every result is read (the transaction is then rolled back)."""
        assert self._pipe is not None
        first = self._opening()
        logged = self._log_statement()
        tail: list[tuple[str, Sequence[Any] | None]] = [] if logged is None else [logged]
        got = self._pipe([*first, *statements, *tail, ("COMMIT", None)])[
            len(first) : len(first) + len(statements)
        ]
        if rows is not None:
            rows += [[] if r is None else list(r) for _n, r in got]
        return [(n, _reported(r)) for n, r in got]

    def defer(self, sql: str, params: Sequence[Any], /, seen: Callable[[int], None] | None = None) -> None:
        """Run ``sql`` whose rows are not read: with the next request where the backend can, else now.

        ``seen``, if given, is told the statement's ``lastrowid`` (0 if none) once its result is in,
        where the backend returns list versions so (`Backend.list_versions`); else never.
        """
        if not self._backend.list_versions:
            seen = None  # no statement returns a version here: none is told
        if self._pipe and seen is None:
            self._deferred.append((sql, params))
        elif self._batch:
            if seen is not None:
                self._seen.append((len(self._deferred), seen))
            self._deferred.append((sql, params))
        else:
            self._open()
            self._c.execute(sql, params)
            if seen is not None:
                seen(int(self._c.lastrowid or 0))

    def defer_log(self, sql: str, at_ms: int, entries: str, /) -> None:
        """Add ``entries`` to the transaction's one log row, written with the COMMIT (``sql``: the
        host's log INSERT, taking the time and the entries)."""
        self._log_row(sql, at_ms).entries.append(entries)

    def defer_log_version(
        self, sql: str, at_ms: int, entry: str, version: str, params: Sequence[Any], /
    ) -> None:
        """Add a list's entry to the transaction's log row, ending in the list's version as the
        transaction leaves it (``version``: the query of it, with ``params``; see
        `Backend.change_log_insert_versions`)."""
        self._log_row(sql, at_ms).versions.append((entry, version, params))

    def _log_row(self, sql: str, at_ms: int) -> _LogRow:
        log = self._log
        if log is None:
            log = self._log = _LogRow(sql, at_ms)
        return log

    def executemany(self, sql: str, params: Any, /) -> Any:
        """Run ``sql`` for each parameter set (after BEGIN and anything deferred)."""
        if self._begin is not None or self._deferred:
            self._send([], rowless=True)
        return self._c.executemany(sql, params)

    def commit(self) -> None:
        """Send what is deferred and the log row, then COMMIT, in one request (nothing if nothing was
        ever sent)."""
        logged = self._log_statement()
        if logged is not None:
            self.defer(*logged)
        if self._begin is not None and not self._deferred:
            self._begin = None  # the transaction never began
            return
        self._send([("COMMIT", None)], rowless=True)

    def _log_statement(self) -> tuple[str, Sequence[Any]] | None:
        """The pending log row's INSERT and its parameters (taken: it is no longer pending), or None."""
        log = self._log
        if log is None:
            return None
        self._log = None
        plain = merged_entries(log.entries)
        if log.versions:
            sql = self._backend.change_log_insert_versions([q for _e, q, _p in log.versions])
            args: list[Any] = [log.at_ms, plain or None]
            for entry, _q, given in log.versions:
                args += [entry, *given]
            return sql, args
        return log.sql, (log.at_ms, plain)

    def again(self) -> None:
        """Roll the transaction back and begin a new one: ROLLBACK and BEGIN go out with the
        next request where the backend batches or pipelines, else now. What was deferred is
        dropped (it was never sent, or went with the rolled-back work)."""
        self._deferred.clear()
        self._seen.clear()
        self._log = None
        if self._begin is not None:
            return  # (not begun: nothing to roll back)
        if self._batch or self._pipe:
            self._deferred += [("ROLLBACK", ()), (self._backend.begin, ())]
            return
        self._c.execute("ROLLBACK")
        self._begin = self._backend.begin
        self._open()

    def rollback(self) -> None:
        """Drop what is deferred; ROLLBACK if the transaction began."""
        self._deferred.clear()
        self._seen.clear()
        self._log = None
        if self._begin is None:
            self._c.execute("ROLLBACK")
        self._begin = None

    def fetchone(self) -> Any:
        """The next row of the last statement, or None."""
        return self._c.fetchone()

    def fetchall(self) -> Any:
        """Every remaining row of the last statement."""
        return self._c.fetchall()

    @property
    def rowcount(self) -> int:
        """Rows the last statement changed (or returned)."""
        return int(self._c.rowcount)

    @property
    def lastrowid(self) -> int | None:
        """The id the last INSERT made."""
        return self._c.lastrowid  # type: ignore[no-any-return]

    def close(self) -> Any:
        """Release the cursor."""
        return self._c.close()


def _rolled_back(txns: Sequence[_Txn]) -> bool:
    """Roll every one back; True if each ROLLBACK went through (their connections are clean)."""
    clean = True
    for t in txns:
        try:
            t.rollback()
        except Exception:
            clean = False
    return clean


def _refusal(exc: BaseException) -> bool:
    """True for the store's own refusals raised between statements (not a driver's or a server's error)."""
    return isinstance(exc, StoreError) and not isinstance(exc, (BackendError, StaleMapError))


def _retrying(attempt: Callable[[], T]) -> T:
    """``attempt()``, again after a deadlock or lock wait timeout (it rolled everything back)."""
    for n in range(1, _TXN_ATTEMPTS + 1):
        try:
            return attempt()
        except BackendError as exc:
            if not exc.retryable or n == _TXN_ATTEMPTS:
                raise
            green.sleep(random.uniform(0.25, 1.0) * min(_BACKOFF_CAP_S, _BACKOFF_FIRST_S * 2 ** (n - 1)))
    raise AssertionError("unreachable")
