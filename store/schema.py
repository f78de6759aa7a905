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

import re
from collections.abc import Iterable

from store.config import RelationSpec, StoreConfig, TypeSpec

__all__ = [
    "ARCHIVE_PREFIX",
    "COUNTS_TABLE",
    "DATABASE_PREFIX",
    "TOMBSTONE_ERRNO",
    "TOMBSTONE_TABLE",
    "database_name",
    "parse_tombstone",
    "render_shard_sql",
    "schema_name",
    "shard_ddl",
    "shard_statements",
    "tombstone_statements",
]

DATABASE_PREFIX = "db"
SCHEMA_PREFIX = "shard"
#: One row per (relation, from_id) with the number of pairs, kept in the same
#: transaction as every link and unlink so that it is always exact.
COUNTS_TABLE = "relation_counts"


#: A moved shard's tables are renamed into this database on the old host (``moved_db00042``).
ARCHIVE_PREFIX = "moved_"
#: The marker table of a tombstone: one row saying where the shard went, in which map version.
TOMBSTONE_TABLE = "store_tombstone"
#: The error number every read of a tombstone raises (a user SIGNAL; MariaDB's own numbers stay below).
TOMBSTONE_ERRNO = 9451
_TOMBSTONE_FUNCTION = "store_moved"


def database_name(shard: int) -> str:
    """The database (MariaDB) or file stem (SQLite) of shard ``shard``: ``db00042``."""
    return f"{DATABASE_PREFIX}{shard:05d}"


def schema_name(shard: int) -> str:
    """The PostgreSQL schema of logical shard ``shard``: ``shard0042`` (Instagram's naming)."""
    return f"{SCHEMA_PREFIX}{shard:04d}"


#: Existence keys of objects that are not tables, for `store init`'s skip check.
NEXT_ID = "#next_id"


_MYSQL_DATABASE = "CREATE DATABASE IF NOT EXISTS `{db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"

# local_id is BIGINT UNSIGNED: the article's INT overflows at 2**31.
# data is MEDIUMTEXT (16 MiB - 1), the ceiling of limits.max_object_bytes.
_MYSQL_OBJECTS_TEMPLATE = """\
CREATE TABLE IF NOT EXISTS `{{db}}`.`{{table}}` (
  `{key}` {key_type},
  `data` MEDIUMTEXT NOT NULL,
  `active` TINYINT(1) NOT NULL DEFAULT 1,
  `ts` TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3),
  PRIMARY KEY (`{key}`)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci"""
_MYSQL_OBJECTS = _MYSQL_OBJECTS_TEMPLATE.format(
    key="local_id", key_type="BIGINT UNSIGNED NOT NULL AUTO_INCREMENT"
)

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


# -- Instagram-style IDs made by the database ------------------------------------
#
# The published next_id() uses now() (frozen for a whole transaction) and a
# sequence `% 1024`: the 1,025th ID in one millisecond repeats the first.
# On PostgreSQL the counter v of a shard counts in units of (ms since the
# epoch) * 1024 + sequence: ID = ((v >> 10) << 23) | (shard << 10) | (v & 1023).
# Each call takes v = nextval; if v lags the clock, the counter jumps forward
# to the clock first. So IDs never repeat and keep increasing per shard, even
# when more than 1,024 are made in one millisecond (the ms field borrows the
# next millisecond) or the clock steps back (the ms field runs ahead of the
# clock until it catches up). The counter is the shard's, shared by all its
# tables: no two objects share an ID. Tests may pin the clock:
# @store_clock_ms (MariaDB), SET store.clock_ms (PostgreSQL).

# The same counter on MariaDB, kept in a one-row table of the shard (MariaDB's
# SETVAL takes only a literal, so a sequence cannot jump to the clock inside a
# trigger). Every insert's trigger moves the row under its row lock, so the
# shard's inserts take turns for the moment of their commit, as next_id()'s
# advisory lock makes them on PostgreSQL, and the counter is shared by every
# table of the shard: no two objects of a shard, of any types, share an ID.
# A row in a table also travels with the shard when it moves.
_MYSQL_ID_COUNTER = """\
CREATE TABLE IF NOT EXISTS `{db}`.`id_counter` (
  `one` TINYINT NOT NULL PRIMARY KEY,
  `v` BIGINT NOT NULL
) ENGINE=InnoDB"""
_MYSQL_ID_COUNTER_ROW = "INSERT IGNORE INTO `{db}`.`id_counter` (`one`, `v`) VALUES (1, 0)"

