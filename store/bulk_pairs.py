"""`link_many` and `unlink_many` at their old place: they are `store.relations.bulk`."""

from store.relations.bulk import CHUNK, BulkPairs

__all__ = ["CHUNK", "BulkPairs"]
