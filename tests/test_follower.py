"""The invalidation log (``cache.follow``): writes log their keys with their COMMIT; followers delete them.

On the real MariaDB, memcached and Redis: a writer whose cache deletes are
all lost is seen by another store within a few follower passes, whatever
``max_stale_s`` says; while the follower is current, entries older than the
window are served from the cache; when it stops, the window holds again;
rows committed out of id order are not missed.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pymysql
import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import Store, StoreConfig
from store.admin import init_shards
from store.cache.follower import Follower, LogSource, list_version, merged_entries, parse_entries
from store.cache.leases import wall_ms
from tests.conftest import NAMES, cached_mariadb_config, db, root_sql

BHP = "board_has_pins"
#: The invalidation log database of this namespace, and its cache keys' prefix (config ``t:``).
LOG = NAMES.log_database
T = NAMES.cache_prefix("t:")


def _raw(memcached: list[str], redis_url: str, **cache: Any) -> dict[str, Any]:
    raw = cached_mariadb_config(memcached, redis_url)
    raw["cache"].update({"follow": True, "follow_poll_s": 0.1, **cache})
    init_shards(StoreConfig.from_dict(raw))  # makes the logs: the application account may not
    return raw


@pytest.fixture
def raw(mariadb_ready: StoreConfig, memcached_pair: list[str], redis_ready: str) -> dict[str, Any]:
    """The cached MariaDB test config, following the logs, with a 30 s window (the window fixes nothing)."""
    return _raw(memcached_pair, redis_ready, max_stale_s=30)


def _lose_deletes(store: Store) -> None:
    """Make every cache delete of ``store`` vanish, as a cache unreachable from the writer only would."""
    caches = store.admin_context().caches
    assert caches.objects is not None
    assert caches.lists is not None
    caches.objects.invalidate = lambda keys: None  # type: ignore[method-assign]
    caches.lists.invalidate = lambda keys: None  # type: ignore[method-assign]


def _wait_for(check: Any, *, within_s: float) -> float:
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < within_s, f"not seen within {within_s} s"
        time.sleep(0.02)
    return time.monotonic() - began


def _log_rows() -> list[str]:
    return [str(r[0]) for r in root_sql(f"SELECT entries FROM {LOG}.cache_log ORDER BY id DESC LIMIT 20")]


def _log_count() -> int:
    return int(root_sql(f"SELECT COUNT(*) FROM {LOG}.cache_log")[0][0])


def _table(s: Store, from_id: int, relation: str) -> str:
    return f"{db(s.locate(from_id).shard)}.{relation}"


def test_writes_log_the_keys_they_invalidate(raw: dict[str, Any]) -> None:
    with Store.from_config(raw) as s:
        board = s.create("board", {"n": 0})
        pin = s.create("pin", {"n": 0}, near=board)
        s.update(pin, {"n": 1})
        objects, _lists = parse_entries(_log_rows()[:1])
        assert objects == [s.cache_key(pin)]
        s.link(BHP, board, pin)
        # Both sides: one transaction on one host, one row, naming the version each list is left
        # at (a new list's first is 1).
        _objects, lists = parse_entries(_log_rows()[:1])
        assert sorted(lists) == sorted([f"{T}l:{BHP}:{board}@1", f"{T}l:pin_owned_by_board:{pin}@1"])
        elsewhere = s.create("pin", {"n": 2}, shard=s.locate(board).shard ^ 4)  # the other host
        assert s.locate(elsewhere).host != s.locate(board).host
        s.link(BHP, board, elsewhere)
        first, second = _log_rows()[:2]  # a transaction on each host, a row each
        assert sorted([parse_entries([first])[1], parse_entries([second])[1]]) == sorted(
            [[f"{T}l:{BHP}:{board}@2"], [f"{T}l:pin_owned_by_board:{elsewhere}@1"]]
        )
        s.link(BHP, board, elsewhere, sequence=5)  # a move: both lists' versions go up too
        _objects, lists = parse_entries(_log_rows()[:2])  # (a row on each host)
        assert sorted(lists) == sorted([f"{T}l:{BHP}:{board}@3", f"{T}l:pin_owned_by_board:{elsewhere}@2"])
        s.unlink(BHP, board, elsewhere)  # an unlink too: the inverse's row goes with its COMMIT
        _objects, lists = parse_entries(_log_rows()[:2])
        assert sorted(lists) == sorted([f"{T}l:{BHP}:{board}@4", f"{T}l:pin_owned_by_board:{elsewhere}@3"])
        before = _log_count()
        s.link(BHP, board, pin)  # changes nothing: logs nothing
        assert s.unlink(BHP, board, elsewhere) is False  # nor does an unlink of nothing
        assert _log_count() == before
        # A split pair (the inverse row left behind): the inverse side's insert finds its row, its
        # COMMIT logs nothing, and the slow way moves the row to the new sequence and logs that.
        s.link(BHP, board, elsewhere, sequence=7)
        root_sql(f"DELETE FROM {_table(s, board, BHP)} WHERE from_id = %s AND to_id = %s", board, elsewhere)
        before = _log_count()
        assert s.link(BHP, board, elsewhere, sequence=8) is True
        assert _log_count() == before + 2  # a row on each host
        _objects, lists = parse_entries(_log_rows()[:2])
        assert sorted(lists) == sorted([f"{T}l:{BHP}:{board}@6", f"{T}l:pin_owned_by_board:{elsewhere}@5"])
        assert s.page("pin_owned_by_board", elsewhere).ids == [board]
        s.unlink(BHP, board, pin)
        s.delete(pin)
        assert parse_entries(_log_rows()[:1])[0] == [s.cache_key(pin)]
        assert len(_log_rows()) >= min(20, before)


def test_a_writer_whose_deletes_are_lost_is_seen_through_the_log(raw: dict[str, Any]) -> None:
    with Store.from_config(raw) as writer, Store.from_config(raw) as reader:
        board = writer.create("board", {})
        pin = writer.create("pin", {"v": 0}, near=board)
        assert reader.get(pin) == {"v": 0}
        assert reader.page(BHP, board).ids == []
        _lose_deletes(writer)
        for v in range(1, 4):
            writer.update(pin, {"v": v})
            took = _wait_for(lambda v=v: reader.get(pin) == {"v": v}, within_s=3.0)
            assert took < 3.0
        writer.link(BHP, board, pin)
        _wait_for(lambda: reader.page(BHP, board).ids == [pin], within_s=3.0)
        writer.unlink(BHP, board, pin)
        _wait_for(lambda: reader.page(BHP, board).ids == [], within_s=3.0)
        writer.delete(pin)
        _wait_for(lambda: reader.get(pin) is None, within_s=3.0)


def test_entries_outlive_the_window_while_the_follower_is_current(
    memcached_pair: list[str], redis_ready: str, mariadb_ready: StoreConfig
) -> None:
    raw = _raw(memcached_pair, redis_ready, max_stale_s=0.5, follow_poll_s=0.1)
    with Store.from_config(raw) as s:
        board = s.create("board", {})
        pin = s.create("pin", {"v": 1}, near=board)
        s.link(BHP, board, pin)
        _wait_for(lambda: s.admin_context().caches.objects.follower.covered_ms() > 0, within_s=3.0)  # type: ignore[union-attr]
        time.sleep(0.3)  # the follower's first pass has begun: entries read from now on are covered
        assert s.get(pin) == {"v": 1}
        assert s.page(BHP, board).ids == [pin]
        follower = s.admin_context().caches.objects.follower  # type: ignore[union-attr]
        assert isinstance(follower, Follower)

        def current() -> bool:  # the follower's last pass began within the window
            return follower.trusted_since_ms(wall_ms(), 500) is not None

        # Entries twice the window old are trusted while the follower is current: judged on reads
        # made while it was current throughout (a pass held up by a busy machine makes it not).
        judged = 0
        for _ in range(5):
            time.sleep(1.0)  # twice the window
            was = current()
            before = {name: dict(v) for name, v in s.stats().items()}
            assert s.get(pin) == {"v": 1}
            assert s.page(BHP, board).ids == [pin]
            after = s.stats()
            if not (was and current()):
                continue
            for name in after:
                assert after[name]["expired"] == before[name]["expired"], name
            judged += 1
            break
        assert judged, "the follower was never current for a whole read"
        # The follower stops: the window holds again.
        follower.stop()
        assert s.get(pin) == {"v": 1}
        assert sum(v["expired"] for v in s.stats().values()) > sum(v["expired"] for v in after.values())


def test_rows_committed_out_of_id_order_are_not_missed(mariadb_ready: StoreConfig) -> None:
    """A row whose id was taken before a later row's, but committed after it, is read in a later pass."""

    def connect() -> Any:
        return pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)

    setup = connect()
    with setup.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {LOG}")
        cur.execute(
            f"CREATE TABLE IF NOT EXISTS {LOG}.cache_log (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT "
            "PRIMARY KEY, at_ms BIGINT NOT NULL, entries MEDIUMTEXT NOT NULL) ENGINE=InnoDB"
        )
    seen: list[str] = []

    class Conn:
        def __enter__(self) -> Any:
            self.c = connect()
            return self.c

        def __exit__(self, *exc: object) -> None:
            self.c.close()

    source = LogSource("local", Conn, f"`{LOG}`.`cache_log`")
    follower = Follower(lambda: [source], lambda objects, _lists: seen.extend(objects))
    follower.run_pass()  # starts near the end
    slow, fast = connect(), connect()
    tag = uuid.uuid4().hex  # rows of earlier runs are in the log too
    try:
        with slow.cursor() as a, fast.cursor() as b:
            a.execute("BEGIN")
            a.execute(f"INSERT INTO {LOG}.cache_log (at_ms, entries) VALUES (0, %s)", ("o" + tag + "slow",))
            slow_id = a.lastrowid
            b.execute(f"INSERT INTO {LOG}.cache_log (at_ms, entries) VALUES (0, %s)", ("o" + tag + "fast",))
            follower.run_pass()
            assert tag + "fast" in seen
            assert tag + "slow" not in seen
            assert slow_id in source.gaps  # asked for again in the next passes
            a.execute("COMMIT")
            follower.run_pass()
            assert tag + "slow" in seen
            assert slow_id not in source.gaps
    finally:
        for c in (slow, fast, setup):
            c.close()


