"""`store bench`: the store's operations next to the raw driver doing the same work.

Each case times the library call and a floor (the raw DBAPI statement on a
connection of its own) in the same loop, alternating one call of each, so
both see the same machine noise; the report gives medians, p99s and their
ratios. Only ratios from one run are meaningful on a shared machine.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from store.backends.statements import int_array
from store.config import CacheConfig
from store.cursors import encode_cursor
from store.engines import DBAPIConnection
from store.exceptions import ConnectionLostError
from store.ids import encode_instagram, encode_pinterest
from store.store import Store
from store.tools.bench_bulk import bulk_cases
from store.tools.timing import PIN, BenchResult, pair

if TYPE_CHECKING:
    from store.engines import ShardHandle
    from store.metrics import Metrics

__all__ = ["CASES", "Wanted", "format_results", "metrics_cost_cases", "run_bench"]

#: Every case `run_bench` can run, by group (the ticket cases are named by their servers and block).
CASES: dict[str, tuple[str, ...]] = {
    "objects": ("create", "create (instagram)", "get", "get_many(50)"),
    "relations": (
        "page 1",
        "page 200 cursor",
        "page 200 offset",
        "count",
        "has_links(500)",
        "board_pins_many(20)",
    ),
    "bulk": ("create_many(100)", "link_many(100)", "cached create_many(100)", "cached link_many(100)"),
    "cache": (
        "warm get",
        "warm get_many(50)",
        "warm board page",
        "warm has_links(500)",
        "warm board_pins_many(20)",
    ),
    "tickets": ("ticket",),
    "metrics": ("get: metrics on/off", "warm get: metrics on/off"),
}


class Wanted:
    """Which cases to run: all (``names`` None), or those ``names`` name.

    A name is a case's whole name (``page 1``) or the part before its size or detail:
    ``create_many`` names ``create_many(100)``, ``create`` names ``create (instagram)``, ``ticket``
    every ticket case.
    """

    def __init__(self, names: Iterable[str] | None = None) -> None:
        self.names = None if names is None else [n.strip() for n in names if n.strip()]
        known = [c for group in CASES.values() for c in group]
        for name in self.names or []:
            if not any(_names(name, c) for c in known):
                raise ValueError(f"no bench case is named {name!r}; the cases: {', '.join(known)}")

    def __call__(self, case: str) -> bool:
        """Whether ``case`` runs."""
        return self.names is None or any(_names(n, case) for n in self.names)

    def group(self, name: str) -> bool:
        """Whether any case of group ``name`` (of `CASES`) runs."""
        return any(self(c) for c in CASES[name])


def _names(name: str, case: str) -> bool:
    return case == name or case.startswith((f"{name}(", f"{name} (", f"{name},"))


@contextmanager
def _raw_connection(store: Store, host: str, shard: int) -> Iterator[tuple[DBAPIConnection, str]]:
    """A driver connection outside the store's pool, and the driver's placeholder."""
    backend = store.admin_context().engines.backend(host)
    store.admin_context().engines.shard(shard, host)  # where shards are made on first use, this makes it
    c = store.config
    connect = backend.connector(
        c.hosts[host], shard=shard, connect_timeout_s=c.connect_timeout_s, query_timeout_s=c.query_timeout_s
    )
    try:
        conn: Any = connect()
    except Exception as exc:
        if not backend.is_driver_error(exc):
            raise
        raise ConnectionLostError(
            f"bench cannot connect to shard {shard} on host {host}: {exc} "
            "(is the server up, and has `store init` run for this config?)",
            orig=exc,
        ) from exc
    try:
        yield conn, backend.param
    finally:
        conn.close()


class _PooledCursor:
    """The floors' cursor: each statement on the store's own pooled connection to the shard's host.

    The connection is borrowed for one statement and its rows (given back by
    ``fetchone``, ``fetchall`` or ``release``), so the store's next call takes
    the same one: each side's statements are served by the same server
    process or thread. On PostgreSQL (a process per connection, 2 cores) the
    same statement measured 47 us on one connection and 78 us on another,
    by which core the server process ran on. The statements go through the
    driver's own cursor, not the store's (PyMySQL's plain `Cursor`, not the
    store's faster one) unless ``driver_cursor`` is False; on PostgreSQL the
    connection's cursor sends ``$n`` text, as a careful hand-written program
    would (see BENCHMARKS.md).
    """

    def __init__(self, h: ShardHandle, *, driver_cursor: bool = True) -> None:
        self._pool = h.pool
        self._driver_cursor = driver_cursor
        self._held: tuple[Any, float] | None = None
        self._cur: Any = None
        self._cursors: dict[int, Any] = {}  # id of a driver connection -> its plain cursor

    def _plain_cursor(self, raw: Any) -> Any:
        cur = self._cursors.get(id(raw))
        if cur is None:
            # The store's connection class subclasses PyMySQL's: ask the class's ancestry, not its
            # own module (which is the store's).
            if self._driver_cursor and any(c.__module__.startswith("pymysql.") for c in type(raw).__mro__):
                import pymysql.cursors

                cur = raw.cursor(pymysql.cursors.Cursor)
            else:
                cur = raw.cursor()
            self._cursors[id(raw)] = cur
        return cur

    def execute(self, sql: str, params: Any) -> None:
        """Borrow the connection and run ``sql``."""
        self.release()
        self._held = self._pool.checkout()
        raw = self._held[0].raw
        self._cur = self._plain_cursor(raw)
        if hasattr(raw, "prepare_threshold"):
            # psycopg: prepared on the server, as a program on psycopg's defaults has its statements
            # prepared after their fifth run (the store's connections prepare their own instead).
            self._cur.execute(sql, params, prepare=True)
        else:
            self._cur.execute(sql, params)

    def fetchone(self) -> Any:
        """The next row; the connection goes back."""
        row = self._cur.fetchone()
        self.release()
        return row

    def fetchall(self) -> Any:
        """Every row; the connection goes back."""
        rows = self._cur.fetchall()
        self.release()
        return rows

    def release(self) -> None:
        """Give the connection back (after a statement with no rows to read)."""
        if self._held is not None:
            self._pool.checkin(*self._held)
            self._held = None


def run_bench(
    store: Store,
    *,
    n: int = 2000,
    progress: Callable[[str], None] | None = None,
    metrics: Metrics | None = None,
    cases: Wanted | None = None,
    floor_cursor: str = "driver",
) -> list[BenchResult]:
    """Run every case (or those ``cases`` wants) ``n`` times against ``store``'s first open shard's host.

    The database cases run without caches (a twin of ``store`` sharing its
    pools); the warm-cache cases run when ``store`` has memcached and Redis.
    Where ``store`` has caches, the batch writes run a second time on it as
    configured ("cached create_many(100)", "cached link_many(100)"): a
    write's invalidations are part of what it costs, and the links' floor
    drops what a program caching lists must (`bulk_cases`).
    With ``metrics``, both are instrumented, and `metrics_cost_cases` is added.
    ``floor_cursor``: "driver" (the floors send their statements through the
    driver's own cursor, as a hand-written program does) or "store" (through
    the store's cursor, with its quicker binding and escaping: a stricter
    floor, which prices the store's own steps alone).
    """
    if floor_cursor not in ("driver", "store"):
        raise ValueError(f"floor_cursor is 'driver' or 'store', not {floor_cursor!r}")
    wanted = cases or Wanted()
    shard = store.config.open_shards[0][0]
    host = store.shard_map.master(shard)
    say = progress or (lambda _msg: None)
    uncached = Store(replace(store.config, cache=CacheConfig()), engines=store.admin_context().engines)
    if metrics is not None:
        from store.metrics import instrument

        instrument(store, metrics)
        instrument(uncached, metrics)
    floor = _PooledCursor(
        store.admin_context().engines.shard(shard, host), driver_cursor=floor_cursor == "driver"
    )
    with _raw_connection(store, host, shard) as (raw, p):
        cur = raw.cursor()
        try:
            results = _object_cases(uncached, floor, p, shard, n, say, wanted)
            if "board_has_pins" in store.config.relations and wanted.group("relations"):
                results += _relation_cases(uncached, cur, floor, p, shard, n, say, wanted)
            if wanted.group("bulk"):
                results += bulk_cases(uncached, floor, p, shard, n, say, wanted)
                if store.config.cache.memcached or store.config.cache.redis:
                    results += bulk_cases(store, floor, p, shard, n, say, wanted, label="cached ")
        finally:
            floor.release()
            cur.close()
    if store.config.cache.memcached and store.config.cache.redis and wanted.group("cache"):
        from store.tools.bench_cache import cache_cases

        results += cache_cases(store, shard, n, say)
    if store.config.tickets is not None and wanted.group("tickets"):
        from store.tools.bench_tickets import ticket_cases

        results += ticket_cases(store.config.tickets, n, say)
    if metrics is not None and wanted.group("metrics"):
        results += metrics_cost_cases(store, metrics, n, say)
    return [r for r in results if wanted(r.case)]


def metrics_cost_cases(
    store: Store, metrics: Metrics, n: int, say: Callable[[str], None]
) -> list[BenchResult]:
    """``get`` and warm ``get`` with metrics on (the "store" column) against off (the "raw" column).

    Both sides call one store (same pools, same cache connections, same
    objects): "on" through the timing wrapper `store.metrics.instrument`
    installs, "off" straight to the method. Two stores of their own measured
    5-60 % apart with no metrics at all (which one made the objects, which
    connection is warm), far above the cost being measured. The store's host
    observer is on for both sides, so "off" pays its one call per checkout
    too (about 0.1 us): the figure slightly understates the cost of a get.
    The calls alternate in one loop, as every case here does.
    """
    shard = store.config.open_shards[0][0]
    name = "pin" if "pin" in store.config.types else next(iter(store.config.types))
    results: list[BenchResult] = []
    cold = replace(store.config, cache=CacheConfig())
    with Store(cold) as db:
        db.admin_context().engines.set_observer(metrics.observe_host)
        timed = metrics.timed("get", db.get)
        ids = [db.create(name, PIN, shard=shard) for _ in range(200)]
        rng = random.Random(11)
        picks = [ids[rng.randrange(len(ids))] for _ in range(n + 50)]
        say("get, metrics on vs off")
        results.append(
            pair(
                "get: metrics on/off",
                lambda i: timed(picks[i], type_name=name),
                lambda i: db.get(picks[i], type_name=name),
                n,
            )
        )
    if store.config.cache.memcached or store.config.cache.memory:
        with Store(store.config) as warm:
            warm.admin_context().engines.set_observer(metrics.observe_host)
            timed = metrics.timed("get", warm.get)
            pins = [warm.create(name, PIN, shard=shard) for _ in range(50)]
            for p in pins:
                warm.get(p)
            say("warm get, metrics on vs off")
            results.append(
                pair(
                    "warm get: metrics on/off",
                    lambda i: timed(pins[i % 50]),
                    lambda i: warm.get(pins[i % 50]),
                    n,
                )
            )
    return results


def _object_cases(
    store: Store, cur: _PooledCursor, p: str, shard: int, n: int, say: Callable[[str], None], wanted: Wanted
) -> list[BenchResult]:
    pin_type = store.config.types.get("pin") or next(iter(store.config.types.values()))
    table = store.admin_context().engines.backend(store.shard_map.master(shard)).table(shard, pin_type.table)
    results: list[BenchResult] = []
    instagram = store.config.ids == "instagram"
    key = "id" if instagram else "local_id"
    name = pin_type.name

    # The floors do the same work as the store: encode before the INSERT,
    # decode after the SELECT, with the same JSON library. Instagram IDs come
    # back with RETURNING, made by the database's next_id().
    if instagram:

        def raw_insert(_i: int) -> None:
            cur.execute(
                f"INSERT INTO {table} (data) VALUES ({p}) RETURNING id", (orjson.dumps(PIN).decode(),)
            )
            cur.fetchone()

    else:

        def raw_insert(_i: int) -> None:
            cur.execute(f"INSERT INTO {table} (data) VALUES ({p})", (orjson.dumps(PIN).decode(),))
            cur.release()

    case = "create (instagram)" if instagram else "create"
    if wanted(case):
        say(case)
        results.append(pair(case, lambda _i: store.create(name, PIN, shard=shard), raw_insert, n))
    if not (wanted("get") or wanted("get_many(50)")):
        return results
    ids = [store.create(name, PIN, shard=shard) for _ in range(200)]
    local_ids = [store.locate(i, type_name=name).local_id for i in ids]
    rng = random.Random(7)
    picks = [rng.randrange(len(ids)) for _ in range(n + 50)]

    def raw_get(i: int) -> None:
        cur.execute(f"SELECT data FROM {table} WHERE {key} = {p} AND active = 1", (local_ids[picks[i]],))
        orjson.loads(cur.fetchone()[0])

    if wanted("get"):
        say("get")
        results.append(pair("get", lambda i: store.get(ids[picks[i]], type_name=name), raw_get, n))

    batches = [rng.sample(range(len(ids)), 50) for _ in range(16)]
    in_list = ", ".join([p] * 50)

    def raw_get_many(i: int) -> None:
        cur.execute(
            f"SELECT {key}, data FROM {table} WHERE active = 1 AND {key} IN ({in_list})",
            [local_ids[j] for j in batches[i % 16]],
        )
        {row[0]: orjson.loads(row[1]) for row in cur.fetchall()}

    if wanted("get_many(50)"):
        say("get_many(50)")
        results.append(
            pair(
                "get_many(50)",
                lambda i: store.get_many([ids[j] for j in batches[i % 16]], type_name=name),
                raw_get_many,
                max(1, n // 2),
            )
        )
    return results


#: Pins on the bench board: page 200 of 50 starts at entry 9,950.
BOARD_PINS = 10_050
Row = tuple[int, int, int]  # from_id, to_id, sequence


@contextmanager
def _loaded_board(store: Store, cur: Any, p: str, shard: int, rel: str) -> Iterator[tuple[int, list[Row]]]:
    """A new board with BOARD_PINS entries in ``rel``, bulk-loaded, removed afterwards."""
    spec = store.config.relations[rel]
    board = store.create(spec.from_type, {"name": "bench board"}, shard=shard)
    to_type = store.config.types[spec.to_type].id
    h = store.admin_context().engines.shard(shard, store.shard_map.master(shard))
    table, counts = h.table(rel), h.table("relation_counts")
    # Straight into the table (reads need no inverse side), plus the count row the store keeps.
    if store.config.ids == "instagram":
        base = int(time.time() * 1000) - store.config.instagram_epoch_ms
        rows = [(board, encode_instagram(base + k // 1024, shard, k % 1024), k) for k in range(BOARD_PINS)]
    else:
        rows = [(board, encode_pinterest(shard, to_type, 1 + k), k) for k in range(BOARD_PINS)]
    cur.execute("BEGIN")
    cur.executemany(f"INSERT INTO {table} (from_id, to_id, sequence) VALUES ({p}, {p}, {p})", rows)
    cur.execute(
        f"INSERT INTO {counts} (relation, from_id, n) VALUES ({p}, {p}, {p})", (rel, board, len(rows))
    )
    cur.execute("COMMIT")
    try:
        yield board, rows
    finally:
        # Leave no bench rows behind: they have no inverse side, and a later
        # `store relations repair` would rightly report them.
        cur.execute(f"DELETE FROM {table} WHERE from_id = {p}", (board,))
        cur.execute(f"DELETE FROM {counts} WHERE relation = {p} AND from_id = {p}", (rel, board))


def _relation_cases(
    store: Store,
    cur: Any,
    floor: _PooledCursor,
    p: str,
    shard: int,
    n: int,
    say: Callable[[str], None],
    wanted: Wanted,
) -> list[BenchResult]:
    """The relation cases: ``cur`` (a connection of its own) loads the lists, ``floor`` times the floors."""
    rel = "board_has_pins"
    h = store.admin_context().engines.shard(shard, store.shard_map.master(shard))
    table, counts = h.table(rel), h.table("relation_counts")
    keyed = f"SELECT sequence, to_id FROM {table} WHERE from_id = {p}"
    first_sql = f"{keyed} ORDER BY sequence, to_id LIMIT {p}"
    deep_sql = (
        f"{keyed} AND sequence >= {p} AND (sequence > {p} OR to_id > {p}) ORDER BY sequence, to_id LIMIT {p}"
    )
    offset_sql = (
        f"SELECT to_id FROM {table} WHERE from_id = {p} ORDER BY sequence, to_id LIMIT {p} OFFSET {p}"
    )
    count_sql = f"SELECT n FROM {counts} WHERE relation = {p} AND from_id = {p}"
    say(f"loading {BOARD_PINS} pins onto a board")
    with _loaded_board(store, cur, p, shard, rel) as (board, rows):
        _from, deep_to, deep_seq = rows[9_949]  # page 200 starts after entry 9,949
        deep_cursor = encode_cursor(rel, board, False, deep_seq, deep_to, key=store.config.cursor_secret)

        def raw(sql: str, params: tuple[Any, ...]) -> Callable[[int], None]:
            def run(_i: int) -> None:
                floor.execute(sql, params)
                floor.fetchall()

            return run

        cases = [
            ("page 1", lambda _i: store.page(rel, board, limit=50), raw(first_sql, (board, 51)), n),
            (
                "page 200 cursor",
                lambda _i: store.page(rel, board, limit=50, cursor=deep_cursor),
                raw(deep_sql, (board, deep_seq, deep_seq, deep_to, 51)),
                n,
            ),
            (
                "page 200 offset",
                lambda _i: store.links(rel, board, limit=50, offset=9_950),
                raw(offset_sql, (board, 50, 9_950)),
                max(1, n // 4),
            ),
            ("count", lambda _i: store.count(rel, board), raw(count_sql, (rel, board)), n),
            _has_links_case(store, floor, p, table, board, rows, n, postgres=h.backend.name == "postgresql"),
        ]
        results = []
        for case, store_op, raw_op, times in cases:
            if wanted(case):
                say(case)
                results.append(pair(case, store_op, raw_op, times))
    if not wanted(f"board_pins_many({MANY_BOARDS})"):
        return results
    say(f"loading {MANY_BOARDS} boards of {MANY_PINS} pins")
    with _loaded_boards(store, cur, p, shard, rel) as pages:
        say(f"board_pins_many({MANY_BOARDS})")
        results.append(
            pair(
                f"board_pins_many({MANY_BOARDS})",
                lambda _i: store.board_pins_many(list(pages), limit=MANY_PINS),
                _raw_board_pins_many(store, floor, p, shard, rel, pages),
                max(1, n // 10),
            )
        )
    return results


#: `has_links` asks this many to_ids of the bench board, about half of them linked.
HAS_LINKS = 500
#: `board_pins_many` reads this many boards' first pages, of this many pins each.
MANY_BOARDS, MANY_PINS = 20, 50


def _has_links_case(
    store: Store,
    cur: _PooledCursor,
    p: str,
    table: str,
    board: int,
    rows: list[Row],
    n: int,
    *,
    postgres: bool,
) -> tuple[str, Callable[[int], object], Callable[[int], None], int]:
    """``has_links`` of the bench board, half of the to_ids linked, next to one ``SELECT ... IN``."""
    linked = [t for _f, t, _s in rows]
    # IDs of the same shard and type beyond the loaded ones: later local ids, or later milliseconds.
    offset = 64 << 23 if store.config.ids == "instagram" else BOARD_PINS
    rng = random.Random(11)
    asks = []
    for _ in range(8):
        ask = rng.sample(linked, HAS_LINKS // 2) + [t + offset for t in rng.sample(linked, HAS_LINKS // 2)]
        rng.shuffle(ask)
        asks.append(ask)
    if postgres:  # (the store's own shape, by hand)
        # Its sessions plan a statement once for any values (`GENERIC_PLANS`), so each to_id is
        # one probe of the key whatever the board's length: the to_ids as one array, each
        # looked up by a LATERAL subquery. An IN list planned so would read the board's rows.
        sql = (
            f"SELECT p.to_id FROM unnest({p}::bigint[]) AS u(t) JOIN LATERAL (SELECT to_id FROM {table} "
            f"WHERE from_id = {p} AND to_id = u.t LIMIT 1) AS p ON true"
        )
        params = [[int_array(ask), board] for ask in asks]
    else:
        sql = f"SELECT to_id FROM {table} WHERE from_id = {p} AND to_id IN ({', '.join([p] * HAS_LINKS)})"
        params = [[board, *ask] for ask in asks]

    def raw_has_links(i: int) -> None:
        cur.execute(sql, params[i % 8])
        {int(row[0]) for row in cur.fetchall()}

    case = f"has_links({HAS_LINKS})"
    return (
        case,
        lambda i: store.has_links("board_has_pins", board, asks[i % 8]),
        raw_has_links,
        max(1, n // 4),
    )


@contextmanager
def _loaded_boards(store: Store, cur: Any, p: str, shard: int, rel: str) -> Iterator[dict[int, list[int]]]:
    """MANY_BOARDS new boards of MANY_PINS new pins each (pins by the store, pairs bulk-loaded).

    The pairs are removed afterwards (they have no inverse side); the objects stay, as the
    create case's do.
    """
    spec = store.config.relations[rel]
    pages: dict[int, list[int]] = {}
    for b in range(MANY_BOARDS):
        board = store.create(spec.from_type, {"name": f"bench board {b}"}, shard=shard)
        pages[board] = [store.create(spec.to_type, PIN, shard=shard) for _ in range(MANY_PINS)]
    h = store.admin_context().engines.shard(shard, store.shard_map.master(shard))
    table, counts = h.table(rel), h.table("relation_counts")
    rows = [(board, pin, k) for board, pins in pages.items() for k, pin in enumerate(pins)]
    cur.execute("BEGIN")
    cur.executemany(f"INSERT INTO {table} (from_id, to_id, sequence) VALUES ({p}, {p}, {p})", rows)
    cur.executemany(
        f"INSERT INTO {counts} (relation, from_id, n) VALUES ({p}, {p}, {p})",
        [(rel, board, MANY_PINS) for board in pages],
    )
    cur.execute("COMMIT")
    try:
        yield pages
    finally:
        marks = ", ".join([p] * len(pages))
        cur.execute(f"DELETE FROM {table} WHERE from_id IN ({marks})", list(pages))
        cur.execute(f"DELETE FROM {counts} WHERE relation = {p} AND from_id IN ({marks})", [rel, *pages])


def _raw_board_pins_many(
    store: Store, cur: _PooledCursor, p: str, shard: int, rel: str, pages: dict[int, list[int]]
) -> Callable[[int], None]:
    """The floor of ``board_pins_many``: one UNION ALL of the boards' first pages, one IN of their pins.

    The same two statements the store sends to a host, hand-written, decoded with orjson.
    """
    spec = store.config.relations[rel]
    pin_type = store.config.types[spec.to_type]
    h = store.admin_context().engines.shard(shard, store.shard_map.master(shard))
    table, pins_table = h.table(rel), h.table(pin_type.table)
    instagram = store.config.ids == "instagram"
    key = "id" if instagram else "local_id"
    boards = list(pages)
    lists_sql = " UNION ALL ".join(
        f"SELECT {i} AS part, q.sequence, q.to_id FROM (SELECT sequence, to_id FROM {table} "
        f"WHERE from_id = {p} ORDER BY sequence, to_id LIMIT {p}) AS q"
        for i in range(len(boards))
    )
    lists_args = [a for board in boards for a in (board, MANY_PINS + 1)]
    mask = -1 if instagram else (1 << 36) - 1  # the local id is the low 36 bits of a Pinterest ID
    objects_sql = f"SELECT {key}, data FROM {pins_table} WHERE active = 1 AND {key} IN "

    def run(_i: int) -> None:
        cur.execute(lists_sql, lists_args)
        by_board: list[list[tuple[int, int]]] = [[] for _ in boards]
        for part, seq, to_id in cur.fetchall():
            by_board[part].append((seq, to_id))
        firsts = [[t for _s, t in sorted(rows)[:MANY_PINS]] for rows in by_board]
        keys = [t & mask for ids in firsts for t in ids]
        cur.execute(objects_sql + f"({', '.join([p] * len(keys))})", keys)
        found = {int(k): orjson.loads(data) for k, data in cur.fetchall()}
        [[found[t & mask] for t in ids if t & mask in found] for ids in firsts]

    return run


def format_results(results: list[BenchResult]) -> str:
    """A fixed-width table of results."""
    head = ("case", "store med", "raw med", "ratio", "store p99", "raw p99", "ratio")
    lines = ["{:<26}{:>11}{:>10}{:>7}{:>11}{:>10}{:>7}".format(*head)]
    for r in results:
        lines.append(
            f"{r.case:<26}{r.store_median_us:>9.0f}us{r.raw_median_us:>8.0f}us{r.ratio_median:>6.2f}x"
            f"{r.store_p99_us:>9.0f}us{r.raw_p99_us:>8.0f}us{r.ratio_p99:>6.2f}x"
        )
    tickets = [r for r in results if r.case.startswith("ticket")]
    if tickets:
        rates = ", ".join(f"{r.case} {1e6 / r.store_mean_us:,.0f}" for r in tickets)
        lines.append(f"tickets/s, one thread: {rates}; raw UPDATE {1e6 / tickets[0].raw_mean_us:,.0f}")
    by_case = {r.case: r for r in results}
    if "page 1" in by_case and "page 200 cursor" in by_case:
        depth = by_case["page 200 cursor"].store_median_us / by_case["page 1"].store_median_us
        lines.append(f"cursor page 200 (depth 9,950) costs {depth:.2f}x the first page (store medians)")
    return "\n".join(lines)
