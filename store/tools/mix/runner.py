"""Running the mix: phases over threads, round trips counted, answers checked against the database.

A phase is one system, one thread count, cold (caches emptied first) or
warm (right after the cold one): every thread replays its own request
stream for ``seconds`` or ``requests`` calls. Each call is timed in wall
time (``perf_counter_ns``) and in the CPU time of its thread
(``thread_time_ns``); the phase's process CPU time is kept as well.
"""

from __future__ import annotations

import importlib
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from store.tools.mix.dataset_db import Copy, Truth
from store.tools.mix.pg import PgTruth
from store.tools.mix.system import System
from store.tools.mix.workload import MIX, PAGE, DataSet, Request, requests

__all__ = [
    "Check",
    "OpSamples",
    "Phase",
    "check_holding",
    "check_system",
    "count_round_trips",
    "counting_sends",
    "merge",
    "merge_processes",
    "run_phase",
    "sends",
]


@dataclass
class OpSamples:
    """One operation's calls in a phase: wall and CPU nanoseconds per call, errors."""

    wall_ns: list[int] = field(default_factory=list)
    cpu_ns: list[int] = field(default_factory=list)
    errors: int = 0
    first_error: str = ""


@dataclass
class Phase:
    """One system, one thread count, cold or warm."""

    system: str
    threads: int
    temperature: str
    seconds: float
    cpu_s: float
    ops: dict[str, OpSamples]
    #: Worker processes the phase ran in (each with ``threads`` threads); 1: in this process.
    processes: int = 1
    #: Calls made by each worker process (empty when the phase ran in this process).
    process_calls: list[int] = field(default_factory=list)
    #: CPU seconds the machine's server processes used during the phase, by program
    #: (`store.tools.mix.servers_cpu`; empty where it cannot be read).
    server_cpu_s: dict[str, float] = field(default_factory=dict)
    #: Deletes the cache servers counted during the phase, by cache (every deleter:
    #: `store.tools.mix.invalidation`; empty where they cannot be read).
    cache_deletes: dict[str, int] = field(default_factory=dict)
    #: The most database connections the system had in use at once, summed over its hosts' pools
    #: (None: not known; a merged phase keeps its slices' highest).
    connections: int | None = None
    #: The cache calls that failed or were skipped (a breaker open) during the phase, by cache,
    #: where the system is a store in this process (empty elsewhere): a phase whose cache was
    #: off for a while measured another system.
    cache_faults: dict[str, int] = field(default_factory=dict)

    @property
    def calls(self) -> int:
        """Calls made, errors included."""
        return sum(len(s.wall_ns) for s in self.ops.values())

    @property
    def ops_per_s(self) -> float:
        """Calls per second of wall time."""
        return self.calls / self.seconds if self.seconds else 0.0

    @property
    def errors(self) -> int:
        """Calls that raised."""
        return sum(s.errors for s in self.ops.values())


def _combined(parts: Iterable[dict[str, OpSamples]]) -> dict[str, OpSamples]:
    """Samples of several threads or slices, per operation, as one."""
    ops = {op: OpSamples() for op in MIX}
    for part in parts:
        for op, s in part.items():
            m = ops[op]
            m.wall_ns += s.wall_ns
            m.cpu_ns += s.cpu_ns
            m.errors += s.errors
            m.first_error = m.first_error or s.first_error
    return ops


def merge(parts: list[Phase]) -> Phase:
    """Slices of one system's phase, run apart, as one phase (times and samples summed)."""
    first = parts[0]
    seconds = sum(p.seconds for p in parts)
    cpu_s = sum(p.cpu_s for p in parts)
    merged = Phase(
        first.system, first.threads, first.temperature, seconds, cpu_s, _combined(p.ops for p in parts)
    )
    if first.processes > 1:
        merged.processes = first.processes
        merged.process_calls = [sum(c) for c in zip(*(p.process_calls for p in parts), strict=True)]
    counted = [p.connections for p in parts if p.connections is not None]
    merged.connections = max(counted) if counted else None
    if all(p.server_cpu_s for p in parts):
        merged.server_cpu_s = {
            name: sum(p.server_cpu_s.get(name, 0.0) for p in parts) for name in first.server_cpu_s
        }
    faults: dict[str, int] = {}
    for p in parts:
        for name, n in p.cache_faults.items():
            faults[name] = faults.get(name, 0) + n
    merged.cache_faults = faults
    if all(p.cache_deletes for p in parts):
        merged.cache_deletes = {
            name: sum(p.cache_deletes.get(name, 0) for p in parts) for name in first.cache_deletes
        }
    return merged


