"""Instagram-style IDs made by the database: PostgreSQL shard schemas and MariaDB triggers."""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

import pymysql
import pytest

from store import IdError, Store, StoreConfig, decode_instagram
from store.admin import init_shards
from store.ids import INSTAGRAM_EPOCH_MS
from tests.conftest import MARIADB_URL, NAMESPACE, base_config, db, require_port

BHP = "board_has_pins"


def now_ms() -> int:
    return int(time.time() * 1000) - INSTAGRAM_EPOCH_MS


def test_eight_threads_make_40000_distinct_ids_in_16_schemas(postgres_ready: StoreConfig) -> None:
    made: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    start = now_ms() - 5  # the machine's clock and PostgreSQL's may differ by a few ms
    with Store(postgres_ready) as store:

        def work(t: int) -> None:
            # Thread t fills its two schemas in turn: 16 schemas in all.
            try:
                made[t] = [
                    store.create("pin", {"t": t, "i": i}, shard=2 * t + i // 2500) for i in range(5000)
                ]
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        end = now_ms() + 5
        assert errors == []
        every = [i for ids in made.values() for i in ids]
        assert len(every) == 40_000
        assert len(set(every)) == 40_000
        for ids in made.values():
            # Strictly increasing per thread. (Within one millisecond IDs
            # order by their shard bits, so a thread that hops between shards
            # inside a millisecond would see increasing times, not IDs.)
            assert all(a < b for a, b in itertools.pairwise(ids)), "a thread's IDs are not increasing"
        for i in every:
            assert start <= decode_instagram(i).ms <= end
        # Each ID's row is in the schema its shard bits name.
        by_shard: dict[int, set[int]] = {}
        for i in every:
            by_shard.setdefault(decode_instagram(i).shard_id, set()).add(i)
        assert len(by_shard) == 16
        for shard, ids in by_shard.items():
            h = store.admin_context().engines.shard(shard, store.shard_map.master(shard))
            with h.connect() as conn:
                cur = conn.cursor()
                cur.execute(f"SELECT id FROM {h.table('pins')}")
                assert ids <= {row[0] for row in cur.fetchall()}
        assert store.get(made[0][0], type_name="pin") == {"t": 0, "i": 0}


PUBLISHED_NEXT_ID = """
CREATE OR REPLACE FUNCTION public.published_next_id(OUT result bigint) AS $$
DECLARE
    our_epoch bigint := 1314220021721;
    seq_id bigint;
    now_millis bigint;
    shard_id int := 5;
BEGIN
    SELECT nextval('public.published_seq') % 1024 INTO seq_id;
    SELECT FLOOR(EXTRACT(EPOCH FROM now()) * 1000) INTO now_millis;
    result := (now_millis - our_epoch) << 23;
    result := result | (shard_id << 10);
    result := result | (seq_id);
END;
$$ LANGUAGE plpgsql
"""


def test_a_burst_of_more_than_1024_ids_in_one_millisecond(postgres_ready: StoreConfig) -> None:
    with Store(postgres_ready.for_admin()) as store:  # it makes a function: the admin's work
        h = store.admin_context().engines.shard(3, store.shard_map.master(3))
        pins = h.table("pins")
        with h.connect() as conn:
            cur = conn.cursor()
            # The published function (its % fixed): one statement, one now(), so
            # IDs 1,025 and on repeat earlier ones. This is the hazard.
            cur.execute("CREATE SEQUENCE IF NOT EXISTS public.published_seq")
            cur.execute(PUBLISHED_NEXT_ID)
            cur.execute("SELECT count(DISTINCT public.published_next_id()) FROM generate_series(1, 3000)")
            assert cur.fetchone()[0] == 1024
            # Ours, with the clock pinned to one millisecond: 3,000 rows in one statement.
            cur.execute("SELECT count(*) FROM " + pins)
            before = cur.fetchone()[0]
            cur.execute(f"SET store.clock_ms = '{INSTAGRAM_EPOCH_MS + now_ms()}'")
            cur.execute(f"INSERT INTO {pins} (data) SELECT '{{}}' FROM generate_series(1, 3000) RETURNING id")
            ids = [row[0] for row in cur.fetchall()]
            cur.execute("RESET store.clock_ms")
            cur.execute("SELECT count(*) FROM " + pins)
            after = cur.fetchone()[0]
    assert len(ids) == 3000
    assert len(set(ids)) == 3000, "a duplicate ID"
    assert after - before == 3000, "a lost row"
    assert ids == sorted(ids)
    assert {decode_instagram(i).shard_id for i in ids} == {3}
    spans = {decode_instagram(i).ms for i in ids}
    assert len(spans) >= 3  # 3,000 IDs need 3 ms of 1,024: the later ones borrow ahead


def test_clock_stepping_back_keeps_ids_unique_and_increasing(postgres_ready: StoreConfig) -> None:
    with Store(postgres_ready) as store:
        h = store.admin_context().engines.shard(4, store.shard_map.master(4))
        first = [store.create("pin", {"i": i}, shard=4) for i in range(50)]
        with h.connect() as conn:
            cur = conn.cursor()
            # The clock steps back 10 s for this session.
            cur.execute(f"SET store.clock_ms = '{INSTAGRAM_EPOCH_MS + now_ms() - 10_000}'")
            cur.execute(
                f"INSERT INTO {h.table('pins')} (data) SELECT '{{}}' FROM generate_series(1, 50) RETURNING id"
            )
            stepped = [row[0] for row in cur.fetchall()]
            cur.execute("RESET store.clock_ms")
        later = [store.create("pin", {"i": i}, shard=4) for i in range(50)]
    every = first + stepped + later
    assert len(set(every)) == 150
    assert every == sorted(every), "IDs went backwards with the clock"
    # While the clock is behind, the ms field runs on from the last ID instead.
    assert decode_instagram(stepped[0]).ms >= decode_instagram(first[-1]).ms


def test_objects_and_relations_with_instagram_ids(postgres_ready: StoreConfig) -> None:
    with Store(postgres_ready) as store:
        board = store.create("board", {"name": "timeline"})
        pins = [store.create("pin", {"i": i}, near=board) for i in range(5)]
        assert decode_instagram(pins[0]).shard_id == decode_instagram(board).shard_id
        for p in pins:
            store.link(BHP, board, p, sequence=p)  # the ID itself as the sequence: a timeline
        assert store.links(BHP, board) == pins
        assert store.links(BHP, board, newest_first=True) == pins[::-1]
        assert store.count(BHP, board) == 5
        assert store.links("pin_owned_by_board", pins[0]) == [board]
        page = store.board_pins(board, limit=3)
        assert page.objects == [{"i": 0}, {"i": 1}, {"i": 2}]
        assert store.update(pins[1], {"x": 1}, type_name="pin") == {"i": 1, "x": 1}
        assert store.delete(pins[1], type_name="pin") is True
        assert store.get(pins[1], type_name="pin") is None
        assert store.get_many(pins, type_name="pin") == {p: {"i": i} for i, p in enumerate(pins) if i != 1}
        with pytest.raises(IdError, match="carries no type: pass type_name="):
            store.get(pins[0])


# -- MariaDB: the same layout from a sequence and a trigger ----------------------

IG_MARIADB_SHARDS = range(24, 32)


@pytest.fixture(scope="module")
def mariadb_instagram() -> StoreConfig:
    require_port("MariaDB", 3306)
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            for s in IG_MARIADB_SHARDS:
                cur.execute(f"DROP DATABASE IF EXISTS {db(s)}")
    finally:
        conn.close()
    raw = base_config(
        namespace=NAMESPACE,
        ids="instagram",
        shards=32,
        open_shards=[24, 29],  # 30 and 31 stay empty for the burst test
        hosts={"A": MARIADB_URL},
        map=[{"range": [0, 31], "master": "A"}],
    )
    config = StoreConfig.from_dict(raw)
    init_shards(config, shards=IG_MARIADB_SHARDS)
    return config


def test_mariadb_makes_instagram_ids(mariadb_instagram: StoreConfig) -> None:
    start = now_ms() - 1000
    with Store(mariadb_instagram) as store:
        board = store.create("board", {})
        pins = [store.create("pin", {"i": i}, near=board) for i in range(20)]
        assert len(set(pins)) == 20
        assert pins == sorted(pins)
        for p in pins:
            d = decode_instagram(p)
            assert d.shard_id == decode_instagram(board).shard_id
            assert start <= d.ms <= now_ms() + 1000
        store.link(BHP, board, pins[0])
        assert store.board_pins(board).objects == [{"i": 0}]
        assert store.get(pins[3], type_name="pin") == {"i": 3}


def test_mariadb_burst_in_one_statement_has_no_duplicates(mariadb_instagram: StoreConfig) -> None:
    conn: Any = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"INSERT INTO {db(30)}.pins (data) SELECT '{{}}' FROM {db(30)}.seq_1_to_3000")
            cur.execute(f"SELECT COUNT(*), COUNT(DISTINCT id) FROM {db(30)}.pins")
            assert cur.fetchone() == (3000, 3000)
            # The clock pinned to one millisecond: the published next_id() would
            # repeat the 1,025th ID; the shard's counter borrows the next ms instead.
            cur.execute(f"SET @store_clock_ms = {INSTAGRAM_EPOCH_MS + now_ms()}")
            cur.execute(f"INSERT INTO {db(31)}.pins (data) SELECT '{{}}' FROM {db(31)}.seq_1_to_2000")
            cur.execute(f"SELECT COUNT(*), COUNT(DISTINCT id), MIN(id) < MAX(id) FROM {db(31)}.pins")
            assert cur.fetchone() == (2000, 2000, 1)
    finally:
        conn.close()


