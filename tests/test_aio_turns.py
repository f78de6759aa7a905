"""`AsyncStore(io="native", max_workers=N)`: at most N calls run at once on a loop, the others
waiting their turn in order before they start; a caller cancelled while it waits never starts,
and no turn is lost. Without ``max_workers`` there is no cap. On the MariaDB test server: each
call is a real `get` (its socket waits the loop's), wrapped to count the calls running at once
and to hold each a moment (a sleep of the loop's, so that the others could run meanwhile).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from store import StoreConfig, green
from store.aio import AsyncStore
from tests.conftest import mariadb_config


class _Counted:
    """Wraps a store's ``get``: records the order calls start in and the most running at once."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.running = 0
        self.most = 0
        self.started: list[int] = []

    def __call__(self, id_: int, *, type_name: str | None = None, tag: int = 0) -> Any:
        self.running += 1
        self.most = max(self.most, self.running)
        self.started.append(tag)
        try:
            green.sleep(0.01)
            return self.real(id_, type_name=type_name)
        finally:
            self.running -= 1


def _counted(s: AsyncStore) -> _Counted:
    counted = _Counted(s._store.get)
    s._store.get = counted  # type: ignore[method-assign]
    return counted


@pytest.mark.parametrize("cap", [1, 3, None])
def test_at_most_max_workers_calls_run_at_once_in_order(mariadb_ready: StoreConfig, cap: int | None) -> None:
    async def main() -> None:
        async with AsyncStore.from_config(mariadb_config(), io="native", max_workers=cap) as s:
            oid = await s.create("board", {"n": 1})
            counted = _counted(s)
            got = await asyncio.gather(*(s._run(s._store.get, oid, tag=i) for i in range(12)))
            assert got == [{"n": 1}] * 12
            assert counted.most == (12 if cap is None else cap)
            assert counted.started == list(range(12))  # first come, first served
            if cap is not None:
                turns = s._turns[asyncio.get_running_loop()]
                assert (turns.free, len(turns.waiting)) == (cap, 0)

    asyncio.run(main())


def test_a_caller_cancelled_while_it_waits_never_starts_and_loses_no_turn(mariadb_ready: StoreConfig) -> None:
    async def main() -> None:
        async with AsyncStore.from_config(mariadb_config(), io="native", max_workers=1) as s:
            oid = await s.create("board", {"n": 1})
            counted = _counted(s)
            first = asyncio.ensure_future(s._run(s._store.get, oid, tag=0))
            waiting = [asyncio.ensure_future(s._run(s._store.get, oid, tag=i)) for i in (1, 2, 3)]
            await asyncio.sleep(0.001)  # the first runs; the others wait for its turn
            waiting[0].cancel()
            assert await first == {"n": 1}
            assert await asyncio.gather(*waiting[1:]) == [{"n": 1}] * 2
            with pytest.raises(asyncio.CancelledError):
                await waiting[0]
            assert counted.started == [0, 2, 3]
            assert await asyncio.gather(s.get(oid), s.get(oid)) == [{"n": 1}] * 2
            turns = s._turns[asyncio.get_running_loop()]
            assert (turns.free, len(turns.waiting)) == (1, 0)

    asyncio.run(main())


def test_a_turn_handed_to_a_caller_cancelled_before_it_starts_goes_to_the_next() -> None:
    """The turn is given (the call before ended) and, in the same turn of the loop, its caller is
    cancelled: it never starts, and the turn passes to the caller after it."""
    from store.aio import _Turns

    async def main() -> None:
        loop = asyncio.get_running_loop()
        turns = _Turns(1)
        await turns.take(loop)  # the running call's turn
        second = asyncio.ensure_future(turns.take(loop))
        third = asyncio.ensure_future(turns.take(loop))
        await asyncio.sleep(0)  # both wait
        turns.give()  # the running call ends: the turn is the second's
        second.cancel()  # ... which is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await second
        await asyncio.wait_for(third, 1)  # the turn went on
        assert (turns.free, len(turns.waiting)) == (0, 0)
        turns.give()
        assert turns.free == 1

    asyncio.run(main())