def merge_processes(parts: list[Phase], seconds: float) -> Phase:
    """One phase run at once in several processes, as one: ``seconds`` is the wall time of the whole.

    Samples are pooled, CPU time is the sum of the processes' CPU time, and
    each process's call count is kept in ``process_calls``.
    """
    first = parts[0]
    return Phase(
        first.system,
        first.threads,
        first.temperature,
        seconds,
        sum(p.cpu_s for p in parts),
        _combined(p.ops for p in parts),
        processes=len(parts),
        process_calls=[p.calls for p in parts],
    )


def _call(system: System, data: DataSet, copy: Copy, r: Request) -> Callable[[], Any]:
    """The system call for request ``r`` (made before the clock starts)."""
    op, kind = r.op, r.kind
    if op == "board_page":
        return lambda: system.board_page(copy.boards[r.a], PAGE)
    if op == "likes_page":
        return lambda: system.link_ids(kind, copy.users[r.a], PAGE)
    if op == "count_link":
        return lambda: system.count_links(kind, copy.boards[r.a])
    if op == "get_node":
        return lambda: system.get_node(copy.pins[r.a], kind)
    if op == "update_node":
        return lambda: system.update_node(copy.pins[r.a], {"n": r.value}, kind)
    if op == "delete_node":
        return lambda: system.delete_node(copy.pins[r.a], kind)
    if op == "add_node":
        board = copy.boards[r.a]
        obj = data.pin_data(r.a % data.shape.pins)
        return lambda: copy.created.append(system.add_node("pin", obj, board))
    from_id = copy.users[r.a] if kind == "users_likes_pins" else copy.boards[r.a]
    to_id = copy.pins[r.b]
    if op == "add_link":
        return lambda: system.add_link(kind, from_id, to_id, time.time_ns() // 1000)
    if op == "update_link":
        return lambda: system.update_link(kind, from_id, to_id, time.time_ns() // 1000)
    if op == "delete_link":
        return lambda: system.delete_link(kind, from_id, to_id)
    if op == "get_link":
        return lambda: system.has_link(kind, from_id, to_id)
    raise ValueError(f"unknown operation {op!r}")


def run_phase(
    system: System,
    data: DataSet,
    copy: Copy,
    *,
    threads: int,
    temperature: str,
    seconds: float,
    requests_per_thread: int | None,
    seed: int,
    tick: Callable[[float], None] | None = None,
    gate: Callable[[], None] | None = None,
) -> Phase:
    """Run one phase; ``tick`` is told the elapsed fraction now and then (for a progress bar).

    ``gate``, when given, is called once every thread is ready and before the
    clock starts (a worker process waits there for the others); if it raises,
    the threads are let go without a call and the error propagates.
    """
    stop = threading.Event()
    ready = threading.Barrier(threads + 1)
    results: list[dict[str, OpSamples]] = [{} for _ in range(threads)]
    limit = requests_per_thread if requests_per_thread is not None else 1 << 62

    def worker(t: int) -> None:
        stream = requests(data, seed, t)
        mine = results[t] = {op: OpSamples() for op in MIX}
        try:
            ready.wait()
        except threading.BrokenBarrierError:
            return
        n = 0
        clock, cpu = time.perf_counter_ns, time.thread_time_ns
        while n < limit and not stop.is_set():
            r = next(stream)
            call = _call(system, data, copy, r)
            c0, w0 = cpu(), clock()
            try:
                call()
            except Exception as exc:
                s = mine[r.op]
                s.errors += 1
                if not s.first_error:
                    s.first_error = f"{type(exc).__name__}: {exc}"[:300]
            w1, c1 = clock(), cpu()
            s = mine[r.op]
            s.wall_ns.append(w1 - w0)
            s.cpu_ns.append(c1 - c0)
            n += 1

    pool = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(threads)]
    for th in pool:
        th.start()
    if gate is not None:
        try:
            gate()
        except BaseException:
            ready.abort()
            for th in pool:
                th.join()
            raise
    ready.wait()
    started, cpu0 = time.perf_counter(), time.process_time()
    if requests_per_thread is None:
        while (elapsed := time.perf_counter() - started) < seconds:
            if tick is not None:
                tick(elapsed / seconds)
            time.sleep(min(0.25, max(0.0, seconds - elapsed)))
        stop.set()
    for th in pool:
        th.join()
    took, cpu_s = time.perf_counter() - started, time.process_time() - cpu0
    if tick is not None:
        tick(1.0)
    return Phase(system.name, threads, temperature, took, cpu_s, _combined(results))


# -- round trips ------------------------------------------------------------------

_counts = threading.local()


def sends() -> int:
    """Sends counted on this thread since `counting_sends` began or this was last reset to 0."""
    return int(getattr(_counts, "n", 0))


def reset_sends() -> None:
    """Start this thread's count again from 0."""
    _counts.n = 0


@contextmanager
def counting_sends() -> Iterator[None]:
    """Count every ``sendall``/``send`` on Python sockets (PyMySQL, pymemcache and redis-py use them),
    every query mysqlclient sends, and every statement psycopg sends.

    A request is one send on all three (a pipeline's commands go out
    together), so sends are round trips. mysqlclient's and libpq's sockets
    are in C: mysqlclient's ``Connection.query`` (one request, however many
    statements it holds), psycopg's ``Cursor.execute`` and ``executemany``
    (one request each) and its pipelines (one request for all the
    statements in one), and the store's own libpq pipelines
    (`store.backends.postgres.driver.run_pipeline`: every statement of a
    store's PostgreSQL connection), are counted instead.
    """
    cls: Any = socket.socket
    orig_sendall, orig_send = cls.sendall, cls.send
    mysqldb: Any = None
    with suppress(ImportError):
        mysqldb = importlib.import_module("MySQLdb.connections").Connection
    orig_query: Any = None if mysqldb is None else mysqldb.query
    psycopg: Any = None
    pg_conn: Any = None
    with suppress(ImportError):
        psycopg = importlib.import_module("psycopg").Cursor
        pg_conn = importlib.import_module("psycopg").Connection
    orig_execute: Any = None if psycopg is None else psycopg.execute
    orig_executemany: Any = None if psycopg is None else psycopg.executemany
    orig_pipeline: Any = None if pg_conn is None else pg_conn.pipeline
    # The store's own libpq pipeline (`store.backends.postgres.driver.run_pipeline`): one request.
    pg_driver: Any = None
    with suppress(ImportError):
        pg_driver = importlib.import_module("store.backends.postgres.driver")
    orig_run: Any = None if pg_driver is None else pg_driver.run_pipeline

    def run_pipeline(*args: Any, **kwargs: Any) -> Any:
        _counts.n = getattr(_counts, "n", 0) + 1
        return orig_run(*args, **kwargs)

    def query(self: Any, sql: Any) -> Any:
        _counts.n = getattr(_counts, "n", 0) + 1
        return orig_query(self, sql)

    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(_counts, "piped", 0):  # a pipeline's statements go out together
            _counts.n = getattr(_counts, "n", 0) + 1
        return orig_execute(self, *args, **kwargs)

    def executemany(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(_counts, "piped", 0):
            _counts.n = getattr(_counts, "n", 0) + 1
        return orig_executemany(self, *args, **kwargs)

    @contextmanager
    def pipeline(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
        _counts.n = getattr(_counts, "n", 0) + 1
        _counts.piped = getattr(_counts, "piped", 0) + 1
        try:
            with orig_pipeline(self, *args, **kwargs) as p:
                yield p
        finally:
            _counts.piped -= 1

    def sendall(self: socket.socket, data: Any, *args: Any) -> Any:
        _counts.n = getattr(_counts, "n", 0) + 1
        return orig_sendall(self, data, *args)

    def send(self: socket.socket, data: Any, *args: Any) -> Any:
        _counts.n = getattr(_counts, "n", 0) + 1
        return orig_send(self, data, *args)

    cls.sendall, cls.send = sendall, send
    if mysqldb is not None:
        mysqldb.query = query
    if psycopg is not None:
        psycopg.execute, psycopg.executemany = execute, executemany
        pg_conn.pipeline = pipeline
    if pg_driver is not None:
        pg_driver.run_pipeline = run_pipeline
    try:
        yield
    finally:
        cls.sendall, cls.send = orig_sendall, orig_send
        if mysqldb is not None:
            mysqldb.query = orig_query
        if psycopg is not None:
            psycopg.execute, psycopg.executemany = orig_execute, orig_executemany
            pg_conn.pipeline = orig_pipeline
        if pg_driver is not None:
            pg_driver.run_pipeline = orig_run


def count_round_trips(system: System, data: DataSet, copy: Copy, *, n: int, seed: int) -> dict[str, float]:
    """Mean round trips per call of each operation, over ``n`` calls on one thread."""
    sends: dict[str, list[int]] = {op: [] for op in MIX}
    stream = requests(data, seed, 0)
    with counting_sends():
        for _ in range(n):
            r = next(stream)
            call = _call(system, data, copy, r)
            _counts.n = 0
            try:
                call()
            except Exception:
                continue
            sends[r.op].append(_counts.n)
    return {op: sum(v) / len(v) for op, v in sends.items() if v}


# -- the after-run check -----------------------------------------------------------


@dataclass
class Check:
    """What a system answered that the database does not hold."""

    system: str
    checked: int = 0
    mismatches: list[str] = field(default_factory=list)
    #: For a system whose fills race its writes (``fills_race_writes``: the floor, which has
    #: no leases): the answers that differed before its caches were flushed. ``mismatches``
    #: then holds what still differs after the flush: rows, not cache entries.
    stale: list[str] = field(default_factory=list)


def check_system(system: System, truth: Truth | PgTruth, data: DataSet, copy: Copy, *, seed: int) -> Check:
    """Compare the system's answers (through its caches) with the databases, on a sample.

    The 10 biggest boards and 30 others (page and count), 30 users' likes,
    100 pins: every answer must be what the database holds now.
    """
    rng = random.Random(seed)
    out = Check(system.name)
    fills = bool(getattr(system, "fills_pages", False))
    boards = data.boards_by_size[:10] + rng.sample(range(data.shape.boards), min(30, data.shape.boards))
    for b in boards:
        board = copy.boards[b]
        rows = truth.rows("board_has_pins", board)
        if fills:
            want: list[int] = []
            for i in range(0, len(rows), 200):
                live = truth.live(rows[i : i + 200], "pin")
                want += [r for r in rows[i : i + 200] if r in live]
                if len(want) >= PAGE:
                    break
            want = want[:PAGE]
        else:
            live = truth.live(rows[:PAGE], "pin")
            want = [r for r in rows[:PAGE] if r in live]
        got = system.board_page(board, PAGE)
        objs = truth.live(want, "pin")
        out.checked += 2
        if [i for i, _o in got] != want:
            out.mismatches.append(f"board {board} page: {len(got)} ids, the database has {len(want)}")
        elif any(objs.get(i) != o for i, o in got):
            out.mismatches.append(f"board {board} page: an object differs from its row")
        n = system.count_links("board_has_pins", board)
        if n != len(rows):
            out.mismatches.append(f"board {board} count {n}, the database has {len(rows)}")
    for u in rng.sample(range(data.shape.users), min(30, data.shape.users)):
        user = copy.users[u]
        want = truth.rows("users_likes_pins", user)[:PAGE]
        got_ids = system.link_ids("users_likes_pins", user, PAGE)
        out.checked += 1
        if got_ids != want:
            out.mismatches.append(f"user {user} likes: {got_ids[:3]}..., the database has {want[:3]}...")
    for p in rng.sample(range(data.shape.pins), min(100, data.shape.pins)):
        pin = copy.pins[p]
        out.checked += 1
        if system.get_node(pin, "pin") != truth.node(pin, "pin"):
            out.mismatches.append(f"pin {pin}: the object differs from its row")
    return out


def check_holding(
    system: System,
    truth: Truth | PgTruth,
    data: DataSet,
    copy: Copy,
    *,
    seed: int,
    empty: Callable[[], None],
) -> Check:
    """`check_system`, holding each system to what it promises of its caches.

    A system whose fills race its writes (``fills_race_writes``: the floor, with no
    leases, may cache a row a concurrent write has just replaced) that answers
    differently from the database is checked again after ``empty()`` has emptied its
    caches: the first answers are reported as ``stale``, and only what still differs,
    its rows, as ``mismatches``. Every other system is held to its first answers.
    """
    check = check_system(system, truth, data, copy, seed=seed)
    if not check.mismatches or not getattr(system, "fills_race_writes", False):
        return check
    empty()
    again = check_system(system, truth, data, copy, seed=seed)
    return Check(check.system, check.checked, again.mismatches, stale=check.mismatches)
