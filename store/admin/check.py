"""`store check`: is every shard live exactly once, where the live map says, whole and consistent?

For every physical server of the config (host names that share a server
are one server), it reads what the server holds (`read_inventory`) and
compares with the live map:

* every shard is live on the server of its master, and on no other server
  (a live copy elsewhere is a *stray copy*: a process with an old map, or a
  tool, could write to it);
* a tombstone on the server the live map names means the map source is
  behind the hosts; tombstones elsewhere, and archives waiting for
  ``store move --cleanup``, are listed, not faults;
* every table of the config exists in every live shard;
* relation counts agree with the rows, and inverse rows with primary rows,
  on a sample of each relation on each shard (``full=True``: all of them);
* where a `store invalidate` daemon catches lost invalidations
  (``cache.invalidation`` log, binlog or wal), every such host has a heartbeat
  in memcached newer than ``max_stale_s``: without one, cache entries are
  trusted for the window only and lost deletes are caught by no one;
* with unique keys (config ``unique:``), every key row names a live object
  that holds its value, and every value a live object holds has its row
  (a writer killed between its steps leaves either; repair fixes both).

Read-only: it changes nothing. The report lists problems (each with what
to run) and notes; `CheckReport.ok` is False when any problem was found.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from store.admin.ownership import ServerInventory, ShardCopy
from store.backends import backend_for
from store.context import AdminContext, HasAdminContext
from store.exceptions import StoreError
from store.naming import COUNTS_TABLE, TOMBSTONE_TABLE
from store.specs import RelationSpec

__all__ = ["CheckReport", "Finding", "check_store", "load_report", "save_report"]

log = logging.getLogger("store.admin.check")

#: Lists (per relation and shard) whose count is compared with the rows, and pairs checked on the other side.
SAMPLE = 200


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing `store check` found: what, where, and what to run about it."""

    kind: str
    shard: int | None
    server: str
    detail: str
    fix: str = ""

    def line(self) -> str:
        """The finding as one line."""
        where = f"shard {self.shard} " if self.shard is not None else ""
        fix = f" ({self.fix})" if self.fix else ""
        return f"{self.kind}: {where}on {self.server}: {self.detail}{fix}"