# The same object table, keyed by the whole ID that the trigger below makes.
_MYSQL_IG_OBJECTS = _MYSQL_OBJECTS_TEMPLATE.format(key="id", key_type="BIGINT NOT NULL DEFAULT 0")

# The time is read when the row is made (SYSDATE, not the statement's NOW).
_MYSQL_IG_TRIGGER = """\
CREATE TRIGGER IF NOT EXISTS `{db}`.`{table}_next_id` BEFORE INSERT ON `{db}`.`{table}` FOR EACH ROW
BEGIN
  DECLARE units BIGINT;
  DECLARE nv BIGINT;
  IF NEW.id = 0 THEN
    SET units = COALESCE(@store_clock_ms, CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS SIGNED)) - {epoch};
    SET units = units * 1024;
    IF units < 0 THEN
      SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'clock before the Instagram ID epoch';
    END IF;
    UPDATE `{db}`.`id_counter` SET `v` = GREATEST(`v` + 1, units) WHERE `one` = 1;
    SELECT c.`v` INTO nv FROM `{db}`.`id_counter` c WHERE c.`one` = 1;
    IF (nv >> 10) >= 1099511627776 THEN
      SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'Instagram ID space of shard {shard} exhausted (2**40 ms)';
    END IF;
    SET NEW.id = ((nv >> 10) << 23) | ({shard} << 10) | (nv & 1023);
  END IF;
END"""

_PG_SCHEMA = 'CREATE SCHEMA IF NOT EXISTS "{schema}"'
_PG_ID_SEQ = 'CREATE SEQUENCE IF NOT EXISTS "{schema}"."id_seq" AS bigint START WITH 1 MINVALUE 1'

# PostgreSQL's setval can move a sequence backwards, so the counter is read
# and moved under a session advisory lock held for microseconds (not the
# transaction): the sequence never goes back and never repeats a value.
_PG_NEXT_ID = """\
CREATE OR REPLACE FUNCTION "{schema}".next_id() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  units bigint;
  v bigint;
BEGIN
  units := (coalesce(nullif(current_setting('store.clock_ms', true), '')::bigint,
                     floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) - {epoch}) * 1024;
  PERFORM pg_advisory_lock({lock_key});
  BEGIN
    v := nextval('"{schema}"."id_seq"');
    IF v < units THEN
      PERFORM setval('"{schema}"."id_seq"', units);
      v := units;
    END IF;
  EXCEPTION WHEN OTHERS OR query_canceled THEN  -- OTHERS alone misses a cancel
    PERFORM pg_advisory_unlock({lock_key});
    RAISE;
  END;
  PERFORM pg_advisory_unlock({lock_key});
  IF (v >> 10) >= 1099511627776 THEN
    RAISE EXCEPTION 'Instagram ID space of shard {shard} exhausted (2**40 ms)';
  END IF;
  RETURN ((v >> 10) << 23) | ({shard}::bigint << 10) | (v & 1023);
END
$$"""

_PG_OBJECTS = """\
CREATE TABLE IF NOT EXISTS "{schema}"."{table}" (
  "id" bigint NOT NULL DEFAULT "{schema}".next_id() PRIMARY KEY,
  "data" text NOT NULL,
  "active" smallint NOT NULL DEFAULT 1,
  "ts" timestamptz(3) NOT NULL DEFAULT now()
)"""

_PG_RELATION = """\
CREATE TABLE IF NOT EXISTS "{schema}"."{table}" (
  "from_id" bigint NOT NULL,
  "to_id" bigint NOT NULL,
  "sequence" bigint NOT NULL,
  PRIMARY KEY ("from_id", "to_id")
)"""