@pytest.fixture
def no_follow(mariadb_ready: StoreConfig, memcached_pair: list[str], redis_ready: str) -> Iterator[Store]:
    raw = cached_mariadb_config(memcached_pair, redis_ready)
    with Store.from_config(raw) as s:
        yield s


def test_without_follow_nothing_is_logged_or_followed(no_follow: Store) -> None:
    assert no_follow.admin_context().engines.logging is False
    caches = no_follow.admin_context().caches
    assert caches.objects is not None
    assert caches.objects.follower is None


def test_old_rows_are_deleted_a_short_batch_a_pass(mariadb_ready: StoreConfig) -> None:
    """A backlog of old rows goes in statements of at most CLEAN_BATCH rows, one a pass, until
    every row up to the old checkpoint is gone; newer rows stay."""
    from store.cache.follower import CLEAN_BATCH, KEEP_S

    root_sql(f"CREATE DATABASE IF NOT EXISTS {LOG}")
    root_sql(f"DROP TABLE IF EXISTS {LOG}.clean_test")
    root_sql(
        f"CREATE TABLE {LOG}.clean_test (id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, "
        "at_ms BIGINT NOT NULL, entries MEDIUMTEXT NOT NULL) ENGINE=InnoDB"
    )
    total = 2 * CLEAN_BATCH + 500
    values = ", ".join(["(0, 'x')"] * total)
    root_sql(f"INSERT INTO {LOG}.clean_test (at_ms, entries) VALUES {values}")
    ids = [int(r[0]) for r in root_sql(f"SELECT id FROM {LOG}.clean_test ORDER BY id")]
    upto = ids[2 * CLEAN_BATCH + 100]  # the checkpoint: more than two batches old
    source = LogSource("local", None, f"`{LOG}`.`clean_test`", checkpoints=[(0.0, upto)])
    follower = Follower(lambda: [source], lambda _objects, _lists: None)
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    left = [total]
    try:
        with conn.cursor() as cur:
            for k in range(5):
                follower._clean(cur, source, KEEP_S + 100.0 + k)
                left.append(int(root_sql(f"SELECT COUNT(*) FROM {LOG}.clean_test")[0][0]))
                if source.clean_upto is None:
                    break
    finally:
        conn.close()
        remaining = [int(r[0]) for r in root_sql(f"SELECT id FROM {LOG}.clean_test ORDER BY id")]
        root_sql(f"DROP TABLE {LOG}.clean_test")
    assert [a - b for a, b in itertools.pairwise(left)] == [CLEAN_BATCH, CLEAN_BATCH, 101]
    assert remaining == [i for i in ids if i > upto]
    assert source.clean_upto is None
    assert source.checkpoints == [(KEEP_S + 100.0, source.last)]  # the old one used, a new one kept


