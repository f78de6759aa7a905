"""`store.aio.AsyncStore` on its own terms: its contract with `Store`, tasks, cancellation, closing, forks.

The behavioural suites (objects, relations, versions, unique keys) also run
through the async face (``BOTH_FACES`` in those modules); these tests cover
what only an event loop can show: many tasks at once, tasks cancelled at
random moments (both sides of every pair and every count checked after each
round, on MariaDB under two host names, caches on), the executor's bound on
connections, ``async with`` and `aclose`, and a fork.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import multiprocessing
import random
import socket
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
import yaml

from store import ConfigError, Store, StoreConfig, StoreError, encode_pinterest, green
from store.aio import IO_MODES, AsyncStore, default_max_workers
from tests.conftest import cached_mariadb_config, sqlite_config

BHP = "board_has_pins"
POB = "pin_owned_by_board"

#: `Store` members that are not request-path calls, and what the async store has for them.
SYNC_ONLY = {"admin_context", "config", "shard_map", "map_source"}
RENAMED = {"close": "aclose"}


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


# -- the contract ---------------------------------------------------------------


def _public_members(cls: type) -> dict[str, Any]:
    return {name: inspect.getattr_static(cls, name) for name in dir(cls) if not name.startswith("_")}


def test_every_store_method_is_a_coroutine_with_the_same_parameters() -> None:
    sync, asynchronous = _public_members(Store), _public_members(AsyncStore)
    for name, member in sync.items():
        ours = RENAMED.get(name, name)
        assert ours in asynchronous, f"AsyncStore has no {ours} (Store.{name})"
        if name in SYNC_ONLY or isinstance(member, property) or not callable(member):
            continue
        if isinstance(member, classmethod):
            continue  # from_config: checked below
        theirs = getattr(AsyncStore, ours)
        assert inspect.iscoroutinefunction(theirs), f"AsyncStore.{ours} is not a coroutine function"
        want = inspect.signature(getattr(Store, name)).parameters
        got = inspect.signature(theirs).parameters
        assert list(got) == list(want), name
        for p, q in zip(want.values(), got.values(), strict=True):
            assert (q.kind, q.default, q.annotation) == (p.kind, p.default, p.annotation), (name, p.name)
    for name in ("__aenter__", "__aexit__"):
        assert inspect.iscoroutinefunction(getattr(AsyncStore, name))
    sync_init = inspect.signature(Store.__init__).parameters
    async_init = inspect.signature(AsyncStore.__init__).parameters
    assert set(sync_init) <= set(async_init)
    assert "max_workers" in async_init
    assert list(inspect.signature(Store.from_config).parameters) == ["source"]
    assert list(inspect.signature(AsyncStore.from_config).parameters) == ["source", "max_workers", "io"]


def test_from_config_takes_what_the_store_takes(tmp_path: Path) -> None:
    raw = sqlite_config(tmp_path)
    path = tmp_path / "store.yaml"
    path.write_text(yaml.safe_dump(raw))

    async def main() -> None:
        for source in (raw, StoreConfig.from_dict(raw), str(path), path):
            async with AsyncStore.from_config(source) as s:
                pin = await s.create("pin", {"src": type(source).__name__})
                assert await s.get(pin) == {"src": type(source).__name__}
                assert s.max_workers == default_max_workers(s.config) == min(32, s.config.pool_size)
        async with AsyncStore.from_config(raw, max_workers=3) as s:
            assert s.max_workers == 3

    run(main())
    with pytest.raises(ConfigError, match="a store's config is a YAML file's path"):
        AsyncStore.from_config(42)  # type: ignore[arg-type]
    for bad in (0, -1, 2.0, True, "4"):
        with pytest.raises(ConfigError, match="max_workers must be an int of at least 1"):
            AsyncStore.from_config(raw, max_workers=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="max_workers"):
            AsyncStore(StoreConfig.from_dict(raw), max_workers=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a Store"):
        AsyncStore.from_store(raw)  # type: ignore[arg-type]


def test_the_app_calls_bulk_writes_pages_with_objects_scans_and_ping(tmp_path: Path) -> None:
    async def main() -> None:
        async with AsyncStore.from_config(sqlite_config(tmp_path), max_workers=2) as s:
            board = await s.create("board", {"name": "b"})
            pins = await s.create_many("pin", ({"n": i} for i in range(30)), near=board)
            assert [(await s.get(p))["n"] for p in pins] == list(range(30))  # type: ignore[index]
            assert await s.link_many(BHP, ((board, p) for p in pins)) == 30
            assert await s.count(BHP, board) == 30
            assert await s.unlink_many(BHP, [(board, p) for p in pins[20:]]) == 10
            await s.delete(pins[3])
            page = await s.page_objects(BHP, board, limit=5)
            assert len(page.ids) == 5
            assert pins[3] not in page.ids  # gone, skipped, the page filled
            assert page.objects == [await s.get(p) for p in page.ids]
            rest = await s.page_objects(BHP, board, limit=50, cursor=page.next_cursor)
            assert len(page.ids) + len(rest.ids) == 19
            many = await s.pages_objects_many(BHP, [board], limit=3)
            assert many[board].ids == page.ids[:3]
            scan = await s.scan("pin", batch=7)
            seen = []
            async for id_, data in scan:
                seen.append((id_, data))
                if len(seen) == 12:
                    break
            token = scan.resume_token
            async for id_, data in await s.scan("pin", resume=token):
                seen.append((id_, data))
            assert sorted(i for i, _d in seen) == sorted(p for p in pins if p != pins[3])
            assert len(seen) == len({i for i, _d in seen}), "no object twice across the resume"
            health = await s.ping()
            assert health["ok"] is True, health

    run(main())


def test_errors_are_the_store_s_and_an_async_update_function_is_refused(tmp_path: Path) -> None:
    from store import IdError, NotFound, UnknownTypeError

    async def main() -> None:
        async with AsyncStore.from_config(sqlite_config(tmp_path)) as s:
            with pytest.raises(IdError):
                await s.get(-1)
            with pytest.raises(UnknownTypeError):
                await s.create("photo", {})
            with pytest.raises(NotFound):
                await s.update(encode_pinterest(0, 1, 987_654), {"x": 1})
            pin = await s.create("pin", {"n": 0})

            async def bump(old: dict[str, Any]) -> dict[str, Any]:
                return {"n": old["n"] + 1}

            class Bumper:
                async def __call__(self, old: dict[str, Any]) -> dict[str, Any]:
                    return old

            for fn in (bump, Bumper()):
                with pytest.raises(TypeError, match="plain function"):
                    await s.update(pin, fn)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="plain function"):  # a coroutine made by a lambda
                await s.update(pin, lambda old: bump(old))  # type: ignore[arg-type,return-value]
            assert await s.get_with_version(pin) == ({"n": 0}, 1)  # nothing written

    run(main())


def test_async_with_waits_for_running_calls_then_closes(tmp_path: Path) -> None:
    """A task cancelled (here by `asyncio.timeout`) while its update runs: the update still lands,
    `aclose` waits for it, and the store then refuses calls and has no worker left."""
    raw = sqlite_config(tmp_path)
    started, release = threading.Event(), threading.Event()

    def slow(old: dict[str, Any]) -> dict[str, Any]:
        started.set()
        release.wait(10)
        return {"n": old["n"] + 1}

    async def main() -> AsyncStore:
        async with AsyncStore.from_config(raw, max_workers=2) as s:
            pin = await s.create("pin", {"n": 0})
            ticks = 0

            async def tick() -> None:
                nonlocal ticks
                while not release.is_set():
                    ticks += 1
                    await asyncio.sleep(0.005)

            ticker = asyncio.create_task(tick())
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.05):
                    await s.update(pin, slow)
            assert started.is_set()
            assert ticks > 0  # the loop ran on while the worker was busy
            threading.Timer(0.1, release.set).start()
            await ticker
        assert await asyncio.to_thread(_read, raw, pin) == {"n": 1}  # applied, once
        with pytest.raises(StoreError, match="closed"):
            await s.get(pin)
        await s.aclose()  # twice is harmless
        return s

    s = run(main())
    assert s._executor is None
    assert not [t for t in threading.enumerate() if t.name.startswith("store-aio")]


def _read(raw: dict[str, Any], id: int) -> dict[str, Any] | None:  # noqa: A002
    with Store.from_config(raw) as store:
        return store.get(id)


def test_contextvars_reach_the_worker(tmp_path: Path) -> None:
    request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
    seen: list[str] = []

    def record(old: dict[str, Any]) -> dict[str, Any]:
        seen.append(request_id.get())
        return old

    async def one(s: AsyncStore, pin: int, rid: str) -> None:
        request_id.set(rid)
        await s.update(pin, record)

    async def main() -> None:
        async with AsyncStore.from_config(sqlite_config(tmp_path)) as s:
            pin = await s.create("pin", {})
            await asyncio.gather(*(one(s, pin, f"r{i}") for i in range(10)))

    run(main())
    assert sorted(seen) == sorted(f"r{i}" for i in range(10))


# -- on MariaDB, under two host names, with memcached and Redis --------------------------


@pytest.fixture
def cached_raw(mariadb_ready: StoreConfig, memcached_pair: list[str], redis_ready: str) -> dict[str, Any]:
    # These tests check that caches agree with the database after every round, which holds
    # "without faults": a cache reply later than the default 50 ms (a loaded machine) is a
    # fault, the delete counted lost and the entry stale up to max_stale_s. Cancellation, not
    # cache faults, is what they test (tests/test_cache_faults.py has those).
    raw = cached_mariadb_config(memcached_pair, redis_ready)
    raw["cache"] |= {"timeout_ms": 2000, "connect_timeout_ms": 2000}
    return raw


def _check_pairs(store: Store, board: int, pins: list[int]) -> list[int]:
    """Both sides of every pair and every count agree, and no deleted pin is listed; the list."""
    linked = store.links(BHP, board, limit=1000)
    assert store.count(BHP, board) == len(linked)
    assert len(set(linked)) == len(linked)
    for p in pins:
        inverse = store.links(POB, p)
        assert inverse == ([board] if p in linked else []), p
        assert store.count(POB, p) == len(inverse)
        if store.get(p) is None:  # deleted: in no list
            assert inverse == [], p
    return linked


def _uncached(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k != "cache"}


_UVLOOP_CHURN = """
import asyncio, json, random, sys
import uvloop
from store.aio import AsyncStore

