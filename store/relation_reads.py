"""Reads of many relation lists at once, at their old place: they are `store.relations.reads`."""

from store.relations.inputs import id_list, pair_list
from store.relations.reads import IN_CHUNK, MAX_PARAMS, RelationReads, check_to_ids

__all__ = ["IN_CHUNK", "MAX_PARAMS", "RelationReads", "check_to_ids", "id_list", "pair_list"]