@dataclass
class CheckReport:
    """What `check_store` found. ``ok`` is False if anything is wrong."""

    map_version: int
    shards: int
    live: dict[int, list[str]] = field(default_factory=dict)  # shard -> servers holding it live
    problems: list[Finding] = field(default_factory=list)
    notes: list[Finding] = field(default_factory=list)
    lists_checked: int = 0
    pairs_checked: int = 0
    full: bool = False

    def problem(self, kind: str, shard: int | None, server: str, detail: str, fix: str = "") -> None:
        """Record something wrong."""
        self.problems.append(Finding(kind, shard, server, detail, fix))

    def note(self, kind: str, shard: int | None, server: str, detail: str, fix: str = "") -> None:
        """Record something worth knowing that is not wrong."""
        self.notes.append(Finding(kind, shard, server, detail, fix))

    @property
    def ok(self) -> bool:
        """True if every shard is live exactly once where the map says, whole and consistent."""
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (for ``--json``)."""

        def rows(items: list[Finding]) -> list[dict[str, Any]]:
            return [
                {"kind": f.kind, "shard": f.shard, "server": f.server, "detail": f.detail, "fix": f.fix}
                for f in items
            ]

        return {
            "ok": self.ok,
            "map_version": self.map_version,
            "shards": self.shards,
            "live_exactly_once": sum(1 for servers in self.live.values() if len(servers) == 1),
            "full": self.full,
            "lists_checked": self.lists_checked,
            "pairs_checked": self.pairs_checked,
            "problems": rows(self.problems),
            "notes": rows(self.notes),
        }


def server_identity(url: URL) -> str:
    """One name per physical server: host names whose URLs point at the same server share it."""
    return backend_for(url).server_identity(url)


def check_store(
    store: HasAdminContext,
    *,
    full: bool = False,
    sample: int = SAMPLE,
    rng: random.Random | None = None,
    on_shard: Callable[[int], None] | None = None,
) -> CheckReport:
    """Check placement, tables, counts and inverses of every shard; change nothing."""
    ctx = store.admin_context()
    ctx.refresh_map(force=True)
    placed = ctx.shard_map
    config = ctx.config
    log.info("check: starting", extra={"fields": {"map_version": placed.version, "full": full}})
    report = CheckReport(map_version=placed.version, shards=placed.shards, full=full)
    servers: dict[str, list[str]] = {}
    for host, url in config.hosts.items():
        servers.setdefault(server_identity(url), []).append(host)
    label = {ident: "/".join(hosts) for ident, hosts in servers.items()}
    inventories = {ident: _inventory(ctx, hosts[0]) for ident, hosts in servers.items()}
    expected = {s: server_identity(config.hosts[placed.master(s)]) for s in range(placed.shards)}
    for ident, inv in inventories.items():
        for shard, copy in sorted(inv.copies.items()):
            _place(report, copy, ident, label[ident], expected.get(shard), placed.version)
        for shard in sorted(inv.archives):
            where = ctx.engines.backend(servers[ident][0]).namespace(shard)
            archive = f"{config.names.archive(where)} holds the rows of a finished move"
            report.note(
                "archive", shard, label[ident], archive, "store move --cleanup drops it once you are sure"
            )
    wanted = _tables(ctx)
    rng = rng or random.Random()
    absent_where: dict[str, list[int]] = {}
    for shard in range(placed.shards):
        ident = expected[shard]
        found = inventories[ident].copies.get(shard)
        if found is None or found.state == "empty":
            absent_where.setdefault(ident, []).append(shard)
        elif found.state == "live":
            missing = sorted(set(wanted) - set(found.tables))
            if missing:
                init = f"store init --shards {shard}-{shard}"
                report.problem("missing tables", shard, label[ident], ", ".join(missing), init)
            else:
                _consistency(ctx, report, shard, label[ident], full, sample, rng)
        if on_shard is not None:
            on_shard(shard)
    if config.unique:
        _unique_keys(store, report)
    _heartbeats(ctx, report)
    for ident, shards in absent_where.items():
        for low, high in _spans(shards):
            span = f"shards {low}-{high}" if high > low else f"shard {low}"
            why = f"{span}: no copy where map version {placed.version} puts {'them' if high > low else 'it'}"
            if ident.startswith("sqlite:"):  # a SQLite shard's file is made on its first use
                report.note("not created yet", None, label[ident], why, "made on first use, or by store init")
            else:
                report.problem("missing", None, label[ident], why, f"store init --shards {low}-{high}")
    log.info(
        "check: %s",
        "ok" if report.ok else f"{len(report.problems)} problem(s)",
        extra={
            "fields": {
                "map_version": report.map_version,
                "problems": len(report.problems),
                "notes": len(report.notes),
                "lists_checked": report.lists_checked,
                "pairs_checked": report.pairs_checked,
            }
        },
    )
    return report


def _heartbeats(ctx: AdminContext, report: CheckReport) -> None:
    """Each host a `store invalidate` daemon should follow has a heartbeat within ``max_stale_s``."""
    from store.cache.heartbeat import decode_heartbeat, heartbeat_key
    from store.cache.leases import wall_ms

    config = ctx.config
    hosts = config.cache.daemon_hosts(sorted(config.hosts))
    if not hosts:
        return
    objects = ctx.caches.objects
    peek = getattr(objects.store, "peek_many", None) if objects is not None else None
    where = ", ".join(hosts)
    if peek is None:
        why = "cache.invalidation needs memcached for its heartbeats: entries are trusted for the window only"
        report.note("no heartbeats", None, where, why, "add cache.memcached")
        return
    keys = {host: heartbeat_key(ctx.caches.prefix, host) for host in hosts}
    try:
        got = peek(list(keys.values()))
    except Exception as exc:  # memcached down: the readers fall back to the window too
        report.problem("stale heartbeat", None, where, f"memcached did not answer: {exc}")
        return
    now_ms = wall_ms()
    limit_s = config.cache.max_stale_s
    fix = "run `store invalidate` for it (one leads, others stand by)"
    for host, key in keys.items():
        beat = decode_heartbeat(got.get(key))
        mode = config.cache.invalidation_of(host)
        if beat is None:
            report.problem("stale heartbeat", None, host, f"no heartbeat ({mode}): no invalidator runs", fix)
        elif beat.covered_ms < now_ms - limit_s * 1000:
            age = (now_ms - beat.covered_ms) / 1000
            detail = f"heartbeat {age:.1f} s old (max_stale_s {limit_s:g}, {mode}): its invalidator is down"
            report.problem("stale heartbeat", None, host, detail, fix)


def _unique_keys(store: HasAdminContext, report: CheckReport) -> None:
    """Key rows that back nothing, and values held with no row (`repair_unique`'s dry run)."""
    from store.admin.repair import repair_unique

    fix = "store relations repair"
    try:
        found = repair_unique(store, dry_run=True)
    except StoreError as exc:
        report.problem("unique keys", None, "all", f"could not be checked: {exc}", "store init")
        return
    for name, value, owner in found.dead_owners:
        why = f"{name} {value!r} is held by {owner}, which is not a live object holding it"
        report.problem("unique key", None, "all", why, fix)
    for name, value, owner in found.unclaimed:
        why = f"object {owner} holds {value!r} with no {name} row: another object could take it"
        report.problem("unique key", None, "all", why, fix)
    for name, value, ids in found.conflicts:
        why = f"{name} {value!r} is held by {len(ids)} live objects {ids}"
        report.problem("unique key", None, "all", why, "change the value of all but one")
    for name, n in found.removed.items():
        if n > len([d for d in found.dead_owners if d[0] == name]):
            report.note("unique key", None, "all", f"{name}: rows of an earlier version's creates", fix)


def save_report(report: CheckReport, path: str | os.PathLike[str]) -> Path:
    """Keep ``report`` (with the time it was made) as JSON at ``path``, for `store serve`; the path."""
    out = Path(path)
    doc = {**report.as_dict(), "checked_at": time.time()}
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    os.replace(tmp, out)
    return out


def load_report(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The report `save_report` last kept at ``path``, or None if there is none (or it is unreadable)."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _spans(shards: list[int]) -> list[tuple[int, int]]:
    """Sorted shard numbers as runs of consecutive ones: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    out: list[tuple[int, int]] = []
    for s in sorted(shards):
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _place(
    report: CheckReport, copy: ShardCopy, ident: str, where: str, expected: str | None, version: int
) -> None:
    shard = copy.shard
    if expected is None:
        why = f"shard {shard} is beyond the map's {report.shards} shards"
        report.problem("stray copy", shard, where, why, "drop it once you are sure it holds nothing you need")
    elif copy.state == "live":
        report.live.setdefault(shard, []).append(where)
        if ident != expected:
            why = (
                f"a live copy where map version {version} does not put the shard: a process with an old map "
                f"could write to it (tables {', '.join(copy.tables[:3])}, ...)"
            )
            report.problem("stray copy", shard, where, why, "find out how it got there, then drop it")
    elif copy.state == "tombstone":
        moved = f"moved to {copy.moved_to} in map version {copy.map_version}"
        if ident == expected:
            why = f"the live map (version {version}) puts the shard here, but it {moved}"
            report.problem(
                "tombstone", shard, where, why, "the map source is behind the hosts: check map_source"
            )
        else:
            report.note("tombstone", shard, where, f"{moved}; refuses every read and write")
    elif ident != expected:
        report.note("empty", shard, where, "an empty shard database: nothing to fence")


def _inventory(ctx: AdminContext, host: str) -> ServerInventory:
    @contextmanager
    def open_cursor() -> Iterator[Any]:
        # Made only when the backend asks: a SQLite handle would make the shard's file.
        with ctx.engines.shard(0, host).connect() as conn:
            cur = conn.cursor()
            try:
                yield cur
            finally:
                cur.close()

    found: ServerInventory = ctx.engines.backend(host).inventory(ctx.config.hosts[host], open_cursor)
    return found


def _tables(ctx: AdminContext) -> list[str]:
    config = ctx.config
    out = [t.table for t in config.types.values()] + list(config.relations)
    if config.relations:
        out.append(COUNTS_TABLE)
    return [t for t in out if t != TOMBSTONE_TABLE]


def _consistency(
    ctx: AdminContext,
    report: CheckReport,
    shard: int,
    where: str,
    full: bool,
    sample: int,
    rng: random.Random,
) -> None:
    repo = ctx.relation_repository
    h = ctx.engines.shard(shard, ctx.shard_map.master(shard))
    relations = ctx.config.relations
    for spec in relations.values():
        if full:
            wrong = repo.count_mismatches(h, spec.name)
            report.lists_checked += _lists(h, spec.name)
        else:
            wrong = _sampled_counts(ctx, h, spec, sample, rng, report)
        repair = f"store relations repair {spec.name} --shards {shard}-{shard}"
        for from_id, kept, actual in wrong:
            report.problem(
                "count", shard, where, f"{spec.name} of {from_id} counts {kept}, holds {actual}", repair
            )
        if spec.inverse is None:
            continue
        other = relations[spec.inverse]
        for f, t in _unmatched(ctx, h, spec, other, None if full else sample, rng, report):
            why = f"{spec.name} {f} -> {t} has no {other.name} {t} -> {f}"
            report.problem("inverse", shard, where, why, f"store relations repair {spec.name}")


def _lists(h: Any, relation: str) -> int:
    row = h.read(
        f"SELECT COUNT(*) FROM {h.table(COUNTS_TABLE)} WHERE relation = {h.backend.param}",
        (relation,),
        one=True,
    )
    return int(row[0])


def _sampled_counts(
    ctx: AdminContext, h: Any, spec: RelationSpec, sample: int, rng: random.Random, report: CheckReport
) -> list[tuple[int, int, int]]:
    """(from_id, kept, actual) for lists whose kept count differs, among up to ``sample`` lists."""
    d = h.backend
    p = d.param
    rows = h.read(
        f"SELECT from_id, n FROM {h.table(COUNTS_TABLE)} WHERE relation = {p} AND from_id >= {p} "
        f"ORDER BY from_id LIMIT {p}",
        (spec.name, rng.randrange(1 << 62), sample),
        one=False,
    )
    if len(rows) < sample:  # wrapped around: take the lists from the start too
        first = (
            f"SELECT from_id, n FROM {h.table(COUNTS_TABLE)} WHERE relation = {p} ORDER BY from_id LIMIT {p}"
        )
        rows = list(rows) + list(h.read(first, (spec.name, sample - len(rows)), one=False))
    kept = {int(f): int(n) for f, n in rows}
    if not kept:
        return []
    report.lists_checked += len(kept)
    actual = {
        int(f): int(n)
        for f, n in h.read(
            f"SELECT from_id, COUNT(*) FROM {h.table(spec.name)} WHERE from_id IN ({d.params(len(kept))}) "
            "GROUP BY from_id",
            list(kept),
            one=False,
        )
    }
    return [(f, n, actual.get(f, 0)) for f, n in sorted(kept.items()) if actual.get(f, 0) != n]


def _unmatched(
    ctx: AdminContext,
    h: Any,
    spec: RelationSpec,
    other: RelationSpec,
    sample: int | None,
    rng: random.Random,
    report: CheckReport,
) -> Iterable[tuple[int, int]]:
    """Pairs of ``spec`` on ``h``'s shard whose ``other`` row is missing (a sample, or all)."""
    repo = ctx.relation_repository
    after: tuple[int, int] | None = None if sample is None else (rng.randrange(1 << 62), 0)
    budget = sample
    while True:
        chunk = 1000 if budget is None else min(1000, budget)
        rows = repo.scan(h, spec.name, after, chunk)
        if not rows and after is not None and sample is not None and budget == sample:
            rows = repo.scan(h, spec.name, None, chunk)  # past the last key: start from the first
        if not rows:
            return
        report.pairs_checked += len(rows)
        groups: dict[tuple[int, str], list[tuple[int, int]]] = {}
        for f, t, _seq in rows:
            try:
                s, _t, _l, host = ctx.router.route(t, spec.to_type)
            except StoreError:
                continue  # not routable: `store relations repair` reports these
            groups.setdefault((s, host), []).append((f, t))
        for (s, host), pairs in groups.items():
            found = repo.present(ctx.engines.shard(s, host), other.name, [(t, f) for f, t in pairs])
            yield from ((f, t) for f, t in pairs if (t, f) not in found)
        after = (rows[-1][0], rows[-1][1])
        if budget is not None:
            budget -= len(rows)
            if budget <= 0:
                return
