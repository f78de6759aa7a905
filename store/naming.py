"""The names of the store's databases, schemas and reserved tables (pure).

Shard N is the database ``db`` + N as five digits on MariaDB and SQLite
(``db00042``; a file ``db00042.sqlite3``), and the schema ``shard`` + N as
four digits on PostgreSQL (``shard0042``, Instagram's naming).
"""

from __future__ import annotations

__all__ = [
    "ARCHIVE_PREFIX",
    "COUNTS_TABLE",
    "DATABASE_PREFIX",
    "NEXT_ID",
    "ADDED_VERSION",
    "SCHEMA_PREFIX",
    "TOMBSTONE_TABLE",
    "database_name",
    "schema_name",
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
#: The suffix of what `store init` calls the ID machinery of Instagram IDs (a trigger, next_id()).
NEXT_ID = "#next_id"
#: What `store init` names the version column it adds to an object table made before versions.
ADDED_VERSION = "#version"


def database_name(shard: int) -> str:
    """The database (MariaDB) or file stem (SQLite) of shard ``shard``: ``db00042``."""
    return f"{DATABASE_PREFIX}{shard:05d}"


def schema_name(shard: int) -> str:
    """The PostgreSQL schema of logical shard ``shard``: ``shard0042`` (Instagram's naming)."""
    return f"{SCHEMA_PREFIX}{shard:04d}"
