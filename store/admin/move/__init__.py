"""`store move`: one workflow (`Mover`) over an engine per kind of server.

engine.py          the steps an engine implements (`MoveEngine`), what it may ask of the move
workflow.py        `Mover`: phases, journal, map write, resume, abort, cleanup
journal.py         `Journal` (the file a move keeps) and `MovePlan`
progress.py        the progress file, its bars and its metrics
mariadb.py         MariaDB shard databases: dump, GTID replication, table locks, renames
mariadb_verify.py  how a MariaDB move compares the two sides
postgres.py        PostgreSQL schema shards: logical replication, a lock, tombstone views
postgres_checks.py what a PostgreSQL move refuses when planned, and how it hashes every row
postgres_verify.py how a PostgreSQL move compares the two sides on snapshots before its fence
"""

from store.admin.move.engine import MoveContext, MoveEngine
from store.admin.move.journal import Journal, MovePlan
from store.admin.move.mariadb import (
    CATCH_UP_TIMEOUT_S,
    FENCE_SESSIONS,
    LEVEL_BEFORE_FENCE_S,
    LEVEL_ROUNDS,
    LOCK_TOGETHER_S,
    LOCK_WAIT_TIMEOUT_S,
    REPLICATION_NAME,
    MariaDBEngine,
)
from store.admin.move.mariadb_verify import FENCE_WAIT_TIMEOUT_S
from store.admin.move.postgres import PostgresEngine
from store.admin.move.progress import (
    FENCE_BAR_S,
    PROGRESS_EVERY_S,
    MoveProgress,
    TerminalProgress,
    progress_line,
)
from store.admin.move.workflow import Mover
from store.exceptions import MoveError

__all__ = [
    "CATCH_UP_TIMEOUT_S",
    "FENCE_BAR_S",
    "FENCE_SESSIONS",
    "FENCE_WAIT_TIMEOUT_S",
    "LEVEL_BEFORE_FENCE_S",
    "LEVEL_ROUNDS",
    "LOCK_TOGETHER_S",
    "LOCK_WAIT_TIMEOUT_S",
    "PROGRESS_EVERY_S",
    "REPLICATION_NAME",
    "Journal",
    "MariaDBEngine",
    "MoveContext",
    "MoveEngine",
    "MoveError",
    "MovePlan",
    "MoveProgress",
    "Mover",
    "PostgresEngine",
    "TerminalProgress",
    "progress_line",
]
