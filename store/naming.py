"""The names of the store's databases, schemas and reserved tables (pure).

Shard N is the database ``db`` + N as five digits on MariaDB and SQLite
(``db00042``; a file ``db00042.sqlite3``), and the schema ``shard`` + N as
four digits on PostgreSQL (``shard0042``, Instagram's naming).

A config's ``namespace: NAME`` puts ``NAME_`` in front of every name the
store makes on a server (``NAME_db00042``, ``NAME_shard0042``,
``NAME_store_meta``, ``NAME_store_log``, ``NAME_tickets``, the archive
``NAME_moved_db00042``) and ``NAME:`` in front of its cache keys, so that
two stores (staging and production, two apps, a developer's and the tests')
can share one MariaDB, PostgreSQL, memcached and Redis. `Names` holds them
all; ``Names()`` (no namespace) gives the names above, unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from store.exceptions import ConfigError

__all__ = [
    "ARCHIVE_PREFIX",
    "COUNTS_TABLE",
    "DATABASE_PREFIX",
    "DEFAULT_NAMES",
    "NAMESPACE_PATTERN",
    "NEXT_ID",
    "ADDED_VERSION",
    "SCHEMA_PREFIX",
    "TOMBSTONE_TABLE",
    "Names",
    "database_name",
    "like_escape",
    "parse_tombstone",
    "schema_name",
    "tombstone_message",
]

DATABASE_PREFIX = "db"
SCHEMA_PREFIX = "shard"
#: A moved shard's tables are renamed into this database on the old host (``moved_db00042``).
ARCHIVE_PREFIX = "moved_"
#: One row per (relation, from_id) with the number of pairs, kept in the same
#: transaction as every link and unlink so that it is always exact.
COUNTS_TABLE = "relation_counts"
#: The marker table of a tombstone: one row saying where the shard went, in which map version.
TOMBSTONE_TABLE = "store_tombstone"
_TOMBSTONE_PARSE = re.compile(r"store-tombstone shard=\d+ moved_to=(.*) map_version=(\d+)")


def tombstone_message(shard: int, moved_to: str, map_version: int) -> str:
    """The error text a statement on a moved shard's tombstone raises, on every backend."""
    return f"store-tombstone shard={shard} moved_to={moved_to} map_version={map_version}"


def parse_tombstone(message: str) -> tuple[str, int] | None:
    """(moved_to, map_version) from the error a tombstone raises (`tombstone_message`), or None if
    it is not one."""
    found = _TOMBSTONE_PARSE.search(message)
    return None if found is None else (found.group(1), int(found.group(2)))


#: The suffix of what `store init` calls the ID machinery of Instagram IDs (a trigger, next_id()).
NEXT_ID = "#next_id"
#: What `store init` names the version column it adds to an object table made before versions.
ADDED_VERSION = "#version"

#: A namespace: a lower-case letter, then up to 15 lower-case letters or digits. No ``_``, so
#: ``NAME_`` always ends where the namespace does, and the longest name it makes
#: (``NAME_moved_shard0042``, 32 characters) stays far below MariaDB's and PostgreSQL's 63-64.
NAMESPACE_PATTERN = re.compile(r"^[a-z][a-z0-9]{0,15}$")
#: Namespaces whose names would be another store's: ``moved_db00042`` is the archive of the
#: store without a namespace, and PostgreSQL keeps schemas beginning ``pg_`` for itself.
_RESERVED = {
    "moved": "moved_db00042 is the archive of a moved shard of the store without a namespace",
    "pg": "PostgreSQL refuses schema names beginning pg_",
}


def like_escape(text: str) -> str:
    """``text`` as a LIKE pattern that matches it literally (``_``, ``%`` and ``\\`` escaped)."""
    return text.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%")


