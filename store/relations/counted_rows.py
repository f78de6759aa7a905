"""A batch's pairs as a few counted-rows statements (`Backend.counted_rows`: PostgreSQL).

One statement per shard and relation inserts (or deletes) every pair of a
side with its count (`Backend.counted_link_rows`, `counted_unlink_rows`: a
data-modifying CTE over arrays) and returns the pairs it wrote, so a side of
a batch is one statement where it would be two per pair. `CountedRows` makes
them (keeping each text once) and reads what they wrote; `BulkPairs` sends
them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from store.backends import Backend
from store.backends.statements import int_array
from store.engines import Cursor
from store.relations.repository import Side

__all__ = ["CountedRows", "Statements"]

#: The most statement texts a `CountedRows` keeps.
_ROW_TEXTS = 4096

#: Counted-rows statements of one side: (text, relation, parameters) each.
Statements = list[tuple[str, str, tuple[object, ...]]]


class CountedRows:
    """The counted-rows statements of a batch's sides, their texts made once per (backend, shard,
    relation, object table)."""

    def __init__(self) -> None:
        #: Texts by (backend, shard, relation, object table, key; the last two empty for unlinks).
        self._texts: dict[tuple[str, int, str, str, str], str] = {}
        #: Gated texts (`gated`) by the text they gate.
        self._gates: dict[str, str] = {}

    def links(self, items: Sequence[tuple[Side, int]]) -> Statements | None:
        """The statements that insert each of ``items`` (a side and its sequence, every side
        guarded) as a new pair with its count, one per shard and relation; None where the
        backend cannot, for one pair, or for a side with no guard."""
        sides = [side for side, _s in items]
        if not _counted(sides) or any(side.guard is None for side in sides):
            return None
        b = sides[0].h.backend
        parts: dict[tuple[int, str, str, str], list[int]] = {}
        for k, side in enumerate(sides):
            g = side.guard
            assert g is not None
            parts.setdefault((side.h.shard, side.relation, g.table, g.key), []).append(k)
        out: Statements = []
        for (shard, relation, table, key), ks in parts.items():
            text = self._text(
                (b.name, shard, relation, table, key),
                lambda: b.counted_link_rows(shard, relation, table, key),  # noqa: B023 - called now
            )
            mine = [sides[k] for k in ks]
            values = [g.value for side in mine if (g := side.guard) is not None]
            arrays = ([s.from_id for s in mine], [s.to_id for s in mine], [items[k][1] for k in ks], values)
            out.append((text, relation, (*map(int_array, arrays), relation)))
        return out

    def unlinks(self, sides: Sequence[Side]) -> Statements | None:
        """The statements that delete each of ``sides``' pairs with its count, one per shard and
        relation; None where the backend cannot, or for one pair."""
        if not _counted(sides):
            return None
        b = sides[0].h.backend
        parts: dict[tuple[int, str], list[Side]] = {}
        for side in sides:
            parts.setdefault((side.h.shard, side.relation), []).append(side)
        out: Statements = []
        for (shard, relation), mine in parts.items():
            text = self._text(
                (b.name, shard, relation, "", ""),
                lambda: b.counted_unlink_rows(shard, relation),  # noqa: B023 - called now
            )
            froms, tos = int_array([s.from_id for s in mine]), int_array([s.to_id for s in mine])
            out.append((text, relation, (froms, tos, relation)))
        return out

    def gated(self, backend: Backend, statements: Statements) -> Statements:
        """``statements`` (of ``backend``), each with a gate that ends the request unless it wrote
        every pair it was given (`Backend.gate_rows`)."""
        out: Statements = []
        for text, relation, params in statements:
            gated = self._gates.get(text)
            if gated is None:
                if len(self._gates) >= _ROW_TEXTS:
                    self._gates.clear()  # (a bound on what is kept, as for the texts)
                gated = self._gates[text] = backend.gate_rows(text)
            out.append((gated, relation, params))
        return out

    def run(self, cur: Cursor, statements: Statements, sides: Sequence[Side]) -> list[bool]:
        """Send ``statements`` in one request; whether each of ``sides`` was written (every
        statement returns the (from_id, to_id) of the pairs it wrote)."""
        answers = cur.batch_rows([(text, params) for text, _r, params in statements])
        done = {
            (relation, int(f), int(t))
            for (_text, relation, _p), (_n, rows) in zip(statements, answers, strict=True)
            for f, t in rows
        }
        return [(s.relation, s.from_id, s.to_id) in done for s in sides]

    def _text(self, key: tuple[str, int, str, str, str], make: Callable[[], str]) -> str:
        text = self._texts.get(key)
        if text is None:
            if len(self._texts) >= _ROW_TEXTS:
                self._texts.clear()  # (a bound on what is kept: shards vary)
            text = self._texts[key] = make()
        return text


def _counted(sides: Sequence[Side]) -> bool:
    """Whether ``sides`` (two or more, one backend) are written as rows (`Backend.counted_rows`)."""
    return len(sides) > 1 and bool(sides[0].h.backend.counted_rows)
