"""`store relations repair` after a writer died between the two commits of a pair write."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from store import BackendError, Store
from store.admin import repair_relations
from store.engines import Engines

BHP = "board_has_pins"
POB = "pin_owned_by_board"


@contextmanager
def table_missing(store: Store, shard: int, table: str) -> Iterator[None]:
    """Make ``table`` on ``shard`` unusable for real (renamed away, as the admin), then put it back."""
    engines = store.admin_context().engines
    host = store.shard_map.master(shard)
    sqlite = engines.backend(host).statement_schema(shard) is None  # one file per shard, no accounts
    admin = engines if sqlite else Engines(store.config.for_admin())
    h = admin.shard(shard, host)
    aside = f"{table}_aside"
    if sqlite:
        away, back = (
            f'ALTER TABLE "{table}" RENAME TO "{aside}"',
            f'ALTER TABLE "{aside}" RENAME TO "{table}"',
        )
    else:
        away = f"RENAME TABLE {h.table(table)} TO {h.table(aside)}"
        back = f"RENAME TABLE {h.table(aside)} TO {h.table(table)}"
    with h.connect() as conn:
        conn.cursor().execute(away)
    try:
        yield
    finally:
        with h.connect() as conn:
            conn.cursor().execute(back)
        admin.dispose()
        engines.dispose()  # SQLite caches prepared statements per connection


def setup(store: Store) -> tuple[int, list[int]]:
    board = store.create("board", {}, shard=1)
    ps = [store.create("pin", {"i": i}, shard=5) for i in range(3)]
    return board, ps


class CrashError(Exception):
    """The process dies here: after the inverse side committed, before the primary side did."""


@contextmanager
def dies_after_the_inverse_commit(store: Store) -> Iterator[None]:
    def step(name: str) -> None:
        if name == "inverse committed":
            raise CrashError  # inside the primary side's open transaction: it rolls back

    writer = store.admin_context().relations.pairs
    writer.step = step
    try:
        yield
    finally:
        writer.step = None


def test_a_failed_inverse_write_leaves_both_sides_as_they_were(store: Store) -> None:
    board, (a, b, _c) = setup(store)
    store.link(BHP, board, a)
    with table_missing(store, 5, POB), pytest.raises(BackendError):
        store.link(BHP, board, b)  # the inverse side fails on shard 5: the primary side rolls back
    with table_missing(store, 5, POB), pytest.raises(BackendError):
        store.unlink(BHP, board, a)
    assert store.links(BHP, board) == [a]
    assert store.links(POB, a) == [board]
    assert store.links(POB, b) == []
    dry = repair_relations(store, dry_run=True, shards=[1, 5])
    assert [fix for fix in dry.inverse_added + dry.inverse_removed if board in fix] == []


def test_repair_drops_an_inverse_left_by_a_link_that_died(store: Store) -> None:
    board, (a, b, c) = setup(store)
    store.link(BHP, board, a)
    with dies_after_the_inverse_commit(store), pytest.raises(CrashError):
        store.link(BHP, board, b)
    store.link(BHP, board, c)
    assert store.links(BHP, board) == [a, c]
    assert store.links(POB, b) == [board]  # dangling: never acknowledged

    dry = repair_relations(store, dry_run=True)
    assert dry.inverse_removed == [(POB, b, board)]
    assert store.links(POB, b) == [board]  # a dry run changes nothing

    report = repair_relations(store, POB, shards=range(5, 6))
    assert report.inverse_removed == [(POB, b, board)]
    assert report.inverse_added == []
    assert store.links(POB, b) == []
    assert store.count(POB, b) == 0
    again = repair_relations(store, dry_run=True, shards=[1, 5])
    assert [fix for fix in again.inverse_added + again.inverse_removed if board in fix] == []  # all fixed


def test_repair_restores_an_inverse_removed_by_an_unlink_that_died(store: Store) -> None:
    board, (a, b, _c) = setup(store)
    store.link(BHP, board, a)
    store.link(BHP, board, b)
    with dies_after_the_inverse_commit(store), pytest.raises(CrashError):
        store.unlink(BHP, board, a)
    assert store.links(BHP, board) == [a, b]  # the primary side kept the pair
    assert store.links(POB, a) == []

    report = repair_relations(store, BHP)
    assert report.inverse_added == [(POB, a, board)]
    assert store.links(POB, a) == [board]
    assert store.count(POB, a) == 1
    assert store.links(POB, b) == [board]


def test_repair_fixes_a_drifted_count(store: Store) -> None:
    board, (a, _b, _c) = setup(store)
    store.link(BHP, board, a)
    h = store.admin_context().engines.shard(1, store.shard_map.master(1))
    with h.connect() as conn:
        conn.cursor().execute(f"UPDATE {h.table('relation_counts')} SET n = 42 WHERE from_id = {board}")
    assert store.count(BHP, board) == 42
    report = repair_relations(store, shards=[1])
    assert report.counts_fixed == [(BHP, board, 42, 1)]
    assert store.count(BHP, board) == 1


def test_repair_names_an_unknown_relation(store: Store) -> None:
    from store import UnknownRelationError

    with pytest.raises(UnknownRelationError, match="unknown relation 'nope'"):
        repair_relations(store, "nope")


def test_repair_reports_rows_it_cannot_route_and_changes_nothing(store: Store) -> None:
    from store import encode_pinterest

    board, _pins = setup(store)
    stray = encode_pinterest(2, 9, 1)  # type id 9: no such type
    h = store.admin_context().engines.shard(1, store.shard_map.master(1))
    p = h.backend.param
    with h.connect() as conn:
        conn.cursor().execute(
            f"INSERT INTO {h.table(BHP)} (from_id, to_id, sequence) VALUES ({p}, {p}, 1)", (board, stray)
        )
    try:
        report = repair_relations(store, BHP, shards=[1])
        assert [(r, f, t) for r, f, t, _why in report.unroutable] == [(BHP, board, stray)]
        assert "type id 9" in report.unroutable[0][3]
        assert report.inverse_added == []
    finally:
        with h.connect() as conn:
            conn.cursor().execute(f"DELETE FROM {h.table(BHP)} WHERE to_id = {p}", (stray,))
