"""The mix benchmark's peer (SQLAlchemy's ShardedSession) against direct reads of the MariaDB rows."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from store import StoreConfig
from store.admin import init_shards
from store.tools.mix.peer import ShardedPeer, local_of, make_id, shard_of, type_of
from store.tools.mix.system import MixSchema, System
from tests.conftest import MARIADB_URL, base_config, one_run_at_a_time, require_port, root_sql

pytestmark = pytest.mark.mariadb

#: The peer's shards: four of their own (it keeps no counts table, so shards other tests
#: check for count drift must not hold its rows). Shard i of the tests below is BASE + i.
BASE = 3000

SCHEMA = MixSchema(
    hosts={"A": MARIADB_URL, "B": MARIADB_URL},
    masters={BASE: "A", BASE + 1: "A", BASE + 2: "B", BASE + 3: "B"},
    types={"pin": (1, "pins"), "board": (2, "boards"), "user": (3, "users")},
    relations={
        "board_has_pins": ("board", "pin", "pin_owned_by_board"),
        "pin_owned_by_board": ("pin", "board", None),
        "users_likes_pins": ("user", "pin", "pin_liked_by_user"),
        "pin_liked_by_user": ("pin", "user", None),
    },
)


@pytest.fixture(scope="module", autouse=True)
def _one_mix_at_a_time() -> Iterator[None]:
    """The mix has no namespace: it uses shards 3000-3003 of the shared MariaDB and the caches of its
    config; two test runs at once take turns here."""
    with one_run_at_a_time("mix-peer"):
        yield


def near(shard: int) -> int:
    """An ID on the test's shard ``shard`` (what ``add_node`` places the new object beside)."""
    return make_id(BASE + shard, 0, 0)


@pytest.fixture(scope="module")
def peer() -> Iterator[ShardedPeer]:
    """The peer on shards BASE..BASE+3 (two under host name A, two under B), made if missing."""
    require_port("MariaDB", 3306)
    init_shards(
        StoreConfig.from_dict(
            base_config(
                shards=4096,
                hosts=SCHEMA.hosts,
                map=[{"range": [0, BASE + 1], "master": "A"}, {"range": [BASE + 2, 4095], "master": "B"}],
            )
        ),
        shards=range(BASE, BASE + 4),
    )
    p = ShardedPeer(SCHEMA, pool_size=4)
    try:
        yield p
    finally:
        p.close()


sql = root_sql


def object_row(id_: int) -> tuple[dict[str, Any], int] | None:
    """(data, active) of the object's row, or None."""
    table = {type_id: table for type_id, table in SCHEMA.types.values()}[type_of(id_)]
    rows = sql(
        f"SELECT data, active FROM {SCHEMA.database(shard_of(id_))}.{table} WHERE local_id = %s",
        local_of(id_),
    )
    return (json.loads(rows[0][0]), rows[0][1]) if rows else None


def pairs(relation: str, from_id: int) -> list[tuple[int, int]]:
    """(to_id, sequence) of ``from_id``'s rows on its shard, in (sequence, to_id) order."""
    rows = sql(
        f"SELECT to_id, sequence FROM {SCHEMA.database(shard_of(from_id))}.{relation} "
        "WHERE from_id = %s ORDER BY sequence, to_id",
        from_id,
    )
    return [(int(t), int(s)) for t, s in rows]


def test_peer_is_a_system(peer: ShardedPeer) -> None:
    system: System = peer
    assert system.name == "horizontal_shard"
    system.flush()  # no cache: nothing to do, and it must not fail


def test_objects_live_where_their_ids_say_on_both_host_names(peer: ShardedPeer) -> None:
    board = peer.add_node("board", {"name": "kitchen", "é": "ü"}, near(1))  # host A
    pin = peer.add_node("pin", {"title": "granite", "n": 1}, near(3))  # host B
    assert (shard_of(board), type_of(board)) == (BASE + 1, 2)
    assert (shard_of(pin), type_of(pin)) == (BASE + 3, 1)
    assert object_row(board) == ({"name": "kitchen", "é": "ü"}, 1)
    assert object_row(pin) == ({"title": "granite", "n": 1}, 1)
    assert peer.get_node(board) == {"name": "kitchen", "é": "ü"}
    assert peer.get_node(pin) == {"title": "granite", "n": 1}

    peer.update_node(pin, {"n": 2, "extra": [1, 2]})
    assert object_row(pin) == ({"title": "granite", "n": 2, "extra": [1, 2]}, 1)
    assert peer.get_node(pin) == {"title": "granite", "n": 2, "extra": [1, 2]}

    peer.delete_node(pin)
    assert object_row(pin) == ({"title": "granite", "n": 2, "extra": [1, 2]}, 0)
    assert peer.get_node(pin) is None
    peer.update_node(pin, {"n": 3})  # deleted: a no-op
    assert object_row(pin) == ({"title": "granite", "n": 2, "extra": [1, 2]}, 0)

    absent = make_id(BASE + 2, 1, (1 << 36) - 1)
    assert peer.get_node(absent) is None
    peer.update_node(absent, {"n": 1})
    peer.delete_node(absent)
    assert object_row(absent) is None
    assert peer.get_node(board) == {"name": "kitchen", "é": "ü"}  # untouched


