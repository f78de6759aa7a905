"""The mix's databases: its config, each system's copy of the data set, the truth for the checks.

Each system gets a copy of the data set with IDs of its own, bulk-loaded
with explicit local ids above what each table holds (so nothing that is
there is touched), and removed again after the run unless kept.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pymysql
from sqlalchemy.engine import make_url

from store.config import StoreConfig
from store.defaults import EMBEDDED
from store.exceptions import ConfigError
from store.ids import encode_pinterest
from store.tools.mix.system import MixSchema
from store.tools.mix.workload import DataSet

__all__ = [
    "Copy",
    "Truth",
    "connections",
    "default_config",
    "load_copy",
    "mix_schema",
    "raw_connection",
    "remove_copy",
    "truth",
]

_BATCH = 1000
_SEQ_STEP = 1000  # initial sequences: far below "now in microseconds", so new links go after


#: The mix's own shards start here (``db02048``...), away from the low shards other configs use.
MIX_FIRST_SHARD = 2048


def default_config(url_a: str, url_b: str, *, shards: int = 64, cache: bool = True) -> dict[str, Any]:
    """The mix's own config: 4,096 shards, ``shards`` open from shard 2048, half on host A, half on B."""
    first, half = MIX_FIRST_SHARD, shards // 2
    config: dict[str, Any] = {
        "ids": "pinterest",
        "shards": 4096,
        "open_shards": [first, first + shards - 1],
        "hosts": {"MixA": url_a, "MixB": url_b},
        "map": [
            {"range": [0, first + half - 1], "master": "MixA"},
            {"range": [first + half, 4095], "master": "MixB"},
        ],
        # The embedded default's types, and its relations that have an inverse.
        "types": copy.deepcopy(EMBEDDED["types"]),
        "relations": {name: dict(rel) for name, rel in EMBEDDED["relations"].items() if "inverse" in rel},
        "pool_size": 16,
    }
    if cache:
        config["cache"] = {
            "memcached": ["127.0.0.1:11211"],
            "redis": "redis://127.0.0.1:6379/0",
            "prefix": "mix:",
            "timeout_ms": 200,
            "connect_timeout_ms": 200,
        }
    return config


def mix_schema(config: StoreConfig, shards: list[int]) -> MixSchema:
    """The layout every system of the mix works on, read off the store's config."""
    m = config.shard_map
    return MixSchema(
        hosts={name: str(url.render_as_string(hide_password=False)) for name, url in config.hosts.items()},
        masters={s: m.master(s) for s in shards},
        types={t.name: (t.id, t.table) for t in config.types.values()},
        relations={
            r.name: (r.from_type, r.to_type, r.inverse if r.primary else None)
            for r in config.relations.values()
        },
        ids=config.ids,
    )


def raw_connection(url: str) -> Any:
    """A plain PyMySQL connection (autocommit) to the server of ``url``."""
    u = make_url(url)
    return pymysql.connect(
        host=u.host or "127.0.0.1",
        port=u.port or 3306,
        user=u.username or "root",
        password=u.password or "",
        autocommit=True,
        charset="utf8mb4",
    )


@contextlib.contextmanager
def connections(
    schema: MixSchema, connect: Callable[[str], Any] = raw_connection
) -> Iterator[Callable[[int], Any]]:
    """A cursor per host name, for the shard's master (``connect`` opens one); closed after."""
    conns: dict[str, Any] = {}
    curs: dict[str, Any] = {}

    def cursor(shard: int) -> Any:
        host = schema.masters[shard]
        if host not in curs:
            conns[host] = connect(schema.hosts[host])
            curs[host] = conns[host].cursor()
        return curs[host]

    try:
        yield cursor
    finally:
        for c in conns.values():
            c.close()


@dataclass
class Copy:
    """One system's copy of the data set: the ID of every user, board and pin, by index."""

    users: list[int]
    boards: list[int]
    pins: list[int]
    #: (shard, table) -> (lowest, highest) local id the copy loaded there.
    spans: dict[tuple[int, str], tuple[int, int]] = field(default_factory=dict)
    #: IDs the run created (``add_node``), removed with the copy.
    created: list[int] = field(default_factory=list)