def test_mariadb_no_two_objects_of_a_shard_share_an_id(mariadb_instagram: StoreConfig) -> None:
    """Pins and boards of one shard draw from one counter: never the same ID, even in one millisecond."""
    with Store(mariadb_instagram) as store:
        made: list[int] = []
        errors: list[BaseException] = []

        def work(type_name: str) -> None:
            try:
                for _ in range(300):
                    made.append(store.create(type_name, {}, shard=29))
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(t,)) for t in ("pin", "board", "user", "pin")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(made) == 1200
        assert len(set(made)) == 1200, "two objects of one shard got the same ID"


def test_a_hung_postgresql_backend_is_given_up_on_within_the_query_timeout(
    postgres_ready: StoreConfig,
) -> None:
    """The backend process serving the store's one pooled connection is SIGSTOPped: the kernel
    still acknowledges what is sent, so neither TCP nor the server's statement_timeout ends the
    wait (before, a read waited for ever). The store's own deadline does: a read returns (on a
    new connection) and a write returns or fails, each within ``query_timeout_s`` plus the
    driver's margin plus its retry; the connection given up on is not used again, and the pair
    the write touched is whole afterwards."""
    import os
    import signal
    from dataclasses import replace

    if os.geteuid() != 0:
        pytest.skip("signalling PostgreSQL's backend needs root")
    with Store(replace(postgres_ready, query_timeout_s=1.0, pool_size=1)) as store:
        board = store.create("board", {})
        pin = store.create("pin", {"n": 1}, near=board)
        loc = store.locate(pin, type_name="pin")
        h = store.admin_context().engines.shard(loc.shard, loc.host)
        stopped: list[int] = []
        for call in (
            lambda: store.get(pin, type_name="pin"),
            lambda: store.link("board_has_pins", board, pin),
        ):
            with h.connect() as conn:
                cur = conn.cursor()
                cur.execute("SELECT pg_backend_pid()")
                pid = int(cur.fetchone()[0])
            os.kill(pid, signal.SIGSTOP)
            try:
                began = time.monotonic()
                try:
                    got: object = call()
                except Exception as exc:  # a failure is an answer too: what matters is when
                    got = exc
                took = time.monotonic() - began
            finally:
                os.kill(pid, signal.SIGCONT)
            print(f"answered after {took:.2f} s: {got!r}")
            assert took < 3.0, (took, got)
            stopped.append(pid)
        # A backend given up on runs on once it is continued, with what it was sent (the write's
        # whole transaction, both sides): wait for it to end before reading the pair, or a read
        # can fall between its two sides' commit and the next read.
        with h.connect() as conn:
            cur = conn.cursor()
            for _ in range(200):  # (bounded: 10 s)
                cur.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND state <> 'idle'",
                    (stopped,),
                )
                if int(cur.fetchone()[0]) == 0:
                    break
                time.sleep(0.05)
        assert store.get(pin, type_name="pin") == {"n": 1}
        linked = store.has_link("board_has_pins", board, pin)
        assert (board in store.links("pin_owned_by_board", pin)) == linked
        assert store.count("board_has_pins", board) == int(linked)


