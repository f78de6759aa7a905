"""What admin jobs and tools reach inside a store: `AdminContext`, and what hands one out.

Admin modules (check, repair, export and import) take anything with an
``admin_context()`` (`HasAdminContext`, which `store.Store` is), so they
import this module, not the store's facade.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from store.cache import Caches
from store.config import StoreConfig
from store.engines import Engines
from store.livemap import LiveMap
from store.mapsource import MapSource
from store.objects import ObjectService
from store.relations.repository import RelationRepository
from store.relations.service import RelationService
from store.routing import Router
from store.shardmap import ShardMap
from store.steps import Steps
from store.unique import UniqueKeys

__all__ = ["AdminContext", "HasAdminContext"]


@dataclass(frozen=True)
class AdminContext:
    """What admin jobs (init, check, repair, move, promote) and tools reach inside a store.

    The request path never needs it; `Store.admin_context` hands it out.
    """

    config: StoreConfig
    engines: Engines
    router: Router
    live: LiveMap
    objects: ObjectService
    relations: RelationService
    caches: Caches
    #: The unique keys (None when the config has no ``unique:``).
    unique: UniqueKeys | None = None
    #: What runs the steps of writes' plans (its ``hook`` hears each step's name).
    steps: Steps | None = None

    @property
    def relation_repository(self) -> RelationRepository:
        """The relation SQL, per shard."""
        return self.relations.repo

    @property
    def shard_map(self) -> ShardMap:
        """The map the store routes by now."""
        return self.live.current

    @property
    def map_source(self) -> MapSource:
        """Where the store reads its live map."""
        return self.live.source

    def refresh_map(self, *, force: bool = False) -> bool:
        """Reload the map if the source has a newer one; True if it changed."""
        return self.live.refresh(force=force)


class HasAdminContext(Protocol):
    """Anything that hands out an `AdminContext` (a `store.Store`)."""

    def admin_context(self) -> AdminContext:
        """The store's insides, for admin jobs and tools."""
        ...
