"""SQLite: a "host" is a folder, every shard a file in it (``db00042.sqlite3``) with a pool of its own.

The embedded default: no server to run. A shard's file and tables are made
on first use. WAL lets readers run beside the one writer; synchronous stays
FULL, so a commit that returned survives a power loss. A write transaction
locks the whole file (BEGIN IMMEDIATE).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from sqlalchemy import literal_column
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.sqlite import pysqlite
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.sql.elements import ClauseElement

from store.backends import Backend, ErrorKind
from store.backends.inventory import ServerInventory, ShardCopy
from store.backends.tables import VERSION_COLUMN, ColumnTypes
from store.exceptions import ConfigError
from store.naming import ADDED_VERSION

__all__ = ["BUSY_TIMEOUT_S", "SQLiteBackend", "sqlite_connector"]

#: How long a writer waits for another's lock on a shard file before it fails.
BUSY_TIMEOUT_S = 30.0
_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"


class SQLiteBackend(Backend):
    """SQLite files, one per shard."""

    name = "sqlite"
    url_backends = frozenset({"sqlite"})
    param = "?"
    begin = "BEGIN IMMEDIATE"  # take the write lock up front: SQLite has no FOR UPDATE
    locks_whole_shard = True
    pool_per_shard = True
    made_on_first_use = True
    has_accounts = False  # files: whoever may open them may do anything

    def _sa_dialect(self) -> Dialect:
        return pysqlite.dialect()

    def column_types(self) -> ColumnTypes:
        """INTEGER keys; AUTOINCREMENT, so a local id is never handed out twice, even after the
        highest row is removed; relation tables WITHOUT ROWID."""
        integer = sqlite.INTEGER()
        return ColumnTypes(
            local_id=integer,
            instagram_id=integer,
            data=sqlite.TEXT(),
            flag=integer,
            timestamp=sqlite.TEXT(),
            timestamp_default=f"({_NOW})",
            pair_id=integer,
            sequence=integer,
            relation_name=sqlite.TEXT(),
            count=integer,
            object_options={"sqlite_autoincrement": True},
            relation_options={"sqlite_with_rowid": False},
        )

    def namespace(self, shard: int) -> str:
        """The file's stem, ``db00042`` (``NAME_db00042`` in a namespace)."""
        return self.names.database_name(shard)

    def statement_schema(self, shard: int) -> str | None:
        """None: a statement runs on the shard's own file."""
        return None

    def describe(self, shard: int) -> str:
        """``file db00042.sqlite3``."""
        return f"file {self.names.database_name(shard)}.sqlite3"

    def check_url(self, host: str, url: URL, base: Path) -> URL:
        """A SQLite host names a folder for its shard files; a relative one is taken from ``base``."""
        if not url.database or url.database == ":memory:":
            raise ConfigError(
                f"hosts.{host}: a SQLite host names a folder for its shard files, e.g. sqlite:///data"
            )
        folder = Path(url.database)
        return url.set(database=str(folder if folder.is_absolute() else base / folder))

    def server_identity(self, url: URL) -> str:
        """The folder."""
        return f"sqlite:{url.database}"

    def connector(
        self, url: URL, *, shard: int, connect_timeout_s: float, query_timeout_s: float
    ) -> Callable[[], Any]:
        """The shard's file (its folder made if missing), WAL, synchronous FULL."""
        folder = Path(str(url.database))
        folder.mkdir(parents=True, exist_ok=True)
        return sqlite_connector(folder / f"{self.names.database_name(shard)}.sqlite3")

    def classify(self, exc: BaseException) -> ErrorKind | None:
        """SQLite says what is missing only in words."""
        if isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc):
            return ErrorKind.DUPLICATE
        if isinstance(exc, sqlite3.OperationalError) and "no such table" in str(exc):
            return ErrorKind.MISSING
        return None

    def is_driver_error(self, exc: BaseException) -> bool:
        """sqlite3's errors."""
        return isinstance(exc, sqlite3.Error)

    add_column_if_not_exists = False

    def existing(self, cur: Any) -> set[tuple[str, str]]:
        """The tables (and added version columns) of the shard file ``cur`` is on, as ``("", name)``.

        A shard's file and tables are made on first use; this lets that use
        skip what exists, as `store init` does on a server.
        """
        cur.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        tables = [str(row[0]) for row in cur.fetchall()]
        out = {("", name) for name in tables}
        for name in tables:
            cur.execute("SELECT 1 FROM pragma_table_info(?) WHERE name = ?", (name, VERSION_COLUMN))
            if cur.fetchone() is not None:
                out.add(("", name + ADDED_VERSION))
        return out

    def inventory(self, url: URL, open_cursor: Callable[[], Any]) -> Any:
        """The shard files in the host's folder, opened read-only (a look never creates a shard)."""
        inv = ServerInventory()
        for path in sorted(Path(str(url.database)).glob(self.names.sqlite_glob)):
            shard = self.names.database_shard(path.name.removesuffix(".sqlite3"))
            assert shard is not None
            with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
                names = [
                    str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                ]
            tables = tuple(sorted(n for n in names if not n.startswith("sqlite_")))
            inv.copies[shard] = ShardCopy(shard, "live" if tables else "empty", tables)
        return inv

    def upsert_skip(self, table: Any) -> Any:
        """``ON CONFLICT DO NOTHING``."""
        return sqlite.insert(table).on_conflict_do_nothing()

    def upsert_add(self, table: Any, key: Sequence[str], column: str, *, also: Mapping[str, Any]) -> Any:
        """``ON CONFLICT (key) DO UPDATE SET n = n + excluded.n``."""
        ins = sqlite.insert(table)
        return ins.on_conflict_do_update(
            index_elements=list(key), set_={column: table.c[column] + ins.excluded[column], **also}
        )

    def upsert_set(self, table: Any, key: Sequence[str], column: str, *, also: Mapping[str, Any]) -> Any:
        """``ON CONFLICT (key) DO UPDATE SET n = excluded.n``."""
        ins = sqlite.insert(table)
        return ins.on_conflict_do_update(
            index_elements=list(key), set_={column: ins.excluded[column], **also}
        )

    def ts_now(self) -> ClauseElement | None:
        """The time in the column's text form: SQLite has no ON UPDATE."""
        return literal_column(_NOW)


def sqlite_connector(path: Path) -> Callable[[], sqlite3.Connection]:
    """A function that opens one shard file in autocommit mode with WAL."""

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(
            str(path), isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_S
        )
        # WAL lets readers run beside the one writer; synchronous stays FULL so
        # a commit that returned survives power loss.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn

    return connect