def test_board_page_is_in_list_order_and_skips_deleted_pins(peer: ShardedPeer) -> None:
    board = peer.add_node("board", {"name": "page"}, near(2))
    pins = [peer.add_node("pin", {"i": i}, near(i % 4)) for i in range(6)]  # every shard, both hosts
    sequences = [30, 10, 20, 10, 40, 50]  # two at 10: their to_ids break the tie
    for pin, seq in zip(pins, sequences, strict=True):
        peer.add_link("board_has_pins", board, pin, seq)
    order = [t for t, _ in pairs("board_has_pins", board)]
    assert order == sorted(pins, key=lambda p: (sequences[pins.index(p)], p))

    page = peer.board_page(board, 10)
    assert page == [(p, {"i": pins.index(p)}) for p in order]
    assert peer.link_ids("board_has_pins", board, 4) == order[:4]
    assert peer.board_page(board, 3) == [(p, {"i": pins.index(p)}) for p in order[:3]]

    gone = order[1]
    peer.delete_node(gone)
    assert peer.board_page(board, 3) == [
        (p, {"i": pins.index(p)}) for p in (order[0], order[2])
    ]  # short page
    assert peer.board_page(board, 10) == [(p, {"i": pins.index(p)}) for p in order if p != gone]
    assert gone in peer.link_ids("board_has_pins", board, 10)  # the peer does not clean lists
    assert peer.count_links("board_has_pins", board) == 6

    empty = peer.add_node("board", {"name": "empty"}, near(0))
    assert peer.board_page(empty, 10) == []
    assert peer.link_ids("board_has_pins", empty, 10) == []
    assert peer.count_links("board_has_pins", empty) == 0


def test_links_and_their_inverses(peer: ShardedPeer) -> None:
    board = peer.add_node("board", {}, near(0))  # host A
    far = peer.add_node("pin", {}, near(3))  # host B
    same = peer.add_node("pin", {}, near(0))  # the board's shard: both sides in one transaction

    peer.add_link("board_has_pins", board, far, 5)
    peer.add_link("board_has_pins", board, same, 6)
    assert pairs("board_has_pins", board) == [(far, 5), (same, 6)]
    assert pairs("pin_owned_by_board", far) == [(board, 5)]
    assert pairs("pin_owned_by_board", same) == [(board, 6)]
    assert peer.count_links("board_has_pins", board) == 2
    assert peer.count_links("pin_owned_by_board", far) == 1
    assert peer.has_link("board_has_pins", board, far)
    assert peer.has_link("pin_owned_by_board", far, board)
    assert not peer.has_link("board_has_pins", far, board)

    peer.add_link("board_has_pins", board, far, 99)  # exists: keeps its place
    assert pairs("board_has_pins", board) == [(far, 5), (same, 6)]
    assert pairs("pin_owned_by_board", far) == [(board, 5)]

    peer.update_link("board_has_pins", board, far, 7)  # moves both sides
    assert pairs("board_has_pins", board) == [(same, 6), (far, 7)]
    assert pairs("pin_owned_by_board", far) == [(board, 7)]
    assert peer.link_ids("board_has_pins", board, 10) == [same, far]

    peer.delete_link("board_has_pins", board, far)
    assert pairs("board_has_pins", board) == [(same, 6)]
    assert pairs("pin_owned_by_board", far) == []
    assert not peer.has_link("board_has_pins", board, far)
    assert not peer.has_link("pin_owned_by_board", far, board)
    peer.delete_link("board_has_pins", board, far)  # already gone: a no-op

    peer.update_link("board_has_pins", board, far, 3)  # absent: added, inverse too
    assert pairs("board_has_pins", board) == [(far, 3), (same, 6)]
    assert pairs("pin_owned_by_board", far) == [(board, 3)]

    peer.delete_link("board_has_pins", board, same)
    assert pairs("board_has_pins", board) == [(far, 3)]
    assert pairs("pin_owned_by_board", same) == []


def test_relation_without_inverse_and_a_second_pair(peer: ShardedPeer) -> None:
    user = peer.add_node("user", {"name": "u"}, near(2))
    pin = peer.add_node("pin", {}, near(1))
    peer.add_link("users_likes_pins", user, pin, 1)
    assert pairs("users_likes_pins", user) == [(pin, 1)]
    assert pairs("pin_liked_by_user", pin) == [(user, 1)]

    board = peer.add_node("board", {}, near(3))
    peer.add_link("pin_owned_by_board", pin, board, 4)  # no inverse: one row only
    assert pairs("pin_owned_by_board", pin) == [(board, 4)]
    assert pairs("board_has_pins", board) == []
    peer.update_link("pin_owned_by_board", pin, board, 8)
    assert pairs("pin_owned_by_board", pin) == [(board, 8)]
    assert pairs("board_has_pins", board) == []
    peer.delete_link("pin_owned_by_board", pin, board)
    assert pairs("pin_owned_by_board", pin) == []
    assert pairs("pin_liked_by_user", pin) == [(user, 1)]  # the other relation is untouched


def test_update_node_from_many_threads_loses_nothing(peer: ShardedPeer) -> None:
    # Each call merges one new key: without the row lock, concurrent read-modify-writes of the
    # JSON would overwrite each other's keys.
    pin = peer.add_node("pin", {"title": "counter"}, near(3))
    threads_n, rounds = 8, 25
    errors: list[BaseException] = []

    def bump(worker: int) -> None:
        try:
            for i in range(rounds):
                peer.update_node(pin, {f"w{worker}.{i}": i})
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=bump, args=(w,)) for w in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    expected = {"title": "counter"} | {f"w{w}.{i}": i for w in range(threads_n) for i in range(rounds)}
    assert object_row(pin) == (expected, 1)
    assert peer.get_node(pin) == expected
