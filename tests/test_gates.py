"""Gates: a pair write's COMMIT in the write's own request, run only if each side's write did
what was hoped (`Backend.gates`).

A same-host `link` (MariaDB, PostgreSQL) and a same-host `link_many` of new
pairs (PostgreSQL) send both sides and the COMMIT in one request; a gate
after each side's write fails the request unless that write changed its
row (or every row it was given). The property: gates change a write's
requests, never its outcome. Every state a pair can be in (each side's row
absent, at the link's sequence or another, each object live or deleted) is
linked once with the backend's gates and once without, and the answers,
rows and counts must match; a gate that never fails breaks that. On SQLite,
MariaDB and PostgreSQL with Instagram IDs, one host and two.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from store import Store
from store.exceptions import NotFound
from tests.test_relink import (
    BHP,
    POB,
    backend,
    mark_deleted,
    pair_state,
    run_sql,
    sequence_of,
    trips,
)

__all__ = ["backend"]  # (the fixture, shared with the re-link tests)


#: The boards and pins a test made, whose pairs it left in states no write leaves (set by hand):
#: removed at the end of the test (`_forget`).
_MADE: list[tuple[int, list[int]]] = []


@pytest.fixture(autouse=True)
def _forget(store: Store) -> Iterator[None]:
    """After each test, every row of the pairs its boards and pins hold, and their counts, go: the
    databases are shared, and a torn pair or a count off by hand left there would be found by
    another test's scan of every shard (`store relations repair`, `store check`)."""
    _MADE.clear()
    yield
    for board, pins in _MADE:
        for owner, kind, relation in [(board, "board", BHP), *((p, "pin", POB) for p in pins)]:
            for text in (
                "DELETE FROM {t} WHERE from_id = %s",
                "DELETE FROM {c} WHERE relation = %s AND from_id = %s",
            ):
                params = (owner,) if "{t}" in text else (relation, owner)
                run_sql(
                    store,
                    owner,
                    kind,
                    lambda h, x=text, r=relation: x.format(t=h.table(r), c=h.table("relation_counts")),
                    params,
                )
    _MADE.clear()


@pytest.mark.parametrize("hosts", ["one host", "two hosts"])
def test_a_new_link_whose_inverse_side_changes_nothing_is_refused_or_repaired(
    store: Store, backend: str, hosts: str
) -> None:
    """The primary side's row is written and the inverse side's is not: on MariaDB with one host,
    the inverse side's gate ends the request before its COMMIT, and the slow way decides.

    A pin marked deleted with no pair yet: the board's side would take the row (the board is
    live), the pin's side refuses it; the link is refused and nothing is written. A pair whose
    primary row was lost (torn by hand) and whose inverse row is still there: the link writes
    the primary row and moves the inverse row to its sequence.
    """
    near, far = (1, 9) if store.config.ids == "instagram" else (1, 5)
    board = store.create("board", {}, shard=near)
    shard = near if hosts == "one host" else far
    dead, torn, plain = (store.create("pin", {"i": i}, shard=shard) for i in range(3))
    _MADE.append((board, [dead, torn, plain]))
    assert store.link(BHP, board, plain) is True
    mark_deleted(store, dead)
    before = pair_state(store, board, dead)
    with pytest.raises(NotFound, match="deleted"):
        store.link(BHP, board, dead)
    assert pair_state(store, board, dead) == before == ([plain], 1, [], 0)
    assert sequence_of(store, BHP, board, dead) is None

    assert store.link(BHP, board, torn) is True
    run_sql(
        store,
        board,
        "board",
        lambda h: f"DELETE FROM {h.table(BHP)} WHERE from_id = %s AND to_id = %s",
        (board, torn),
    )
    assert sequence_of(store, BHP, board, torn) is None
    assert store.link(BHP, board, torn, sequence=77) is True  # new on the primary side
    assert sequence_of(store, BHP, board, torn) == 77
    assert sequence_of(store, POB, torn, board) == 77
    assert store.links(POB, torn) == [board]
    # A plain new pair and a move still go as one request (with the COMMIT) where gates are.
    fresh = store.create("pin", {}, shard=shard)
    _MADE.append((board, [fresh]))
    gated = hosts == "one host" and backend != "sqlite"
    new, n_new = trips(lambda: store.link(BHP, board, fresh))
    _moved, n_moved = trips(lambda: store.link(BHP, board, fresh, sequence=5))
    assert new is True
    if gated:
        assert (n_new, n_moved) == (1, 1)
    assert sequence_of(store, POB, fresh, board) == 5
    # (the board's count is one over its rows: the primary row was deleted by hand, not unlinked)
    assert store.links(BHP, board).count(fresh) == 1
    assert pair_state(store, board, fresh)[2:] == ([board], 1)


