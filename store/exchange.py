"""Export and import: every object and relation entry of a store as NDJSON, one JSON object a line.

The format (``FORMAT`` 1), in this order::

    {"kind": "export", "format": 1, "ids": "pinterest", "shards": [0, 4095]}
    {"kind": "object", "type": "pin", "id": 241294492511762325, "data": {...}, "version": 3}
    {"kind": "object", "type": "pin", "id": ..., "data": {...}, "version": 2, "deleted": true}
    {"kind": "link", "relation": "board_has_pins", "from": ..., "to": ..., "sequence": ...}
    {"kind": "end", "objects": 2, "links": 1}

Objects come type by type (the config's order), then relation entries
relation by relation (inverses are relations of their own: each side is
exported as it is stored); within each, shard by shard in key order,
read by `store.scan`'s keyset pages through the live map. Soft-deleted
objects are exported too (``"deleted": true``), so a round trip gives the
same rows; pending objects (a create that never went live) are not.

An export to a file is resumable: its last complete line says where it
stopped (a partial last line is cut off), and the export goes on after it.
A file whose last line is ``end`` is complete.

An import writes each object with its own ID, version and state, and each
entry with its sequence, skipping what exists: run again, it changes
nothing. Counts go up by the entries actually added, in the same
transaction. Lines are read in batches; a batch is checked whole before
anything of it is written, and a batch with bad lines is refused with every
bad line's number (`BadRecordError`), nothing of it written. What earlier
batches wrote stays (an import run again after the fix skips it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
from sqlalchemy import MetaData, bindparam

from store.backends import Backend
from store.backends.statements import Statements
from store.backends.tables import object_table
from store.cache.follower import log_entries
from store.cache.leases import wall_ms
from store.context import AdminContext, HasAdminContext
from store.exceptions import BadRecordError, ConfigError, LimitError, StoreError, brief
from store.scan import Scan, scan_shards, scan_token
from store.unique_repair import repair_unique

__all__ = ["FORMAT", "IMPORT_BATCH", "ExportReport", "ImportReport", "export_records", "import_records"]

FORMAT = 1
#: Lines an import checks, then writes, at a time.
IMPORT_BATCH = 1000
#: Rows an export reads per page.
EXPORT_PAGE = 1000
#: Bad lines a refusal lists (it says how many more there were).
_SHOWN_ERRORS = 20
_INT_MIN, _INT_MAX = -(1 << 63), (1 << 63) - 1
_OBJECT_KEYS = frozenset({"kind", "type", "id", "data", "version", "deleted"})
_LINK_KEYS = frozenset({"kind", "relation", "from", "to", "sequence"})

Progress = Callable[[int, int], None]


@dataclass
class ExportReport:
    """What an export wrote: objects and entries in the file (earlier runs' too, when resumed)."""

    objects: int = 0
    links: int = 0
    #: True if the export went on from a partial file; False if it began it.
    resumed: bool = False
    #: True if the file was already complete (nothing written).
    complete_already: bool = False


@dataclass
class ImportReport:
    """What an import did: rows added, and rows that were there already (left as they were)."""

    lines: int = 0
    objects_added: int = 0
    objects_present: int = 0
    links_added: int = 0
    links_present: int = 0
    #: Unique keys' rows made for the imported objects (config ``unique:``), by `repair_unique`.
    unique_added: int = 0
    shards: set[int] = field(default_factory=set)
    #: False if the lines began with an export's header but had no end line (an export cut short).
    complete: bool = True


# -- export -----------------------------------------------------------------------------------


def _dumps(record: dict[str, Any]) -> str:
    return orjson.dumps(record).decode() + "\n"


def _sections(ctx: AdminContext) -> list[tuple[str, str]]:
    return [("object", t) for t in ctx.config.types] + [("link", r) for r in ctx.config.relations]


def export_records(
    store: HasAdminContext,
    out: str | os.PathLike[str] | IO[str],
    *,
    shards: Iterable[int] | None = None,
    resume: bool = False,
    progress: Progress | None = None,
) -> ExportReport:
    """Write every object and relation entry on ``shards`` (default: all) to ``out`` as NDJSON.

    ``out``: a path, or a text stream (written to, never closed). A path
    that exists is refused unless ``resume``: then a partial export there
    goes on after its last complete line (with the same ``shards``), and a
    complete one is left as it is. ``progress(done, total)`` is told after
    each shard of each type and relation.
    """
    ctx = store.admin_context()
    wanted = scan_shards(ctx.config, shards)
    header = {"kind": "export", "format": FORMAT, "ids": ctx.config.ids, "shards": _spans(wanted)}
    report = ExportReport()
    if isinstance(out, str | os.PathLike):
        path = Path(out)
        start: tuple[int, int, tuple[int, ...]] | None = None
        if path.exists():
            if not resume:
                raise StoreError(f"{path} exists: pass --resume (resume=True) to go on with it, or remove it")
            start = _resume_point(ctx, path, header, report)
            if start is None:
                return report
        elif resume:
            raise StoreError(f"{path} does not exist: there is no export to resume")
        with path.open("a" if start is not None else "w", encoding="utf-8") as stream:
            _export(ctx, stream, wanted, header, start, report, progress)
            stream.flush()
            os.fsync(stream.fileno())
        return report
    if resume:
        raise StoreError("resume needs the export's file (a path), not a stream")
    _export(ctx, out, wanted, header, None, report, progress)
    return report


def _spans(shards: list[int]) -> list[list[int]]:
    """Sorted shard numbers as [low, high] spans."""
    spans: list[list[int]] = []
    for s in shards:
        if spans and spans[-1][1] == s - 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return spans


def _export(
    ctx: AdminContext,
    stream: IO[str],
    shards: list[int],
    header: dict[str, Any],
    start: tuple[int, int, tuple[int, ...]] | None,
    report: ExportReport,
    progress: Progress | None,
) -> None:
    """Write the sections from ``start`` (section index, shard, position) on; the header if new."""
    sections = _sections(ctx)
    if start is None:
        stream.write(_dumps(header))
        start = (0, -1, ())
    total = len(sections) * len(shards)
    done = 0
    for index, (kind, name) in enumerate(sections):
        if index < start[0]:
            done += len(shards)
            continue
        where = start[1:] if index == start[0] else (-1, ())
        for shard in shards:
            if shard < where[0]:
                done += 1
                continue
            position = where[1] if shard == where[0] else ()
            if kind == "object":
                report.objects += _export_objects(ctx, stream, name, shard, position)
            else:
                report.links += _export_links(ctx, stream, name, shard, position)
            done += 1
            if progress is not None:
                progress(done, total)
    stream.write(_dumps({"kind": "end", "objects": report.objects, "links": report.links}))


def _export_objects(
    ctx: AdminContext, stream: IO[str], type_name: str, shard: int, after: tuple[int, ...]
) -> int:
    spec = ctx.router.type(type_name)
    resume = scan_token(type_name, True, shard, after[0]) if after else None
    scan = Scan(
        config=ctx.config,
        engines=ctx.engines,
        live=ctx.live,
        spec=spec,
        decode=ctx.objects.repo.decode,
        shards=[shard],
        batch=EXPORT_PAGE,
        include_deleted=True,
        resume=resume,
    )
    n = 0
    for row in scan.rows():
        record: dict[str, Any] = {
            "kind": "object",
            "type": type_name,
            "id": row.id,
            "data": orjson.Fragment(row.data),
            "version": row.version,
        }
        if not row.live:
            record["deleted"] = True
        stream.write(_dumps(record))
        n += 1
    return n


def _export_links(
    ctx: AdminContext, stream: IO[str], relation: str, shard: int, after: tuple[int, ...]
) -> int:
    repo = ctx.relation_repository
    position: tuple[int, int] | None = (after[0], after[1]) if after else None
    n = 0
    while True:

        def page(position: tuple[int, int] | None = position) -> list[tuple[int, int, int]]:
            h = ctx.engines.shard(shard, ctx.live.current.master(shard))
            return repo.scan(h, relation, position, EXPORT_PAGE)

        rows = ctx.live.run(page)
        for f, t, s in rows:
            stream.write(_dumps({"kind": "link", "relation": relation, "from": f, "to": t, "sequence": s}))
        n += len(rows)
        if len(rows) < EXPORT_PAGE:
            return n
        position = (rows[-1][0], rows[-1][1])


def _resume_point(
    ctx: AdminContext, path: Path, header: dict[str, Any], report: ExportReport
) -> tuple[int, int, tuple[int, ...]] | None:
    """Where a partial export at ``path`` stopped (its partial last line cut off); None if complete.

    Reads the file once, a line at a time (to count what it holds), never whole.
    """
    first_line = b""
    last_line = b""
    cut = 0
    with path.open("rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break  # a partial last line: cut off below
            cut += len(line)
            if not first_line:
                first_line = line
            last_line = line
            if line.startswith(b'{"kind":"object"'):
                report.objects += 1
            elif line.startswith(b'{"kind":"link"'):
                report.links += 1
    if not first_line:
        raise StoreError(f"{path} holds no complete line: remove it and export again")
    try:
        first = orjson.loads(first_line)
        last = orjson.loads(last_line)
    except orjson.JSONDecodeError as exc:
        raise StoreError(f"{path} is not an export of this format: {exc}") from exc
    if not isinstance(first, dict) or first.get("kind") != "export":
        raise StoreError(f"{path} does not begin with an export's header line: it is no export to resume")
    if first != header:
        raise StoreError(
            f"{path} is an export of {brief(first.get('ids'))} IDs on shards {brief(first.get('shards'))}, "
            f"not {header['ids']} on {header['shards']}: resume it with the same --shards and config"
        )
    report.resumed = True
    if not isinstance(last, dict):
        raise StoreError(f"{path}'s last line is not a record: remove it and export again")
    sections = _sections(ctx)
    kind = last.get("kind")
    if kind == "end":
        report.complete_already = True
        return None
    start: tuple[int, int, tuple[int, ...]]
    try:
        if kind == "export":
            start = (0, -1, ())
        elif kind == "object":
            index = sections.index(("object", last["type"]))
            shard, _t, key, _h = ctx.router.route(last["id"], last["type"])
            start = (index, shard, (key,))
        elif kind == "link":
            index = sections.index(("link", last["relation"]))
            spec = ctx.router.relation(last["relation"])
            shard = ctx.router.route(last["from"], spec.from_type)[0]
            start = (index, shard, (last["from"], last["to"]))
        else:
            raise StoreError(f"{path}'s last line is of kind {brief(kind)}: it is no export to resume")
    except (KeyError, ValueError, TypeError, StoreError) as exc:
        raise StoreError(f"{path}'s last line names no position of this store's export: {exc}") from exc
    # Only now, the file known to be this export: its partial last line goes.
    os.truncate(path, cut)
    return start


# -- import -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Object:
    line: int
    type_name: str
    id: int
    shard: int
    key: int
    text: str
    version: int
    live: bool


@dataclass(frozen=True)
class _Link:
    line: int
    relation: str
    from_id: int
    to_id: int
    shard: int
    sequence: int


class _ImportStatements(Statements):
    """An object's insert with its own key, version and state, skipped where the key exists."""

    def __init__(self, backend: Backend, table: str, *, ids: str) -> None:
        super().__init__(backend)
        t = object_table(MetaData(), table, backend.column_types(), ids=ids, schema=self.schema, shard=0)
        key = "id" if ids == "instagram" else "local_id"
        values: dict[str, Any] = {
            key: bindparam("k"),
            "data": bindparam("d"),
            "active": bindparam("a"),
            "version": bindparam("v"),
        }
        self._add("insert", backend.upsert_skip(t).values(values), ["k", "d", "a", "v"])


def import_records(
    store: HasAdminContext,
    lines: Iterable[str | bytes],
    *,
    batch: int = IMPORT_BATCH,
    progress: Callable[[int], None] | None = None,
) -> ImportReport:
    """Write the objects and entries of an export's ``lines`` that the store lacks; see the module.

    ``progress(n)`` is told the bytes of each batch once it is written.
    Raises `BadRecordError` (every bad line of the batch, by number) before
    writing anything of a batch with a bad line.
    """
    if type(batch) is not int or batch < 1:
        raise LimitError(f"batch must be a positive int (lines per batch), got {brief(batch)}")
    ctx = store.admin_context()
    importer = _Importer(ctx)
    report = ImportReport()
    for chunk, size in _batches(lines, batch):
        objects, links = importer.check(chunk)
        importer.write(objects, links, report)
        report.lines += len(chunk)
        if progress is not None:
            progress(size)
    # An export's file without its end line was cut short: what it held is written, and the
    # caller is told (the CLI says so and exits 1).
    report.complete = importer.ended is not None or not importer.began
    if ctx.unique is not None and report.objects_added:
        report.unique_added = sum(repair_unique(store).added.values())
    return report


def _batches(lines: Iterable[str | bytes], size: int) -> Iterator[tuple[list[tuple[int, str | bytes]], int]]:
    chunk: list[tuple[int, str | bytes]] = []
    nbytes = 0
    for number, line in enumerate(lines, 1):
        chunk.append((number, line))
        nbytes += len(line)
        if len(chunk) == size:
            yield chunk, nbytes
            chunk, nbytes = [], 0
    if chunk:
        yield chunk, nbytes


class _Importer:
    def __init__(self, ctx: AdminContext) -> None:
        self.ctx = ctx
        self.began = False
        self.ended: int | None = None
        self.seen_objects = 0
        self.seen_links = 0
        self._stmts: dict[tuple[str, str], _ImportStatements] = {}
        self._end_record: tuple[int, dict[str, Any]] | None = None

    # -- checks: a whole batch before any write ------------------------------------------------

    def check(self, chunk: list[tuple[int, str | bytes]]) -> tuple[list[_Object], list[_Link]]:
        objects: list[_Object] = []
        links: list[_Link] = []
        errors: list[tuple[int, str]] = []
        for number, line in chunk:
            try:
                record = self._record(number, line)
            except StoreError as exc:
                errors.append((number, str(exc)))
                continue
            if isinstance(record, _Object):
                objects.append(record)
            elif isinstance(record, _Link):
                links.append(record)
        if not errors and self._end_record is not None:
            # Checked only in a batch of good lines: a bad line is what the count would blame.
            end_line, end = self._end_record
            self._end_record = None
            want = (end.get("objects"), end.get("links"))
            if want != (self.seen_objects, self.seen_links):
                errors.append(
                    (
                        end_line,
                        f"the end line counts {brief(want[0])} objects and {brief(want[1])} entries, the "
                        f"file holds {self.seen_objects} and {self.seen_links}: damaged (export it again)",
                    )
                )
        if errors:
            raise BadRecordError(errors, shown=_SHOWN_ERRORS)
        return objects, links

    def _record(self, number: int, line: str | bytes) -> _Object | _Link | None:
        if not line.strip():
            return None  # a blank line (a trailing newline)
        if self.ended is not None:
            raise StoreError(f"a record after the end line (line {self.ended})")
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise StoreError(f"not JSON: {exc}") from None
        if not isinstance(record, dict):
            raise StoreError(f"a record is a JSON object, got {brief(record)}")
        kind = record.get("kind")
        if kind == "object":
            return self._object(number, record)
        if kind == "link":
            return self._link(number, record)
        if kind == "export":
            self._header(number, record)
            return None
        if kind == "end":
            self._end(number, record)
            return None
        raise StoreError(f'"kind" must be "object", "link", "export" or "end", got {brief(kind)}')

    def _header(self, number: int, record: dict[str, Any]) -> None:
        if number != 1:
            raise StoreError("an export's header line may only be the first line")
        self.began = True
        if record.get("format") != FORMAT:
            raise StoreError(f"export format {brief(record.get('format'))}, this store reads format {FORMAT}")
        if record.get("ids") != self.ctx.config.ids:
            raise ConfigError(
                f"the export holds {brief(record.get('ids'))} IDs, this store makes "
                f"{self.ctx.config.ids} IDs: import it into a store with the same ids: setting"
            )

    def _end(self, number: int, record: dict[str, Any]) -> None:
        self._end_record = (number, record)
        self.ended = number

    def _object(self, number: int, record: dict[str, Any]) -> _Object:
        extra = sorted(set(record) - _OBJECT_KEYS)
        missing = sorted(_OBJECT_KEYS - {"deleted"} - set(record))
        if extra or missing:
            raise StoreError(_keys_message("an object", extra, missing))
        type_name, id_, data, version = record["type"], record["id"], record["data"], record["version"]
        deleted = record.get("deleted", False)
        if type(id_) is not int:
            raise StoreError(f'"id" must be an int, got {brief(id_)}')
        shard, spec, key, _host = self.ctx.router.route(id_, type_name)  # UnknownTypeError, IdError, ...
        if not isinstance(data, dict):
            raise StoreError(f'"data" must be a JSON object, got {brief(data)}')
        text = self.ctx.objects.repo.encode(data)  # DataError: what the store refuses to keep
        if type(version) is not int or not 1 <= version <= _INT_MAX:
            raise StoreError(f'"version" must be an int of at least 1, got {brief(version)}')
        if deleted is not True and deleted is not False:
            raise StoreError(f'"deleted" must be true or false, got {brief(deleted)}')
        self.seen_objects += 1
        return _Object(number, spec.name, id_, shard, key, text, version, not deleted)

    def _link(self, number: int, record: dict[str, Any]) -> _Link:
        extra = sorted(set(record) - _LINK_KEYS)
        missing = sorted(_LINK_KEYS - set(record))
        if extra or missing:
            raise StoreError(_keys_message("a link", extra, missing))
        spec = self.ctx.router.relation(record["relation"])
        f, t, s = record["from"], record["to"], record["sequence"]
        for name, value in (("from", f), ("to", t)):
            if type(value) is not int:
                raise StoreError(f'"{name}" must be an int ID, got {brief(value)}')
        shard = self.ctx.router.route(f, spec.from_type)[0]
        self.ctx.router.route(t, spec.to_type)
        if type(s) is not int or not _INT_MIN <= s <= _INT_MAX:
            raise StoreError(f'"sequence" must be an int that fits 64 bits, got {brief(s)}')
        self.seen_links += 1
        return _Link(number, spec.name, f, t, shard, s)

    # -- writes: one transaction per shard and table, each a step through the live map ----------

    def write(self, objects: list[_Object], links: list[_Link], report: ImportReport) -> None:
        by_table: dict[tuple[int, str], list[_Object]] = {}
        for o in objects:
            by_table.setdefault((o.shard, o.type_name), []).append(o)
        for (shard, type_name), group in sorted(by_table.items()):
            added = self.ctx.live.step(lambda s=shard, t=type_name, g=group: self._objects(s, t, g))  # type: ignore[misc]
            report.objects_added += added
            report.objects_present += len(group) - added
            report.shards.add(shard)
            cache = self.ctx.caches.objects
            if added and cache is not None:  # an absent object may be cached as absent
                spec = self.ctx.router.type(type_name)
                cache.invalidate([self.ctx.objects.key(o.id, spec) for o in group])
        by_list: dict[tuple[int, str], list[_Link]] = {}
        for link in links:
            by_list.setdefault((link.shard, link.relation), []).append(link)
        for (shard, relation), rows in sorted(by_list.items()):
            changed = self.ctx.live.step(lambda s=shard, r=relation, g=rows: self._links(s, r, g))  # type: ignore[misc]
            added = sum(changed.values())
            report.links_added += added
            report.links_present += len(rows) - added
            report.shards.add(shard)
            self.ctx.relations.invalidate([(relation, f) for f in changed])

    def _handle(self, shard: int) -> Any:
        return self.ctx.engines.shard(shard, self.ctx.live.current.master(shard))

    def _objects(self, shard: int, type_name: str, group: list[_Object]) -> int:
        h = self._handle(shard)
        spec = self.ctx.router.type(type_name)
        key = (h.backend.name, spec.table)
        stmts = self._stmts.get(key)
        if stmts is None:
            stmts = self._stmts[key] = _ImportStatements(h.backend, spec.table, ids=self.ctx.config.ids)
        sql = stmts.for_shard(shard)["insert"]
        log_sql = h.log_sql() if self.ctx.caches.objects is not None else None

        def txn(cur: Any) -> int:
            answers = cur.batch([(sql, (o.key, o.text, int(o.live), o.version)) for o in group])
            added = sum(1 for rowcount, _id in answers if rowcount == 1)
            if added and log_sql is not None:
                keys = [self.ctx.objects.key(o.id, spec) for o in group]
                cur.defer_log(log_sql, wall_ms(), log_entries(objects=keys))
            return added

        return int(h.transaction(txn))

    def _links(self, shard: int, relation: str, rows: list[_Link]) -> dict[int, int]:
        h = self._handle(shard)
        repo = self.ctx.relation_repository
        sql = repo.sql(h, relation)
        log_sql = h.log_sql() if self.ctx.caches.lists is not None else None

        def txn(cur: Any) -> dict[int, int]:
            answers = cur.batch([(sql.insert, (r.from_id, r.to_id, r.sequence)) for r in rows])
            added: dict[int, int] = {}
            for r, (rowcount, _id) in zip(rows, answers, strict=True):
                if rowcount == 1:
                    added[r.from_id] = added.get(r.from_id, 0) + 1
            for from_id, n in sorted(added.items()):
                cur.execute(sql.count_up, (relation, from_id, n))
            if added and log_sql is not None:
                keys = [self.ctx.relations.list_key(relation, f) for f in added]
                cur.defer_log(log_sql, wall_ms(), log_entries(lists=keys))
            return added

        result: dict[int, int] = h.transaction(txn)
        return result


def _keys_message(what: str, extra: list[str], missing: list[str]) -> str:
    parts = []
    if missing:
        parts.append("lacks " + ", ".join(f'"{k}"' for k in missing))
    if extra:
        parts.append("has unknown key(s) " + ", ".join(f'"{k}"' for k in extra))
    return f"{what} record {' and '.join(parts)}"
