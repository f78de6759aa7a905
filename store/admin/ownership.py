"""Which host holds which shard, as the hosts themselves say: live copies, tombstones, archives.

A shard is live on exactly one host, the one the live map names. When a
move switches a shard away, its old host keeps a *tombstone* in the shard's
database: the marker table `TOMBSTONE_TABLE` (where the shard went, in which
map version) and, in place of every moved table, a view of the same name
whose reads raise and which cannot be written (see
`store.schema.tombstone_statements`). The moved rows wait in the archive
database ``moved_dbNNNNN`` until ``store move --cleanup``.

Admin commands that create or drop things in a shard database take the
shard's *admin lock* (a MariaDB named lock on the host, `shard_lock`) and
look again under it, so an init that raced with a move's switch finds the
tombstone instead of creating a table that stale writers could use.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from store.exceptions import BackendError
from store.schema import (
    ARCHIVE_PREFIX,
    DATABASE_PREFIX,
    SCHEMA_PREFIX,
    TOMBSTONE_TABLE,
    database_name,
    tombstone_statements,
)

__all__ = [
    "SHARD_LOCK_TIMEOUT_S",
    "ServerInventory",
    "ShardCopy",
    "leave_tombstones",
    "read_inventory",
    "shard_lock",
    "tombstones",
]

#: How long an admin command waits for another one's admin lock on a shard.
SHARD_LOCK_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class ShardCopy:
    """One shard database (schema, file) found on one server.

    ``state`` is ``live`` (it holds tables), ``tombstone`` (it moved away:
    ``moved_to`` and ``map_version`` say where and when) or ``empty``.
    """

    shard: int
    state: str
    tables: tuple[str, ...] = ()
    moved_to: str | None = None
    map_version: int | None = None


@dataclass
class ServerInventory:
    """Everything shard-shaped on one server: shard copies and move archives."""

    copies: dict[int, ShardCopy] = field(default_factory=dict)
    archives: dict[int, tuple[str, ...]] = field(default_factory=dict)


def _shard_of(name: str, prefix: str, digits: int) -> int | None:
    rest = name[len(prefix) :]
    if name.startswith(prefix) and len(rest) == digits and rest.isdigit():
        return int(rest)
    return None


def read_inventory(cur: Any, backend: str) -> ServerInventory:
    """The shard databases (MariaDB) or schemas (PostgreSQL) on the server ``cur`` is connected to."""
    inv = ServerInventory()
    if backend == "postgresql":
        cur.execute(
            "SELECT n.nspname, c.relname FROM pg_namespace n LEFT JOIN pg_class c "
            "ON c.relnamespace = n.oid AND c.relkind IN ('r', 'p') WHERE n.nspname LIKE %s",
            (SCHEMA_PREFIX + "____",),
        )
        found: dict[int, list[str]] = {}
        for schema, table in cur.fetchall():
            shard = _shard_of(str(schema), SCHEMA_PREFIX, 4)
            if shard is not None:
                found.setdefault(shard, []).extend([] if table is None else [str(table)])
        for shard, tables in found.items():
            inv.copies[shard] = ShardCopy(shard, "live" if tables else "empty", tuple(sorted(tables)))
        return inv
    cur.execute(
        "SELECT s.schema_name, t.table_name FROM information_schema.schemata s "
        "LEFT JOIN information_schema.tables t ON t.table_schema = s.schema_name "
        "AND t.table_type = 'BASE TABLE' WHERE s.schema_name LIKE %s OR s.schema_name LIKE %s",
        (DATABASE_PREFIX + "_____", ARCHIVE_PREFIX + DATABASE_PREFIX + "_____"),
    )
    live: dict[int, list[str]] = {}
    for db, table in cur.fetchall():
        name = str(db)
        archived = _shard_of(name, ARCHIVE_PREFIX + DATABASE_PREFIX, 5)
        if archived is not None:
            inv.archives[archived] = (*inv.archives.get(archived, ()), *([] if table is None else [table]))
            continue
        shard = _shard_of(name, DATABASE_PREFIX, 5)
        if shard is not None:
            live.setdefault(shard, []).extend([] if table is None else [str(table)])
    marked = [s for s, tables in live.items() if TOMBSTONE_TABLE in tables]
    told = tombstones(cur, marked)
    for shard, tables in live.items():
        if shard in told:
            moved_to, version = told[shard]
            inv.copies[shard] = ShardCopy(shard, "tombstone", (), moved_to, version)
        else:
            inv.copies[shard] = ShardCopy(shard, "live" if tables else "empty", tuple(sorted(tables)))
    return inv


def tombstones(cur: Any, shards: Sequence[int]) -> dict[int, tuple[str, int]]:
    """(moved_to, map_version) of each of ``shards`` whose database on this MariaDB server is a tombstone."""
    if not shards:
        return {}
    cur.execute(
        "SELECT table_schema FROM information_schema.tables WHERE table_name = %s AND table_schema IN ("
        + ", ".join(["%s"] * len(shards))
        + ")",
        (TOMBSTONE_TABLE, *[database_name(s) for s in shards]),
    )
    marked = [str(r[0]) for r in cur.fetchall()]
    if not marked:
        return {}
    cur.execute(
        " UNION ALL ".join(
            f"SELECT shard, moved_to, map_version FROM `{db}`.`{TOMBSTONE_TABLE}`" for db in marked
        )
    )
    return {int(shard): (str(moved_to), int(version)) for shard, moved_to, version in cur.fetchall()}


@contextmanager
def shard_lock(cur: Any, shards: Iterable[int], *, timeout_s: float = SHARD_LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the admin lock of each of ``shards`` on this MariaDB server (named locks, this session).

    Taken in shard order, so two admin commands never wait on each other in
    a circle; released on the way out (and by the server if the session dies).
    """
    held: list[str] = []
    try:
        for shard in sorted(set(shards)):
            name = f"store-admin:{database_name(shard)}"
            cur.execute("SELECT GET_LOCK(%s, %s)", (name, timeout_s))
            if cur.fetchone()[0] != 1:
                raise BackendError(
                    f"another admin command has held shard {shard}'s admin lock for {timeout_s:.0f} s "
                    "(a move switching it, or an init): wait for it to finish, then run this again"
                )
            held.append(name)
        yield
    finally:
        for name in reversed(held):
            cur.execute("SELECT RELEASE_LOCK(%s)", (name,))
            cur.fetchall()


