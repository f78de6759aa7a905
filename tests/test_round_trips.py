"""Round trips of the write path on MariaDB, counted on the sockets (the property, not a timing).

A new pair with its inverse on another host: BEGIN goes with each side's
first statement, the object read is inside each insert, each count runs
in the same request as its write, only if the write changed the row, and
the inverse side's COMMIT goes with them too: 3 requests to the databases
(the primary side's write, the inverse side's write and COMMIT, the
primary side's COMMIT). On one host (a pin on its board's shard): 1, both
sides' writes and counts with the COMMIT behind gates that end the request
unless each side's write changed its row. A move and an unlink alike; an
update: 2. Warm pools, no cache.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from store import Store, StoreConfig
from store.tools.mix.runner import counting_sends, reset_sends, sends

pytestmark = pytest.mark.mariadb

BHP = "board_has_pins"


@pytest.fixture
def store(mariadb_ready: StoreConfig) -> Iterator[Store]:
    s = Store(mariadb_ready)
    try:
        yield s
    finally:
        s.close()


def trips(call: object) -> int:
    assert callable(call)
    with counting_sends():
        reset_sends()
        call()
        return sends()


def test_link_writes_take_few_round_trips(store: Store) -> None:
    board = store.create("board", {"name": "b"}, shard=1)  # host MySQL001A
    here = store.create("pin", {"n": 1}, near=board)  # the board's shard
    there = store.create("pin", {"n": 2}, shard=5)  # host MySQL002A: another pool
    # warm both pools and the statement caches
    warm = store.create("pin", {"n": 3}, shard=5)
    store.link(BHP, board, warm)
    store.unlink(BHP, board, warm)

    # Two pools: the primary side's write and its count in one request; the inverse side's write,
    # count and COMMIT in one; then the primary side's COMMIT.
    assert trips(lambda: store.link(BHP, board, there)) == 3
    # One connection reaches both sides: both sides' writes and counts, and the COMMIT behind
    # gates (it runs only if both writes changed their rows).
    assert trips(lambda: store.link(BHP, board, here)) == 1
    assert trips(lambda: store.link(BHP, board, there, sequence=1 << 40)) == 3
    assert trips(lambda: store.unlink(BHP, board, there)) == 3
    # A link at a sequence of a pair that is not there yet: the move finds nothing and the
    # guarded insert, in the same request, inserts it (no separate read of the board); then
    # moving it is the same request, where the move does it.
    fresh = store.create("pin", {"n": 4}, near=board)
    assert trips(lambda: store.link(BHP, board, fresh, sequence=7)) == 1
    assert trips(lambda: store.link(BHP, board, fresh, sequence=9)) == 1
    far = store.create("pin", {"n": 6}, shard=5)
    assert trips(lambda: store.link(BHP, board, far, sequence=7)) == 3
    assert trips(lambda: store.link(BHP, board, far, sequence=9)) == 3
    # One connection reaches both sides: both deletes, their counts and the COMMIT in one request.
    assert trips(lambda: store.unlink(BHP, board, here)) == 1
    assert trips(lambda: store.link(BHP, board, here)) == 1
    # A re-link of a pair in place: the primary side's gate ends the request (its write changed
    # nothing, the inverse side's did not run); one read of both rows says it is in place; the
    # COMMIT.
    assert trips(lambda: store.link(BHP, board, here)) == 3
    assert store.link(BHP, board, here) is False
    store.unlink(BHP, board, far)
    assert store.page(BHP, board).ids == [fresh, here]
    assert store.count("pin_owned_by_board", fresh) == 1
    store.unlink(BHP, board, fresh)
    # and the rows and counts are right on both sides
    assert trips(lambda: store.update(here, {"n": 5})) == 2  # BEGIN + read for update; UPDATE + COMMIT
    assert store.get(here) == {"n": 5}
    assert store.links(BHP, board) == [here]
    assert store.count(BHP, board) == 1
    assert store.links("pin_owned_by_board", there) == []
    assert store.count("pin_owned_by_board", here) == 1


# -- reads of many lists: one round trip per host ----------------------------------


class Trips:
    """Requests to each database host, to Redis and to each memcached server, from any thread.

    A database request is one ``COM_QUERY`` of a PyMySQL connection, counted
    against the pool (host) that lent the connection; a Redis request is one
    packed send (a pipeline is one; a new connection's handshake, HELLO, CLIENT
    SETINFO and SELECT, is not counted); a memcached request is one pipelined batch, its reply
    waited for or not (a fill's, `MemcachedServer.post`).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import threading

        import pymysql.connections
        import redis.connection

        from store.cache.memcached import MemcachedServer
        from store.pool import ConnectionPool

        self.database: dict[str, int] = {}
        self.redis = 0
        self.memcached: dict[str, int] = {}
        lock = threading.Lock()
        real_checkout = ConnectionPool.checkout
        real_query = pymysql.connections.Connection._execute_command
        real_redis = redis.connection.Connection.send_packed_command
        real_handshake = redis.connection.Connection.on_connect_check_health
        real_mc = MemcachedServer.pipeline
        real_post = MemcachedServer.post

        def checkout(pool: ConnectionPool) -> tuple[object, float]:
            conn, born = real_checkout(pool)
            conn.raw._trips_host = pool.name  # type: ignore[attr-defined]
            return conn, born

        def query(conn: object, command: int, sql: object) -> object:
            with lock:
                host = getattr(conn, "_trips_host", "?")
                self.database[host] = self.database.get(host, 0) + 1
            return real_query(conn, command, sql)

        def redis_send(conn: object, command: object, check_health: bool = True) -> None:
            if not getattr(conn, "_trips_handshake", False):
                with lock:
                    self.redis += 1
            real_redis(conn, command, check_health)  # type: ignore[arg-type]

        def handshake(conn: redis.connection.Connection, check_health: bool = True) -> None:
            conn._trips_handshake = True  # type: ignore[attr-defined]
            try:
                real_handshake(conn, check_health)
            finally:
                conn._trips_handshake = False  # type: ignore[attr-defined]

        def mc_send(server: MemcachedServer, commands: object, parse: object) -> object:
            with lock:
                self.memcached[server.address] = self.memcached.get(server.address, 0) + 1
            return real_mc(server, commands, parse)  # type: ignore[arg-type]

        monkeypatch.setattr(ConnectionPool, "checkout", checkout)
        monkeypatch.setattr(pymysql.connections.Connection, "_execute_command", query)
        monkeypatch.setattr(redis.connection.Connection, "send_packed_command", redis_send)
        monkeypatch.setattr(redis.connection.Connection, "on_connect_check_health", handshake)

        def mc_post(server: MemcachedServer, commands: object, reader: object) -> bool:
            with lock:
                self.memcached[server.address] = self.memcached.get(server.address, 0) + 1
            return real_post(server, commands, reader)  # type: ignore[arg-type]

        monkeypatch.setattr(MemcachedServer, "pipeline", mc_send)
        monkeypatch.setattr(MemcachedServer, "post", mc_post)

    def reset(self) -> None:
        self.database, self.redis, self.memcached = {}, 0, {}


def _twenty_boards(store: Store) -> tuple[list[int], dict[int, list[int]]]:
    """Twenty boards over shards 0-7 (hosts MySQL001A and MySQL002A), three pins each."""
    boards = [store.create("board", {"b": i}, shard=i % 8) for i in range(20)]
    pins = {
        b: [store.create("pin", {"b": i, "k": k}, near=b) for k in range(3)] for i, b in enumerate(boards)
    }
    for b, ps in pins.items():
        for p in ps:
            store.link(BHP, b, p)
    return boards, pins


def test_board_pins_many_cold_and_warm_round_trips(
    mariadb_ready: StoreConfig, memcached_pair: list[str], redis_ready: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import cached_mariadb_config

    with Store.from_config(cached_mariadb_config(memcached_pair, redis_ready)) as store:
        boards, pins = _twenty_boards(store)
        # A Redis of this test process's own may not hold the list scripts yet (the first EVALSHA
        # loads them, two round trips once per server): load them on a list of another board.
        other = store.create("board", {"b": "other"})
        store.link(BHP, other, store.create("pin", {"b": "other"}, near=other))
        store.board_pins_many([other])
        trips = Trips(monkeypatch)
        cold = store.board_pins_many(boards)  # nothing cached: lists and pins from the databases
        assert {b: p.ids for b, p in cold.items()} == pins
        assert trips.database == {"MySQL001A": 2, "MySQL002A": 2}  # lists, then pins, per host
        assert trips.redis == 2  # one pipeline reads every list, one fills them
        assert all(n == 2 for n in trips.memcached.values())  # a lookup, then a fill, per server
        trips.reset()
        warm = store.board_pins_many(boards)
        assert warm == cold
        assert trips.database == {}
        assert trips.redis == 1  # one pipeline for the twenty lists
        assert sorted(trips.memcached) == sorted(memcached_pair)  # the pins are on both servers
        assert all(n == 1 for n in trips.memcached.values())  # one batch per server
        # and the viewer's hearts for the feed, from the cached whole lists: no database either
        shown = [p for b in boards for p in warm[b].ids]
        trips.reset()
        assert store.has_links_many(BHP, [(b, p) for b in boards for p in shown[:5]]) == {
            (boards[0], p) for p in pins[boards[0]]
        } | {(boards[1], p) for p in shown[3:5]}
        assert trips.database == {}
        assert trips.redis == 1


def test_many_lists_reads_are_one_query_per_host_without_a_cache(
    mariadb_ready: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(mariadb_ready) as store:
        boards, pins = _twenty_boards(store)
        viewer = store.create("user", {}, shard=2)
        everything = [p for ps in pins.values() for p in ps]
        for p in everything[::4]:
            store.link("users_likes_pins", viewer, p)
        store.board_pins_many(boards)  # warm the pools
        trips = Trips(monkeypatch)
        assert {b: p.ids for b, p in store.pages_many(BHP, boards, limit=2).items()} == {
            b: ps[:2] for b, ps in pins.items()
        }
        assert trips.database == {"MySQL001A": 1, "MySQL002A": 1}
        trips.reset()
        assert {b: p.ids for b, p in store.board_pins_many(boards).items()} == pins
        assert trips.database == {"MySQL001A": 2, "MySQL002A": 2}
        trips.reset()
        pairs = [(b, p) for b in boards for p in everything[:12]]
        assert store.has_links_many(BHP, pairs) == {(b, p) for b in boards[:4] for p in pins[b]}
        assert trips.database == {"MySQL001A": 1, "MySQL002A": 1}
        trips.reset()
        assert store.has_links("users_likes_pins", viewer, everything) == set(everything[::4])
        assert trips.database == {"MySQL001A": 1}  # the viewer's shard only


def test_a_newest_first_page_of_a_long_list_is_served_warm_from_the_cache(
    mariadb_ready: StoreConfig, memcached_pair: list[str], redis_ready: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two boards of 5,000 pins each (50 real pins, the newest; 4,950 older rows written straight to
    the table): every newest-first read, warm, takes no database round trip. Before, a list longer
    than the cached head (cache.list_entries) was cached from its oldest end only, and every
    newest-first page of it read MariaDB."""
    from tests.conftest import cached_mariadb_config

    older = 4950
    with Store.from_config(cached_mariadb_config(memcached_pair, redis_ready)) as store:
        ctx = store.admin_context()
        boards = [store.create("board", {"b": i}, shard=i * 4) for i in range(2)]  # one on each host
        newest: dict[int, list[int]] = {}
        for i, board in enumerate(boards):
            h = ctx.relations.handle(store.config.relations[BHP], board)
            with h.connect() as conn:
                cur = conn.cursor()
                cur.executemany(
                    f"INSERT INTO {h.table(BHP)} (from_id, to_id, sequence) VALUES (%s, %s, %s)",
                    [(board, (1 << 50) + 10_000 * i + k, k) for k in range(older)],
                )
                conn.commit()
            assert ctx.relations.repo.recount(h, BHP, board) == older
            ctx.relations.invalidate([(BHP, board)])
            pins = [store.create("pin", {"b": i, "k": k}, near=board) for k in range(50)]
            for k, p in enumerate(pins):
                store.link(BHP, board, p, sequence=older + k)
            newest[board] = pins[::-1]
            store.get_many(pins)  # the pin objects cached: only the lists are counted below
        board = boards[0]
        assert store.count(BHP, board) == older + 50
        trips = Trips(monkeypatch)
        cold = store.page(BHP, board, limit=50, newest_first=True)
        assert cold.ids == newest[board]
        assert trips.database == {"MySQL001A": 1}  # the newest end and the count, one statement
        for call, want in (
            (lambda: store.page(BHP, board, limit=50, newest_first=True).ids, newest[board]),
            (lambda: store.page(BHP, board, limit=50, cursor=cold.next_cursor, newest_first=True).ids, None),
            (lambda: store.links(BHP, board, limit=20, offset=10, newest_first=True), newest[board][10:30]),
            (lambda: store.board_pins(board, limit=30, newest_first=True).ids, newest[board][:30]),
        ):
            trips.reset()
            got = call()
            assert trips.database == {}, call
            assert trips.redis == 1
            if want is not None:
                assert got == want
            else:  # the second page: the 4,950 older rows, newest first
                assert got == [(1 << 50) + k for k in range(older - 1, older - 51, -1)]
        # Many boards: the first one cached at its newest end, the second not yet (one query).
        trips.reset()
        pages = store.pages_many(BHP, boards, limit=25, newest_first=True)
        assert {b: p.ids for b, p in pages.items()} == {b: newest[b][:25] for b in boards}
        assert trips.database == {"MySQL002A": 1}
        for call in (
            lambda: store.pages_many(BHP, boards, limit=25, newest_first=True),
            lambda: store.board_pins_many(boards, limit=25, newest_first=True),
        ):
            trips.reset()
            many = call()
            assert {b: p.ids for b, p in many.items()} == {b: newest[b][:25] for b in boards}
            assert trips.database == {}
            assert trips.redis == 1
        # An oldest-first read of the same list: the other end, a miss that fills it (then warm).
        trips.reset()
        assert store.page(BHP, board, limit=3).ids == [(1 << 50) + k for k in range(3)]
        assert trips.database == {"MySQL001A": 1}
        trips.reset()
        assert store.page(BHP, board, limit=3).ids == [(1 << 50) + k for k in range(3)]
        assert trips.database == {}
        # A new pin, the newest of all, updates a head of the newest entries in place.
        store.page(BHP, board, limit=5, newest_first=True)
        pin = store.create("pin", {"new": 1}, near=board)
        store.link(BHP, board, pin, sequence=older + 1000)
        trips.reset()
        assert store.page(BHP, board, limit=3, newest_first=True).ids == [pin, *newest[board][:2]]
        assert trips.database == {}


def test_page_objects_takes_the_round_trips_board_pins_takes(
    mariadb_ready: StoreConfig, memcached_pair: list[str], redis_ready: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`page_objects` of any relation costs what `board_pins` costs for a list of the same shape,
    cold (nothing cached) and warm; `pages_objects_many` what `board_pins_many` costs."""
    from tests.conftest import cached_mariadb_config

    with Store.from_config(cached_mariadb_config(memcached_pair, redis_ready)) as store:
        boards, _pins = _twenty_boards(store)
        # Users' lists of the same shape, on the same shards, of pins of their own (none cached).
        users = [store.create("user", {"u": i}, shard=i % 8) for i in range(20)]
        for u in users:
            for k in range(3):
                store.link("users_has_pins", u, store.create("pin", {"k": k}, near=u))
        store.page(BHP, boards[0])  # warm the pools
        trips = Trips(monkeypatch)

        def counted(call: object) -> tuple[dict[str, int], int, set[int]]:
            """Requests per database host, to Redis, and per memcached server (which servers a
            page's objects live on depends on their IDs: the count per server it reaches)."""
            assert callable(call)
            trips.reset()
            call()
            return trips.database, trips.redis, set(trips.memcached.values())

        for b, u in ((boards[1], users[1]), (boards[2], users[2])):
            for _round in ("cold", "warm"):
                by_board = counted(lambda b=b: store.board_pins(b, limit=2))
                assert counted(lambda u=u: store.page_objects("users_has_pins", u, limit=2)) == by_board
        # page_objects of board_has_pins and board_pins: two boards on shard 3, cold then warm
        for _round in ("cold", "warm"):
            assert counted(lambda: store.page_objects(BHP, boards[3], limit=2)) == counted(
                lambda: store.board_pins(boards[11], limit=2)
            )
        rest_boards, rest_users = boards[5:], users[5:]
        cold = counted(lambda: store.board_pins_many(rest_boards))
        assert counted(lambda: store.pages_objects_many("users_has_pins", rest_users)) == cold
        warm = counted(lambda: store.board_pins_many(rest_boards))
        assert counted(lambda: store.pages_objects_many("users_has_pins", rest_users)) == warm
        assert warm[0] == {}
        assert warm[1] == 1
