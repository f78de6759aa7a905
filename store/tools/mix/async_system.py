"""`store:async` in the mix: `store.aio.AsyncStore` driven by C tasks on one event loop.

Beside the threaded store and the floor: a phase of ``C`` tasks, each
replaying its own request stream (the streams T threads would replay),
awaiting one `AsyncStore`: its calls greenlets on the loop (``io="native"``,
the default here), or run by an executor of ``max_workers`` workers. The
phase's "threads" are its tasks. Calls are timed in wall time from the
task's side (queueing for a worker included); the per-call CPU time of a
task is not its own (tasks interleave on one thread), so only the phase's
process CPU time is kept. The after-run check and the round trips go
through the same store's sync methods (the async face runs the same
statements).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from store.aio import AsyncStore
from store.exceptions import ConfigError, NotFound
from store.store import Store
from store.tools.mix.dataset_db import Copy
from store.tools.mix.runner import OpSamples, Phase, _combined
from store.tools.mix.store_system import StoreSystem
from store.tools.mix.workload import MIX, PAGE, DataSet, Request, requests

__all__ = ["AsyncStoreSystem", "cache_faults", "connections_in_use", "event_loop_factory", "run_async_phase"]

T = TypeVar("T")


def connections_in_use(store: Store, *, restart: bool = False) -> int:
    """The most database connections the store had in use at once, summed over its pools (hosts),
    since the last ``restart=True`` (which starts each pool's count again from what it has now)."""
    pools = store.admin_context().engines.pools().values()
    if restart:
        for pool in pools:
            pool.peak_in_use = pool.in_use
        return 0
    return sum(pool.peak_in_use for pool in pools)


def cache_faults(store: Store) -> dict[str, int]:
    """The calls each of ``store``'s caches failed or skipped so far (`Store.stats`), by cache."""
    return {name: c.get("errors", 0) + c.get("skipped", 0) for name, c in store.stats().items()}


class AsyncStoreSystem(StoreSystem):
    """`AsyncStore` calls for the phases; the sync methods (check, round trips) are its store's."""

    def __init__(
        self,
        store: Store,
        *,
        name: str = "store:async",
        max_workers: int | None = None,
        io: str = "native",
        loop: str = "asyncio",
    ) -> None:
        super().__init__(store, name=name)
        self.astore = AsyncStore.from_store(store, max_workers=max_workers, io=io)
        #: Makes the event loop each phase runs on (`event_loop_factory`).
        self.new_loop = event_loop_factory(loop)

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """``main`` run to its end on a new event loop of this system's kind."""
        with asyncio.Runner(loop_factory=self.new_loop) as runner:
            return runner.run(main)

    def close(self) -> None:
        """`AsyncStore.aclose` (which closes the store)."""
        self.run(self.astore.aclose())


def event_loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new event loop of kind ``name``: ``asyncio`` (the standard library's) or
    ``uvloop`` (`ConfigError` naming the package to install where it is missing)."""
    if name == "asyncio":
        return asyncio.new_event_loop
    if name == "uvloop":
        try:
            import uvloop
        except ImportError as exc:
            raise ConfigError(
                "--async-loop uvloop needs the uvloop package: pip install 'shardstore[bench]'"
            ) from exc
        return uvloop.new_event_loop
    raise ConfigError(f"unknown event loop {name!r}: choose asyncio or uvloop")


async def _gone_is_none(call: Awaitable[Any]) -> None:
    """A write refused because its object is gone (`NotFound`) is an answer, as for `StoreSystem`."""
    with contextlib.suppress(NotFound):
        await call


def _acall(s: AsyncStore, data: DataSet, copy: Copy, r: Request) -> Callable[[], Awaitable[Any]]:
    """The coroutine for request ``r`` (as `store.tools.mix.runner`'s table of calls, on `AsyncStore`)."""
    op, kind = r.op, r.kind
    if op == "board_page":
        return lambda: s.board_pins(copy.boards[r.a], limit=PAGE)
    if op == "likes_page":
        return lambda: s.page(kind, copy.users[r.a], limit=PAGE)
    if op == "count_link":
        return lambda: s.count(kind, copy.boards[r.a])
    if op == "get_node":
        return lambda: s.get(copy.pins[r.a], type_name=kind)
    if op == "update_node":
        return lambda: _gone_is_none(s.update(copy.pins[r.a], {"n": r.value}, type_name=kind))
    if op == "delete_node":
        return lambda: s.delete(copy.pins[r.a], type_name=kind)
    if op == "add_node":
        board, obj = copy.boards[r.a], data.pin_data(r.a % data.shape.pins)

        async def add() -> None:
            copy.created.append(await s.create("pin", obj, near=board))

        return add
    from_id = copy.users[r.a] if kind == "users_likes_pins" else copy.boards[r.a]
    to_id = copy.pins[r.b]
    if op == "add_link":
        return lambda: _gone_is_none(s.link(kind, from_id, to_id))
    if op == "update_link":
        return lambda: _gone_is_none(s.link(kind, from_id, to_id, sequence=time.time_ns() // 1000))
    if op == "delete_link":
        return lambda: s.unlink(kind, from_id, to_id)
    if op == "get_link":
        return lambda: s.has_link(kind, from_id, to_id)
    raise ValueError(f"unknown operation {op!r}")


def run_async_phase(
    system: AsyncStoreSystem,
    data: DataSet,
    copy: Copy,
    *,
    tasks: int,
    temperature: str,
    seconds: float,
    requests_per_task: int | None,
    seed: int,
    tick: Callable[[float], None] | None = None,
) -> Phase:
    """One phase of ``tasks`` tasks on a new event loop; ``tick`` is told the elapsed fraction."""
    limit = requests_per_task if requests_per_task is not None else 1 << 62
    results: list[dict[str, OpSamples]] = [{op: OpSamples() for op in MIX} for _ in range(tasks)]

    async def one(t: int, stop: asyncio.Event) -> None:
        stream = requests(data, seed, t)
        mine = results[t]
        clock = time.perf_counter_ns
        n = 0
        while n < limit and not stop.is_set():
            r = next(stream)
            call = _acall(system.astore, data, copy, r)
            s = mine[r.op]
            w0 = clock()
            try:
                await call()
            except Exception as exc:
                s.errors += 1
                if not s.first_error:
                    s.first_error = f"{type(exc).__name__}: {exc}"[:300]
            s.wall_ns.append(clock() - w0)
            n += 1

    async def main() -> tuple[float, float]:
        stop = asyncio.Event()
        started, cpu0 = time.perf_counter(), time.process_time()
        running = [asyncio.create_task(one(t, stop)) for t in range(tasks)]
        if requests_per_task is None:
            while (elapsed := time.perf_counter() - started) < seconds:
                if tick is not None:
                    tick(elapsed / seconds)
                await asyncio.sleep(min(0.25, max(0.0, seconds - elapsed)))
            stop.set()
        await asyncio.gather(*running)
        return time.perf_counter() - started, time.process_time() - cpu0

    took, cpu_s = system.run(main())
    if tick is not None:
        tick(1.0)
    return Phase(system.name, tasks, temperature, took, cpu_s, _combined(results))