token_st = st.one_of(
    st.builds(lambda k: f"o{k}", st.sampled_from(["s:o:1", "s:o:2"])),
    st.builds(
        lambda k, v: f"l{k}" if v == 0 else f"l{k}@{v}",
        st.sampled_from(["s:l:board_has_pins:1", "s:l:pin_owned_by_board:2"]),
        st.integers(0, 4),
    ),
)


def _named(texts: list[str]) -> tuple[set[str], dict[str, int]]:
    """The object keys, and each list's version as a follower settles it (`store.store._settle`:
    the newest named, 0 if one names none)."""
    objects, lists = parse_entries(texts)
    newest: dict[str, int] = {}
    for entry in lists:
        key, version = list_version(entry)
        newest[key] = 0 if version == 0 or newest.get(key, version) == 0 else max(newest.get(key, 0), version)
    return set(objects), newest


@given(st.lists(st.lists(token_st, min_size=1, max_size=4).map(" ".join), max_size=8))
def test_a_transactions_log_row_names_each_key_once_as_followers_settle_it(texts: list[str]) -> None:
    """A transaction's log entries go as one row, each key once (`merged_entries`): the row a
    follower reads deletes the same objects and settles each list at the same version as the
    entries one by one would."""
    merged = merged_entries(texts)
    assert _named([merged] if merged else []) == _named(texts)
    tokens = merged.split()
    assert len(tokens) == len({t.partition("@")[0] for t in tokens})  # each key once
