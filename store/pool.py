"""A small, fast DBAPI connection pool: one per host (one per shard file on SQLite).

Why not SQLAlchemy's QueuePool: its checkout and checkin (a lock and a
condition, events, fairy and record bookkeeping) measured 10 us per call on
one thread and 335 us under 16 threads, against 1-2 us for this pool, and a
primary-key read through it 1.15x to 1.47x slower (``scripts/bench_pool.py``,
BENCHMARKS.md). This pool is a deque of idle
connections (append and pop are atomic in CPython) and a semaphore that caps
how many are open. It keeps the rules that matter:

* a connection that saw a driver or server error is closed, never reused,
  and a disconnect empties the idle list (after a server restart every idle
  connection is dead, and each would otherwise fail one caller); only a
  transaction the store itself refused (a deleted object linked, a stale
  version), rolled back cleanly, gives its connection back
  (`store.engines`);
* connections older than ``recycle_s`` are replaced at checkout (servers
  drop idle connections after ``wait_timeout``);
* up to ``max_idle`` idle connections are kept however long they wait;
  more (a burst opened up to ``max_open``) are kept too, and closed once
  one of them has sat unused for ``idle_s``. Closing the one beyond
  ``max_idle`` at each return, as SQLAlchemy's QueuePool does with its
  overflow, made a pool whose load hovers around ``max_idle`` (many loop
  calls on few connections) open and close a connection every few calls:
  323 MariaDB connections in 10 s of the mix's async store, about a fifth
  of its CPU. Checkout takes the connection returned last, so under a
  steady load the ones it does not need are those that age;
* no reset on return: connections run in autocommit mode and the callers
  close every transaction they open, so there is nothing to roll back;
* a pool is its process's own: in a child of ``os.fork()`` it forgets the
  connections it inherited, sending nothing on them, and opens its own
  (`store.forks`: at the fork, and by a process id check at each checkout).

Each pooled connection also keeps one cursor for its whole life: creating a
psycopg cursor measured about 45 us per call between round trips here.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from typing import Any, Protocol

from store import green
from store.exceptions import BackendError
from store.forks import at_fork, forget_connection

__all__ = ["ConnectionPool", "PoolLoad", "PooledConnection"]

POOL_TIMEOUT_S = 30.0
RECYCLE_S = 3600.0
#: How long a connection beyond ``max_idle`` may sit idle before it is closed.
IDLE_S = 10.0


class PoolLoad(Protocol):
    """What a pool tells of its load: the gauges metrics export (`ConnectionPool` implements it)."""

    @property
    def in_use(self) -> int:
        """How many connections are checked out."""
        ...

    @property
    def waiting(self) -> int:
        """How many callers wait for a connection."""
        ...

    @property
    def idle(self) -> int:
        """How many connections are idle."""
        ...


class _ReusedCursor:
    """The connection's one cursor; ``close()`` leaves it open for the next user.

    Where the driver runs statements itself (``run_pipeline``: the store's libpq pipeline on
    psycopg), every statement goes that way and the cursor holds the last one's rows and count.
    """

    __slots__ = ("_c", "_count", "_held", "execute_oks", "execute_rows", "run_pipeline")

    def __init__(self, cursor: Any) -> None:
        self._c = cursor
        #: The driver's own runner of statements, one request for all (`run_pipeline`), or None.
        self.run_pipeline: Callable[[Any], list[tuple[int, list[Any] | None]]] | None = getattr(
            cursor, "run_pipeline", None
        )
        #: The last statement's rows (None: it returned none) and count, where ``run_pipeline`` ran it.
        self._held: list[Any] | None = None
        self._count = -1
        #: The driver cursor's one-request reader of rowless statements, where it has one.
        self.execute_oks: Callable[[str, Any], list[tuple[int, int]]] | None = getattr(
            cursor, "execute_oks", None
        )
        #: ... and of any statements (rows too), where it has one.
        self.execute_rows: Callable[[str, Any], list[tuple[int, int, list[Any]]]] | None = getattr(
            cursor, "execute_rows", None
        )

    def execute(self, sql: str, params: Any = None, /) -> Any:
        run = self.run_pipeline
        if run is not None:
            ((self._count, self._held),) = run([(sql, params)])
            return None
        return self._c.execute(sql) if params is None else self._c.execute(sql, params)

    def hold(self, count: int, rows: list[Any] | None) -> None:
        """Keep ``rows`` and ``count`` as the last statement's (one a pipeline ran last)."""
        self._count, self._held = count, rows

    def executemany(self, sql: str, params: Any, /) -> Any:
        self._count, self._held = -1, None
        if self.run_pipeline is not None:
            got = self.run_pipeline([(sql, p) for p in params])
            self._count = sum(max(0, n) for n, _r in got)
            return None
        return self._c.executemany(sql, params)

    def fetchone(self) -> Any:
        if self.run_pipeline is not None:
            held = self._held
            return held.pop(0) if held else None
        return self._c.fetchone()

    def fetchall(self) -> Any:
        if self.run_pipeline is not None:
            held, self._held = self._held, []
            return held or []
        return self._c.fetchall()

    def nextset(self) -> Any:
        return self._c.nextset()

    @property
    def rowcount(self) -> int:
        if self.run_pipeline is not None:
            return self._count
        return int(self._c.rowcount)

    @property
    def lastrowid(self) -> Any:
        return None if self.run_pipeline is not None else self._c.lastrowid

    @property
    def description(self) -> Any:
        """Truthy if the last statement returns rows."""
        if self.run_pipeline is not None:
            return None if self._held is None else True
        return self._c.description

    def close(self) -> None:
        """Kept open: it belongs to the pooled connection."""