#: A side's row before the link: absent, at the link's sequence, or at another one.
ROW_STATES = ("absent", "at 5", "at 7")


def _set_rows(store: Store, board: int, pin: int, primary: str, inverse: str) -> None:
    """Set the pair's rows by hand (its counts left as they are): each side's row "absent",
    "at 5" or "at 7"."""
    for relation, owner, other, state in ((BHP, board, pin, primary), (POB, pin, board, inverse)):
        kind = store.config.relations[relation].from_type
        if state == "absent":
            text = "DELETE FROM {t} WHERE from_id = %s AND to_id = %s"
            params: tuple[Any, ...] = (owner, other)
        else:
            text = "UPDATE {t} SET sequence = %s WHERE from_id = %s AND to_id = %s"
            params = (int(state[3:]), owner, other)
        run_sql(store, owner, kind, lambda h, r=relation, x=text: x.format(t=h.table(r)), params)


def _pair_in_state(store: Store, hosts: str, primary: str, inverse: str, dead: str) -> tuple[int, int]:
    """A board and a pin whose pair is in the state named (each side's row absent, at 5 or at 7,
    set by hand: torn pairs too), ``dead`` ("board", "pin" or "") marked deleted by hand."""
    near, far = (1, 9) if store.config.ids == "instagram" else (1, 5)
    board = store.create("board", {}, shard=near)
    pin = store.create("pin", {}, shard=near if hosts == "one host" else far)
    _MADE.append((board, [pin]))
    assert store.link(BHP, board, pin, sequence=5) is True
    _set_rows(store, board, pin, primary, inverse)
    if dead:
        mark_deleted(store, board if dead == "board" else pin, dead)
    return board, pin


def _linked(store: Store, board: int, pin: int) -> tuple[Any, ...]:
    """``link(board, pin, sequence=5)``: what it answered (or raised), and both sides' rows and
    counts after it, as changes from before it."""
    counts = (store.count(BHP, board), store.count(POB, pin))
    try:
        answer: Any = store.link(BHP, board, pin, sequence=5)
    except NotFound:
        answer = NotFound
    after = (store.count(BHP, board) - counts[0], store.count(POB, pin) - counts[1])
    return answer, sequence_of(store, BHP, board, pin), sequence_of(store, POB, pin, board), after


