"""The mix's answer check holds each system to what it promises of its caches.

Pure logic: the "database" here is a dict and the system a cache in front of it,
so the check's two passes can be driven into every case by hand.
"""

from __future__ import annotations

from typing import Any

from store.tools.mix.dataset_db import Copy
from store.tools.mix.runner import check_holding
from store.tools.mix.workload import Shape, make_data_set

DATA = make_data_set(Shape(users=20, boards_per_user=2, pins=200, likes_per_user=3))
COPY = Copy(
    users=[1_000 + u for u in range(DATA.shape.users)],
    boards=[2_000 + b for b in range(DATA.shape.boards)],
    pins=[10_000 + p for p in range(DATA.shape.pins)],
)


class Rows:
    """The database the check reads: each pin's object, each list's to_ids."""

    def __init__(self) -> None:
        self.pins = {COPY.pins[p]: DATA.pin_data(p) for p in range(DATA.shape.pins)}
        self.lists = {
            ("board_has_pins", COPY.boards[b]): [COPY.pins[p] for p in pins]
            for b, pins in enumerate(DATA.board_pins)
        }
        self.lists |= {
            ("users_likes_pins", COPY.users[u]): [COPY.pins[p] for p in likes]
            for u, likes in enumerate(DATA.user_likes)
        }

    def node(self, id_: int, type_name: str | None = None) -> dict[str, Any] | None:
        return self.pins.get(id_)

    def rows(self, relation: str, from_id: int) -> list[int]:
        return list(self.lists.get((relation, from_id), []))

    def live(self, ids: list[int], type_name: str) -> dict[int, dict[str, Any]]:
        return {i: self.pins[i] for i in ids if i in self.pins}


class Cached:
    """A system answering from a cache filled from ``Rows``; ``planted`` entries are what it cached."""

    name = "cached"
    fills_pages = False

    def __init__(self, db: Rows, *, races: bool) -> None:
        self.db = db
        self.fills_race_writes = races
        self.cache: dict[int, dict[str, Any]] = {}
        self.flushed = 0

    def get_node(self, id_: int, type_name: str | None = None) -> dict[str, Any] | None:
        if id_ not in self.cache and (row := self.db.node(id_)) is not None:
            self.cache[id_] = row
        return self.cache.get(id_)

    def board_page(self, board_id: int, limit: int) -> list[tuple[int, dict[str, Any]]]:
        return [(i, self.db.pins[i]) for i in self.db.rows("board_has_pins", board_id)[:limit]]

    def link_ids(self, relation: str, from_id: int, limit: int) -> list[int]:
        return self.db.rows(relation, from_id)[:limit]

    def count_links(self, relation: str, from_id: int) -> int:
        return len(self.db.rows(relation, from_id))

    def flush(self) -> None:
        self.flushed += 1
        self.cache.clear()


def _check(system: Cached, db: Rows) -> Any:
    return check_holding(system, db, DATA, COPY, seed=7, empty=system.flush)  # type: ignore[arg-type]


def _stale_everywhere(system: Cached) -> None:
    """Cache an old version of every pin, as fills that raced writes would."""
    for p in COPY.pins:
        system.cache[p] = {"old": True}


def test_a_system_that_answers_the_rows_is_checked_once() -> None:
    db = Rows()
    for races in (False, True):
        system = Cached(db, races=races)
        check = _check(system, db)
        assert check.checked > 100
        assert check.mismatches == []
        assert check.stale == []
        assert system.flushed == 0


def test_stale_entries_of_a_system_whose_fills_race_are_reported_apart_from_its_rows() -> None:
    db = Rows()
    system = Cached(db, races=True)
    _stale_everywhere(system)
    check = _check(system, db)
    assert system.flushed == 1
    assert check.stale
    assert all("differs from its row" in m for m in check.stale)
    assert check.mismatches == []


def test_a_system_that_promises_fresh_caches_is_held_to_its_first_answers() -> None:
    db = Rows()
    system = Cached(db, races=False)
    _stale_everywhere(system)
    check = _check(system, db)
    assert system.flushed == 0
    assert check.stale == []
    assert check.mismatches
    assert all("differs from its row" in m for m in check.mismatches)


def test_what_still_differs_with_empty_caches_is_a_mismatch() -> None:
    db = Rows()
    system = Cached(db, races=True)
    _stale_everywhere(system)
    # The rows themselves are wrong for one list: an empty cache cannot hide that.
    board = COPY.boards[DATA.boards_by_size[0]]
    system.db = Rows()
    system.db.lists[("board_has_pins", board)] = system.db.lists[("board_has_pins", board)][1:]
    check = _check(system, db)
    assert check.stale
    assert any(f"board {board}" in m for m in check.mismatches)