def leave_tombstones(cur: Any, shards: Iterable[int], moved_to: str, map_version: int) -> int:
    """Leave a tombstone of each of ``shards`` whose tables were moved into the archive; how many.

    The views take the names and columns of the archived tables. Runs off the
    binlog (the renames were too), so replicas of this host never see half a
    switch. Idempotent: a resumed move runs it again.
    """
    wanted = sorted(set(shards))
    if not wanted:
        return 0
    archives = [ARCHIVE_PREFIX + database_name(s) for s in wanted]
    cur.execute(
        "SELECT table_schema, table_name, column_name FROM information_schema.columns "
        "WHERE table_schema IN (" + ", ".join(["%s"] * len(archives)) + ") "
        "ORDER BY table_schema, table_name, ordinal_position",
        archives,
    )
    columns: dict[int, dict[str, list[str]]] = {}
    for db, table, column in cur.fetchall():
        shard = _shard_of(str(db), ARCHIVE_PREFIX + DATABASE_PREFIX, 5)
        assert shard is not None
        columns.setdefault(shard, {}).setdefault(str(table), []).append(str(column))
    cur.execute("SET SESSION sql_log_bin = 0")
    try:
        for shard in wanted:
            tables = columns.get(shard)
            if not tables:
                continue  # nothing was archived: nothing there to fence
            cur.execute(f"CREATE DATABASE IF NOT EXISTS `{database_name(shard)}`")
            for stmt in tombstone_statements(shard, moved_to, map_version, tables):
                cur.execute(stmt)
    finally:
        cur.execute("SET SESSION sql_log_bin = 1")
    return len(columns)