def test_statements_the_store_prepared_come_back_after_someone_deallocates_them(
    postgres_ready: StoreConfig,
) -> None:
    """The store prepares its statements on each connection itself (its libpq pipeline). A
    ``DEALLOCATE ALL`` sent on that connection by anyone else (psycopg's own statement cache does
    it after a ROLLBACK, once it has prepared something) drops them: the next read and the next
    write prepare them again and run once, not twice."""
    from dataclasses import replace

    with Store(replace(postgres_ready, pool_size=1)) as store:
        board = store.create("board", {})
        pin = store.create("pin", {"n": 1}, near=board)
        assert store.link("board_has_pins", board, pin) is True
        loc = store.locate(pin, type_name="pin")
        h = store.admin_context().engines.shard(loc.shard, loc.host)
        for call, want in (
            (lambda: store.get(pin, type_name="pin"), {"n": 1}),
            (lambda: store.unlink("board_has_pins", board, pin), True),
            (lambda: store.link("board_has_pins", board, pin), True),
            (lambda: store.update(pin, {"n": 2}, type_name="pin"), {"n": 2}),
        ):
            with h.connect() as conn:
                conn.raw.execute("DEALLOCATE ALL")
            assert call() == want
        assert store.count("board_has_pins", board) == 1
        assert store.links("pin_owned_by_board", pin) == [board]
        assert store.get_with_version(pin, type_name="pin") == ({"n": 2}, 2)


