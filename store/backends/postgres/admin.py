"""PostgreSQL admin SQL: the advisory lock keys admin commands and moves take, the tombstone, and what
`store promote` asks of a streaming standby and of a dead primary's connect error.

A moved shard's schema on its old host is a tombstone (`store.admin.move.postgres`
leaves it): every statement there raises `TOMBSTONE_SQLSTATE` naming the new host and
map version, which `parse_tombstone` reads back.

A slave is a streaming (physical) hot standby of its master: `standby_state` reads
whether it is in recovery and whether it has replayed all the WAL it received;
`promote_standby` ends its recovery (``pg_promote``).
"""

from __future__ import annotations

import hashlib
import socket
from typing import Any

from store.backends import ReplicaState
from store.exceptions import PromoteError
from store.naming import Names, parse_tombstone

__all__ = [
    "PG_LOCK_BASE",
    "PROMOTE_WAIT_S",
    "TOMBSTONE_SQLSTATE",
    "parse_tombstone",
    "promote_standby",
    "standby_state",
    "unreachable",
]

#: Advisory lock keys of next_id(): one per shard, in a range of their own.
PG_LOCK_BASE = 0x5707E1D0000
#: The SQLSTATE every statement on a moved shard's tombstone raises (`store.admin.move.postgres`).
TOMBSTONE_SQLSTATE = "ST001"
#: How long ``pg_promote`` waits for a standby to end its recovery (`promote_standby`).
PROMOTE_WAIT_S = 60


def _admin_key(shard: int, names: Names) -> int:
    """The session advisory lock key of shard ``shard``'s admin lock (`PostgresBackend.admin_lock`)."""
    digest = hashlib.blake2b(f"store-admin:{names.schema_name(shard)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


# -- promoting a standby (`store promote`) -----------------------------------------------------

#: What libpq (and the store's connection, `store.backends.postgres.driver`) says of a connect that
#: no server answered: refused, timed out, no route. A server's own refusal carries ``FATAL:``
#: (or a SQLSTATE), a name that does not resolve says so: neither is a dead server. These are
#: libpq's English texts; one that speaks another language makes every failure read as a server
#: that may be up, the safe side.
_UNREACHABLE_TEXTS = (
    "Connection refused",
    "timeout expired",
    "Connection timed out",
    "No route to host",
    "Network is unreachable",
    "did not answer within",
)


def unreachable(exc: BaseException) -> bool:
    """True if ``exc`` (psycopg's error opening a connection) says no server answered there."""
    if isinstance(exc, socket.gaierror):
        return False
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    if not type(exc).__module__.startswith("psycopg") or getattr(exc, "sqlstate", None) is not None:
        return False
    text = str(exc)
    return "FATAL:" not in text and any(words in text for words in _UNREACHABLE_TEXTS)


def standby_state(cur: Any) -> ReplicaState:
    """The standby on ``cur``: in recovery (``pg_is_in_recovery()``), and the WAL it received by
    streaming (``pg_last_wal_receive_lsn()``) against what it replayed (``pg_last_wal_replay_lsn()``).

    A standby that has streamed nothing since it started (the receive position is NULL) cannot
    say what it received: that counts as not caught up.
    """
    cur.execute(
        "SELECT pg_is_in_recovery(), pg_last_wal_receive_lsn()::text, pg_last_wal_replay_lsn()::text, "
        "pg_wal_lsn_diff(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())"
    )
    recovering, received, replayed, behind = cur.fetchone()
    if not recovering:
        return ReplicaState(not_replicating="not in recovery (pg_is_in_recovery() is false)")
    if received is None:
        return ReplicaState(
            unapplied=(
                f"WAL received unknown (nothing streamed since it started: pg_last_wal_receive_lsn() "
                f"is NULL) replayed {replayed}",
            )
        )
    if behind is not None and behind > 0:
        return ReplicaState(unapplied=(f"WAL received {received} replayed {replayed} ({int(behind)} bytes)",))
    return ReplicaState()


def promote_standby(cur: Any) -> None:
    """End the recovery of the standby on ``cur`` (``pg_promote``, waiting `PROMOTE_WAIT_S`): it
    replays the WAL it received, then takes writes. A server out of recovery is left as it is
    (promoted already). `PromoteError` if it did not finish in time."""
    cur.execute("SELECT pg_is_in_recovery()")
    if not cur.fetchone()[0]:
        return
    cur.execute(f"SELECT pg_promote(true, {PROMOTE_WAIT_S})")
    if not cur.fetchone()[0]:
        raise PromoteError(
            f"the standby did not end its recovery within {PROMOTE_WAIT_S} s (pg_promote returned false); "
            "the map is unchanged: once pg_is_in_recovery() is false there, run store promote --force"
        )
