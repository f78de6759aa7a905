"""What only the real MariaDB can show: the rows where the ID says, DDL, disconnects."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pymysql
import pytest

from store import (
    BackendError,
    ConfigError,
    ConflictError,
    ConnectionLostError,
    NotFound,
    ShardNotInitializedError,
    Store,
    StoreConfig,
    decode_pinterest,
    encode_pinterest,
)
from store.admin import init_shards
from store.engines import ShardHandle
from tests.conftest import NAMESPACE, TEST_SHARDS, db, make_app_account, mariadb_config

#: A scratch database of this namespace's own.
OKS = f"{NAMESPACE}_oks_test"


def root() -> Any:
    return pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)


def test_object_is_where_its_id_says(mariadb_ready: StoreConfig) -> None:
    with Store(mariadb_ready) as store:
        board = store.create("board", {"name": "kitchen", "é": "ü"})
        pin = store.create("pin", {"title": "granite", "board": board}, near=board)
    shard, type_id, local_id = decode_pinterest(pin)
    assert type_id == 1
    query = f"SELECT data, active FROM {db(shard)}.pins WHERE local_id = {local_id}"
    client = shutil.which("mariadb") or shutil.which("mysql")
    if client is not None:  # the operator's view: the command-line client
        out = subprocess.run(
            [client, "-uroot", "-h127.0.0.1", "-N", "-B", "-e", query],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        assert out.strip() == f'{{"title":"granite","board":{board}}}\t1'
    conn = root()
    try:
        with conn.cursor() as cur:
            cur.execute(query)
            assert cur.fetchone() == (f'{{"title":"granite","board":{board}}}', 1)
            cur.execute(
                f"SELECT data FROM {db(shard)}.boards WHERE local_id = {decode_pinterest(board).local_id}"
            )
            assert cur.fetchone() == ('{"name":"kitchen","é":"ü"}',)
    finally:
        conn.close()


def test_init_is_idempotent_and_makes_the_documented_tables(mariadb_ready: StoreConfig) -> None:
    again = init_shards(mariadb_ready)
    assert (again.databases_created, again.tables_created) == (0, 0)
    conn = root()
    try:
        with conn.cursor() as cur:
            cur.execute(f"SHOW CREATE TABLE {db(3)}.board_has_pins")
            ddl = cur.fetchone()[1]
            assert "PRIMARY KEY (`from_id`,`to_id`)" in ddl
            assert "KEY `board_has_pins_from_sequence_to` (`from_id`,`sequence`,`to_id`)" in ddl
            assert "`from_id` bigint(20) unsigned NOT NULL" in ddl
            cur.execute(f"SHOW CREATE TABLE {db(3)}.pins")
            ddl = cur.fetchone()[1]
            assert "`local_id` bigint(20) unsigned NOT NULL AUTO_INCREMENT" in ddl
            assert "timestamp(3) NOT NULL DEFAULT current_timestamp(3) ON UPDATE current_timestamp(3)" in ddl
            assert "ENGINE=InnoDB" in ddl
            assert "utf8mb4" in ddl
            # (unique_keys too where a test with unique keys ran init first on these shared shards)
            cur.execute(
                "SELECT COUNT(*) FROM information_schema.tables "
                f"WHERE table_schema = '{db(5)}' AND table_name <> 'unique_keys'"
            )
            expected = len(mariadb_ready.types) + len(mariadb_ready.relations) + 1  # + relation_counts
            assert cur.fetchone()[0] == expected
    finally:
        conn.close()


def test_missing_shard_says_to_run_init(mariadb_ready: StoreConfig) -> None:
    raw = mariadb_config()
    raw["shards"] = 10
    raw["map"][-1]["range"] = [4, 9]
    conn = root()
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {db(9)}")
    finally:
        conn.close()
    make_app_account(StoreConfig.from_dict(raw))  # the application account serves all 10 shards
    with Store.from_config(raw) as store:
        with pytest.raises(ShardNotInitializedError, match=r"store init --shards 9-9"):
            store.create("pin", {"a": 1}, shard=9)
        report = init_shards(store.config, shards=[9])
        assert report.databases_created == 1
        assert store.get(store.create("pin", {"a": 1}, shard=9)) == {"a": 1}


def test_init_with_a_small_pool_waits_for_no_connection(mariadb_ready: StoreConfig) -> None:
    # Two connections a host, eight workers asked for, and next to no wait allowed: init must run
    # no more workers on a host than its pool opens, or a worker times out behind another's DDL.
    conn = root()
    try:
        with conn.cursor() as cur:
            for s in range(TEST_SHARDS):
                cur.execute(f"DROP DATABASE IF EXISTS {db(s)}")
    finally:
        conn.close()
    raw = mariadb_config()
    raw["pool_size"] = 1
    raw["pool_timeout_s"] = 0.001
    report = init_shards(StoreConfig.from_dict(raw), workers_per_host=8)
    assert report.databases_created == TEST_SHARDS
    make_app_account(StoreConfig.from_dict(raw))
    with Store.from_config(mariadb_config()) as store:
        assert store.get(store.create("pin", {"a": 1}, shard=5)) == {"a": 1}


def test_a_read_survives_a_killed_connection(mariadb_ready: StoreConfig) -> None:
    with Store(mariadb_ready) as store:
        pin = store.create("pin", {"a": 1}, shard=0)
        assert store.get(pin) == {"a": 1}
        pool = store.admin_context().engines.shard(0, store.locate(pin).host).pool
        victims = [c.thread_id() for c in pool.idle_connections()]
        assert victims
        conn = root()
        try:
            with conn.cursor() as cur:
                for tid in victims:
                    cur.execute(f"KILL {tid}")
        finally:
            conn.close()
        opened = pool.opened
        assert store.get(pin) == {"a": 1}  # retried once on a fresh connection
        assert pool.opened == opened + 1
        assert store.get_many([pin]) == {pin: {"a": 1}}


def test_pool_recycle_s_replaces_old_connections(mariadb_ready: StoreConfig) -> None:
    """Like SQLAlchemy's pool_recycle: a connection older than pool_recycle_s is closed and a new one
    opened at checkout; a younger one is reused. The server sees a different connection id."""
    raw = mariadb_config()
    raw["pool_recycle_s"] = 0.5
    with Store(StoreConfig.from_dict(raw)) as store:
        pin = store.create("pin", {"a": 1}, shard=0)
        pool = store.admin_context().engines.shard(0, store.locate(pin).host).pool
        store.get(pin)
        first = {c.thread_id() for c in pool.idle_connections()}
        assert first
        opened = pool.opened
        store.get(pin)
        assert pool.opened == opened  # young: reused
        time.sleep(0.6)
        assert store.get(pin) == {"a": 1}
        assert pool.opened == opened + 1  # old: replaced
        assert not first & {c.thread_id() for c in pool.idle_connections()}
    with pytest.raises(ConfigError, match="pool_recycle_s must be a number of seconds"):
        StoreConfig.from_dict({**raw, "pool_recycle_s": 0})


def test_unreachable_host_is_a_connection_error() -> None:
    raw = mariadb_config()
    raw["hosts"] = {
        "MySQL001A": "mysql+pymysql://root@127.0.0.1:1",
        "MySQL002A": "mysql+pymysql://root@127.0.0.1:1",
    }
    with Store.from_config(raw) as store, pytest.raises(ConnectionLostError, match="on host MySQL00"):
        store.create("pin", {"a": 1})


def test_a_read_from_an_unreachable_host_fails_after_one_connect_timeout() -> None:
    """A connection that cannot be opened is not tried again (only a pooled one found dead is):
    the read fails after one ``connect_timeout_s``, not two."""
    timeout_s = 1.0
    with _host_that_never_answers() as port:
        raw = mariadb_config()
        raw["hosts"] = {name: f"mysql+pymysql://root@127.0.0.1:{port}" for name in ("MySQL001A", "MySQL002A")}
        raw["connect_timeout_s"] = timeout_s
        with Store.from_config(raw) as store:
            pin = encode_pinterest(0, 1, 1)
            for call in (lambda: store.get(pin), lambda: store.get_many([pin])):
                started = time.monotonic()
                with pytest.raises(ConnectionLostError, match="on host MySQL001A"):
                    call()
                took = time.monotonic() - started
                assert 0.8 * timeout_s < took < 1.6 * timeout_s, f"the read took {took:.2f} s"


@contextmanager
def _host_that_never_answers() -> Iterator[int]:
    """The port of a listener whose accept queue is full: the kernel drops every new SYN, so a
    connect waits out its whole timeout, as to a host that is down or cut off."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers: list[socket.socket] = []
    try:
        for _ in range(8):
            try:
                fillers.append(socket.create_connection(("127.0.0.1", port), timeout=0.3))
            except TimeoutError:
                break  # the queue is full: from here on a connect hears nothing
        else:
            pytest.fail("the listener's accept queue never filled")
        yield port
    finally:
        for s in fillers:
            s.close()
        listener.close()