def load_copy(
    schema: MixSchema, data: DataSet, shards: list[int], progress: Callable[[int], None] | None = None
) -> Copy:
    """Bulk-load a copy of ``data`` over ``shards``; its IDs. ``progress`` is told rows written."""
    say = progress or (lambda _n: None)
    tid = {name: t for name, (t, _table) in schema.types.items()}
    table = {name: tb for name, (_t, tb) in schema.types.items()}
    s = data.shape
    user_shard = [shards[u % len(shards)] for u in range(s.users)]
    board_shard = [user_shard[data.board_owner[b]] for b in range(s.boards)]
    pin_shard = [board_shard[data.pin_board[p]] for p in range(s.pins)]
    copy = Copy([], [], [])
    with connections(schema) as cursor:
        # Local ids: consecutive per (shard, table), above what is there.
        nxt: dict[tuple[int, str], int] = {}
        for shard in shards:
            cur = cursor(shard)
            for name in ("user", "board", "pin"):
                db = MixSchema.database(shard)
                cur.execute(
                    "SELECT COUNT(*) FROM information_schema.columns "
                    "WHERE table_schema = %s AND table_name = %s AND column_name = 'local_id'",
                    (db, table[name]),
                )
                if not cur.fetchone()[0]:
                    raise ConfigError(
                        f"{db}.{table[name]} on host {schema.masters[shard]} has no local_id column (tables "
                        "for Instagram IDs?); the mix needs Pinterest-ID shards: give it other shards "
                        "(--config with other open_shards) or drop that database and run again"
                    )
                cur.execute(f"SELECT COALESCE(MAX(local_id), 0) FROM `{db}`.`{table[name]}`")
                nxt[(shard, name)] = int(cur.fetchone()[0]) + 1
        rows: dict[tuple[int, str], list[tuple[int, str]]] = {}

        def place(name: str, shard: int, obj: dict[str, Any], out: list[int]) -> None:
            local = nxt[(shard, name)]
            nxt[(shard, name)] = local + 1
            out.append(encode_pinterest(shard, tid[name], local))
            rows.setdefault((shard, name), []).append((local, orjson.dumps(obj).decode()))

        for u in range(s.users):
            place("user", user_shard[u], data.user_data(u), copy.users)
        for b in range(s.boards):
            place("board", board_shard[b], data.board_data(b), copy.boards)
        for p in range(s.pins):
            place("pin", pin_shard[p], data.pin_data(p), copy.pins)
        for (shard, name), objs in rows.items():
            cur = cursor(shard)
            sql = (
                f"INSERT INTO `{MixSchema.database(shard)}`.`{table[name]}` (local_id, data) VALUES (%s, %s)"
            )
            for i in range(0, len(objs), _BATCH):
                cur.executemany(sql, objs[i : i + _BATCH])
                say(len(objs[i : i + _BATCH]))
            copy.spans[(shard, table[name])] = (objs[0][0], objs[-1][0])
        pairs: dict[str, list[tuple[int, int, int]]] = {}
        for b, own in enumerate(data.board_pins):
            for p in own:
                seq = (p + 1) * _SEQ_STEP
                pairs.setdefault("board_has_pins", []).append((copy.boards[b], copy.pins[p], seq))
                pairs.setdefault("pin_owned_by_board", []).append((copy.pins[p], copy.boards[b], seq))
        for u, liked in enumerate(data.user_likes):
            for i, p in enumerate(liked):
                seq = (i + 1) * _SEQ_STEP
                pairs.setdefault("users_likes_pins", []).append((copy.users[u], copy.pins[p], seq))
                pairs.setdefault("pin_liked_by_user", []).append((copy.pins[p], copy.users[u], seq))
        for relation, triples in pairs.items():
            by_shard: dict[int, list[tuple[int, int, int]]] = {}
            counts: dict[int, int] = {}
            for f, t, q in triples:
                by_shard.setdefault(f >> 46, []).append((f, t, q))
                counts[f] = counts.get(f, 0) + 1
            for shard, part in by_shard.items():
                cur = cursor(shard)
                db = MixSchema.database(shard)
                sql = f"INSERT INTO `{db}`.`{relation}` (from_id, to_id, sequence) VALUES (%s, %s, %s)"
                for i in range(0, len(part), _BATCH):
                    cur.executemany(sql, part[i : i + _BATCH])
                    say(len(part[i : i + _BATCH]))
                mine = [(relation, f, n) for f, n in counts.items() if f >> 46 == shard]
                sql = (
                    f"INSERT INTO `{db}`.`{schema.counts_table}` (relation, from_id, n) VALUES (%s, %s, %s) "
                    "ON DUPLICATE KEY UPDATE n = VALUES(n)"
                )
                for i in range(0, len(mine), _BATCH):
                    cur.executemany(sql, mine[i : i + _BATCH])
    return copy