def test_a_store_session_plans_what_it_prepared_once(postgres_ready: StoreConfig) -> None:
    """Each statement a store connection prepared is planned on its first run only (a generic
    plan), not on each of its first five: run ten times, one statement text is planned once,
    and its answers are the same."""
    from dataclasses import replace

    with Store(replace(postgres_ready, pool_size=1)) as store:
        board = store.create("board", {})
        pins = [store.create("pin", {"n": i}, near=board) for i in range(10)]
        loc = store.locate(pins[0], type_name="pin")
        h = store.admin_context().engines.shard(loc.shard, loc.host)
        with h.connect() as conn:
            [(mode,)] = conn.raw.execute("SHOW plan_cache_mode").fetchall()
        assert mode == "force_generic_plan"
        for i, pin in enumerate(pins):
            assert store.get(pin, type_name="pin") == {"n": i}
        with h.connect() as conn:
            rows = conn.raw.execute(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
                ("%pins.data%FROM%pins%WHERE%",),
            ).fetchall()
        assert rows, "the store prepared no read of a pin"
        assert all(custom == 0 for _generic, custom in rows)
        assert sum(generic for generic, _custom in rows) >= 10


def test_get_many_over_many_schemas_of_a_host_prepares_one_statement_per_schema(
    postgres_ready: StoreConfig,
) -> None:
    """`get_many` over many schema shards of one host is one request of one prepared statement per
    schema, its keys one array: every call, whatever its keys and their number, runs the same
    texts, so a connection prepares one read per schema and table and no more. Every answer is
    the database's: live objects only, absent and deleted IDs left out."""
    from dataclasses import replace

    with Store(replace(postgres_ready, pool_size=1)) as store:
        boards = [store.create("board", {"b": b}) for b in range(12)]
        pins = {store.create("pin", {"i": i}, near=boards[i % 12]): i for i in range(60)}
        gone = list(pins)[::7]
        for p in gone:
            assert store.delete(p, type_name="pin") is True
        live = {p: {"i": i} for p, i in pins.items() if p not in gone}
        by_host: dict[str, set[int]] = {}
        for p in pins:
            loc = store.locate(p, type_name="pin")
            by_host.setdefault(loc.host, set()).add(loc.shard)
        assert max(len(s) for s in by_host.values()) > 1, "the pins should span schemas of a host"
        ids = list(pins)
        for k in range(1, 60, 7):  # (different numbers of keys a schema each time)
            asked = ids[:k] + gone
            assert store.get_many(asked, type_name="pin") == {p: live[p] for p in asked if p in live}
        absent = max(ids) + (1 << 23)  # (a millisecond after the last ID: same schema, none made)
        assert store.get_many([absent, *ids], type_name="pin") == live
        loc = store.locate(ids[0], type_name="pin")
        h = store.admin_context().engines.shard(loc.shard, loc.host)
        texts = _prepared(h, "statement LIKE %s", "%.pins.data%FROM%pins%")
        assert texts
        assert all("ANY" in t and " IN (" not in t for t in texts), texts
        assert len(texts) == len(set(texts)) <= len(by_host[loc.host])