def _plan_with_rows(
    table: str, rows: list[tuple[int, int, int]], sql: str, params: tuple[Any, ...]
) -> list[Any]:
    """EXPLAIN of ``sql`` once ``rows`` are in ``table`` (and its statistics read again); the rows
    are removed again after."""
    conn = root()
    try:
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table} (from_id, to_id, sequence) VALUES (%s, %s, %s)", rows)
            cur.execute(f"ANALYZE TABLE {table}")
            cur.fetchall()
            cur.execute("EXPLAIN " + sql, params)
            names = [d[0] for d in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    finally:
        with conn.cursor() as cur:
            cur.executemany(f"DELETE FROM {table} WHERE from_id = %s", sorted({(r[0],) for r in rows}))
        conn.close()


def _new_board(store: Store) -> tuple[int, ShardHandle, str]:
    """A new board on shard 6, that shard's handle, and its board_has_pins table."""
    board = store.create("board", {}, shard=6)
    h = store.admin_context().engines.shard(6, store.shard_map.master(6))
    return board, h, h.table("board_has_pins")


@pytest.mark.parametrize(
    "statement", ["list_asc", "list_desc", "page_asc", "page_asc_after", "page_desc_after"]
)
def test_list_queries_use_the_sequence_index_without_filesort(
    mariadb_ready: StoreConfig, statement: str
) -> None:
    with Store(mariadb_ready) as store:
        board, h, table = _new_board(store)
        # This board and three others no test creates, 500 pins each; removed again below.
        froms = [board] + [encode_pinterest(6, 2, 10**9 + k) for k in range(3)]
        rows = [(f, encode_pinterest(6, 1, 10**9 + j), j) for f in froms for j in range(500)]
        sql = getattr(store.admin_context().relation_repository.sql(h, "board_has_pins"), statement)
        offset_paged = {"f": board, "lim": 50, "off": 150}
        orders = store.admin_context().relation_repository.statements(h, "board_has_pins").orders
        params = {
            "list_asc": tuple(offset_paged[p] for p in orders["list_asc"]),
            "list_desc": tuple(offset_paged[p] for p in orders["list_desc"]),
            "page_asc": (board, 51),
            "page_asc_after": (board, 200, 200, rows[200][1], 51),
            "page_desc_after": (board, 200, 200, rows[200][1], 51),
        }[statement]
        plan = _plan_with_rows(table, rows, sql, params)
    assert len(plan) == 1, plan
    assert plan[0]["key"] == "board_has_pins_from_sequence_to", plan
    assert "filesort" not in (plan[0]["Extra"] or ""), plan


@pytest.mark.parametrize("statement", ["delete", "move", "move_if_other", "exists_locked"])
def test_a_pairs_writes_by_key_read_the_primary_key_on_a_one_entry_list(
    mariadb_ready: StoreConfig, statement: str
) -> None:
    # Through (from_id, sequence, to_id) a write of one pair locks every entry of its list, and
    # in the other order than a write through the primary key: the two deadlock. MariaDB chose
    # that index for a plain DELETE of a one-entry list; each write of a pair must name one row.
    with Store(mariadb_ready) as store:
        board, h, table = _new_board(store)
        pin = encode_pinterest(6, 1, 10**9)
        others = [encode_pinterest(6, 2, 10**9 + k) for k in range(3)]
        rows = [(board, pin, 1)] + [
            (f, encode_pinterest(6, 1, 10**9 + j), j) for f in others for j in range(2)
        ]
        sql = getattr(store.admin_context().relation_repository.sql(h, "board_has_pins"), statement)
        params = {
            "delete": (board, pin),
            "move": (5, board, pin),
            "move_if_other": (5, board, pin, 7),
            "exists_locked": (board, pin),
        }[statement]
        plan = _plan_with_rows(table, rows, sql, params)
    assert len(plan) == 1, plan
    assert plan[0]["key"] == "PRIMARY", plan


def test_a_refused_write_gives_its_connections_back(mariadb_ready: StoreConfig) -> None:
    """A write the store itself refuses (a deleted object linked, a stale version) rolls back and
    reuses its connections: no new connection is opened, none is left in a transaction, and a
    server error still discards the connection it came on."""
    with Store(mariadb_ready) as store:
        board = store.create("board", {"name": "b"}, shard=1)
        pin = store.create("pin", {"a": 1}, shard=5)  # another host: a pair over two pools
        kept = store.create("pin", {"a": 2}, shard=5)
        store.link("board_has_pins", board, kept)
        store.delete(pin)
        pools = {
            h: store.admin_context().engines.shard(s, h).pool
            for s, h in ((1, store.locate(board).host), (5, store.locate(pin).host))
        }
        assert len({id(p) for p in pools.values()}) == 2
        opened = {h: p.opened for h, p in pools.items()}
        version = store.get_with_version(kept).version
        store.update(kept, {"a": 3})
        for _ in range(5):
            with pytest.raises(NotFound):
                store.link("board_has_pins", board, pin)
            with pytest.raises(ConflictError):
                store.update(kept, {"a": 4}, if_version=version)
        assert {h: p.opened for h, p in pools.items()} == opened
        for p in pools.values():
            for conn in p.idle_connections():
                cur = conn.cursor()
                cur.execute("SELECT @@in_transaction")
                assert cur.fetchone()[0] == 0
                cur.close()
        assert store.link("board_has_pins", board, store.create("pin", {"a": 5}, shard=5))
        assert store.get(kept) == {"a": 3}
        # A server's error is not a refusal: its connection goes.
        host = store.locate(kept).host
        before = pools[host].opened
        with pytest.raises(BackendError):
            store.admin_context().engines.shard(5, host).transaction(
                lambda cur: cur.execute("SELECT * FROM no_such_table_here")
            )
        assert store.get(kept) == {"a": 3}
        assert pools[host].opened == before + 1


@pytest.mark.parametrize(
    "args",
    [
        (0, 1, -1, (1 << 63) - 1, -(1 << 63), 1 << 64),
        (True, False, None, 1.5, -0.0),
        ("plain", "it's", 'a "quote"', "back\\slash", "100%", "€ and \n"),
        ("\\'\"\0\r\n\x1a", '{"a": "b\\\\c", "d": "it\'s"}', "\\\\'", ""),
        (b"\x00\xff'", bytearray(b"ab"), 7, "x"),
        [3, "y", None],
    ],
)
def test_the_int_binding_cursor_sends_what_pymysql_would(mariadb_ready: StoreConfig, args: Any) -> None:
    """The store's PyMySQL cursor binds ints itself: the statement text is the driver's, byte for byte,
    for every type, and a wrong number of parameters is the driver's error."""
    from store.backends.pymysql_fast import cursor_class

    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", cursorclass=cursor_class(pymysql))
    try:
        ours, theirs = conn.cursor(), pymysql.cursors.Cursor(conn)
        query = "SELECT " + ", ".join(["%s"] * len(args)) + " -- 5%% of it"
        ours.execute(query, args)
        assert ours._executed == theirs.mogrify(query, args)
        assert list(ours.fetchone()) == list(theirs.execute(query, args) and theirs.fetchone())
        with pytest.raises(pymysql.err.ProgrammingError):
            ours.execute(query, [*args, 1])
        # A session without backslash escapes: a str is escaped as the driver escapes it there.
        ours.execute("SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')")
        ours.execute(query, args)
        assert ours._executed == theirs.mogrify(query, args)
        assert list(ours.fetchone()) == list(theirs.execute(query, args) and theirs.fetchone())
    finally:
        conn.close()


def test_the_cursor_reads_a_request_of_writes_as_pymysql_would(mariadb_ready: StoreConfig) -> None:
    """``execute_oks`` reads each statement's OK packet itself: the same affected rows and insert
    ids as PyMySQL's own reading (large ids in 8-byte length encoding too), an error in the middle
    raised as the driver raises it with the connection usable after, and a statement that returns
    rows refused with its connection closed."""
    from store.backends.pymysql_fast import cursor_class

    def connect() -> Any:
        return pymysql.connect(
            host="127.0.0.1",
            port=3306,
            user="root",
            autocommit=True,
            client_flag=pymysql.constants.CLIENT.MULTI_STATEMENTS,
            cursorclass=cursor_class(pymysql),
        )

    conn = connect()
    try:
        cur = conn.cursor()
        cur.execute(f"CREATE DATABASE IF NOT EXISTS {OKS}")

        def fresh() -> None:
            cur.execute(f"DROP TABLE IF EXISTS {OKS}.t")
            cur.execute(
                f"CREATE TABLE {OKS}.t (id BIGINT UNSIGNED AUTO_INCREMENT PRIMARY KEY, v INT) "
                "AUTO_INCREMENT = 72057594037927936"  # 2^56: an 8-byte insert id
            )

        fresh()
        request = (
            f"BEGIN; INSERT INTO {OKS}.t (v) VALUES (%s), (%s); "
            f"UPDATE {OKS}.t SET v = v + 1 WHERE v < %s; SELECT LAST_INSERT_ID(300) INTO @x; "
            f"DELETE FROM {OKS}.t WHERE v = %s; COMMIT"
        )
        ours = cur.execute_oks(request, (1, 2, 100, 3))
        fresh()
        theirs = []
        cur.execute(request, (1, 2, 100, 3))
        while True:
            theirs.append((cur.rowcount, cur.lastrowid or 0))
            if not cur.nextset():
                break
        assert [n for n, _ in ours] == [0, 2, 2, 1, 1, 0]
        assert ours[1][1] == 72057594037927936
        assert theirs == ours
        cur.execute("SELECT @x")
        assert cur.fetchone()[0] == 300
        # an error half way: the driver's exception, later statements not run, connection in step
        with pytest.raises(pymysql.err.ProgrammingError):
            cur.execute_oks(f"DO 1; INSERT INTO {OKS}.nope VALUES (1); DO 2")
        assert cur.execute_oks("DO 3") == [(0, 0)]
        # rows where none were expected: refused, and the connection is not reused
        with pytest.raises(pymysql.err.InternalError):
            cur.execute_oks("DO 1; SELECT 1; DO 2")
        assert not conn.open
    finally:
        conn.close()
        other = connect()
        other.cursor().execute(f"DROP DATABASE IF EXISTS {OKS}")
        other.close()


def test_the_cursor_reads_a_request_with_rows_as_pymysql_would(mariadb_ready: StoreConfig) -> None:
    """``execute_rows`` reads every statement's answer itself: OKs as ``execute_oks`` reads them,
    and each result's rows as PyMySQL's cursor gives them (ints, NULLs, text in the connection's
    encoding, binary as bytes, JSON, decimals, dates, long values, an empty result), an
    error half way raised as the driver raises it, with the connection usable after."""
    from store.backends.pymysql_fast import cursor_class

    conn = pymysql.connect(
        host="127.0.0.1",
        port=3306,
        user="root",
        autocommit=True,
        client_flag=pymysql.constants.CLIENT.MULTI_STATEMENTS,
        cursorclass=cursor_class(pymysql),
    )
    try:
        cur = conn.cursor()
        request = (
            "DO 1; SELECT %s, NULL, -5, 18446744073709551615, 'caf\u00e9 \u20ac', _binary X'00ff', "
            "JSON_OBJECT('a', 1), 1.50, DATE '2024-02-29', 2.5e0; "
            "SELECT 1 FROM DUAL WHERE 1 = 0; SELECT GROUP_CONCAT(x SEPARATOR ';') FROM "
            "(SELECT 1 AS x UNION SELECT 2) AS t; SELECT REPEAT('a', 300), REPEAT('b', 70000), 7; DO 2"
        )
        ours = cur.execute_rows(request, (12345678901234,))
        theirs = []
        cur.execute(request, (12345678901234,))
        while True:
            theirs.append((cur.rowcount, cur.lastrowid or 0, list(cur.fetchall()) if cur.description else []))
            if not cur.nextset():
                break
        assert [(n, last) for n, last, _rows in ours] == [(n, last) for n, last, _rows in theirs]
        assert [rows for _n, _last, rows in ours] == [rows for _n, _last, rows in theirs]
        assert ours[1][2][0][0] == 12345678901234
        assert ours[1][2][0][4] == "caf\u00e9 \u20ac"
        assert ours[2] == (0, 0, [])
        assert ours[3][2] == [("1;2",)]
        assert [len(v) for v in ours[4][2][0][:2]] == [300, 70000]
        with pytest.raises(pymysql.err.ProgrammingError):
            cur.execute_rows("SELECT 1; SELECT * FROM no_such_db_here.nope; SELECT 2")
        assert cur.execute_rows("SELECT 3") == [(1, 0, [(3,)])]
    finally:
        conn.close()
