"""What a server holds, shard by shard, as its backend reads it: live copies, tombstones, archives.

Each backend reads its server's inventory (`store.backends.Backend.inventory`)
into a `ServerInventory`: per shard a `ShardCopy` (live, tombstone or empty)
and the move archives waiting for cleanup. What the admin commands make of
it (which host owns which shard) is `store.admin.ownership`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ServerInventory", "ShardCopy", "shard_number"]


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
