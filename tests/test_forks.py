"""Fork safety: a store used before ``os.fork()`` serves each forked process right, on connections of its own.

The parent warms the store (pooled database connections, memcached and
Redis sockets, the follower's thread), forks workers with `multiprocessing`'s
fork context, and reads on beside them. Every answer is checked against
what was written (`tests.forkload`), and the server says which connection
each process used (``CONNECTION_ID()``, and the PROCESSLIST while every
worker still holds its own).
"""

from __future__ import annotations

import multiprocessing
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store import Store, StoreConfig
from store.admin import init_shards
from tests.conftest import (
    APP_USER,
    cached_mariadb_config,
    instagram_pg_config,
    mariadb_config,
    root_sql,
    sqlite_config,
)
from tests.forkload import Known, seed

WORKERS = 8
READS_PER_WORKER = 500
#: A read that waits on a socket another process emptied ends after this, as an error. Long enough
#: that no read times out on a machine the other test workers keep busy: a read that timed out is
#: retried on a new connection, and the server then no longer lists the one a worker reported.
QUERY_TIMEOUT_S = 20
#: Time for one process's reads (they take about a second where every read works).
READ_BUDGET_S = 60


def _config(raw: dict[str, Any]) -> StoreConfig:
    raw = dict(raw, query_timeout_s=QUERY_TIMEOUT_S, connect_timeout_s=5)
    return StoreConfig.from_dict(raw)


@pytest.fixture(scope="module")
def known(mariadb_ready: StoreConfig) -> Known:
    """Boards and pins written once for the module on MariaDB (the caches are filled by each
    test's warm-up)."""
    with Store(_config(mariadb_config())) as store:
        return seed(store, boards=10, pins_per_board=24)


@pytest.fixture(params=["mariadb", "mariadb-cached"])
def warm_store(request: pytest.FixtureRequest, known: Known) -> Iterator[Store]:
    """The store, with caches off or on (memcached and Redis, the follower running), warmed."""
    if request.param == "mariadb":
        raw = mariadb_config()
    else:
        raw = cached_mariadb_config(
            request.getfixturevalue("memcached_pair"), request.getfixturevalue("redis_ready")
        )
        raw["cache"]["follow"] = True
        init_shards(StoreConfig.from_dict(raw))  # makes the namespace's log: the application account may not
    with Store(_config(raw)) as store:
        known.warm(store)
        known.warm(store)  # the second time from the caches, where there are caches
        yield store


#: Each server's id of the connection a statement runs on, and its list of the app's connections.
SERVER_SQL = {
    "mysql": (
        "SELECT CONNECTION_ID()",
        "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = %s",
    ),
    "postgresql": ("SELECT pg_backend_pid()", "SELECT pid FROM pg_stat_activity WHERE usename = %s"),
}


def connection_ids(store: Store) -> set[int]:
    """The server's id of every connection pooled in this process (at least one per pool)."""
    ids: set[int] = set()
    engines = store.admin_context().engines
    sql = SERVER_SQL[engines.backend(next(iter(store.shard_map)).master).name][0]
    for pool in engines.pools().values():
        held = [pool.checkout() for _ in range(max(1, pool.idle))]
        try:
            for conn, _born in held:
                cur = conn.cursor()
                cur.execute(sql)
                ids.add(int(cur.fetchone()[0]))
        finally:
            for conn, born in held:
                pool.checkin(conn, born)
    return ids


def live_connections(store: Store) -> set[int]:
    """The ids of the application account's connections, as the server lists them now."""
    kind = store.admin_context().engines.backend(next(iter(store.shard_map)).master).name
    if kind == "mysql":
        return {int(r[0]) for r in root_sql(SERVER_SQL["mysql"][1], APP_USER)}
    import psycopg

    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as conn:
        return {int(r[0]) for r in conn.execute(SERVER_SQL["postgresql"][1], (APP_USER,)).fetchall()}


def read_and_check(store: Store, known: Known, rng: random.Random, reads: int) -> tuple[int, int, list[str]]:
    """``reads`` random reads: (wrong answers, errors, a few of them). Reads not made within
    `READ_BUDGET_S` (each stuck for a timeout) count as errors."""
    wrong = errors = 0
    seen: list[str] = []
    deadline = time.monotonic() + READ_BUDGET_S
    for done in range(reads):
        if time.monotonic() > deadline:
            errors += reads - done
            seen.append(f"{reads - done} reads not made within {READ_BUDGET_S} s")
            break
        try:
            bad = known.check(store, rng)
        except Exception as exc:
            errors += 1
            bad = f"{type(exc).__name__}: {exc}"[:200]
        else:
            wrong += bad is not None
        if bad is not None and len(seen) < 3:
            seen.append(bad)
    return wrong, errors, seen


def _worker(store: Store, known: Known, n: int, results: Any, release: Any) -> None:
    """In a forked child: read with the parent's store, report, hold the connections until released."""
    try:
        wrong, errors, seen = read_and_check(store, known, random.Random(n), READS_PER_WORKER)
        try:
            ids = connection_ids(store)
        except Exception as exc:
            ids, errors = set(), errors + 1
            seen.append(f"connection ids: {exc}")
        follower = store._follower  # the thread a cached store runs
        following = follower is not None and follower._thread is not None and follower._thread.is_alive()
        results.put((n, os.getpid(), wrong, errors, seen, sorted(ids), following))
    finally:
        release.wait(60)