@dataclass(frozen=True, slots=True)
class Names:
    """Every name a store makes on its servers and caches, for one namespace (None: none)."""

    namespace: str | None = None

    def __post_init__(self) -> None:
        ns = self.namespace
        if ns is None:
            return
        if not isinstance(ns, str) or not NAMESPACE_PATTERN.fullmatch(ns):
            shown = repr(ns) if isinstance(ns, str) and len(ns) <= 40 else type(ns).__name__
            raise ConfigError(
                f"namespace must be a lower-case letter followed by up to 15 lower-case letters or "
                f"digits (no '_' or '-'), e.g. namespace: staging; got {shown}"
            )
        if ns in _RESERVED:
            raise ConfigError(f"namespace {ns!r} is reserved ({_RESERVED[ns]}): pick another")

    @property
    def prefix(self) -> str:
        """What every database and schema name starts with: ``NAME_``, or nothing."""
        return "" if self.namespace is None else self.namespace + "_"

    # -- shards ----------------------------------------------------------------------

    @property
    def database_prefix(self) -> str:
        """``db`` or ``NAME_db``: a shard database's name before its five digits."""
        return self.prefix + DATABASE_PREFIX

    @property
    def schema_prefix(self) -> str:
        """``shard`` or ``NAME_shard``: a shard schema's name before its four digits."""
        return self.prefix + SCHEMA_PREFIX

    def database_name(self, shard: int) -> str:
        """The database (MariaDB) or file stem (SQLite) of shard ``shard``: ``db00042``, ``NAME_db00042``."""
        return f"{self.database_prefix}{shard:05d}"

    def schema_name(self, shard: int) -> str:
        """The PostgreSQL schema of logical shard ``shard``: ``shard0042``, ``NAME_shard0042``."""
        return f"{self.schema_prefix}{shard:04d}"

    def archive(self, name: str) -> str:
        """The archive of shard database or schema ``name`` after a move: ``moved_db00042``,
        ``NAME_moved_db00042`` (the namespace first, so ``NAME_%`` covers it too)."""
        p = self.prefix
        if not name.startswith(p):
            raise ValueError(f"{name!r} is not a name of namespace {self.namespace!r}")
        return p + ARCHIVE_PREFIX + name[len(p) :]

    def unarchive(self, archive: str) -> str:
        """The shard database or schema whose archive is ``archive`` (the inverse of `archive`)."""
        head = self.prefix + ARCHIVE_PREFIX
        if not archive.startswith(head):
            raise ValueError(f"{archive!r} is not an archive of namespace {self.namespace!r}")
        return self.prefix + archive[len(head) :]

    @property
    def archive_database_prefix(self) -> str:
        """``moved_db`` or ``NAME_moved_db``."""
        return self.archive(self.database_prefix)

    @property
    def archive_schema_prefix(self) -> str:
        """``moved_shard`` or ``NAME_moved_shard``."""
        return self.archive(self.schema_prefix)

    def database_shard(self, name: str) -> int | None:
        """The shard whose database is ``name`` in this namespace, or None."""
        return _number(name, self.database_prefix, 5)

    def schema_shard(self, name: str) -> int | None:
        """The shard whose schema is ``name`` in this namespace, or None."""
        return _number(name, self.schema_prefix, 4)

    # -- LIKE patterns that find this namespace's names and no other's --------------------

    @property
    def databases_like(self) -> str:
        """Shard databases: ``db_____`` or ``NAME\\_db_____`` (five one-character wildcards)."""
        return like_escape(self.database_prefix) + "_" * 5

    @property
    def archive_databases_like(self) -> str:
        """Archived shard databases: ``moved\\_db_____``, ``NAME\\_moved\\_db_____``."""
        return like_escape(self.archive_database_prefix) + "_" * 5

    @property
    def schemas_like(self) -> str:
        """Shard schemas: ``shard____`` or ``NAME\\_shard____``."""
        return like_escape(self.schema_prefix) + "_" * 4

    @property
    def archive_schemas_like(self) -> str:
        """Archived shard schemas: ``moved\\_shard____``, ``NAME\\_moved\\_shard____``."""
        return like_escape(self.archive_schema_prefix) + "_" * 4

    @property
    def sqlite_glob(self) -> str:
        """The shard files of a SQLite host's folder: ``db[0-9]...[0-9].sqlite3``."""
        return self.database_prefix + "[0-9]" * 5 + ".sqlite3"

    # -- the server-wide databases ----------------------------------------------------

    @property
    def meta_database(self) -> str:
        """The shard map table's database (``map_source: {table: ...}``): ``store_meta``."""
        return self.prefix + "store_meta"

    @property
    def log_database(self) -> str:
        """The invalidation log's database on each MariaDB server: ``store_log``."""
        return self.prefix + "store_log"

    @property
    def tickets_database(self) -> str:
        """The ticket servers' database: ``tickets``."""
        return self.prefix + "tickets"

    @property
    def replication_name(self) -> str:
        """The replication connection (MariaDB) or publication, subscription and slot stem
        (PostgreSQL) of a move: ``store_move``."""
        return self.prefix + "store_move"

    @property
    def zookeeper_path(self) -> str:
        """The znode of the shard map in ZooKeeper: ``/store/shardmap``, ``/store/NAME/shardmap``."""
        return "/store/shardmap" if self.namespace is None else f"/store/{self.namespace}/shardmap"

    # -- caches ---------------------------------------------------------------------------

    def cache_prefix(self, prefix: str) -> str:
        """Cache keys' prefix for the config's ``cache.prefix``: as it is, or ``NAME:`` before it."""
        return prefix if self.namespace is None else f"{self.namespace}:{prefix}"


#: The names of a store without a namespace.
DEFAULT_NAMES = Names()


def _number(name: str, prefix: str, digits: int) -> int | None:
    rest = name[len(prefix) :]
    if name.startswith(prefix) and len(rest) == digits and rest.isdigit():
        return int(rest)
    return None


def database_name(shard: int) -> str:
    """The database (MariaDB) or file stem (SQLite) of shard ``shard``: ``db00042``."""
    return DEFAULT_NAMES.database_name(shard)


def schema_name(shard: int) -> str:
    """The PostgreSQL schema of logical shard ``shard``: ``shard0042`` (Instagram's naming)."""
    return DEFAULT_NAMES.schema_name(shard)
