"""The tables every shard holds, as DDL an operator can read, per backend.

Shard N is the database ``db`` + N as five digits. It holds one object table
per type and one table per relation (both directions of an inverse pair).
The DDL is plain SQL text rather than SQLAlchemy `Table` objects because the
exact MariaDB column types (BIGINT UNSIGNED, TIMESTAMP(3) ON UPDATE, InnoDB,
utf8mb4) are the contract, and ``schemas/`` ships the same text rendered for
one shard (a test keeps it in step).
"""

from __future__ import annotations

from collections.abc import Iterable

from store.config import RelationSpec, TypeSpec

__all__ = ["DATABASE_PREFIX", "database_name", "shard_ddl"]

DATABASE_PREFIX = "db"


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

_SQLITE_RELATION_INDEX = (
    'CREATE INDEX IF NOT EXISTS "{table}_from_sequence_to" ON "{table}" ("from_id", "sequence", "to_id")'
)


def shard_ddl(
    backend: str, shard: int, types: Iterable[TypeSpec], relations: Iterable[RelationSpec]
) -> list[str]:
    """Idempotent statements that create shard ``shard`` on a ``backend`` host."""
    db = database_name(shard)
    if backend in ("mysql", "mariadb"):
        out = [_MYSQL_DATABASE.format(db=db)]
        out += [_MYSQL_OBJECTS.format(db=db, table=t.table) for t in types]
        out += [_MYSQL_RELATION.format(db=db, table=r.name) for r in relations]
        return out
    if backend == "sqlite":
        out = [_SQLITE_OBJECTS.format(table=t.table) for t in types]
        for r in relations:
            out += [_SQLITE_RELATION.format(table=r.name), _SQLITE_RELATION_INDEX.format(table=r.name)]
        return out
    raise ValueError(f"no shard DDL for backend {backend!r}")
