"""Ordered relations: from/to lists kept in sequence order, with exact counts.

Layered one way, each module importing only those before it:

- `repository`: the SQL of one shard (`RelationRepository`), a pair's
  `Side`, `Plan`, `Page`;
- `writer`: the pair protocol that keeps a pair and its inverse agreeing
  (`PairWriter`);
- `listcache`: the relation lists in the list cache (`RelationListCache`);
  `rows`: one side of many pairs as multi-row statements per shard
  (`SideRows`, for `bulk`);
- `service`: validated, routed calls (`RelationService`), on the three above;
- `bulk` (`link_many`, `unlink_many`) and `reads` (many lists at once, and
  pages with their objects), on the service. `inputs` checks lists of IDs.
"""

from store.relations.listcache import MIN_FILL, fill_size
from store.relations.repository import Page, Plan, RelationRepository
from store.relations.service import REMOVE_CHUNK, RelationService

__all__ = ["MIN_FILL", "REMOVE_CHUNK", "Page", "Plan", "RelationRepository", "RelationService", "fill_size"]
