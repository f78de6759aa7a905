"""A list's counts row is locked for the primary side's COMMIT only, not across the inverse side's write.

Every write of a pair changes its list's count (and version) in the counts
row, which every writer of a hot list (a popular board) takes. Where the
inverse side is on another host, the primary side's transaction spans the
inverse side's whole request: its count goes with its COMMIT, so the row is
locked for that request alone. Each write (a link, a re-link to a new
sequence, an unlink) is paused after the primary side is written, before
the inverse side's: another session then takes the board's counts row with
``NOWAIT``, which fails while a transaction holds it. The counts come out
exact. On MariaDB and PostgreSQL, each with two host names.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from store import Store, StoreConfig
from store.naming import Names
from tests.conftest import NAMES, PG_TEST_DB, root_sql

BHP = "board_has_pins"


@pytest.fixture(params=["mariadb", "postgresql"])
def config(request: pytest.FixtureRequest) -> StoreConfig:
    if request.param == "mariadb":
        ready: StoreConfig = request.getfixturevalue("mariadb_ready")
    else:
        ready = request.getfixturevalue("postgres_ready")
    return ready


def _try_lock(config: StoreConfig, shard: int, board: int) -> bool:
    """Whether another session can take the board's counts row now (``FOR UPDATE NOWAIT``)."""
    if config.ids == "pinterest":
        import pymysql

        try:
            root_sql(
                f"SELECT n FROM `{NAMES.database_name(shard)}`.relation_counts "
                f"WHERE relation = '{BHP}' AND from_id = {board} FOR UPDATE NOWAIT"
            )
        except pymysql.err.OperationalError as exc:
            if exc.args[0] not in (1205, 3572):  # (a lock wait timeout, NOWAIT refused)
                raise
            return False
        return True
    import psycopg

    names = Names(config.namespace)
    with psycopg.connect(f"host=127.0.0.1 user=postgres dbname={PG_TEST_DB}", autocommit=True) as conn:
        try:
            conn.execute(
                f"SELECT n FROM {names.schema_name(shard)}.relation_counts "
                f"WHERE relation = '{BHP}' AND from_id = {board} FOR UPDATE NOWAIT"
            )
        except psycopg.errors.LockNotAvailable:
            return False
    return True


def test_the_counts_row_is_not_held_across_the_inverse_side(config: StoreConfig) -> None:
    with Store(config) as store:
        shard_a, shard_b = 1, config.shards - 2
        assert store.shard_map.master(shard_a) != store.shard_map.master(shard_b)  # two host names
        board = store.create("board", {"n": 0}, shard=shard_a)
        pins = [store.create("pin", {"n": i}, shard=shard_b) for i in range(2)]
        store.link(BHP, board, pins[0])  # the board's counts row exists
        writer = store.admin_context().relations.pairs
        paused, resume = threading.Event(), threading.Event()
        free: list[bool] = []

        def hook(step: str) -> None:
            if step == "primary written":
                paused.set()
                assert resume.wait(30)

        def paused_at_the_inverse(call: Callable[[], Any]) -> Any:
            got: list[Any] = []
            paused.clear()
            resume.clear()
            writer.step = hook
            t = threading.Thread(target=lambda: got.append(call()))
            t.start()
            try:
                assert paused.wait(30), "the write never reached its inverse side"
                free.append(_try_lock(config, shard_a, board))
            finally:
                resume.set()
                t.join(30)
                writer.step = None
            return got[0]

        assert paused_at_the_inverse(lambda: store.link(BHP, board, pins[1])) is True
        assert paused_at_the_inverse(lambda: store.link(BHP, board, pins[1], sequence=7)) is False  # a move
        assert paused_at_the_inverse(lambda: store.unlink(BHP, board, pins[0])) is True
        assert free == [True, True, True], "the board's counts row was held across the inverse side"
        assert store.count(BHP, board) == 1
        assert store.links(BHP, board) == [pins[1]]
        assert store.count("pin_owned_by_board", pins[1]) == 1
        assert store.count("pin_owned_by_board", pins[0]) == 0