@pytest.mark.parametrize("hosts", ["one host", "two hosts"])
def test_gates_change_a_links_requests_never_its_outcome_from_any_state_of_its_pair(
    store: Store, backend: str, hosts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every state a pair can be in before ``link(board, pin, sequence=5)`` (each side's row
    absent, at 5 or at 7, each object live or deleted, 27 in all), once with the backend's
    gates and once without: the same answer, the same rows, the same count changes.

    On MariaDB and PostgreSQL with one host the states reach every outcome of the gated
    request: both gates pass, the primary side's fails, the inverse side's fails. Where a
    new pair is written, the gated request is one request.
    """
    outcomes: dict[tuple[str, str, str], tuple[Any, ...]] = {}
    gated = hosts == "one host" and backend != "sqlite"
    for primary in ROW_STATES:
        for inverse in ROW_STATES:
            for dead in ("", "board", "pin"):
                board, pin = _pair_in_state(store, hosts, primary, inverse, dead)
                outcomes[(primary, inverse, dead)] = _linked(store, board, pin)
    backend_class = type(store.admin_context().engines.backend(next(iter(store.config.hosts))))
    monkeypatch.setattr(backend_class, "gates", False)
    for state, want in outcomes.items():
        board, pin = _pair_in_state(store, hosts, *state)
        assert _linked(store, board, pin) == want, state
    monkeypatch.undo()
    # (the model the outcomes follow, in brief: a pair in place is no news; a live pair ends at 5)
    assert outcomes[("at 5", "at 5", "")] == (False, 5, 5, (0, 0))
    assert outcomes[("absent", "absent", "")] == (True, 5, 5, (1, 1))
    assert outcomes[("absent", "absent", "pin")][0] is NotFound
    if gated:
        board, pin = _pair_in_state(store, hosts, "absent", "absent", "")
        assert trips(lambda: store.link(BHP, board, pin, sequence=5)) == (True, 1)


def _batch_in_states(store: Store, hosts: str, states: list[tuple[str, str, str]]) -> tuple[int, list[int]]:
    """A board and one pin per state of ``states`` (as `_pair_in_state` makes each pair's)."""
    near, far = (1, 9) if store.config.ids == "instagram" else (1, 5)
    board = store.create("board", {}, shard=near)
    pins = store.create_many(
        "pin", [{"i": k} for k in range(len(states))], shard=near if hosts == "one host" else far
    )
    _MADE.append((board, pins))
    assert store.link_many(BHP, [(board, p) for p in pins], sequence=5) == len(pins)
    for pin, (primary, inverse, dead) in zip(pins, states, strict=True):
        _set_rows(store, board, pin, primary, inverse)
        if dead:
            mark_deleted(store, pin)
    return board, pins


def _batch_linked(store: Store, board: int, pins: list[int]) -> tuple[Any, ...]:
    """``link_many`` of the board's pins (no sequence: new pairs take the time, pairs there keep
    theirs): what it answered (or raised), every pair's rows (a sequence not 5 or 7: "new"),
    and the counts' changes."""
    counts = [store.count(BHP, board), *(store.count(POB, p) for p in pins)]
    try:
        answer: Any = store.link_many(BHP, [(board, p) for p in pins])
    except NotFound:
        answer = NotFound

    def seen(seq: int | None) -> int | str | None:
        return seq if seq in (None, 5, 7) else "new"

    rows = [
        (seen(a := sequence_of(store, BHP, board, p)), seen(b := sequence_of(store, POB, p, board)), a == b)
        for p in pins
    ]
    after = [store.count(BHP, board), *(store.count(POB, p) for p in pins)]
    return answer, rows, [b - a for a, b in zip(counts, after, strict=True)]


@pytest.mark.parametrize("hosts", ["one host", "two hosts"])
def test_gates_change_a_batchs_requests_never_its_outcome(
    store: Store, backend: str, hosts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`link_many` of a board's pins, all new, or with one pair in each other state (a side's row
    absent, at a sequence or at another, a pin deleted), once with the backend's gates and once
    without: the same answer, rows and count changes. On PostgreSQL with one host, all new is
    one request (both sides and the COMMIT); any other state fails a gate, and the sides go
    one at a time."""
    batches: list[list[tuple[str, str, str]]] = [[("absent", "absent", "")] * 4]
    for primary in ROW_STATES:
        for inverse in ROW_STATES:
            for dead in ("", "pin"):
                if (primary, inverse, dead) != ("absent", "absent", ""):
                    batches.append(
                        [("absent", "absent", ""), (primary, inverse, dead), ("absent", "absent", "")]
                    )
    outcomes = [_batch_linked(store, *_batch_in_states(store, hosts, b)) for b in batches]
    backend_class = type(store.admin_context().engines.backend(next(iter(store.config.hosts))))
    monkeypatch.setattr(backend_class, "gates", False)
    for batch, want in zip(batches, outcomes, strict=True):
        assert _batch_linked(store, *_batch_in_states(store, hosts, batch)) == want, batch
    monkeypatch.undo()
    assert outcomes[0] == (4, [("new", "new", True)] * 4, [4, 1, 1, 1, 1])
    if hosts == "one host" and backend == "postgres":
        board, pins = _batch_in_states(store, hosts, batches[0])
        assert trips(lambda: store.link_many(BHP, [(board, p) for p in pins])) == (4, 1)
