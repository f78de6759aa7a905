"""PostgreSQL admin SQL: the advisory lock keys admin commands and moves take, and the tombstone.

A moved shard's schema on its old host is a tombstone (`store.admin.move.postgres`
leaves it): every statement there raises `TOMBSTONE_SQLSTATE` naming the new host and
map version, which `parse_tombstone` reads back.
"""

from __future__ import annotations

import hashlib

from store.naming import Names, parse_tombstone

__all__ = ["PG_LOCK_BASE", "TOMBSTONE_SQLSTATE", "parse_tombstone"]

#: Advisory lock keys of next_id(): one per shard, in a range of their own.
PG_LOCK_BASE = 0x5707E1D0000
#: The SQLSTATE every statement on a moved shard's tombstone raises (`store.admin.move.postgres`).
TOMBSTONE_SQLSTATE = "ST001"


def _admin_key(shard: int, names: Names) -> int:
    """The session advisory lock key of shard ``shard``'s admin lock (`PostgresBackend.admin_lock`)."""
    digest = hashlib.blake2b(f"store-admin:{names.schema_name(shard)}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)
