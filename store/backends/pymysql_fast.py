"""The first place of `store.backends.mysql.pymysql_fast` (the store's shortcuts through PyMySQL's
internals): its names, still importable from here.

The module's state (the classes made, the decisions taken) and the functions the driver calls
are that module's: patch them there, not here.
"""

from store.backends.mysql.pymysql_fast import (
    CONNECTION_INTERNALS,
    TESTED_PYMYSQL,
    TLS_INTERNALS,
    WRITE_INTERNALS,
    Internal,
    adopt,
    connection_class,
    cursor_class,
    escape_text,
    fast_writes,
    missing_internals,
    pymysql_version,
)

__all__ = [
    "CONNECTION_INTERNALS",
    "TESTED_PYMYSQL",
    "TLS_INTERNALS",
    "WRITE_INTERNALS",
    "Internal",
    "adopt",
    "connection_class",
    "cursor_class",
    "escape_text",
    "fast_writes",
    "missing_internals",
    "pymysql_version",
]
