"""A delete's sweep of the deleted object's lists: each page's pairs removed as a batch.

`Store.delete` takes the object out of every list that reaches it through an
inverse, a page of its lists at a time, each page's pairs unlinked as
`unlink_many` unlinks them: grouped by the hosts of their two sides, a few
requests per group, not two or three per pair. On SQLite and MariaDB (with
and without caches) and PostgreSQL with Instagram IDs; the requests are
counted on MariaDB and PostgreSQL without caches, as `tests/test_round_trips.py`
counts them. A sweep step refused by a moved shard runs again for the pairs
it had not removed yet, and every count stays exact.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from store import Store
from store.exceptions import ShardMovedError
from store.relations import REMOVE_CHUNK
from store.relations.bulk import BulkPairs
from store.tools.mix.runner import counting_sends, reset_sends, sends

BHP = "board_has_pins"
POB = "pin_owned_by_board"
LIKES = "users_likes_pins"
LIKED = "pin_liked_by_user"
R = TypeVar("R")


@pytest.fixture(params=["sqlite", "mariadb", "mariadb-cached", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    """SQLite, MariaDB without and with caches, and PostgreSQL with Instagram IDs."""
    return str(request.param)


def two_hosts(store: Store) -> tuple[int, int]:
    """A shard on the first host and one on the second (each config here has two host names)."""
    return (1, 9) if store.config.ids == "instagram" else (1, 5)


def counted(backend: str) -> bool:
    """Whether requests are counted on ``backend``: MariaDB or PostgreSQL without cache servers
    (whose requests would be counted too)."""
    return backend in ("mariadb", "postgres")


def trips(call: Callable[[], Any]) -> tuple[Any, int]:
    """``call()`` and the requests it sent to the databases."""
    with counting_sends():
        reset_sends()
        out = call()
        return out, sends()


def test_deleting_a_board_removes_its_pins_a_page_at_a_time_in_a_few_requests(
    store: Store, backend: str
) -> None:
    """150 pins on a board, half on its host and half on the other: both sides and every count exact
    after the delete, in a few requests (it took two or three per pin, one pair at a time)."""
    near, far = two_hosts(store)
    board = store.create("board", {}, shard=near)
    other = store.create("board", {}, shard=far)
    pins = store.create_many("pin", [{"p": i} for i in range(75)], shard=near)
    pins += store.create_many("pin", [{"p": i} for i in range(75, 150)], shard=far)
    assert store.link_many(BHP, [(board, p) for p in pins]) == 150
    assert store.link_many(BHP, [(other, p) for p in pins[::10]]) == 15
    gone, n = trips(lambda: store.delete(board, type_name="board"))
    assert gone is True
    if counted(backend):
        # The mark, the read of its lists, then per group of pairs (the board's host and each
        # pin host) two requests on one host, three across two: 8 on MariaDB, 7 on PostgreSQL
        # (377 on both when each pair was a step of its own).
        assert n <= 8, n
    assert (store.links(BHP, board), store.count(BHP, board)) == ([], 0)
    assert sorted(store.links(BHP, other)) == sorted(pins[::10])
    assert store.count(BHP, other) == 15
    for p in pins:
        assert store.links(POB, p) == ([other] if p in pins[::10] else [])
        assert store.count(POB, p) == (1 if p in pins[::10] else 0)
    assert store.delete(board, type_name="board") is False  # again: nothing left, nothing fails


def test_deleting_a_pin_removes_the_pairs_of_both_its_relations_in_one_batch(
    store: Store, backend: str
) -> None:
    """A pin on boards on both hosts and liked by users on both: the first page of each of its lists
    is read in the mark's request (no step of its own) and goes in one step, the pairs of both
    relations grouped together by their hosts."""
    near, far = two_hosts(store)
    pin = store.create("pin", {}, shard=far)
    keep = store.create("pin", {}, shard=far)
    boards = [
        store.create("board", {"i": i}, shard=s) for i, s in enumerate([near, near + 1, far, far + 1] * 3)
    ]
    users = [store.create("user", {"i": i}, shard=s) for i, s in enumerate([near, far + 1] * 4)]
    store.link_many(BHP, [(b, pin) for b in boards] + [(boards[0], keep)])
    store.link_many(LIKES, [(u, pin) for u in users] + [(users[1], keep)])
    steps: list[str] = []
    ctx = store.admin_context()
    assert ctx.steps is not None
    ctx.steps.hook = steps.append
    try:
        gone, n = trips(lambda: store.delete(pin, type_name="pin"))
    finally:
        ctx.steps.hook = None
    assert gone is True
    assert steps.count("read lists") == 0
    assert steps.count("sweep") == 1
    if counted(backend):
        assert n <= 7, n  # (52 pair by pair; 8 with the first pages read after the mark)
    assert (store.links(POB, pin), store.count(POB, pin)) == ([], 0)
    assert (store.links(LIKED, pin), store.count(LIKED, pin)) == ([], 0)
    assert [store.links(BHP, b) for b in boards] == [[keep]] + [[]] * (len(boards) - 1)
    assert [store.count(BHP, b) for b in boards] == [1] + [0] * (len(boards) - 1)
    assert [store.links(LIKES, u) for u in users] == [[], [keep]] + [[]] * (len(users) - 2)
    assert [store.count(LIKES, u) for u in users] == [0, 1] + [0] * (len(users) - 2)
    assert store.links(POB, keep) == [boards[0]]
    assert store.links(LIKED, keep) == [users[1]]


@pytest.mark.parametrize("backend", ["sqlite", "mariadb"], indirect=True)
def test_a_longer_list_is_a_read_and_a_sweep_step_per_page(store: Store) -> None:
    near, far = two_hosts(store)
    board = store.create("board", {}, shard=near)
    pins = store.create_many("pin", [{"p": i} for i in range(REMOVE_CHUNK + 30)], shard=far)
    store.link_many(BHP, [(board, p) for p in pins])
    steps: list[str] = []
    ctx = store.admin_context()
    assert ctx.steps is not None
    ctx.steps.hook = steps.append
    try:
        assert store.delete(board, type_name="board") is True
    finally:
        ctx.steps.hook = None
    # The first page is read with the mark; the next is a step of its own.
    assert [s for s in steps if s in ("read lists", "sweep")] == ["sweep", "read lists", "sweep"]
    assert (store.links(BHP, board), store.count(BHP, board)) == ([], 0)
    assert all(store.count(POB, p) == 0 for p in pins)


@pytest.mark.parametrize("backend", ["sqlite", "mariadb-cached"], indirect=True)
def test_a_sweep_refused_after_a_committed_group_runs_again_for_the_rest_only(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second group of a sweep is refused (as by a moved shard) after the first committed: the
    step runs again alone, for the pairs left; each pair is removed once and counted once."""
    near, far = two_hosts(store)
    board = store.create("board", {}, shard=near)
    pins = store.create_many("pin", [{"p": i} for i in range(5)], shard=near)
    pins += store.create_many("pin", [{"p": i} for i in range(5, 12)], shard=far)
    store.link_many(BHP, [(board, p) for p in pins])
    for p in pins:  # cached lists, for the sweep to keep right
        assert store.links(POB, p) == [board]
    assert store.links(BHP, board, limit=100) != []
    groups: list[int] = []
    real = BulkPairs._unlink_group

    def refused_once(self: BulkPairs, group: list[Any], pending: list[Any] | None = None) -> int:
        groups.append(len(group))
        if len(groups) == 2:
            raise ShardMovedError("moved (a test's refusal)", shard=near, host="A")
        return real(self, group, pending)

    monkeypatch.setattr(BulkPairs, "_unlink_group", refused_once)
    ctx = store.admin_context()
    assert ctx.steps is not None

    def again(call: Callable[[], R]) -> R:
        """`LiveMap.step` after a newer map: the refused step runs again, alone."""
        try:
            return call()
        except ShardMovedError:
            return call()

    monkeypatch.setattr(ctx.steps, "_reroute", again)
    assert store._bulk_pairs.remove_object("board", board) == 12  # the sweep, as delete runs it
    assert len(groups) == 3
    assert groups[0] + groups[1] == 12
    assert groups[2] == groups[1]  # the refused group again, not the committed one
    assert (store.links(BHP, board), store.count(BHP, board)) == ([], 0)
    assert all((store.links(POB, p), store.count(POB, p)) == ([], 0) for p in pins)


def test_an_unlink_that_one_connection_reaches_is_one_request(store: Store, backend: str) -> None:
    """Both sides on one host: both deletes, their counts and the COMMIT go in one request (nothing
    waits on what they found)."""
    near, far = two_hosts(store)
    board = store.create("board", {}, shard=near)
    here = store.create("pin", {}, shard=near)
    there = store.create("pin", {}, shard=far)
    store.link_many(BHP, [(board, here), (board, there)])
    gone, n = trips(lambda: store.unlink(BHP, board, here))
    assert gone is True
    if counted(backend):
        assert n == 1, n
    gone, n = trips(lambda: store.unlink(BHP, board, here))  # again: nothing there, still one
    assert gone is False
    if counted(backend):
        assert n == 1, n
    assert (store.links(BHP, board), store.count(BHP, board)) == ([there], 1)
    assert (store.links(POB, here), store.count(POB, here)) == ([], 0)
    assert (store.links(POB, there), store.count(POB, there)) == ([board], 1)
    assert store.unlink(BHP, board, there) is True
    assert (store.links(BHP, board), store.count(BHP, board)) == ([], 0)
    assert (store.links(POB, there), store.count(POB, there)) == ([], 0)