def test_reads_of_many_lists_run_the_same_prepared_texts_whatever_they_ask(
    postgres_ready: StoreConfig,
) -> None:
    """`pages_many`, `has_links_many` and `has_links` over boards in many schemas of a host: each
    host's statements go in one request, one text per schema and kind whatever the lists and
    IDs asked (no UNION ALL, no IN list), so a connection prepares each once. Every answer is
    the database's, read one list at a time."""
    from dataclasses import replace

    with Store(replace(postgres_ready, pool_size=1)) as store:
        boards = [store.create("board", {"b": b}) for b in range(10)]
        pins: dict[int, list[int]] = {b: [] for b in boards}
        for i in range(40):
            b = boards[i % 10]
            p = store.create("pin", {"i": i}, near=b)
            store.link(BHP, b, p)
            pins[b].append(p)
        everyone = [p for ps in pins.values() for p in ps]
        for k in (1, 3, 7, 10):
            asked = boards[:k]
            got = store.pages_many(BHP, asked, limit=3, newest_first=k % 2 == 1)
            assert {b: page.ids for b, page in got.items()} == {
                b: store.page(BHP, b, limit=3, newest_first=k % 2 == 1).ids for b in asked
            }
            pairs = [(b, p) for b in asked for p in everyone[: 5 * k]]
            want = {(b, p) for b, p in pairs if p in pins[b]}
            assert store.has_links_many(BHP, pairs) == want
            assert store.has_links(BHP, asked[0], everyone[: 9 * k]) == set(pins[asked[0]]) & set(
                everyone[: 9 * k]
            )
        loc = store.locate(boards[0], type_name="board")
        h = store.admin_context().engines.shard(loc.shard, loc.host)
        texts = _prepared(h, "statement LIKE %s", "%board_has_pins%")
        reads = [t for t in texts if "board_has_pins" in t and t.lstrip().upper().startswith("SELECT")]
        assert reads
        assert not [t for t in reads if "UNION ALL" in t or " IN (" in t]


