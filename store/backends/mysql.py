"""MariaDB / MySQL: every shard is a database (``db00042``) on its host; all of them share a pool.

Drivers: PyMySQL (``mysql+pymysql://``, through the store's own cursor and
connection classes: `store.backends.pymysql_fast`) or mysqlclient
(``mysql+mysqldb://``); opening their connections is
`store.backends.mysql_driver`'s, whose names this module still exports.
This module also owns what only MariaDB does here: Instagram IDs from a
counter row and a trigger, the tombstone a moved shard leaves behind, and
the named locks that keep admin commands from stepping on a move.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import func, text
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.mysql import pymysql as mysql_pymysql
from sqlalchemy.engine import URL, Dialect

from store.backends import Backend, ErrorKind
from store.backends.inventory import ServerInventory, ShardCopy, shard_number
from store.backends.mysql_driver import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    _load_tls_files,
    _mysql_driver,
    mysql_connector,
    mysql_driver_error,
)
from store.backends.tables import VERSION_COLUMN, ColumnTypes
from store.exceptions import BackendError, ConfigError
from store.naming import (
    ADDED_VERSION,
    DEFAULT_NAMES,
    NEXT_ID,
    TOMBSTONE_TABLE,
    Names,
)
from store.specs import TypeSpec
from store.tls import absolute_files, mysql_tls

__all__ = [
    "CONNECT_TIMEOUT_S",
    "READ_TIMEOUT_S",
    "TOMBSTONE_ERRNO",
    "MySQLBackend",
    "STASH_SUFFIX",
    "dump_databases",
    "id_trigger",
    "load_dump",
    "leave_tombstones",
    "mysql_connector",
    "mysql_driver_error",
    "parse_tombstone",
    "table_triggers",
    "tombstone_statements",
]

#: The error number every read of a tombstone raises (a user SIGNAL; MariaDB's own numbers stay below).
TOMBSTONE_ERRNO = 9451

# 1049 unknown database, 1146 unknown table.
_MISSING = frozenset({1049, 1146})
# A write to a view (1471 not insertable, 1288 not updatable), or an index hint
# on one (1176 no such key: each write of a pair names the primary key): the store's
# tables are never views, except the tombstone a moved shard leaves behind.
_TOMBSTONE = frozenset({TOMBSTONE_ERRNO, 1471, 1288, 1176})
# Client errors meaning the connection is gone: can't connect (2002, 2003),
# server gone away (2006), lost during query (2013), lost (2055).
_DISCONNECT = frozenset({2002, 2003, 2006, 2013, 2055})
# Transactions rolled back whole, safe to run again: deadlock (1213), lock wait timeout (1205).
_RETRY = frozenset({1205, 1213})
_DUPLICATE = frozenset({1062})


def _code(exc: BaseException) -> int | None:
    args = getattr(exc, "args", ())
    return args[0] if args and isinstance(args[0], int) else None


#: What the application account may do to the rows of a shard's tables.
ROW_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
#: MariaDB's "access denied" errors: to a database, at login, to a table or command,
#: to a column, a missing global privilege, to a routine.
_DENIED = frozenset({1044, 1045, 1142, 1143, 1227, 1370})


def _grant_database(name: str) -> str:
    """``name`` as a MariaDB GRANT names one database: ``_`` is a wildcard there (``store_log`` would
    also grant ``storeXlog``, ``app_db00001`` ``appXdb00001``), so it is escaped."""
    return name.replace("_", "\\_")


class MySQLBackend(Backend):
    """MariaDB and MySQL."""

    name = "mysql"
    url_backends = frozenset({"mysql", "mariadb"})
    param = "%s"
    serves_ids = frozenset({"pinterest", "instagram"})
    can_move = True
    can_hold_tickets = True
    move_kind = "mariadb"
    begin_with_first_statement = True

    def _sa_dialect(self) -> Dialect:
        return mysql_pymysql.dialect(paramstyle="format")

    def column_types(self) -> ColumnTypes:
        """BIGINT UNSIGNED keys (the article's INT overflows at 2**31), MEDIUMTEXT JSON, InnoDB, utf8mb4."""
        unsigned = mysql.BIGINT(unsigned=True)
        return ColumnTypes(
            local_id=unsigned,
            instagram_id=mysql.BIGINT(),
            instagram_default=lambda _schema, _shard: text("0"),  # the trigger makes the ID
            data=mysql.MEDIUMTEXT(),  # 16 MiB - 1: the ceiling of limits.max_object_bytes
            flag=mysql.TINYINT(1),
            timestamp=mysql.TIMESTAMP(fsp=3),
            timestamp_default="CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)",
            pair_id=unsigned,
            sequence=mysql.BIGINT(),
            relation_name=mysql.VARCHAR(64),
            count=mysql.BIGINT(),
            key_value=mysql.VARBINARY(512),
            object_options={
                "mysql_engine": "InnoDB",
                "mysql_charset": "utf8mb4",
                "mysql_collate": "utf8mb4_unicode_ci",
            },
            relation_options={"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4"},
        )

    def namespace(self, shard: int) -> str:
        """``db00042`` (``NAME_db00042`` in a namespace)."""
        return self.names.database_name(shard)

    def check_url(self, host: str, url: URL, base: Path) -> URL:
        """A MariaDB host names no database (each shard is its own), its driver is installed, and its
        query parameters are ``unix_socket`` and the TLS ones (`store.tls.mysql_tls`), right.

        Relative TLS file names are taken from ``base`` (the config file's folder); the URL
        returned names them in full. The files are loaded once here, so a CA, certificate or
        key that is not PEM, or a key that does not match its certificate, is refused now.
        """
        if url.database:
            raise ConfigError(
                f"hosts.{host} names database {url.database!r}; leave it out: "
                "each shard is its own database (db00000, db00001, ...)"
            )
        url = absolute_files(url, base)
        try:
            _mysql_driver(url)
            _load_tls_files(mysql_tls(url))
        except ConfigError as exc:
            raise ConfigError(f"hosts.{host}: {exc}") from None
        return url

    def server_identity(self, url: URL) -> str:
        """``mysql://host:port`` (or the socket)."""
        socket = url.query.get("unix_socket")
        return f"mysql://{socket}" if socket else f"mysql://{url.host or '127.0.0.1'}:{url.port or 3306}"

    def connector(
        self, url: URL, *, shard: int, connect_timeout_s: float, query_timeout_s: float
    ) -> Callable[[], Any]:
        """PyMySQL or mysqlclient, autocommit, utf8mb4, REPEATABLE READ, with the timeouts.

        Shard connections accept several statements in one request, so a
        transaction's BEGIN goes out with its first statement
        (`Backend.begin_with_first_statement`); every statement the store
        sends is compiled, its values passed as parameters.
        """
        return mysql_connector(
            url, connect_timeout_s=connect_timeout_s, query_timeout_s=query_timeout_s, multi_statements=True
        )

    def classify(self, exc: BaseException) -> ErrorKind | None:
        """By MariaDB error number."""
        if isinstance(exc, ConnectionError | TimeoutError):
            return ErrorKind.DISCONNECT
        code = _code(exc)
        if code in _TOMBSTONE:
            return ErrorKind.TOMBSTONE
        if code in _MISSING:
            return ErrorKind.MISSING
        if code in _DISCONNECT or (type(exc).__name__ == "InterfaceError" and code in (0, None)):
            return ErrorKind.DISCONNECT
        if code in _RETRY:
            return ErrorKind.RETRYABLE
        if code in _DUPLICATE:
            return ErrorKind.DUPLICATE
        return None

    def is_driver_error(self, exc: BaseException) -> bool:
        """PyMySQL's or MySQLdb's errors, and socket errors."""
        return isinstance(exc, ConnectionError | TimeoutError) or type(exc).__module__.startswith(
            ("pymysql", "MySQLdb")
        )

    def extra_statements(
        self, shard: int, types: Sequence[TypeSpec], *, ids: str, epoch_ms: int
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """The database; for Instagram IDs the shard's counter row and a trigger per object table."""
        db = self.names.database_name(shard)
        before = [("", _DATABASE.format(db=db))]
        if ids != "instagram":
            return before, []
        before += [("id_counter", _ID_COUNTER.format(db=db)), ("id_counter", _ID_COUNTER_ROW.format(db=db))]
        after = [(t.table + NEXT_ID, id_trigger(shard, t.table, epoch_ms, db=db)) for t in types]
        return before, after

    list_versions = True
    conditional_writes = True
    pair_rows = True

    def id_step(self, cur: Any) -> int | None:
        """``auto_increment_increment``, where ``innodb_autoinc_lock_mode`` is 0 or 1: an INSERT whose
        row count is known takes its keys as one block, so they follow each other by the step
        (mode 2, interleaved, as Galera wants it, promises no such thing: None)."""
        cur.execute("SELECT @@innodb_autoinc_lock_mode, @@auto_increment_increment")
        row = cur.fetchone()
        if row is None:
            return None
        mode, step = int(row[0]), int(row[1])
        return step if mode in (0, 1) and step >= 1 else None

    # -- accounts and grants ------------------------------------------------------

    def grant_statements(
        self, *, shards: int, user: str, host: str, database: str | None, log: bool, meta: bool
    ) -> list[str]:
        """Row privileges and EXECUTE on each shard database, SELECT, INSERT and DELETE on the
        invalidation log's database (where there are shards), SELECT on the map table's."""
        account = f"'{user}'@'{host}'"
        out = [
            f"GRANT {ROW_PRIVILEGES}, EXECUTE ON `{_grant_database(self.names.database_name(s))}`.* "
            f"TO {account}"
            for s in range(shards)
        ]
        if shards:
            out.append(
                f"GRANT SELECT, INSERT, DELETE ON `{_grant_database(self.names.log_database)}`.* TO {account}"
            )
        if meta:
            out.append(f"GRANT SELECT ON `{_grant_database(self.names.meta_database)}`.* TO {account}")
        return out

    def account_exists(self, cur: Any, user: str, host: str) -> bool:
        """A row of ``mysql.user``."""
        cur.execute("SELECT 1 FROM mysql.user WHERE User = %s AND Host = %s", (user, host))
        return cur.fetchone() is not None

    def create_account_hint(self, user: str, host: str) -> str:
        """``CREATE USER``."""
        return f"CREATE USER '{user}'@'{host}' IDENTIFIED BY '...'"

    def admin_connector(self, url: URL) -> Callable[[], Any]:
        """`mysql_connector` with its default timeouts."""
        return mysql_connector(url)

    def denies(self, exc: BaseException) -> bool:
        """MariaDB's access-denied error numbers."""
        args: tuple[Any, ...] = getattr(exc, "args", ())
        return bool(args) and isinstance(args[0], int) and args[0] in _DENIED

    upsert_style = "on_duplicate_key"
    invalidation_modes = ("log", "binlog")
    change_log_step_sql = "SELECT @@auto_increment_increment"

    def change_log_clean(self, batch: int) -> str:
        """``DELETE ... LIMIT``: at most ``batch`` rows."""
        return f"DELETE FROM {self.change_log} WHERE id <= %s LIMIT {int(batch)}"

    def wait_for_lock(self, cur: Any, name: str, wait_s: int) -> bool:
        """``GET_LOCK``: a named lock of the connection's, freed when the connection goes."""
        cur.execute("SELECT GET_LOCK(%s, %s)", (name, wait_s))
        got = cur.fetchone()
        return got is not None and got[0] == 1

    @property
    def change_log(self) -> str:
        """The invalidation log, ``store_log.cache_log`` (``NAME_store_log`` in a namespace), quoted."""
        return f"`{self.names.log_database}`.`cache_log`"

    def change_log_ddl(self) -> list[str]:
        """The ``store_log`` database and its ``cache_log`` table (one per server, not per shard)."""
        return [
            f"CREATE DATABASE IF NOT EXISTS `{self.names.log_database}` CHARACTER SET utf8mb4 "
            "COLLATE utf8mb4_bin",
            f"CREATE TABLE IF NOT EXISTS {self.change_log} ("
            "id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY, "
            "at_ms BIGINT NOT NULL, entries MEDIUMTEXT NOT NULL) ENGINE=InnoDB",
        ]

    def change_log_insert(self) -> str:
        """One log row, sent with the write's COMMIT."""
        return f"INSERT INTO {self.change_log} (at_ms, entries) VALUES (%s, %s)"

    def change_log_insert_versions(self, versions: Sequence[str]) -> str:
        """One log row, its list entries' versions read in the transaction (which holds their rows'
        locks: the versions its writes made), 0 for a list with no counts row."""
        named = "".join(f", CONCAT(%s, COALESCE(({q}), 0))" for q in versions)
        return f"INSERT INTO {self.change_log} (at_ms, entries) SELECT %s, CONCAT_WS(' ', %s{named})"

    def change_log_insert_if_changed(self) -> str:
        """One log row, only if the count before it in the request counted a change; the version
        that count made is the session's ``LAST_INSERT_ID()`` (`RelationStatements`)."""
        return (
            f"INSERT INTO {self.change_log} (at_ms, entries) "
            "SELECT %s, CONCAT(%s, LAST_INSERT_ID()) FROM DUAL WHERE ROW_COUNT() > 0"
        )

    def existing(self, cur: Any) -> set[tuple[str, str]]:
        """Databases, tables (and views) and ID triggers of this namespace, from information_schema."""
        like = self.names.databases_like
        cur.execute("SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s", (like,))
        out = {(str(row[0]), "") for row in cur.fetchall()}
        cur.execute(
            "SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema LIKE %s",
            (like,),
        )
        out |= {(str(row[0]), str(row[1])) for row in cur.fetchall()}
        cur.execute(
            "SELECT trigger_schema, event_object_table FROM information_schema.triggers "
            "WHERE trigger_schema LIKE %s",
            (like,),
        )
        out |= {(str(row[0]), str(row[1]) + NEXT_ID) for row in cur.fetchall()}
        cur.execute(
            "SELECT table_schema, table_name FROM information_schema.columns "
            "WHERE table_schema LIKE %s AND column_name = %s",
            (like, VERSION_COLUMN),
        )
        out |= {(str(row[0]), str(row[1]) + ADDED_VERSION) for row in cur.fetchall()}
        return out

    def inventory(self, url: URL, open_cursor: Callable[[], Any]) -> Any:
        """Shard databases (live, tombstone or empty) and move archives, of this namespace only."""
        names = self.names
        inv = ServerInventory()
        with open_cursor() as cur:
            cur.execute(
                "SELECT s.schema_name, t.table_name FROM information_schema.schemata s "
                "LEFT JOIN information_schema.tables t ON t.table_schema = s.schema_name "
                "AND t.table_type = 'BASE TABLE' WHERE s.schema_name LIKE %s OR s.schema_name LIKE %s",
                (names.databases_like, names.archive_databases_like),
            )
            live: dict[int, list[str]] = {}
            for db, table in cur.fetchall():
                name = str(db)
                archived = shard_number(name, names.archive_database_prefix, 5)
                if archived is not None:
                    inv.archives[archived] = (
                        *inv.archives.get(archived, ()),
                        *([] if table is None else [table]),
                    )
                    continue
                shard = shard_number(name, names.database_prefix, 5)
                if shard is not None:
                    live.setdefault(shard, []).extend([] if table is None else [str(table)])
            told = self.tombstones(cur, [s for s, tables in live.items() if TOMBSTONE_TABLE in tables])
        for shard, tables in live.items():
            if shard in told:
                moved_to, version = told[shard]
                inv.copies[shard] = ShardCopy(shard, "tombstone", (), moved_to, version)
            else:
                inv.copies[shard] = ShardCopy(shard, "live" if tables else "empty", tuple(sorted(tables)))
        return inv

    def tombstones(self, cur: Any, shards: Iterable[int]) -> dict[int, tuple[str, int]]:
        """(moved_to, map_version) of each of ``shards`` whose database here is a tombstone."""
        wanted = sorted(set(shards))
        if not wanted:
            return {}
        cur.execute(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = %s AND table_schema IN ("
            + ", ".join(["%s"] * len(wanted))
            + ")",
            (TOMBSTONE_TABLE, *[self.names.database_name(s) for s in wanted]),
        )
        marked = [str(r[0]) for r in cur.fetchall()]
        if not marked:
            return {}
        rows = (f"SELECT shard, moved_to, map_version FROM `{db}`.`{TOMBSTONE_TABLE}`" for db in marked)
        cur.execute(" UNION ALL ".join(rows))
        return {int(shard): (str(moved_to), int(version)) for shard, moved_to, version in cur.fetchall()}

    def tombstone_from_error(self, exc: BaseException) -> tuple[str, int] | None:
        """A read refused by a tombstone says where the shard went; a write (1471, 1288, 1176) does not."""
        return parse_tombstone(str(exc))

    @contextmanager
    def admin_lock(self, cur: Any, shards: Iterable[int], *, timeout_s: float) -> Iterator[None]:
        """Named locks, one per shard, taken in shard order (released on the way out, or with the session)."""
        held: list[str] = []
        try:
            for shard in sorted(set(shards)):
                name = f"store-admin:{self.names.database_name(shard)}"
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

    def upsert_skip(self, table: Any) -> Any:
        """``ON DUPLICATE KEY UPDATE k = k``: a no-op update reports 0 rows and, unlike INSERT
        IGNORE, hides no other error."""
        first = next(iter(table.primary_key.columns))
        return mysql.insert(table).on_duplicate_key_update({first.name: first})

    def upsert_add(self, table: Any, key: Sequence[str], column: str, *, also: Mapping[str, Any]) -> Any:
        """``ON DUPLICATE KEY UPDATE n = n + VALUES(n)`` (and ``also``)."""
        ins = mysql.insert(table)
        return ins.on_duplicate_key_update({column: table.c[column] + ins.inserted[column], **also})

    def returned(self, value: Any) -> Any:
        """``LAST_INSERT_ID(value)``: the statement's OK packet carries it (the driver's ``lastrowid``)."""
        return func.last_insert_id(value)

    def upsert_set(self, table: Any, key: Sequence[str], column: str, *, also: Mapping[str, Any]) -> Any:
        """``ON DUPLICATE KEY UPDATE n = VALUES(n)`` (and ``also``)."""
        ins = mysql.insert(table)
        return ins.on_duplicate_key_update({column: ins.inserted[column], **also})


# -- DDL that is not a table -------------------------------------------------------------

_DATABASE = "CREATE DATABASE IF NOT EXISTS `{db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"

# Instagram IDs: the shard's counter, in units of (ms since the epoch) * 1024 +
# sequence, kept in a one-row table (MariaDB's SETVAL takes only a literal,
# so a sequence cannot jump to the clock inside a trigger). Every insert's
# trigger moves the row under its row lock, so the shard's inserts take turns
# for the moment of their commit, and the counter is shared by every table of
# the shard: no two objects of a shard, of any types, share an ID. A burst of
# more than 1,024 in one millisecond borrows the next; a clock that steps back
# leaves the ms field running ahead until it catches up. A row in a table also
# travels with the shard when it moves. Tests may pin the clock: @store_clock_ms.
_ID_COUNTER = """\
CREATE TABLE IF NOT EXISTS `{db}`.`id_counter` (
  `one` TINYINT NOT NULL PRIMARY KEY,
  `v` BIGINT NOT NULL
) ENGINE=InnoDB"""
_ID_COUNTER_ROW = "INSERT IGNORE INTO `{db}`.`id_counter` (`one`, `v`) VALUES (1, 0)"

# The time is read when the row is made (SYSDATE, not the statement's NOW).
_IG_TRIGGER = """\
CREATE TRIGGER IF NOT EXISTS `{db}`.`{table}_next_id` BEFORE INSERT ON `{db}`.`{on}` FOR EACH ROW
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


def id_trigger(shard: int, table: str, epoch_ms: int, *, on: str | None = None, db: str | None = None) -> str:
    """``CREATE TRIGGER IF NOT EXISTS`` of the Instagram ID trigger of ``table`` in shard ``shard``.

    The trigger is named after ``table`` (``pins_next_id``); ``on`` names the
    table it is made on when that is not ``table`` itself (a move puts it back
    on a table under its `STASH_SUFFIX` name, then renames the table). ``db``:
    the shard's database, where it is not ``db00042`` (a namespace's).
    """
    return _IG_TRIGGER.format(
        db=db or DEFAULT_NAMES.database_name(shard), table=table, on=on or table, shard=shard, epoch=epoch_ms
    )


# -- moving tables that carry triggers -------------------------------------------------------
#
# MariaDB refuses to rename a table with triggers into another database
# (error 1435, "Trigger in wrong schema"), yet renames it within its own
# database, triggers and all. So a move fences such a table by renaming it to
# ``<table>__moving`` in its own database (still under the fence's lock: from
# then on a write finds no table, as after an archive rename), and only then
# drops its triggers and renames it into the archive, from another session
# (a renamed table leaves the lock). A table that has lost its trigger is never
# reachable under its own name; an abort puts the trigger back on the stashed
# name before the rename that makes it live again.

#: What a fenced table with triggers is called in its own database until it reaches the archive.
STASH_SUFFIX = "__moving"


def table_triggers(cur: Any, databases: Sequence[str]) -> dict[tuple[str, str], list[str]]:
    """(database, table) -> the names of its triggers, for each table of ``databases`` that has any."""
    if not databases:
        return {}
    cur.execute(
        "SELECT event_object_schema, event_object_table, trigger_name FROM information_schema.triggers "
        "WHERE event_object_schema IN (" + ", ".join(["%s"] * len(databases)) + ") ORDER BY 1, 2, 3",
        list(databases),
    )
    out: dict[tuple[str, str], list[str]] = {}
    for db, table, name in cur.fetchall():
        out.setdefault((str(db), str(table)), []).append(str(name))
    return out


# -- tombstones: what a moved shard leaves on its old host -------------------------------------
#
# The moved tables are renamed into the archive database; in their place
# stand views of the same names and columns whose every read calls a function
# that raises TOMBSTONE_ERRNO, naming the new host and map version. A view
# cannot be written to (MariaDB answers 1471 / 1288), so every statement the
# store sends to a tombstone fails: the fence holds whether or not a table of
# that name is ever created again, and `CREATE TABLE IF NOT EXISTS` (an init
# run by an old config) finds the name taken. Live shards keep plain tables:
# no cost on the request path.

_TOMBSTONE_FUNCTION = "store_moved"
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

_TOMBSTONE_PARSE = re.compile(r"store-tombstone shard=\d+ moved_to=(.*) map_version=(\d+)")


def parse_tombstone(message: str) -> tuple[str, int] | None:
    """(moved_to, map_version) from the error a tombstone raises, or None if it is not one."""
    found = _TOMBSTONE_PARSE.search(message)
    return None if found is None else (found.group(1), int(found.group(2)))


def tombstone_statements(
    shard: int,
    moved_to: str,
    map_version: int,
    tables: dict[str, list[str]],
    *,
    names: Names = DEFAULT_NAMES,
) -> list[str]:
    """Statements that leave a tombstone of ``shard`` (idempotent), in the namespace of ``names``.

    ``tables`` maps each moved table to its columns, in order. Host names
    are config keys (checked by the config) and are quoted for SQL here.
    """
    db = names.database_name(shard)
    fn = f"`{db}`.`{_TOMBSTONE_FUNCTION}`()"
    quoted = moved_to.replace("\\", "\\\\").replace("'", "''")
    message = f"store-tombstone shard={shard} moved_to={moved_to} map_version={map_version}"
    out = [
        _TOMBSTONE_MARKER.format(db=db, table=TOMBSTONE_TABLE),
        f"REPLACE INTO `{db}`.`{TOMBSTONE_TABLE}` (shard, moved_to, map_version) "
        f"VALUES ({shard}, '{quoted}', {map_version})",
        _TOMBSTONE_FUNCTION_SQL.format(
            db=db, fn=_TOMBSTONE_FUNCTION, errno=TOMBSTONE_ERRNO, message=message.replace("'", "''")
        ),
    ]
    for table, columns in sorted(tables.items()):
        listed = ", ".join(f"`{c}`" for c in columns)
        values = ", ".join(fn for _c in columns)
        # TEMPTABLE: the view is computed before any WHERE applies, so a
        # primary-key read of a row that "is not there" raises too.
        out.append(
            f"CREATE OR REPLACE ALGORITHM=TEMPTABLE SQL SECURITY INVOKER VIEW `{db}`.`{table}` "
            f"({listed}) AS SELECT {values}"
        )
    return out


def leave_tombstones(
    cur: Any, shards: Iterable[int], moved_to: str, map_version: int, *, names: Names = DEFAULT_NAMES
) -> int:
    """Leave a tombstone of each of ``shards`` whose tables were moved into the archive; how many.

    The views take the names and columns of the archived tables. Runs off the
    binlog (the renames were too), so replicas of this host never see half a
    switch. Idempotent: a resumed move runs it again.
    """
    wanted = sorted(set(shards))
    if not wanted:
        return 0
    archives = [names.archive(names.database_name(s)) for s in wanted]
    cur.execute(
        "SELECT table_schema, table_name, column_name FROM information_schema.columns "
        "WHERE table_schema IN (" + ", ".join(["%s"] * len(archives)) + ") "
        "ORDER BY table_schema, table_name, ordinal_position",
        archives,
    )
    columns: dict[int, dict[str, list[str]]] = {}
    for db, table, column in cur.fetchall():
        shard = shard_number(str(db), names.archive_database_prefix, 5)
        assert shard is not None
        columns.setdefault(shard, {}).setdefault(str(table), []).append(str(column))
    cur.execute("SET SESSION sql_log_bin = 0")
    try:
        for shard in wanted:
            tables = columns.get(shard)
            if not tables:
                continue  # nothing was archived: nothing there to fence
            cur.execute(f"CREATE DATABASE IF NOT EXISTS `{names.database_name(shard)}`")
            for stmt in tombstone_statements(shard, moved_to, map_version, tables, names=names):
                cur.execute(stmt)
    finally:
        cur.execute("SET SESSION sql_log_bin = 1")
    return len(columns)


def _client(url: URL) -> tuple[list[str], dict[str, str]]:
    """Arguments and environment for MariaDB's command-line clients (the password not on argv).

    The URL's TLS settings become ``--ssl``, ``--ssl-ca``, ``--ssl-cert``,
    ``--ssl-key`` and ``--ssl-verify-server-cert`` (chain and name: these
    clients refuse a server without TLS only with it), or ``--skip-ssl``.
    """
    args = [f"-h{url.host or '127.0.0.1'}", f"-P{url.port or 3306}", f"-u{url.username or 'root'}"]
    tls = mysql_tls(url)
    if tls.disabled:
        args.append("--skip-ssl")
    elif tls.required:
        args.append("--ssl")
        files = (("ssl-ca", tls.ca), ("ssl-cert", tls.cert), ("ssl-key", tls.key))
        args += [f"--{flag}={path}" for flag, path in files if path is not None]
        if tls.verify_identity:
            args.append("--ssl-verify-server-cert")
    return args, {**os.environ, "MYSQL_PWD": url.password or ""}


def dump_databases(url: URL, databases: Sequence[str]) -> tuple[bytes, str]:
    """A consistent dump of ``databases`` (``mariadb-dump --single-transaction``) and the GTID
    position it was taken at; `BackendError` if the dump fails or the server has no binlog."""
    args, env = _client(url)
    dump = subprocess.run(
        ["mariadb-dump", *args, "--single-transaction", "--gtid", "--master-data=2",
         "--skip-lock-tables", "--triggers", "--skip-routines", "--skip-events", "--databases", *databases],
        capture_output=True,
        env=env,
    )  # fmt: skip
    if dump.returncode != 0:
        raise BackendError(f"mariadb-dump failed: {dump.stderr.decode(errors='replace').strip()[:500]}")
    found = re.search(rb"gtid_slave_pos\s*=\s*'([^']*)'", dump.stdout)
    if found is None:
        raise BackendError("mariadb-dump printed no GTID position: is the source's binlog on?")
    # Triggers are dumped with their definer (``DEFINER=`admin`@`10.0.0.5```), an account the
    # target may not have: a trigger whose definer is missing refuses every insert there.
    # Without the clause the account that loads the dump becomes the definer, as when
    # `store init` makes the trigger.
    return _DEFINER.sub(b"", dump.stdout), found.group(1).decode()


_DEFINER = re.compile(rb"/\*!50017 DEFINER=(?:`[^`]*`|[^ @*]+)@(?:`[^`]*`|[^ *]+)\s*\*/ ?")


def load_dump(url: URL, dump: bytes) -> None:
    """Run a dump made by `dump_databases` on the server at ``url``; `BackendError` if it fails."""
    args, env = _client(url)
    load = subprocess.run(["mariadb", *args], input=dump, capture_output=True, env=env)
    if load.returncode != 0:
        raise BackendError(f"loading failed: {load.stderr.decode(errors='replace').strip()[:500]}")
