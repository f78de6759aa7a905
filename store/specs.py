"""What the config declares about types and relations, as plain frozen values (pure: no I/O).

Kept apart from `store.config` (which parses YAML and URLs) so that routing,
which needs them, imports nothing but pure modules.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RelationSpec", "TypeSpec", "UniqueSpec"]


@dataclass(frozen=True, slots=True)
class TypeSpec:
    """An object type: its name, the type id in its IDs, and its table in each shard."""

    name: str
    id: int
    table: str


@dataclass(frozen=True, slots=True)
class RelationSpec:
    """A one-directional relation table stored on the shard of ``from_type`` objects.

    Of an inverse pair, the relation declared with ``inverse:`` is the
    primary: it is written first and is the truth that ``store relations
    repair`` restores the other side from.
    """

    name: str
    from_type: str
    to_type: str
    inverse: str | None = None
    primary: bool = True


@dataclass(frozen=True, slots=True)
class UniqueSpec:
    """A unique key (config ``unique:``): no two live objects of ``type`` share a value of ``field``.

    Its rows live in every shard's ``unique_keys`` table, each on the shard
    a hash of the value picks (not the object's shard).
    """

    name: str
    type: str
    field: str