def test_membership_checks_probe_each_pin_however_long_the_board(postgres_ready: StoreConfig) -> None:
    """A store session plans its statements once for any values, so a membership check must not
    be planned as a read of the whole list: on a board of 3,000 pins, `has_links` of ten pins
    reads ten keys (its plan run with EXPLAIN ANALYZE on the store's own connection), and
    answers as the rows say."""
    from dataclasses import replace

    with Store(replace(postgres_ready, pool_size=1)) as store:
        big = store.create("board", {})
        small = store.create("board", {}, near=big)
        pins = store.create_many("pin", [{"i": i} for i in range(3000)], near=big)
        store.link_many(BHP, [(big, p) for p in pins])
        store.link_many(BHP, [(small, p) for p in pins[:3]])
        asked = [*pins[::300], max(pins) + 1]
        assert store.has_links(BHP, big, asked) == set(pins[::300])
        assert store.has_links(BHP, small, asked) == {pins[0]}
        assert store.has_links_many(BHP, [(big, p) for p in asked]) == {(big, p) for p in pins[::300]}
        loc = store.locate(big, type_name="board")
        h = store.admin_context().engines.shard(loc.shard, loc.host)
        with h.connect() as conn:
            named = conn.raw.execute(
                "SELECT name, statement FROM pg_prepared_statements WHERE statement LIKE %s",
                ("%JOIN LATERAL%board_has_pins%",),
            ).fetchall()
            assert len(named) == 2  # (has_links's, and has_links_many's labelled one)
            array = "{" + ",".join(map(str, asked)) + "}"
            for name, _text in named:
                explain = f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}('{array}', {big})"  # (ints only)
                [(plan,)] = conn.raw.execute(explain).fetchall()
                read = _rows_read(plan[0]["Plan"])
                assert read <= 2 * len(asked), (read, plan)


def _rows_read(node: dict[str, Any]) -> float:
    """Rows every scan under ``node`` returned, over all its loops."""
    mine = node["Actual Rows"] * node["Actual Loops"] if "Scan" in node["Node Type"] else 0
    return mine + sum(_rows_read(child) for child in node.get("Plans", []))


def test_a_connection_keeps_the_statements_it_runs_most_recently_prepared(
    postgres_ready: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A connection keeps at most `PREPARED_PER_CONNECTION` statements prepared; past it, the one
    least recently run is closed to make room (in the same request), so the statements the
    traffic runs stay prepared, however many schemas the host has. Reads of 8 schemas with room
    for 3: the server holds at most 3 of the store's statements, the last 3 run among them, and
    every answer is right, the first schemas' again after they were closed."""
    from dataclasses import replace

    from store.backends.postgres import driver

    if not driver._can_close():
        msg = "this libpq closes no prepared statement (libpq 17 and later do: psycopg[binary])"
        if os.environ.get("STORE_REQUIRE_SERVICES") == "1":
            pytest.fail(msg)  # (CI installs psycopg[binary], whose libpq does: never a skip there)
        pytest.skip(msg)
    monkeypatch.setattr(driver, "PREPARED_PER_CONNECTION", 3)
    with Store(replace(postgres_ready, pool_size=1)) as store:
        boards = [store.create("board", {"b": b}) for b in range(60)]
        h_of = {}
        for b in boards:
            loc = store.locate(b, type_name="board")
            h_of.setdefault(loc.host, {}).setdefault(loc.shard, b)
        host, firsts = max(h_of.items(), key=lambda kv: len(kv[1]))
        mine = list(firsts.values())[:8]
        assert len(mine) >= 5, "the boards should span schemas of one host"
        h = store.admin_context().engines.shard(store.locate(mine[0], type_name="board").shard, host)
        for _round in range(2):
            for b in mine:
                assert store.get(b, type_name="board") == {"b": boards.index(b)}
                texts = _prepared(h, "name LIKE %s", "\\_store\\_%")
                assert len(texts) <= 3
                shard = store.locate(b, type_name="board").shard
                assert any(f"shard{shard:04d}" in t for t in texts), (shard, texts)


def _prepared(h: Any, where: str, value: str) -> list[str]:
    """The text of each statement prepared on ``h``'s pooled connection that ``where`` (with one
    parameter, ``value``) picks out of ``pg_prepared_statements``."""
    with h.connect() as conn:
        rows = conn.raw.execute(f"SELECT statement FROM pg_prepared_statements WHERE {where}", (value,))
        return [t for (t,) in rows.fetchall()]
