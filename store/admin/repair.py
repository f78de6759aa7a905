"""`store relations repair`: make inverse relations match their primary, and counts exact.

Link and unlink write both sides of an inverse pair by the protocol of
`store.relations.writer`; a crash between the two commits leaves one of two states,
and this job fixes both:

* a primary pair whose inverse is missing (a link stopped half way): the
  inverse is added with the primary's sequence;
* an inverse pair whose primary is missing (an unlink stopped half way): the
  inverse is removed.

It also recounts any list whose kept count differs from its rows. It scans
the tables stored on the shards it is given, in key order and in chunks, and
checks the other side with one query per chunk and shard. It can run while
the application writes: each fix takes the primary pair's lock, as link and
unlink do, and copies the primary row as it is at that moment.

`repair_unique` (unique keys' rows to match the live objects) is
`store.unique_repair`'s, so that an import can run it; it is exported here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from store.context import AdminContext, HasAdminContext
from store.exceptions import StoreError, UnknownRelationError
from store.specs import RelationSpec
from store.unique_repair import repair_unique

__all__ = ["RepairReport", "repair_relations", "repair_unique"]

CHUNK_ROWS = 1000
Row = tuple[int, int, int]  # from_id, to_id, sequence


@dataclass
class RepairReport:
    """What `repair_relations` found, and fixed unless ``dry_run``."""

    dry_run: bool
    rows_scanned: int = 0
    inverse_added: list[tuple[str, int, int]] = field(default_factory=list)
    inverse_removed: list[tuple[str, int, int]] = field(default_factory=list)
    counts_fixed: list[tuple[str, int, int, int]] = field(default_factory=list)
    #: (relation, from_id, to_id, why) of rows whose other end no map or type covers:
    #: reported, never changed, because no rule says what they should be.
    unroutable: list[tuple[str, int, int, str]] = field(default_factory=list)

    @property
    def changes(self) -> int:
        """How many fixes were found."""
        return len(self.inverse_added) + len(self.inverse_removed) + len(self.counts_fixed)


def repair_relations(
    store: HasAdminContext,
    relation: str | None = None,
    *,
    shards: Iterable[int] | None = None,
    dry_run: bool = False,
    on_shard: Callable[[int], None] | None = None,
) -> RepairReport:
    """Scan ``shards`` (default: all) and fix inverse pairs and counts of ``relation`` (default: all)."""
    ctx = store.admin_context()
    config = ctx.config
    if relation is not None and relation not in config.relations:
        known = ", ".join(config.relations) or "none"
        raise UnknownRelationError(f"unknown relation {relation!r}; the config defines: {known}")
    specs = _selected(config.relations, relation)
    wanted = sorted(set(range(config.shards) if shards is None else shards))
    report = RepairReport(dry_run=dry_run)
    repair = _Repair(ctx, report)
    for shard in wanted:
        for spec in specs:
            if spec.inverse is not None and spec.primary:
                repair.missing_inverses(shard, spec, config.relations[spec.inverse])
            elif spec.inverse is not None:
                repair.dangling_inverses(shard, spec, config.relations[spec.inverse])
        for spec in specs:  # after the pair fixes, which move counts too
            repair.counts(shard, spec)
        if on_shard is not None:
            on_shard(shard)
    return report


def _selected(relations: Mapping[str, RelationSpec], name: str | None) -> list[RelationSpec]:
    if name is None:
        return list(relations.values())
    spec: RelationSpec = relations[name]
    out = [spec]
    if spec.inverse is not None:
        out.append(relations[spec.inverse])
    return out


class _Repair:
    def __init__(self, ctx: AdminContext, report: RepairReport) -> None:
        self.store = ctx
        self.report = report
        self.repo = ctx.relation_repository
        self.service = ctx.relations
        self.router = ctx.router

    def _chunks(self, shard: int, spec: RelationSpec) -> Iterable[list[Row]]:
        h = self.store.engines.shard(shard, self.store.shard_map.master(shard))
        after: tuple[int, int] | None = None
        while True:
            rows = self.repo.scan(h, spec.name, after, CHUNK_ROWS)
            if not rows:
                return
            self.report.rows_scanned += len(rows)
            yield rows
            after = (rows[-1][0], rows[-1][1])

    def _by_other_shard(self, spec: RelationSpec, rows: list[Row]) -> dict[tuple[int, str], list[Row]]:
        groups: dict[tuple[int, str], list[Row]] = {}
        for row in rows:
            try:
                shard, _t, _l, host = self.router.route(row[1], spec.to_type)
            except StoreError as exc:
                self.report.unroutable.append((spec.name, row[0], row[1], str(exc)))
                continue
            groups.setdefault((shard, host), []).append(row)
        return groups

    def missing_inverses(self, shard: int, primary: RelationSpec, inverse: RelationSpec) -> None:
        for rows in self._chunks(shard, primary):
            for (other, host), group in self._by_other_shard(primary, rows).items():
                there = self.store.engines.shard(other, host)
                found = self.repo.present(there, inverse.name, [(t, f) for f, t, _s in group])
                for f, t, _seq in group:
                    if (t, f) in found:
                        continue
                    # The fix locks the primary pair and copies what it finds
                    # (unlinked meanwhile: nothing to restore).
                    if self.report.dry_run or self.service.sync(primary.name, f, t):
                        self.report.inverse_added.append((inverse.name, t, f))

    def dangling_inverses(self, shard: int, inverse: RelationSpec, primary: RelationSpec) -> None:
        for rows in self._chunks(shard, inverse):
            for (other, host), group in self._by_other_shard(inverse, rows).items():
                there = self.store.engines.shard(other, host)
                found = self.repo.present(there, primary.name, [(t, f) for f, t, _s in group])
                for f, t, _seq in group:
                    if (t, f) in found:
                        continue
                    # Linked meanwhile: the inverse is right, and sync leaves it.
                    if self.report.dry_run or self.service.sync(primary.name, t, f):
                        self.report.inverse_removed.append((inverse.name, f, t))

    def counts(self, shard: int, spec: RelationSpec) -> None:
        h = self.store.engines.shard(shard, self.store.shard_map.master(shard))
        for from_id, kept, actual in self.repo.count_mismatches(h, spec.name):
            if not self.report.dry_run:
                actual = self.repo.recount(h, spec.name, from_id)
                self.service.invalidate([(spec.name, from_id)])
            self.report.counts_fixed.append((spec.name, from_id, kept, actual))
