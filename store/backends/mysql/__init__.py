"""MariaDB / MySQL: the dialect (`dialect`), opening a driver's connection (`driver`, with PyMySQL's
fast path in `pymysql_fast`), and the admin SQL of Instagram IDs, tombstones and dumps (`admin`).

Every name importable from ``store.backends.mysql`` before it was a package still is.
"""

from store.backends.mysql.admin import (
    STASH_SUFFIX,
    TOMBSTONE_ERRNO,
    dump_databases,
    id_trigger,
    leave_tombstones,
    load_dump,
    parse_tombstone,
    table_triggers,
    tombstone_statements,
)
from store.backends.mysql.dialect import ROW_PRIVILEGES as ROW_PRIVILEGES
from store.backends.mysql.dialect import MySQLBackend
from store.backends.mysql.driver import CONNECT_TIMEOUT_S, READ_TIMEOUT_S, mysql_connector, mysql_driver_error

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
