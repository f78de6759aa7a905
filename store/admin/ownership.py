"""Which host holds which shard, as the hosts themselves say: live copies, tombstones, archives.

A shard is live on exactly one host, the one the live map names. When a
move switches a shard away, its old host keeps a *tombstone* in the shard's
database: views in place of the moved tables that refuse every read and
write, and a marker saying where the shard went, in which map version (see
`store.backends.mysql.admin`). The moved rows wait in the archive database
``moved_dbNNNNN`` until ``store move --cleanup``.

Admin commands that create or drop things in a shard database take the
shard's *admin lock* (`store.backends.Backend.admin_lock`) and look again
under it, so an init that raced with a move's switch finds the tombstone
instead of creating a table that stale writers could use.

Each backend reads its server's inventory (`Backend.inventory`) into the
types of `store.backends.inventory`, which this module still exports.
"""

from __future__ import annotations

from store.backends.inventory import ServerInventory, ShardCopy, shard_number

__all__ = ["SHARD_LOCK_TIMEOUT_S", "ServerInventory", "ShardCopy", "shard_number"]

#: How long an admin command waits for another one's admin lock on a shard.
SHARD_LOCK_TIMEOUT_S = 60