def remove_copy(schema: MixSchema, copy: Copy) -> None:
    """Delete every row of the copy and the objects its run created, with their lists and counts."""
    tid = {tb: t for _name, (t, tb) in schema.types.items()}
    spans = [(shard, table, lo, hi) for (shard, table), (lo, hi) in copy.spans.items()]
    by_type = {t: tb for _name, (t, tb) in schema.types.items()}
    spans += [
        (i >> 46, by_type[(i >> 36) & 0x3FF], i & ((1 << 36) - 1), i & ((1 << 36) - 1)) for i in copy.created
    ]
    with connections(schema) as cursor:
        for shard, table, lo, hi in spans:
            cur = cursor(shard)
            db = MixSchema.database(shard)
            cur.execute(f"DELETE FROM `{db}`.`{table}` WHERE local_id BETWEEN %s AND %s", (lo, hi))
            first, last = encode_pinterest(shard, tid[table], lo), encode_pinterest(shard, tid[table], hi)
            for relation, (from_type, _to, _inv) in schema.relations.items():
                if schema.types[from_type][1] != table:
                    continue
                cur.execute(f"DELETE FROM `{db}`.`{relation}` WHERE from_id BETWEEN %s AND %s", (first, last))
                cur.execute(
                    f"DELETE FROM `{db}`.`{schema.counts_table}` "
                    "WHERE relation = %s AND from_id BETWEEN %s AND %s",
                    (relation, first, last),
                )


class Truth:
    """What the databases hold, read directly: the answers every system is checked against."""

    def __init__(self, schema: MixSchema) -> None:
        self._schema = schema
        self._stack = contextlib.ExitStack()
        self._cursor = self._stack.enter_context(connections(schema))
        self._tables = {t: tb for t, (_id, tb) in schema.types.items()}
        self._type_of = {t: name for name, (t, _tb) in schema.types.items()}

    def close(self) -> None:
        """Close the connections."""
        self._stack.close()

    def node(self, id_: int, type_name: str | None = None) -> dict[str, Any] | None:
        """The live object, or None (``type_name``: read off the Pinterest ID instead)."""
        shard, type_id, local = id_ >> 46, (id_ >> 36) & 0x3FF, id_ & ((1 << 36) - 1)
        cur = self._cursor(shard)
        table = self._tables[self._type_of[type_id]]
        cur.execute(
            f"SELECT data FROM `{MixSchema.database(shard)}`.`{table}` WHERE local_id = %s AND active = 1",
            (local,),
        )
        row = cur.fetchone()
        return None if row is None else dict(orjson.loads(row[0]))

    def rows(self, relation: str, from_id: int) -> list[int]:
        """Every to_id of the list, in (sequence, to_id) order."""
        shard = from_id >> 46
        cur = self._cursor(shard)
        cur.execute(
            f"SELECT to_id FROM `{MixSchema.database(shard)}`.`{relation}` WHERE from_id = %s "
            "ORDER BY sequence, to_id",
            (from_id,),
        )
        return [int(r[0]) for r in cur.fetchall()]

    def live(self, ids: list[int], type_name: str | None = None) -> dict[int, dict[str, Any]]:
        """The live objects among ``ids`` (``type_name``: as for `node`)."""
        out: dict[int, dict[str, Any]] = {}
        for id_ in ids:
            obj = self.node(id_)
            if obj is not None:
                out[id_] = obj
        return out


def truth(schema: MixSchema) -> Truth:
    """Direct reads of the databases, for the after-run checks."""
    return Truth(schema)