raw, board, pins, seconds = json.loads(sys.stdin.read())

async def main():
    async with AsyncStore.from_config(raw, io="native") as s:
        loop = asyncio.get_running_loop()
        stop = loop.time() + seconds
        calls = 0

        async def churn(seed):
            nonlocal calls
            rng = random.Random(seed)
            while loop.time() < stop:
                p = pins[rng.randrange(len(pins))]
                kind = rng.randrange(5)
                if kind == 0:
                    await s.unlink("board_has_pins", board, p)
                elif kind == 1:
                    await s.link("board_has_pins", board, p)
                elif kind == 2:
                    await s.board_pins(board, limit=20)
                elif kind == 3:
                    await s.get(p)
                else:
                    await s.count("pin_owned_by_board", p)
                calls += 1

        await asyncio.gather(*(churn(i) for i in range(128)))
        print(calls)

with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
    runner.run(main())
"""


def test_native_calls_on_uvloop_keep_every_pair_and_count_exact(cached_raw: dict[str, Any]) -> None:
    """128 tasks linking, unlinking and reading pairs across two hosts for 4 s on uvloop, in a
    child process (a crash is this test's failure, not a lost worker): it exits cleanly, and both
    sides and the counts agree afterwards, from the caches and from the database."""
    import json
    import subprocess
    import sys

    # Connections past pool_size are closed as soon as they sit idle: calls close sockets (and stop
    # the loop watching them) all the time, which is where a switch from the poll itself broke.
    raw = {**cached_raw, "pool_size": 1, "pool_overflow": 3, "pool_idle_s": 0.001}
    with Store.from_config(raw) as store:
        board = store.create("board", {"name": "uvloop"}, shard=0)  # MySQL001A
        pins = [store.create("pin", {"i": i}, shard=4 + i % 4) for i in range(24)]  # MySQL002A
    child = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", _UVLOOP_CHURN],
        input=json.dumps([raw, board, pins, 4.0]),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    assert int(child.stdout.split()[-1]) > 500  # (it did run: hundreds of calls)
    for each in (raw, _uncached(raw)):  # the caches' answers are the database's
        with Store.from_config(each) as store:
            _check_pairs(store, board, pins)


@pytest.mark.parametrize("io", IO_MODES)
def test_two_hundred_tasks_link_and_unlink_and_counts_stay_exact(cached_raw: dict[str, Any], io: str) -> None:
    workers = 8
    # Native: the calls are not bounded by workers, the connections are (by the pools: 2 x 2 a host).
    raw = {**cached_raw, "pool_size": 2} if io == "native" else cached_raw

    async def main() -> tuple[int, list[int], dict[str, int]]:
        async with AsyncStore.from_config(raw, max_workers=workers, io=io) as s:
            board = await s.create("board", {"name": "tasks"}, shard=0)  # MySQL001A
            pins = list(
                await asyncio.gather(*(s.create("pin", {"i": i}, shard=4 + i % 4) for i in range(30)))
            )  # MySQL002A: every pair spans the two hosts
            rng = random.Random(7)

            async def churn(i: int) -> None:
                p = pins[rng.randrange(len(pins))]
                if i % 3 == 2:
                    await s.unlink(BHP, board, p)
                else:
                    await s.link(BHP, board, p)
                await s.has_link(BHP, board, p)

            await asyncio.gather(*(churn(i) for i in range(200)))
            pools = s.admin_context().engines.pools()
            if io == "native":  # many calls at once, never more connections than a pool allows
                assert max(pool.peak_in_use for pool in pools.values()) > 1, pools
                assert all(pool.peak_in_use <= pool.max_open == 4 for pool in pools.values()), pools
            opened = {name: pool.opened for name, pool in pools.items()}
            linked = await s.links(BHP, board, limit=1000)
            assert await s.count(BHP, board) == len(linked)
            return board, pins, opened

    board, pins, opened = run(main())
    if io == "threads":  # the connections are bounded by the workers, not by the 200 tasks
        assert all(n <= workers for n in opened.values()), opened
    for raw in (cached_raw, _uncached(cached_raw)):  # the caches' answers are the database's
        with Store.from_config(raw) as store:
            _check_pairs(store, board, pins)


@pytest.mark.parametrize("io", IO_MODES)
def test_cancelled_writes_leave_both_sides_and_counts_whole(cached_raw: dict[str, Any], io: str) -> None:
    """Rounds of link, unlink, update and delete tasks, each cancelled at a random moment: after
    each round (`aclose` waiting for the writes a worker had started) every pair has both sides,
    every count is exact, deleted pins are in no list, and each update function that ran was
    applied exactly once."""
    rng = random.Random(11)
    with Store.from_config(cached_raw) as setup:
        board = setup.create("board", {"name": "cancel"}, shard=1)  # MySQL001A
        pins = [setup.create("pin", {"i": i}, shard=5 + i % 3) for i in range(12)]  # MySQL002A
        counter = setup.create("board", {"n": 0}, shard=6)
    applied = 0
    lock = threading.Lock()

    def bump(old: dict[str, Any]) -> dict[str, Any]:
        nonlocal applied
        with lock:
            applied += 1
        return {"n": old["n"] + 1}

    async def round_(seed: int) -> None:
        r = random.Random(seed)
        async with AsyncStore.from_config(cached_raw, max_workers=4, io=io) as s:
            tasks: list[asyncio.Task[Any]] = []
            for _ in range(12):
                p = pins[r.randrange(len(pins))]
                op = r.random()
                coro: Coroutine[Any, Any, Any]
                if op < 0.45:
                    coro = s.link(BHP, board, p)
                elif op < 0.75:
                    coro = s.unlink(BHP, board, p)
                elif op < 0.95:
                    coro = s.update(counter, bump)
                else:
                    coro = s.delete(p)
                tasks.append(asyncio.create_task(coro))
            await asyncio.sleep(r.random() * 0.004)
            for t in tasks:
                if r.random() < 0.7:
                    t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    for _ in range(15):
        run(round_(rng.randrange(1 << 30)))
        with Store.from_config(cached_raw) as store:
            _check_pairs(store, board, pins)
            assert store.get(counter) == {"n": applied}
    with Store.from_config(_uncached(cached_raw)) as store:
        _check_pairs(store, board, pins)
        assert store.get_with_version(counter) == ({"n": applied}, applied + 1)


class _Writes:
    """The writes the cancellation tests cancel, on MariaDB under two host names: a board on
    MySQL001A, a counter (a board too) on MySQL002A, and a fresh pin on MySQL002A for each run,
    so that every pair spans the hosts. ``applied``: how many times the update's function ran."""

    def __init__(self, raw: dict[str, Any]) -> None:
        self.raw = raw
        with Store.from_config(raw) as setup:
            self.board = setup.create("board", {}, shard=1)  # MySQL001A
            self.counter = setup.create("board", {"n": 0}, shard=6)  # MySQL002A
        self.applied = 0
        board, counter = self.board, self.counter
        self.ops: dict[str, Any] = {
            "link": lambda s, p: s.link(BHP, board, p),
            "unlink": lambda s, p: s.unlink(BHP, board, p),
            "update": lambda s, _p: s.update(counter, self.bump),
            "delete": lambda s, p: s.delete(p),
        }

    def bump(self, old: dict[str, Any]) -> dict[str, Any]:
        """The update's function: counts its runs."""
        self.applied += 1
        return {"n": old["n"] + 1}

    def fresh_pin(self, name: str) -> int:
        """A new pin for op ``name``, already linked to the board where the op takes it away."""
        with Store.from_config(self.raw) as st:
            pin = st.create("pin", {}, shard=5)  # MySQL002A: the pair spans the hosts
            if name in ("unlink", "delete"):
                st.link(BHP, self.board, pin)
            return pin


@pytest.mark.parametrize("io", IO_MODES)
def test_a_write_cancelled_at_each_of_its_steps_leaves_both_sides_and_counts_whole(
    cached_raw: dict[str, Any], io: str
) -> None:
    """`link`, `unlink`, `update` and `delete` on MariaDB under two host names, each cancelled
    at every point it can be: before its worker starts (nothing runs), and while its worker
    stands at each step of the write (every step of its plan, `Steps.hook`, and of the pair
    protocol, `PairWriter.step`; the steps are found by a first run). After each, both sides of
    the pair and the counts agree, and an update function was applied once or not at all. With
    ``io="native"`` each step is an await of the write's greenlet on the loop, where it stands
    while the task is cancelled."""
    w = _Writes(cached_raw)
    board, counter, ops, fresh_pin = w.board, w.counter, w.ops, w.fresh_pin

    async def once(name: str, pin: int, stop_at: int | None) -> list[str]:
        """Run op ``name``; ``stop_at``: cancel it while its worker stands at that step (-1:
        before it starts; None: never). The steps it passed."""
        seen: list[str] = []
        reached, go = threading.Event(), threading.Event()
        async with AsyncStore.from_config(cached_raw, max_workers=2, io=io) as s:
            ctx = s.admin_context()

            def hook(step: str) -> None:
                seen.append(step)
                if stop_at is not None and len(seen) - 1 == stop_at:
                    reached.set()
                    green.wait_event(go, 10)  # (native: an await, the loop runs on)

            ctx.relations.pairs.step = hook
            assert ctx.steps is not None
            ctx.steps.hook = hook
            task = asyncio.create_task(ops[name](s, pin))
            if stop_at == -1:
                task.cancel()
            elif stop_at is not None:
                assert await asyncio.to_thread(reached.wait, 10), (name, stop_at, seen)
                task.cancel()
                await asyncio.sleep(0)
                go.set()
            try:
                await task
            except asyncio.CancelledError:
                assert stop_at is not None
        return seen

    for name in ops:
        steps = run(once(name, fresh_pin(name), None))
        assert steps, name
        for stop_at in range(-1, len(steps)):
            pin = fresh_pin(name)
            before = w.applied
            run(once(name, pin, stop_at))  # (`async with` waits for a write its worker started)
            with Store.from_config(_uncached(cached_raw)) as store:
                _check_pairs(store, board, [pin])
                assert store.get(counter) == {"n": w.applied}, (name, stop_at)
            assert w.applied - before == (0 if name != "update" or stop_at == -1 else 1), (name, stop_at)
        print(f"{name}: cancelled before it started and at each of its {len(steps)} steps: {steps}")


def test_a_native_call_cancelled_at_each_of_its_awaits_leaves_both_sides_and_counts_whole(
    cached_raw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`link`, `unlink`, `update` and `delete` through `AsyncStore(io="native")` on MariaDB under
    two host names, the caller cancelled at each await of the call in turn: every wait on a
    socket (MariaDB, memcached, Redis) and every other await of the loop, counted by a first run
    (a reply already there when read costs none, so a run may have fewer). The caller
    gets `CancelledError`; the call runs to its end; after each, both sides and the counts agree,
    and the update function was applied exactly once."""
    w = _Writes(cached_raw)
    board, counter, ops, fresh_pin = w.board, w.counter, w.ops, w.fresh_pin
    waits = [0]
    cancel_at: list[int | None] = [None]
    caller: list[asyncio.Task[Any] | None] = [None]
    drive = green._drive

    def counted_drive(child: Any, value: Any = None, error: BaseException | None = None) -> None:
        """`store.green._drive`, which runs a call up to its next await: count each await."""
        drive(child, value, error)
        if caller[0] is not None and not child.dead:
            if waits[0] == cancel_at[0]:
                caller[0].cancel()
            waits[0] += 1

    monkeypatch.setattr(green, "_drive", counted_drive)

    async def once(name: str, pin: int, k: int | None) -> bool:
        """Op ``name``, its caller cancelled at its ``k``-th await (None: never); whether it was."""
        async with AsyncStore.from_config(cached_raw, io="native") as s:
            await s.get(board)  # (the connections opened before the op, counted apart)
            waits[0], cancel_at[0] = 0, k
            caller[0] = asyncio.create_task(ops[name](s, pin))
            try:
                await caller[0]
            except asyncio.CancelledError:
                return True
            finally:
                caller[0] = None
        return False

    for name in ops:
        assert not run(once(name, fresh_pin(name), None))
        total = waits[0]
        assert total >= 2, (name, total)
        for k in range(total):
            pin = fresh_pin(name)
            before = w.applied
            cancelled = run(once(name, pin, k))  # (`async with` waits for the call's end)
            # A reply already there when it is read costs no wait: a run may wait fewer times.
            assert cancelled or waits[0] <= k, (name, k, waits[0])
            with Store.from_config(_uncached(cached_raw)) as store:
                _check_pairs(store, board, [pin])
                assert store.get(counter) == {"n": w.applied}, (name, k)
            assert w.applied - before == (1 if name == "update" else 0), (name, k)
        print(f"{name}: its caller cancelled at each of its {total} awaits")


def test_a_store_used_by_threads_first_gives_native_calls_only_the_loop_s_sockets(
    cached_raw: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `Store` used by plain code first (its pools then hold blocking sockets), then driven
    natively (`AsyncStore.from_store(..., io="native")`): the native calls never wait for a reply on
    a blocking socket, which would hold the loop at each reply (or stall it, waiting for a lock
    another call on the loop holds); the one write such a socket still sees in a native call is
    the driver's goodbye as it is closed. MariaDB connections, memcached clients and Redis connections
    opened outside the loop are replaced by the loop's own as native calls take them; plain code
    may use the loop's afterwards."""
    store = Store.from_config(cached_raw)
    board = store.create("board", {}, shard=1)  # MySQL001A
    pins = [store.create("pin", {"i": i}, shard=5) for i in range(3)]  # MySQL002A
    for p in pins:
        store.link(BHP, board, p)
    assert store.board_pins(board).ids  # (the caches filled: memcached and Redis sockets opened)
    ctx = store.admin_context()

    def sockets() -> list[type]:
        kinds = [type(c.raw._sock) for pool in ctx.engines.pools().values() for c in pool.idle_connections()]
        for server in ctx.caches.objects.store.servers:  # type: ignore[union-attr]
            kinds += [type(c.sock) for c in server._idle if c.sock is not None]
        lists = ctx.caches.lists.backend  # type: ignore[union-attr]
        for backend in getattr(lists, "servers", [lists]):
            kinds += [type(c._sock) for c in backend._idle if c._sock is not None]
        return kinds

    assert socket.socket in sockets()
    native = AsyncStore.from_store(store, io="native")
    # Every read of a plain (blocking) socket, and whether it was inside a native call. `GreenSocket`
    # has its own of these methods; PyMySQL, memcached and Redis reach a plain one's through these.
    uses: list[tuple[str, bool]] = []
    for name in ("recv", "recv_into"):
        plain = getattr(socket.socket, name)

        def spy(self: socket.socket, *args: Any, _plain: Any = plain, _name: str = name) -> Any:
            if type(self) is socket.socket:  # (not a GreenSocket's own call of its base's method)
                uses.append((_name, green.active()))
            return _plain(self, *args)

        monkeypatch.setattr(socket.socket, name, spy)

    async def main() -> None:
        for p in pins:
            await native.unlink(BHP, board, p)
            await native.link(BHP, board, p)
        page = await native.board_pins(board)
        assert sorted(page.ids) == sorted(pins)
        assert green.GreenSocket in sockets()

    run(main())
    assert not [u for u in uses if u[1]], uses  # no blocking socket used by a native call
    uses.clear()
    store.get(pins[0])
    assert uses or green.GreenSocket in sockets()  # (the spy sees plain code's sockets)
    assert store.count(BHP, board) == 3  # plain code on the loop's sockets
    assert sorted(store.links(BHP, board)) == sorted(pins)
    monkeypatch.undo()
    run(native.aclose())


def test_get_many_of_hundreds_of_ids(cached_raw: dict[str, Any]) -> None:
    async def main() -> None:
        async with AsyncStore.from_config(cached_raw) as s:
            ids = list(await asyncio.gather(*(s.create("pin", {"i": i}) for i in range(400))))
            missing = [encode_pinterest(k % 8, 1, 900_000 + k) for k in range(20)]
            await s.delete(ids[0])
            want = {p: {"i": i} for i, p in enumerate(ids) if i}
            assert await s.get_many([*ids, *missing]) == want
            assert await s.get_many([*ids, *missing]) == want  # warm: from memcached
            halves = await asyncio.gather(s.get_many(ids[:200]), s.get_many(iter(ids[200:])))
            assert halves[0] | halves[1] == want

    run(main())


# -- forks ----------------------------------------------------------------------


def _child(pin: int, s: AsyncStore, parent_executor: Any, out: Any) -> None:
    async def main() -> None:
        got = await s.get(pin)
        await s.update(pin, lambda o: {**o, "child": True})
        out.put((got, s._executor is not None and s._executor is not parent_executor))
        await s.aclose()

    asyncio.run(main())


def test_a_child_of_a_fork_gets_its_own_executor(tmp_path: Path) -> None:
    raw = sqlite_config(tmp_path)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()

    async def before() -> tuple[AsyncStore, int, Any]:
        s = AsyncStore.from_config(raw, max_workers=2)
        pin = await s.create("pin", {"n": 1})
        assert await s.get(pin) == {"n": 1}
        return s, pin, s._executor

    s, pin, parent_executor = run(before())
    proc = ctx.Process(target=_child, args=(pin, s, parent_executor, out))
    proc.start()
    got, fresh = out.get(timeout=30)
    proc.join(30)
    assert proc.exitcode == 0
    assert got == {"n": 1}
    assert fresh

    async def after() -> None:
        assert s._executor is parent_executor  # the parent's is untouched
        assert await s.get(pin) == {"n": 1, "child": True}
        await s.aclose()

    run(after())
