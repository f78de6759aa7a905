"""`store bench`'s batch rows: `create_many(100)` and `link_many(100)` next to a floor doing the same by hand.

The floors are multi-row statements on the bench shard, sent through the
store's own pooled connection (`store.tools.bench._PooledCursor`), each in
autocommit: 100 objects in one INSERT (with ``RETURNING id`` for Instagram
IDs, which the database makes); 100 pairs of a board as one INSERT per
side (the board's list, the pins' inverse lists) and one upsert of every
count. `store bench` runs them on the store without caches, and again on
the store as configured where it has caches (the "cached" rows). With lists
cached in Redis, the links' floor then drops the cached lists and counts it
changed, one ``DEL`` per Redis server, as the mix's floor does for each
link (its own keys, under `RAW_PREFIX`): a program that caches lists must.
The store does more for the same result (a transaction per side, the pair
locks, list versions kept in step), and the ratio says what that costs.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import orjson

from store.cache.redis_lists import RedisListBackend, RedisListServers
from store.store import Store
from store.tools.timing import PIN, RAW_PREFIX, BenchResult, pair

__all__ = ["BATCH", "bulk_cases"]

#: Objects or pairs per batch call.
BATCH = 100


def _list_drops(store: Store) -> Callable[[list[str]], None] | None:
    """How a floor drops cached lists: one ``DEL`` of its keys per Redis server of the store's list
    cache (each key on the server that would hold it); None where lists are not cached in Redis."""
    lists = store.admin_context().caches.lists
    backend = None if lists is None else lists.backend
    servers: list[RedisListBackend]
    place: Callable[[str], int]
    if isinstance(backend, RedisListBackend):
        servers, place = [backend], lambda _key: 0
    elif isinstance(backend, RedisListServers):
        servers, place = backend.servers, backend.index_for
    else:
        return None

    def drop(keys: list[str]) -> None:
        by_server: dict[int, list[str]] = {}
        for key in keys:
            by_server.setdefault(place(key), []).append(key)
        for i, group in by_server.items():
            servers[i].client.delete(*group)

    return drop


def bulk_cases(
    store: Store,
    floor: Any,
    p: str,
    shard: int,
    n: int,
    say: Callable[[str], None],
    wanted: Callable[[str], bool] | None = None,
    *,
    label: str = "",
) -> list[BenchResult]:
    """The `create_many(100)` and `link_many(100)` rows on ``shard`` (``floor``: the floors' cursor;
    ``wanted``: which of the two run, None: both; ``label``: put before each row's name)."""
    wanted = wanted or (lambda _case: True)
    config = store.config
    pin = config.types.get("pin") or next(iter(config.types.values()))
    h = store.admin_context().engines.shard(shard, store.shard_map.master(shard))
    instagram = config.ids == "instagram"
    times = max(1, n // 20)
    rows = ", ".join([f"({p})"] * BATCH)
    insert = f"INSERT INTO {h.table(pin.table)} (data) VALUES {rows}" + (" RETURNING id" if instagram else "")

    def raw_create_many(_i: int) -> None:
        floor.execute(insert, [orjson.dumps(PIN).decode() for _k in range(BATCH)])
        if instagram:
            floor.fetchall()
        else:
            floor.release()

    results = []
    if wanted(f"{label}create_many({BATCH})"):
        say(f"{label}create_many({BATCH})")
        results.append(
            pair(
                f"{label}create_many({BATCH})",
                lambda _i: store.create_many(pin.name, [PIN] * BATCH, shard=shard),
                raw_create_many,
                times,
            )
        )
    spec = config.relations.get("board_has_pins")
    if spec is None or spec.inverse is None or not wanted(f"{label}link_many({BATCH})"):
        return results
    say(f"{label}link_many({BATCH}): making boards and pins")
    calls = times + min(50, times)  # `pair` warms up with up to 50 calls of each side
    pins = store.create_many(spec.to_type, [PIN] * BATCH, shard=shard)
    mine = iter(store.create_many(spec.from_type, [{}] * calls, shard=shard))
    theirs = iter(store.create_many(spec.from_type, [{}] * calls, shard=shard))
    keys = pins  # (relation rows hold whole IDs)
    pair_rows = ", ".join([f"({p}, {p}, {p})"] * BATCH)
    lists, inverse = h.table(spec.name), h.table(spec.inverse)
    counts = h.table("relation_counts")
    count_rows = ", ".join([f"({p}, {p}, {p})"] * (BATCH + 1))
    upsert = f"INSERT INTO {counts} (relation, from_id, n) VALUES {count_rows} " + _add_counts(
        h.backend.upsert_style
    )
    counter = itertools.count()
    drop = _list_drops(store)

    def cached_keys(board: int) -> list[str]:
        sides = [(spec.name, board), *((spec.inverse, k) for k in keys)]
        return [f"{RAW_PREFIX}{kind}:{rel}:{f}" for rel, f in sides for kind in ("l", "c")]

    def raw_link_many(_i: int) -> None:
        board = next(theirs)
        seq = time.time_ns() // 1000 + next(counter)
        floor.execute(
            f"INSERT INTO {lists} (from_id, to_id, sequence) VALUES {pair_rows}",
            [v for k in keys for v in (board, k, seq)],
        )
        floor.release()
        floor.execute(
            f"INSERT INTO {inverse} (from_id, to_id, sequence) VALUES {pair_rows}",
            [v for k in keys for v in (k, board, seq)],
        )
        floor.release()
        floor.execute(upsert, [spec.name, board, BATCH, *[v for k in keys for v in (spec.inverse, k, 1)]])
        floor.release()
        if drop is not None:
            drop(cached_keys(board))

    def store_link_many(_i: int) -> None:
        board = next(mine)
        store.link_many(spec.name, [(board, x) for x in pins])

    say(f"{label}link_many({BATCH})")
    results.append(
        pair(
            f"{label}link_many({BATCH})",
            store_link_many,
            raw_link_many,
            times,
        )
    )
    return results


def _add_counts(style: str) -> str:
    """The end of an upsert that adds each row's ``n`` to a count that is there, and bumps its version
    (``style``: `Backend.upsert_style`)."""
    if style == "on_duplicate_key":
        return "ON DUPLICATE KEY UPDATE n = n + VALUES(n), version = version + 1"
    t = "relation_counts"  # (the target table's own name, as ON CONFLICT refers to it)
    return f"ON CONFLICT (relation, from_id) DO UPDATE SET n = {t}.n + excluded.n, version = {t}.version + 1"