class PooledConnection:
    """A DBAPI connection with one reused cursor; other attributes pass through."""

    __slots__ = ("_cursor", "pid", "raw")

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self._cursor: _ReusedCursor | None = None
        #: The process that opened it: no other may use it (`store.forks`).
        self.pid = os.getpid()

    def cursor(self) -> _ReusedCursor:
        """The connection's cursor (made on first use)."""
        if self._cursor is None:
            self._cursor = _ReusedCursor(self.raw.cursor())
        return self._cursor

    def close(self) -> None:
        """Close the connection."""
        self.raw.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class ConnectionPool:
    """Idle DBAPI connections for one host, at most ``max_open`` open at once."""

    def __init__(
        self,
        connect: Callable[[], Any],
        *,
        name: str,
        max_open: int = 16,
        max_idle: int = 8,
        timeout_s: float = POOL_TIMEOUT_S,
        recycle_s: float = RECYCLE_S,
        idle_s: float = IDLE_S,
    ) -> None:
        self._connect = connect
        self.name = name
        #: (connection, birth, when it was given back), the last given back at the right.
        self._idle: deque[tuple[Any, float, float]] = deque()
        # A plain counter under a lock: threading.Semaphore costs about 1 us
        # per acquire and release in Python code; the Condition is waited on
        # only when every connection is in use.
        self._cond = threading.Condition(threading.Lock())
        self._in_use = 0
        self._waiting = 0
        #: Callers inside an event loop's call waiting for a connection (`_wait_handed`).
        self._green_waiters: deque[green.Pause] = deque()
        self._max_open = max_open
        self._max_idle = max_idle
        self._timeout_s = timeout_s
        self._recycle_s = recycle_s
        self._idle_s = idle_s
        self.opened = 0  # connections made over the pool's life, for tests and stats
        #: The most connections checked out at once (for tests and benchmarks; set it to start again).
        self.peak_in_use = 0
        #: The process whose connections the pool holds.
        self._pid = os.getpid()
        at_fork(self, ConnectionPool._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's connections (sending nothing), start empty."""
        if self._pid == os.getpid():
            return
        self._cond = threading.Condition(threading.Lock())  # may have been held by a parent's thread
        self._in_use = 0  # the threads that had them checked out do not exist here
        self.peak_in_use = 0
        self._waiting = 0
        self._green_waiters = deque()
        inherited, self._idle = self._idle, deque()
        self._pid = os.getpid()
        for conn, _born, _back in inherited:
            forget_connection(getattr(conn, "raw", conn))

    def checkout(self) -> tuple[Any, float]:
        """An open connection and its birth time; make one if none is idle."""
        if self._pid != _getpid():  # a fork the hook missed
            self._after_fork()
        call = green.current()
        with self._cond:
            if self._in_use < self._max_open:
                self._in_use += 1
            elif call is not None:
                self._wait_handed(call)  # (a slot handed over is already counted in use)
            else:
                self._wait_for_slot()
                self._in_use += 1
            if self._in_use > self.peak_in_use:
                self.peak_in_use = self._in_use
        try:
            got = self._idle_one(call is not None)
            if got is None:
                got = PooledConnection(self._connect()), time.monotonic()
                self.opened += 1
        except BaseException:
            self._release()
            raise
        if call is not None:
            call.holding += 1
        return got

    def _idle_one(self, in_loop_call: bool) -> tuple[Any, float] | None:
        """An idle connection fit for use, the one given back last (those too old, or blocking for a
        loop's call, are closed on the way); None when none is left."""
        while True:
            try:
                conn, born, _back = self._idle.pop()
            except IndexError:
                return None
            if time.monotonic() - born < self._recycle_s and not (in_loop_call and _blocking(conn)):
                return conn, born
            _close_quietly(conn)

    def _wait_for_slot(self) -> None:
        # Called with the lock held.
        deadline = time.monotonic() + self._timeout_s
        self._waiting += 1
        try:
            while self._in_use >= self._max_open:
                left = deadline - time.monotonic()
                if left <= 0 or not self._cond.wait(left):
                    if self._in_use < self._max_open:
                        return
                    raise self._exhausted()
        finally:
            self._waiting -= 1

    def _exhausted(self) -> BackendError:
        return BackendError(
            f"no free connection to {self.name} within {self._timeout_s:g} s "
            f"(all {self._max_open} are in use): raise pool_size or use fewer threads"
        )

    def _wait_handed(self, call: Any) -> None:
        """Inside an event loop's call (`store.green`), with the lock held: queue for a slot and
        wait on the loop (the lock let go) until one is handed over, first come first served.

        A slot given back while such calls wait is handed to the first of them (`_release`),
        still counted in use, so no call arriving meanwhile takes it and the woken one never
        has to queue again. `BackendError` after ``timeout_s`` (a wait that times out is never
        handed a slot: the hand-off and the timeout both happen on the waiter's loop thread, and
        only one of them can end the wait).

        A call that holds another pool's connection (a pair write takes both hosts' before it
        begins) goes first: at the back of a long queue it would keep that connection idle the
        whole time, and at 256 tasks on 3 connections a host such waits made a plain read wait
        a quarter of a second."""
        pause = green.pause()
        if call.holding:
            self._green_waiters.appendleft(pause)
        else:
            self._green_waiters.append(pause)
        self._waiting += 1
        self._cond.release()
        handed = False
        try:
            handed = green.wait(pause, self._timeout_s)
        finally:
            self._cond.acquire()
            self._waiting -= 1
            if not handed:
                with suppress(ValueError):
                    self._green_waiters.remove(pause)
        if not handed:
            raise self._exhausted()

    def _pass_on(self) -> None:
        """Give a slot back, the lock held: to the first waiting loop call if any, else free."""
        while self._green_waiters:
            pause = self._green_waiters.popleft()
            if not pause.waiting:  # (it timed out meanwhile)
                continue
            loop = pause.loop
            if _running_loop() is loop:  # given back on the waiter's own loop: handed at once
                green.wake(pause)  # (the waiter runs later, as the loop's callback)
            else:
                loop.call_soon_threadsafe(self._hand, pause)
            return
        self._in_use -= 1
        if self._waiting:
            self._cond.notify()

    def _hand(self, pause: green.Pause) -> None:
        """On the waiter's loop: the slot is its, unless its wait has ended (then it goes on)."""
        with self._cond:
            if not green.wake(pause):
                self._pass_on()

    def _release(self) -> None:
        with self._cond:
            self._pass_on()

    def _foreign(self, conn: Any) -> bool:
        """True (and the connection forgotten) if another process opened ``conn``: a checkout made
        before this process was forked, given back in the child."""
        if getattr(conn, "pid", self._pid) == self._pid:
            return False
        forget_connection(getattr(conn, "raw", conn))
        return True

    def checkin(self, conn: Any, born: float) -> None:
        """Give back a healthy connection."""
        _let_go()
        if self._foreign(conn):
            return
        idle, now = self._idle, time.monotonic()
        idle.append((conn, born, now))
        # Beyond max_idle, the one unused longest goes once it has sat for idle_s (module text).
        while len(idle) > self._max_idle:
            try:  # (other threads check out and give back meanwhile: the deque may change under us)
                if now - idle[0][2] < self._idle_s:
                    break
                old, _born, _back = idle.popleft()
            except IndexError:
                break
            _close_quietly(old)
        self._release()

    def discard(self, conn: Any, *, disconnected: bool = False) -> None:
        """Close a connection in an unknown state; after a disconnect, drop the idle ones too."""
        _let_go()
        if self._foreign(conn):
            return
        _close_quietly(conn)
        if disconnected:
            self.clear()
        self._release()

    def clear(self) -> None:
        """Close every idle connection."""
        if self._pid != _getpid():
            self._after_fork()  # the parent's connections are forgotten, never closed
            return
        while True:
            try:
                conn, _born, _back = self._idle.pop()
            except IndexError:
                return
            _close_quietly(conn)

    @property
    def in_use(self) -> int:
        """How many connections are checked out."""
        return self._in_use

    @property
    def waiting(self) -> int:
        """How many callers wait for a connection (every one is in use)."""
        return self._waiting

    @property
    def max_open(self) -> int:
        """The most connections open at once."""
        return self._max_open

    @property
    def idle(self) -> int:
        """How many connections are idle."""
        return len(self._idle)

    def idle_connections(self) -> list[Any]:
        """The idle connections, the one given back last at the end (for tests and tools)."""
        return [conn for conn, _born, _back in list(self._idle)]


_getpid = os.getpid


def _blocking(conn: Any) -> bool:
    """Whether ``conn`` talks over a plain blocking Python socket (opened outside an event loop's
    call: PyMySQL's ``_sock``). Such a connection is not used inside one, where it would hold the
    loop for each reply (and, waiting for a lock another call on the loop holds, stall it until
    the server's lock wait timeout): it is closed, and one of the loop's is opened."""
    return type(getattr(getattr(conn, "raw", conn), "_sock", None)) is socket.socket


def _let_go() -> None:
    """A connection checked out inside an event loop's call is given back (see `_wait_handed`)."""
    call = green.current()
    if call is not None and call.holding:
        call.holding -= 1


def _running_loop() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, if any."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _close_quietly(conn: Any) -> None:
    # Closing a broken connection may fail; it is gone either way.
    with suppress(Exception):
        conn.close()
