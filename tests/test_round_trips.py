"""Round trips of the write path on MariaDB, counted on the sockets (the property, not a timing).

A new pair with its inverse on another host: BEGIN goes with each side's
first statement, the object read is inside each insert, and the count
updates go with the COMMITs: 4 requests to the databases. On one host (a
pin on its board's shard): 3. A move: 4; an unlink: 4; an update: 2. Warm
pools, no cache.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store import Store, StoreConfig
from store_tools.mix.runner import counting_sends, reset_sends, sends

pytestmark = pytest.mark.mariadb

BHP = "board_has_pins"


@pytest.fixture
def store(mariadb_ready: StoreConfig) -> Iterator[Store]:
    s = Store(mariadb_ready)
    try:
        yield s
    finally:
        s.close()


def trips(call: object) -> int:
    assert callable(call)
    with counting_sends():
        reset_sends()
        call()
        return sends()


def test_link_writes_take_few_round_trips(store: Store) -> None:
    board = store.create("board", {"name": "b"}, shard=1)  # host MySQL001A
    here = store.create("pin", {"n": 1}, near=board)  # the board's shard
    there = store.create("pin", {"n": 2}, shard=5)  # host MySQL002A: another pool
    # warm both pools and the statement caches
    warm = store.create("pin", {"n": 3}, shard=5)
    store.link(BHP, board, warm)
    store.unlink(BHP, board, warm)

    assert trips(lambda: store.link(BHP, board, there)) == 4
    assert trips(lambda: store.link(BHP, board, here)) == 3
    assert trips(lambda: store.link(BHP, board, there, sequence=1 << 40)) == 4
    assert trips(lambda: store.unlink(BHP, board, there)) == 4
    # and the rows and counts are right on both sides
    assert trips(lambda: store.update(here, {"n": 5})) == 2  # BEGIN + read for update; UPDATE + COMMIT
    assert store.get(here) == {"n": 5}
    assert store.links(BHP, board) == [here]
    assert store.count(BHP, board) == 1
    assert store.links("pin_owned_by_board", there) == []
    assert store.count("pin_owned_by_board", here) == 1
