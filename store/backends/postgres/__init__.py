"""PostgreSQL: the dialect (`dialect`), psycopg's connection and its ``$n`` cursor (`driver`), and the
advisory lock keys and tombstone that admin commands and moves share with the dialect (`admin`).

Every name importable from ``store.backends.postgres`` before it was a package still is.
"""

from store.backends.postgres.admin import PG_LOCK_BASE, TOMBSTONE_SQLSTATE, parse_tombstone
from store.backends.postgres.dialect import ROW_PRIVILEGES as ROW_PRIVILEGES
from store.backends.postgres.dialect import PostgresBackend
from store.backends.postgres.driver import DOLLAR_CACHE_SIZE as DOLLAR_CACHE_SIZE
from store.backends.postgres.driver import dollar_params, postgres_connector

__all__ = [
    "PG_LOCK_BASE",
    "TOMBSTONE_SQLSTATE",
    "PostgresBackend",
    "dollar_params",
    "parse_tombstone",
    "postgres_connector",
]