def check_forked_workers(store: Store, known: Known) -> None:
    """`WORKERS` forked children and the parent read at once: every answer right, no connection
    used by two processes; the parent right afterwards, on the connections it had."""
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    release = ctx.Event()
    parent_ids = connection_ids(store)
    # Daemonic: a worker stuck on a read never keeps the test run from ending.
    workers = [
        ctx.Process(target=_worker, args=(store, known, n, results, release), daemon=True)
        for n in range(WORKERS)
    ]
    for w in workers:
        w.start()
    # The parent reads on while its children do.
    p_wrong, p_errors, p_seen = read_and_check(store, known, random.Random(99), 300)
    got = []
    try:
        deadline = time.monotonic() + 120
        while len(got) < WORKERS and time.monotonic() < deadline:
            try:
                got.append(results.get(timeout=1))
            except Exception:
                if not any(w.is_alive() for w in workers):
                    break
        # Every worker still holds its connections: the server lists them.
        live = live_connections(store)
    finally:
        release.set()
        deadline = time.monotonic() + 30
        for w in workers:
            w.join(max(0.1, deadline - time.monotonic()))
            if w.is_alive():
                w.kill()
                w.join()
    wrong = sum(r[2] for r in got)
    errors = sum(r[3] for r in got) + (WORKERS - len(got))
    seen = [s for r in got for s in r[4]][:5]
    print(f"workers: {wrong} wrong, {errors} errors; parent: {p_wrong} wrong, {p_errors} errors")
    if store._follower is not None:  # (a failing pass would churn the parent's connections)
        assert not store._follower.last_error, store._follower.last_error
    assert (wrong, errors) == (0, 0), f"{wrong} wrong answers, {errors} errors in the workers: {seen}"
    assert (p_wrong, p_errors) == (0, 0), f"the parent: {p_wrong} wrong, {p_errors} errors: {p_seen}"

    per_process = [set(parent_ids), *(set(r[5]) for r in got)]
    assert all(per_process), "every process saw at least one connection"
    everyone = set().union(*per_process)
    assert len(everyone) == sum(len(s) for s in per_process), "two processes used one connection"
    assert {i for r in got for i in r[5]} <= live, "the server lists every worker's connections"
    if store._follower is not None:
        assert all(r[6] for r in got), "each worker runs its own follower thread"

    # The parent after its children: still right, on its own connections.
    assert read_and_check(store, known, random.Random(7), 300)[:2] == (0, 0)
    # The parent's follower (cached stores) holds a connection for a moment twice a second, and
    # `connection_ids` sees only the idle ones: look again until none is out.
    deadline = time.monotonic() + 10
    after = connection_ids(store)
    while not parent_ids <= after and time.monotonic() < deadline:
        time.sleep(0.05)
        after = connection_ids(store)
    assert parent_ids <= after, f"the parent's connections are still there, and its own: {parent_ids} {after}"


def test_forked_workers_read_right_on_connections_of_their_own(warm_store: Store, known: Known) -> None:
    check_forked_workers(warm_store, known)


def test_forked_workers_on_postgresql(postgres_ready: StoreConfig) -> None:
    """The same on PostgreSQL (Instagram IDs): libpq's connections are let go of without a Terminate."""
    with Store(_config(instagram_pg_config())) as store:
        known = seed(store, boards=6, pins_per_board=20)
        known.warm(store)
        check_forked_workers(store, known)


def test_a_lock_held_by_another_thread_at_the_fork_does_not_stop_the_child(tmp_path: Path) -> None:
    """A thread of the parent holds a pool's lock while another thread forks: the
    child, which has neither that thread nor a way to release its locks, still reads."""
    with Store(StoreConfig.from_dict(sqlite_config(tmp_path))) as store:
        pin = store.create("pin", {"n": 1})
        store.get(pin)
        pool = next(iter(store.admin_context().engines.pools().values()))
        holding, forked = threading.Event(), threading.Event()

        def hold() -> None:
            with pool._cond:
                holding.set()
                forked.wait(10)

        t = threading.Thread(target=hold)
        t.start()
        holding.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: exit 0 only if every read works
            code = 1
            try:
                code = 0 if all(store.get(pin) == {"n": 1} for _ in range(20)) else 2
            finally:
                os._exit(code)
        forked.set()
        t.join()
        assert exit_code(pid) == 0


def exit_code(pid: int, seconds: float = 20.0) -> int | str:
    """The exit code of child ``pid``, or "hung" (and the child killed) after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"


def test_a_sqlite_store_forked_reads_right_and_the_parent_too(tmp_path: Path) -> None:
    """The embedded default: children of a warmed store read their own files, the parent goes on."""
    with Store(StoreConfig.from_dict(sqlite_config(tmp_path))) as store:
        pins = {store.create("pin", {"n": n}): {"n": n} for n in range(40)}
        assert store.get_many(pins) == pins
        children = []
        for _ in range(4):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = 0 if all(store.get_many(pins) == pins for _ in range(50)) else 2
                    store.close()
                finally:
                    os._exit(code)
            children.append(pid)
        assert all(store.get(p) == d for p, d in pins.items())
        assert [exit_code(pid) for pid in children] == [0] * len(children)
        assert store.get_many(pins) == pins
