"""Pages with their objects for any relation: `Store.page_objects` and `Store.pages_objects_many`.

On SQLite (with the in-process caches), MariaDB with memcached and Redis,
and PostgreSQL with Instagram IDs: gone objects are skipped and pages filled,
``since``/``until`` as for `page`, the cursors shared with `page`, and
`board_pins` / `board_pins_many` the same calls for ``board_has_pins``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from store import CursorError, LimitError, Page, Store, StoreConfig, UnknownRelationError

BHP = "board_has_pins"
OWNS = "users_has_pins"  # no inverse: a deleted pin's entries stay in the list
POB = "pin_owned_by_board"


@pytest.fixture(params=["sqlite-memory", "mariadb-cached", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    """SQLite with caches, MariaDB with memcached and Redis, PostgreSQL with Instagram IDs."""
    return str(request.param)


@pytest.fixture
def s(config: StoreConfig) -> Iterator[Store]:
    with Store(config) as store:
        yield store


def walk(store: Store, relation: str, from_id: int, first: Page, **kw: Any) -> tuple[list[int], list[Any]]:
    """Every ID and object from ``first`` on, following cursors with `page_objects`."""
    ids, objects = list(first.ids), list(first.objects)
    cursor = first.next_cursor
    while cursor is not None:
        page = store.page_objects(relation, from_id, cursor=cursor, **kw)
        ids += page.ids
        objects += page.objects
        cursor = page.next_cursor
    return ids, objects


def test_a_users_pins_skip_gone_pins_and_fill_pages(s: Store) -> None:
    user = s.create("user", {"name": "ada"})
    pins = [s.create("pin", {"k": k}, near=user) for k in range(12)]
    for k, p in enumerate(pins):
        s.link(OWNS, user, p, sequence=10 * k)
    for p in pins[1:8]:  # seven gone in a row: the first page reads past them
        s.delete(p, type_name="pin")
    live = [p for k, p in enumerate(pins) if not 1 <= k < 8]
    for _round in ("cold", "warm"):
        first = s.page_objects(OWNS, user, limit=3)
        assert first.ids == live[:3]
        assert first.objects == [{"k": k} for k in (0, 8, 9)]
        ids, objects = walk(s, OWNS, user, first, limit=3)
        assert ids == live
        assert objects == [s.get(p, type_name="pin") for p in live]
        newest = s.page_objects(OWNS, user, limit=2, newest_first=True)
        assert newest.ids == live[::-1][:2]
        assert walk(s, OWNS, user, newest, limit=2, newest_first=True)[0] == live[::-1]
    # since <= sequence < until, as page() reads it; the cursor keeps the range
    ranged = s.page_objects(OWNS, user, limit=1, since=0, until=90)
    assert ranged.ids == [pins[0]]
    assert walk(s, OWNS, user, ranged, limit=1, since=0, until=90)[0] == [pins[0], pins[8]]
    with pytest.raises(CursorError):
        s.page_objects(OWNS, user, limit=1, cursor=ranged.next_cursor)
    # the cursors are page()'s: either call goes on with the other's
    plain = s.page(OWNS, user, limit=2)
    assert s.page_objects(OWNS, user, limit=50, cursor=plain.next_cursor).ids == [
        p for p in pins[2:] if p in live
    ]
    objs = s.page_objects(OWNS, user, limit=1)
    assert s.page(OWNS, user, limit=2, cursor=objs.next_cursor).ids == pins[1:3]


def test_the_inverse_and_many_lists(s: Store) -> None:
    boards = [s.create("board", {"b": i}, shard=i) for i in range(3)]
    pins = {b: [s.create("pin", {"b": i, "k": k}, near=b) for k in range(4)] for i, b in enumerate(boards)}
    for b, ps in pins.items():
        for p in ps:
            s.link(BHP, b, p)
    # the inverse side: a pin's boards, as board objects
    pin = pins[boards[0]][0]
    assert s.page_objects(POB, pin) == Page([boards[0]], None, [{"b": 0}])
    s.delete(pins[boards[1]][0], type_name="pin")
    many = s.pages_objects_many(BHP, iter(boards), limit=2)
    assert list(many) == boards
    for b in boards:
        assert many[b] == s.page_objects(BHP, b, limit=2)
        assert many[b] == s.board_pins(b, limit=2)
        live = [p for p in pins[b] if s.get(p, type_name="pin") is not None]
        assert walk(s, BHP, b, many[b], limit=2)[0] == live
    assert s.board_pins_many(boards, limit=2) == many
    assert s.pages_objects_many(BHP, boards, limit=2, newest_first=True) == {
        b: s.board_pins(b, limit=2, newest_first=True) for b in boards
    }
    assert s.pages_objects_many(BHP, []) == {}


def test_bad_input_is_refused(s: Store) -> None:
    board = s.create("board", {})
    with pytest.raises(UnknownRelationError):
        s.page_objects("board_has_cats", board)
    with pytest.raises(LimitError):
        s.page_objects(BHP, board, limit=0)
    with pytest.raises(LimitError):
        s.page_objects(BHP, board, since=5, until=4)
    with pytest.raises(CursorError):
        s.page_objects(BHP, board, cursor="nonsense")
    other = s.create("board", {})
    pin = s.create("pin", {}, near=other)
    s.link(BHP, other, pin)
    s.link(BHP, other, s.create("pin", {}, near=other))
    cursor = s.page_objects(BHP, other, limit=1).next_cursor
    assert cursor is not None
    with pytest.raises(CursorError):
        s.page_objects(BHP, board, cursor=cursor)
    with pytest.raises(UnknownRelationError):
        s.pages_objects_many("nope", [board])
