"""The pair protocol's old place: it is `store.relations.writer` (and `store.relations.repository`)."""

from store.relations.repository import ADD, MOVE, REMOVE, Guard, Seen, Side, make_guard, make_side
from store.relations.writer import Change, PairWriter, State

__all__ = [
    "ADD",
    "MOVE",
    "REMOVE",
    "Change",
    "Guard",
    "PairWriter",
    "Seen",
    "Side",
    "State",
    "make_guard",
    "make_side",
]
