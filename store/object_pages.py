"""Pages of a relation list with their objects, at their old place: they are `store.relations.reads`."""

from store.relations.reads import Loader, ObjectPages

__all__ = ["Loader", "ObjectPages"]