_PG_RELATION_INDEX = (
    'CREATE INDEX IF NOT EXISTS "{table}_from_sequence_to" '
    'ON "{schema}"."{table}" ("from_id", "sequence", "to_id")'
)

_PG_COUNTS = """\
CREATE TABLE IF NOT EXISTS "{schema}"."{table}" (
  "relation" text NOT NULL,
  "from_id" bigint NOT NULL,
  "n" bigint NOT NULL,
  PRIMARY KEY ("relation", "from_id")
)"""

#: Advisory lock keys of next_id(): one per shard, in a range of their own.
PG_LOCK_BASE = 0x5707E1D0000


def shard_statements(
    backend: str,
    shard: int,
    types: Iterable[TypeSpec],
    relations: Iterable[RelationSpec],
    *,
    ids: str = "pinterest",
    epoch_ms: int = 0,
) -> list[tuple[str, str]]:
    """Idempotent DDL for shard ``shard`` as (what it creates, statement) pairs.

    What it creates is ``""`` for the database or schema, a table name, or
    ``table#next_id`` / ``#next_id`` for the ID trigger or function, so that
    `store init` can skip what already exists.
    """
    db = database_name(shard)
    types, relations = list(types), list(relations)
    if ids == "instagram":
        return _instagram_statements(backend, shard, types, relations, epoch_ms)
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


def _instagram_statements(
    backend: str, shard: int, types: list[TypeSpec], relations: list[RelationSpec], epoch_ms: int
) -> list[tuple[str, str]]:
    if backend in ("mysql", "mariadb"):
        db = database_name(shard)
        out = [
            ("", _MYSQL_DATABASE.format(db=db)),
            ("id_counter", _MYSQL_ID_COUNTER.format(db=db)),
            ("id_counter", _MYSQL_ID_COUNTER_ROW.format(db=db)),
        ]
        for t in types:
            out.append((t.table, _MYSQL_IG_OBJECTS.format(db=db, table=t.table)))
            out.append(
                (
                    t.table + NEXT_ID,
                    _MYSQL_IG_TRIGGER.format(db=db, table=t.table, shard=shard, epoch=epoch_ms),
                )
            )
        out += [(r.name, _MYSQL_RELATION.format(db=db, table=r.name)) for r in relations]
        if relations:
            out.append((COUNTS_TABLE, _MYSQL_COUNTS.format(db=db, table=COUNTS_TABLE)))
        return out
    if backend == "postgresql":
        sc = schema_name(shard)
        out = [
            ("", _PG_SCHEMA.format(schema=sc)),
            (NEXT_ID, _PG_ID_SEQ.format(schema=sc)),
            (
                NEXT_ID,
                _PG_NEXT_ID.format(schema=sc, shard=shard, epoch=epoch_ms, lock_key=PG_LOCK_BASE + shard),
            ),
        ]
        out += [(t.table, _PG_OBJECTS.format(schema=sc, table=t.table)) for t in types]
        for r in relations:
            out += [
                (r.name, _PG_RELATION.format(schema=sc, table=r.name)),
                (r.name, _PG_RELATION_INDEX.format(schema=sc, table=r.name)),
            ]
        if relations:
            out.append((COUNTS_TABLE, _PG_COUNTS.format(schema=sc, table=COUNTS_TABLE)))
        return out
    raise ValueError(f"no Instagram-ID DDL for backend {backend!r}")


def shard_ddl(
    backend: str,
    shard: int,
    types: Iterable[TypeSpec],
    relations: Iterable[RelationSpec],
    *,
    ids: str = "pinterest",
    epoch_ms: int = 0,
) -> list[str]:
    """Idempotent statements that create shard ``shard`` on a ``backend`` host."""
    pairs = shard_statements(backend, shard, types, relations, ids=ids, epoch_ms=epoch_ms)
    return [stmt for _what, stmt in pairs]


