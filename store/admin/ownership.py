"""Which host holds which shard, as the hosts themselves say: live copies, tombstones, archives.

A shard is live on exactly one host, the one the live map names. When a
move switches a shard away, its old host keeps a *tombstone* in the shard's
database: views in place of the moved tables that refuse every read and
write, and a marker saying where the shard went, in which map version (see
`store.backends.mysql`). The moved rows wait in the archive database
``moved_dbNNNNN`` until ``store move --cleanup``.

Admin commands that create or drop things in a shard database take the
shard's *admin lock* (`store.backends.Backend.admin_lock`) and look again
under it, so an init that raced with a move's switch finds the tombstone
instead of creating a table that stale writers could use.

Each backend reads its server's inventory (`Backend.inventory`); this
module holds what they report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SHARD_LOCK_TIMEOUT_S", "ServerInventory", "ShardCopy", "shard_number"]

#: How long an admin command waits for another one's admin lock on a shard.
SHARD_LOCK_TIMEOUT_S = 60


@dataclass(frozen=True, slots=True)
class ShardCopy:
    """One shard database (schema, file) found on one server.

    ``state`` is ``live`` (it holds tables), ``tombstone`` (it moved away:
    ``moved_to`` and ``map_version`` say where and when) or ``empty``.
    """

    shard: int
    state: str
    tables: tuple[str, ...] = ()
    moved_to: str | None = None
    map_version: int | None = None


@dataclass
class ServerInventory:
    """Everything shard-shaped on one server: shard copies and move archives."""

    copies: dict[int, ShardCopy] = field(default_factory=dict)
    archives: dict[int, tuple[str, ...]] = field(default_factory=dict)


def shard_number(name: str, prefix: str, digits: int) -> int | None:
    """The shard a database or schema name stands for (``db00042`` -> 42), or None."""
    rest = name[len(prefix) :]
    if name.startswith(prefix) and len(rest) == digits and rest.isdigit():
        return int(rest)
    return None
