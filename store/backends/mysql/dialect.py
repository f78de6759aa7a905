"""MariaDB / MySQL: every shard is a database (``db00042``) on its host; all of them share a pool.

`MySQLBackend` is the dialect: names, column types, DDL, error numbers,
grants, the invalidation log, the inventory of a server, and the named locks
that keep admin commands from stepping on a move. Opening a driver's
connection is `store.backends.mysql.driver`'s; the SQL of Instagram IDs'
counter and trigger and of tombstones is `store.backends.mysql.admin`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import func, text
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.mysql import pymysql as mysql_pymysql
from sqlalchemy.engine import URL, Dialect

from store.backends import Backend, ErrorKind, ReplicaState
from store.backends.inventory import ServerInventory, ShardCopy, shard_number
from store.backends.mysql.admin import (
    _ID_COUNTER,
    _ID_COUNTER_ROW,
    TOMBSTONE_ERRNO,
    id_trigger,
    not_replicating,
    parse_tombstone,
    slave_status,
    stop_slaves,
    unapplied,
)
from store.backends.mysql.admin import unreachable as connect_unreachable
from store.backends.mysql.driver import _load_tls_files, _mysql_driver, mysql_connector
from store.backends.tables import VERSION_COLUMN, ColumnTypes
from store.exceptions import BackendError, ConfigError
from store.naming import ADDED_VERSION, NEXT_ID, TOMBSTONE_TABLE
from store.specs import TypeSpec
from store.tls import absolute_files, mysql_tls

__all__ = ["ROW_PRIVILEGES", "MySQLBackend"]

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
# A gate fails when the pair write before it changed no row (``ROW_COUNT()`` < 1: an UPDATE or
# INSERT that wrote nothing, or a conditional count that did not run) by setting a session
# variable to a value it refuses, else to the value it holds (no change): ``sql_mode`` to an
# unknown mode ("Variable 'sql_mode' can't be set to the value of 'store_gate'") for a pair's
# primary side, ``time_zone`` to an unknown zone ("Unknown or incorrect time zone") for its
# inverse. Plain statements (no compound statement to parse), no table read, and errors no
# other statement of the store's can raise; a statement's error rolls nothing back, so the
# transaction goes on. (Subqueries that return two rows did it before: each built a UNION in a
# temporary table, 60-80 us of the server's CPU a gate against 10-15 now, measured on MariaDB
# 10.11 with a gate after each of 8,000 INSERTs.)
_GATE_ERRORS = {1231: 0, 1298: 1}
_FAILS = "ROW_COUNT() < 1"
_OR_MARKED = " AND @store_pair < 1"
_MARK = "SET @store_pair = ROW_COUNT()"


def _gate_text(variable: str, condition: str) -> str:
    return f"SET SESSION {variable} = IF({condition}, 'store_gate', @@SESSION.{variable})"


#: By kind (`MySQLBackend.gate`): (after one write, after two).
_GATE_TEXTS = tuple(
    (_gate_text(variable, _FAILS), _gate_text(variable, _FAILS + _OR_MARKED))
    for variable in ("sql_mode", "time_zone")
)


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

    def gate_plan(
        self, statements: Sequence[tuple[str, Any]], writes: int, kind: int
    ) -> tuple[list[tuple[str, Any]], list[int]]:
        """A statement after the plan's last count (each write is followed by its conditional
        count); with two writes, the first count's ROW_COUNT() kept by a statement after it."""
        last, either = _GATE_TEXTS[kind]
        if writes == 1:
            return [*statements, (last, None)], [0, 1]
        w1, c1, w2, c2 = statements
        return [w1, c1, (_MARK, None), w2, c2, (either, None)], [0, 1, 3, 4]

    def gate(self, exc: BaseException) -> int | None:
        """By MariaDB error number (`_GATE_ERRORS`)."""
        code = _code(exc)
        return None if code is None else _GATE_ERRORS.get(code)

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
    gates = True
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

    # -- promoting a slave ---------------------------------------------------------

    can_promote = True

    def unreachable(self, exc: BaseException) -> bool:
        """A client error of a connect no server answered (`store.backends.mysql.admin.unreachable`)."""
        return connect_unreachable(exc)

    def replica_state(self, url: URL) -> ReplicaState:
        """``SHOW ALL SLAVES STATUS``: whether it replicates at all (`not_replicating`), and each
        connection whose executed position is behind what it read."""
        conn = mysql_connector(url)()
        try:
            rows = slave_status(conn.cursor())
        finally:
            conn.close()
        return ReplicaState(not_replicating=not_replicating(rows), unapplied=tuple(unapplied(rows)))

    def promote_replica(self, url: URL) -> None:
        """``STOP ALL SLAVES``."""
        conn = mysql_connector(url)()
        try:
            stop_slaves(conn.cursor())
        finally:
            conn.close()

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


# -- DDL that is not a table (Instagram IDs' counter and trigger: `store.backends.mysql.admin`) ----

_DATABASE = "CREATE DATABASE IF NOT EXISTS `{db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