def render_shard_sql(backend: str, shard: int, config: StoreConfig) -> str:
    """One shard's DDL as a readable SQL script (what ``schemas/`` ships)."""
    where = {
        "sqlite": f"file {database_name(shard)}.sqlite3",
        "postgresql": f"schema {schema_name(shard)}",
    }.get(backend, f"database {database_name(shard)}")
    head = (
        f"-- Shard {shard}: {where}. Generated by `store schema --backend {backend} --shard {shard}`;\n"
        "-- `store init` runs the same statements on every shard's master.\n"
    )
    stmts = shard_ddl(
        backend,
        shard,
        config.types.values(),
        config.relations.values(),
        ids=config.ids,
        epoch_ms=config.instagram_epoch_ms,
    )
    return head + "".join(f"\n{stmt};\n" for stmt in stmts)


# -- tombstones: what a moved shard leaves on its old host (MariaDB) ------------------
#
# The moved tables are renamed into the archive database; in their place
# stand views of the same names and columns whose every read calls a function
# that raises TOMBSTONE_ERRNO, naming the new host and map version. A view
# cannot be written to (MariaDB answers 1471 / 1288), so every statement the
# store sends to a tombstone fails: the fence holds whether or not a table of
# that name is ever created again, and `CREATE TABLE IF NOT EXISTS` (an init
# run by an old config) finds the name taken. Live shards keep plain tables:
# no cost on the request path.

_TOMBSTONE_MARKER = """\
CREATE TABLE IF NOT EXISTS `{db}`.`{table}` (
  `shard` INT NOT NULL PRIMARY KEY,
  `moved_to` VARCHAR(255) NOT NULL,
  `map_version` BIGINT NOT NULL,
  `moved_at` TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"""

_TOMBSTONE_FUNCTION_SQL = """\
CREATE OR REPLACE FUNCTION `{db}`.`{fn}`() RETURNS BIGINT NOT DETERMINISTIC NO SQL
BEGIN
  SIGNAL SQLSTATE '45000' SET MYSQL_ERRNO = {errno}, MESSAGE_TEXT = '{message}';
  RETURN 0;
END"""


def _tombstone_message(shard: int, moved_to: str, map_version: int) -> str:
    return f"store-tombstone shard={shard} moved_to={moved_to} map_version={map_version}"


_TOMBSTONE_PARSE = re.compile(r"store-tombstone shard=\d+ moved_to=(.*) map_version=(\d+)")


def parse_tombstone(message: str) -> tuple[str, int] | None:
    """(moved_to, map_version) from the error a tombstone raises, or None if it is not one."""
    found = _TOMBSTONE_PARSE.search(message)
    return None if found is None else (found.group(1), int(found.group(2)))


def tombstone_statements(
    shard: int, moved_to: str, map_version: int, tables: dict[str, list[str]]
) -> list[str]:
    """MariaDB statements that leave a tombstone of ``shard`` (idempotent).

    ``tables`` maps each moved table to its columns, in order. Host names
    are config keys (checked by the config) and are quoted for SQL here.
    """
    db = database_name(shard)
    fn = f"`{db}`.`{_TOMBSTONE_FUNCTION}`()"
    quoted = moved_to.replace("\\", "\\\\").replace("'", "''")
    out = [
        _TOMBSTONE_MARKER.format(db=db, table=TOMBSTONE_TABLE),
        f"REPLACE INTO `{db}`.`{TOMBSTONE_TABLE}` (shard, moved_to, map_version) "
        f"VALUES ({shard}, '{quoted}', {map_version})",
        _TOMBSTONE_FUNCTION_SQL.format(
            db=db,
            fn=_TOMBSTONE_FUNCTION,
            errno=TOMBSTONE_ERRNO,
            message=_tombstone_message(shard, moved_to, map_version).replace("'", "''"),
        ),
    ]
    for table, columns in sorted(tables.items()):
        names = ", ".join(f"`{c}`" for c in columns)
        values = ", ".join(fn for _c in columns)
        # TEMPTABLE: the view is computed before any WHERE applies, so a
        # primary-key read of a row that "is not there" raises too.
        out.append(
            f"CREATE OR REPLACE ALGORITHM=TEMPTABLE SQL SECURITY INVOKER VIEW `{db}`.`{table}` "
            f"({names}) AS SELECT {values}"
        )
    return out
