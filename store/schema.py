"""The tables every shard holds, as DDL an operator can read, per backend.

Shard N is the database ``db`` + N as five digits. It holds one object table
per type, one table per relation (both directions of an inverse pair) and
``relation_counts``, the exact length of every relation list.
The DDL is plain SQL text rather than SQLAlchemy `Table` objects because the
exact MariaDB column types (BIGINT UNSIGNED, TIMESTAMP(3) ON UPDATE, InnoDB,
utf8mb4) are the contract, and ``schemas/`` ships the same text rendered for
one shard (a test keeps it in step).
"""

from __future__ import annotations

from collections.abc import Iterable

from store.config import RelationSpec, StoreConfig, TypeSpec

__all__ = [
    "COUNTS_TABLE",
    "DATABASE_PREFIX",
    "database_name",
    "render_shard_sql",
    "shard_ddl",
    "shard_statements",
]

DATABASE_PREFIX = "db"
#: One row per (relation, from_id) with the number of pairs, kept in the same
#: transaction as every link and unlink so that it is always exact.
COUNTS_TABLE = "relation_counts"


def database_name(shard: int) -> str:
    """The database (MariaDB) or file stem (SQLite) of shard ``shard``: ``db00042``."""
    return f"{DATABASE_PREFIX}{shard:05d}"


_MYSQL_DATABASE = "CREATE DATABASE IF NOT EXISTS `{db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"

# local_id is BIGINT UNSIGNED: the article's INT overflows at 2**31.
# data is MEDIUMTEXT (16 MiB - 1), the ceiling of limits.max_object_bytes.
_MYSQL_OBJECTS = """\
CREATE TABLE IF NOT EXISTS `{db}`.`{table}` (
  `local_id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
  `data` MEDIUMTEXT NOT NULL,
  `active` TINYINT(1) NOT NULL DEFAULT 1,
  `ts` TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (`local_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci"""

# (from_id, to_id) is the primary key: one row per pair. The secondary index
# (from_id, sequence, to_id) serves ORDER BY sequence without a filesort; the
# article's (board_id, pin_id, sequence) cannot.
_MYSQL_RELATION = """\
CREATE TABLE IF NOT EXISTS `{db}`.`{table}` (
  `from_id` BIGINT UNSIGNED NOT NULL,
  `to_id` BIGINT UNSIGNED NOT NULL,
  `sequence` BIGINT NOT NULL,
  PRIMARY KEY (`from_id`, `to_id`),
  KEY `from_sequence_to` (`from_id`, `sequence`, `to_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""

# AUTOINCREMENT: SQLite must never hand out a local id twice, even after the
# highest row is removed (a moved shard's cleanup does that).
_SQLITE_OBJECTS = """\
CREATE TABLE IF NOT EXISTS "{table}" (
  "local_id" INTEGER PRIMARY KEY AUTOINCREMENT,
  "data" TEXT NOT NULL,
  "active" INTEGER NOT NULL DEFAULT 1,
  "ts" TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now'))
)"""

_SQLITE_RELATION = """\
CREATE TABLE IF NOT EXISTS "{table}" (
  "from_id" INTEGER NOT NULL,
  "to_id" INTEGER NOT NULL,
  "sequence" INTEGER NOT NULL,
  PRIMARY KEY ("from_id", "to_id")
) WITHOUT ROWID"""

_MYSQL_COUNTS = """\
CREATE TABLE IF NOT EXISTS `{db}`.`{table}` (
  `relation` VARCHAR(64) NOT NULL,
  `from_id` BIGINT UNSIGNED NOT NULL,
  `n` BIGINT NOT NULL,
  PRIMARY KEY (`relation`, `from_id`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""

_SQLITE_COUNTS = """\
CREATE TABLE IF NOT EXISTS "{table}" (
  "relation" TEXT NOT NULL,
  "from_id" INTEGER NOT NULL,
  "n" INTEGER NOT NULL,
  PRIMARY KEY ("relation", "from_id")
) WITHOUT ROWID"""

_SQLITE_RELATION_INDEX = (
    'CREATE INDEX IF NOT EXISTS "{table}_from_sequence_to" ON "{table}" ("from_id", "sequence", "to_id")'
)


def shard_statements(
    backend: str, shard: int, types: Iterable[TypeSpec], relations: Iterable[RelationSpec]
) -> list[tuple[str, str]]:
    """Idempotent DDL for shard ``shard`` as (table it creates, statement) pairs.

    The table is ``""`` for the CREATE DATABASE; an index statement names the
    table it belongs to, so `store init` can skip what already exists.
    """
    db = database_name(shard)
    types, relations = list(types), list(relations)
    if backend in ("mysql", "mariadb"):
        out = [("", _MYSQL_DATABASE.format(db=db))]
        out += [(t.table, _MYSQL_OBJECTS.format(db=db, table=t.table)) for t in types]
        out += [(r.name, _MYSQL_RELATION.format(db=db, table=r.name)) for r in relations]
        if relations:
            out.append((COUNTS_TABLE, _MYSQL_COUNTS.format(db=db, table=COUNTS_TABLE)))
        return out
    if backend == "sqlite":
        out = [(t.table, _SQLITE_OBJECTS.format(table=t.table)) for t in types]
        for r in relations:
            out += [
                (r.name, _SQLITE_RELATION.format(table=r.name)),
                (r.name, _SQLITE_RELATION_INDEX.format(table=r.name)),
            ]
        if relations:
            out.append((COUNTS_TABLE, _SQLITE_COUNTS.format(table=COUNTS_TABLE)))
        return out
    raise ValueError(f"no shard DDL for backend {backend!r}")


def shard_ddl(
    backend: str, shard: int, types: Iterable[TypeSpec], relations: Iterable[RelationSpec]
) -> list[str]:
    """Idempotent statements that create shard ``shard`` on a ``backend`` host."""
    return [stmt for _table, stmt in shard_statements(backend, shard, types, relations)]


def render_shard_sql(backend: str, shard: int, config: StoreConfig) -> str:
    """One shard's DDL as a readable SQL script (what ``schemas/`` ships)."""
    where = (
        f"database {database_name(shard)}" if backend != "sqlite" else f"file {database_name(shard)}.sqlite3"
    )
    head = (
        f"-- Shard {shard}: {where}. Generated by `store schema --backend {backend} --shard {shard}`;\n"
        "-- `store init` runs the same statements on every shard's master.\n"
    )
    stmts = shard_ddl(backend, shard, config.types.values(), config.relations.values())
    return head + "".join(f"\n{stmt};\n" for stmt in stmts)
