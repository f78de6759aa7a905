"""Unique keys (config ``unique:``): lookup rows sharded by a hash of the key, claimed first.

A unique key ``user_by_username: {type: user, field: username}`` keeps one
row per value, ``(name, value) -> object_id``, in the ``unique_keys`` table
of the shard that a hash of (name, value) picks, whatever shard the object
lives on. The row's primary key is the lock: of two writers inserting it,
exactly one succeeds, on any backend.

- **create** claims each key first with owner 0 (a create under way), then
  inserts the object, then names the new ID as the owner; it releases its
  claims if the insert fails.
- **update** claims the new values (owner: the object's ID) inside the
  object's transaction, before the write, so a taken value aborts it whole;
  after the commit it releases the old values. A rename is therefore held
  under both values for a moment, never under neither.
- **delete** releases the values the object held.

A claimant that dies half way leaves a row that is not backed by its owner
(owner 0, a deleted owner, or an owner whose field says otherwise). Such a
row is taken over by the next claim once it is older than `CLAIM_GRACE_S`
(a claim younger than that may belong to a create or rename still under
way), and ``store relations repair`` removes it or points it at the live
object that holds the value.

Values are strings (an int is taken as its decimal text), compared exactly
as UTF-8 bytes, at most `MAX_UNIQUE_VALUE_BYTES`: normalise case or spaces
before storing if the app wants that.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import MetaData, and_, bindparam, delete, insert, literal_column, select, update

from store.backends import Backend
from store.backends.statements import Statements
from store.backends.tables import MAX_UNIQUE_VALUE_BYTES, unique_table
from store.cache.leases import ObjectCache
from store.config import StoreConfig
from store.engines import Engines, ShardHandle
from store.exceptions import BackendError, DataError, DuplicateKeyError, UnknownTypeError, brief
from store.routing import Router
from store.specs import UniqueSpec

__all__ = ["CLAIM_GRACE_S", "UniqueKeys", "UniqueRepairReport", "UniqueStatements", "key_shard"]

#: How long a claim belongs to its claimant even if its object does not show the value (yet).
CLAIM_GRACE_S = 60.0


def key_shard(name: str, value: bytes, shards: int) -> int:
    """The shard holding key ``name``'s row for ``value``: a stable hash, not the object's shard."""
    digest = hashlib.blake2b(name.encode() + b"\0" + value, digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class UniqueStatements(Statements):
    """The statements of a shard's ``unique_keys`` table (parameters in the order named).

    - claim (name, value, object_id, claimed_ms); get (name, value): object_id, claimed_ms;
    - take (object_id, claimed_ms, name, value, old object_id, old claimed_ms): a claim over a dead row;
    - own (object_id, name, value, claimed_ms): a create's claim names its object;
    - release (name, value, object_id); scan (name): name, value, object_id, claimed_ms.
    """

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        t = unique_table(MetaData(), backend.column_types(), schema=self.schema)
        p = bindparam
        key = and_(t.c.name == p("name"), t.c.value == p("value"))
        self._add(
            "claim",
            insert(t).values(name=p("name"), value=p("value"), object_id=p("oid"), claimed_ms=p("ms")),
            ["name", "value", "oid", "ms"],
            any_order=True,
        )
        self._add("get", select(t.c.object_id, t.c.claimed_ms).where(key), ["name", "value"])
        take = update(t).where(key, t.c.object_id == p("old_oid"), t.c.claimed_ms == p("old_ms"))
        self._add(
            "take",
            take.values(object_id=p("oid"), claimed_ms=p("ms")),
            ["oid", "ms", "name", "value", "old_oid", "old_ms"],
        )
        own = (
            update(t)
            .where(key, t.c.object_id == literal_column("0"), t.c.claimed_ms == p("ms"))
            .values(object_id=p("oid"))
        )
        self._add("own", own, ["oid", "name", "value", "ms"])
        self._add("release", delete(t).where(key, t.c.object_id == p("oid")), ["name", "value", "oid"])
        cols = (t.c.name, t.c.value, t.c.object_id, t.c.claimed_ms)
        self._add("scan", select(*cols).where(t.c.name == p("name")), ["name"])

    def args(self, name: str, params: Mapping[str, Any]) -> tuple[Any, ...]:
        """``params`` in the order statement ``name`` takes them on this backend."""
        order = self.orders.get(name)
        if order is None:
            raise AssertionError(f"{name} has a fixed parameter order")
        return tuple(params[k] for k in order)


@dataclass
class UniqueRepairReport:
    """What `UniqueKeys.repair` found and fixed, per unique key name."""

    checked: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    added: dict[str, int] = field(default_factory=dict)
    repointed: dict[str, int] = field(default_factory=dict)
    #: (key, value, object IDs) where several live objects hold one value: an app must decide.
    conflicts: list[tuple[str, str, list[int]]] = field(default_factory=list)


@dataclass(frozen=True)
class Claim:
    """One unique key value an object holds (or is about to)."""

    spec: UniqueSpec
    value: bytes

    @property
    def text(self) -> str:
        """The value as text (for messages)."""
        return self.value.decode()


class UniqueKeys:
    """Claims, releases and lookups of unique keys over the shards (see the module's text)."""

    def __init__(
        self, *, config: StoreConfig, router: Router, engines: Engines, cache: ObjectCache | None, prefix: str
    ) -> None:
        self._config = config
        self._router = router
        self._engines = engines
        self._cache = cache
        self._prefix = prefix + "k:"
        self._by_type: dict[str, list[UniqueSpec]] = {}
        for spec in config.unique.values():
            self._by_type.setdefault(spec.type, []).append(spec)
        self._stmts: dict[str, UniqueStatements] = {}
        #: Test hook: called between a create's claims and its insert.
        self.after_claim: Callable[[], None] | None = None

    def indexes(self, type_name: str) -> list[UniqueSpec]:
        """The unique keys of type ``type_name``."""
        return self._by_type.get(type_name, [])

    # -- values ----------------------------------------------------------------------------

    def claims(self, type_name: str, data: Mapping[str, Any]) -> list[Claim]:
        """The unique values ``data`` holds for its type's keys; `DataError` for one that cannot be."""
        out: list[Claim] = []
        for spec in self._by_type.get(type_name, ()):
            c = self.claim_of(spec, data.get(spec.field))
            if c is not None:
                out.append(c)
        return out

    @staticmethod
    def claim_of(spec: UniqueSpec, raw: object) -> Claim | None:
        """The claim of value ``raw`` of ``spec`` (None: no value, not indexed); `DataError` if invalid."""
        if raw is None:
            return None
        if isinstance(raw, bool) or not isinstance(raw, str | int):
            raise DataError(
                f"{spec.field!r} is a unique key ({spec.name}); its value must be a string or an int, "
                f"got {type(raw).__name__}"
            )
        if isinstance(raw, int) and not -(1 << 63) <= raw < 1 << 64:
            raise DataError(
                f"{spec.field!r} is a unique key ({spec.name}); an int value must fit 64 bits "
                f"(as every int an object holds), got {brief(raw)}"
            )
        try:
            value = str(raw).encode()
        except UnicodeEncodeError:
            raise DataError(
                f"{spec.field!r} is a unique key ({spec.name}); its value {brief(raw)} holds a lone "
                "surrogate, which is not valid Unicode (UTF-8)"
            ) from None
        if not value or len(value) > MAX_UNIQUE_VALUE_BYTES:
            raise DataError(
                f"{spec.field!r} is a unique key ({spec.name}); its value must be 1 to "
                f"{MAX_UNIQUE_VALUE_BYTES} bytes of UTF-8, got {len(value)}"
            )
        return Claim(spec, value)

    def _spec(self, name: str) -> UniqueSpec:
        try:
            spec = self._config.unique.get(name)
        except TypeError:  # unhashable: a list, a dict
            spec = None
        if spec is None:
            known = ", ".join(self._config.unique) or "none: add a unique: section to the config"
            raise UnknownTypeError(f"no unique key {brief(name)}; configured: {known}")
        return spec

    def _where(self, name: str, value: bytes) -> tuple[ShardHandle, dict[str, str], UniqueStatements]:
        shard_map = self._router.shard_map
        shard = key_shard(name, value, shard_map.shards)
        h = self._engines.shard(shard, shard_map.master(shard))
        stmts = self._stmts_for(h)
        return h, stmts.for_shard(shard), stmts

    def cache_key(self, name: str, value: bytes) -> str:
        """The object cache's key of a lookup (the value hashed: keys hold no spaces and stay short)."""
        return f"{self._prefix}{name}:{hashlib.blake2b(value, digest_size=16).hexdigest()}"

    def _invalidate(self, claims: Iterable[Claim]) -> None:
        if self._cache is not None:
            keys = [self.cache_key(c.spec.name, c.value) for c in claims]
            if keys:
                self._cache.invalidate(keys)

    # -- claims ----------------------------------------------------------------------------

    def claim(self, c: Claim, owner: int, *, live_value: Callable[[int], bytes | None]) -> int:
        """Take ``c`` for ``owner`` (0: a create under way); the claim's time, to name it later.

        ``live_value(id)`` is the value the live object ``id`` holds for
        this key now (None if none or gone): a row older than the grace
        period that its owner does not back is taken over.
        Raises `DuplicateKeyError` if another object holds the value.
        """
        h, sql, stmts = self._where(c.spec.name, c.value)
        for _attempt in range(3):
            ms = _now_ms()
            params = {"name": c.spec.name, "value": c.value, "oid": owner, "ms": ms}
            try:
                self._write(h, sql["claim"], stmts.args("claim", params))
                if owner:
                    self._invalidate([c])  # a cached "free" must not outlive the claim
                return ms
            except BackendError as exc:
                if not exc.duplicate:
                    raise
            row = h.read(sql["get"], (c.spec.name, c.value), one=True)
            if row is None:
                continue  # released meanwhile: claim again
            holder, claimed_ms = int(row[0]), int(row[1])
            if holder == owner and owner != 0:
                return claimed_ms  # already ours (a rename to the value it has)
            dead = claimed_ms < ms - CLAIM_GRACE_S * 1000 and (holder == 0 or live_value(holder) != c.value)
            if not dead:
                raise DuplicateKeyError(
                    f"{c.spec.field} {c.text!r} is taken ({c.spec.name}, held by "
                    f"{holder if holder else 'an object being created'}); pick another value",
                    key=c.spec.name,
                    value=c.text,
                    owner=holder,
                )
            took = self._write(h, sql["take"], (owner, ms, c.spec.name, c.value, holder, claimed_ms))
            if took:
                self._invalidate([c])
                return ms
        raise DuplicateKeyError(
            f"{c.spec.field} {c.text!r} ({c.spec.name}) kept changing hands while claimed; try again",
            key=c.spec.name,
            value=c.text,
            owner=0,
        )

    def own(self, c: Claim, owner: int, claimed_ms: int) -> None:
        """Name ``owner`` as the holder of a create's claim (made with owner 0 at ``claimed_ms``)."""
        h, sql, _stmts = self._where(c.spec.name, c.value)
        self._write(h, sql["own"], (owner, c.spec.name, c.value, claimed_ms))
        self._invalidate([c])

    def release(self, claims: Iterable[Claim], owner: int) -> None:
        """Give up each of ``claims`` if ``owner`` holds it (0: a create's claims)."""
        done: list[Claim] = []
        for c in claims:
            h, sql, _stmts = self._where(c.spec.name, c.value)
            self._write(h, sql["release"], (c.spec.name, c.value, owner))
            done.append(c)
        self._invalidate(done)

    @staticmethod
    def _write(h: ShardHandle, sql: str, params: tuple[Any, ...]) -> int:
        with h.connect() as conn:
            cur = conn.cursor()
            cur.execute(sql, params)
            n = int(cur.rowcount)
            cur.close()
        return n

    # -- reads -----------------------------------------------------------------------------

    def lookup(self, name: str, value: str | int) -> int | None:
        """The ID of the live object whose unique key ``name`` is ``value``, or None."""
        spec = self._spec(name)
        found = self.claim_of(spec, value)
        if found is None:
            raise DataError(f"lookup of {name} needs a value, got None")
        raw = found.value
        if self._cache is None:
            return self._read_owner(name, raw)
        key = self.cache_key(name, raw)

        def load(_missing: list[str]) -> dict[str, bytes]:
            owner = self._read_owner(name, raw)
            return {} if owner is None else {key: b"%d" % owner}

        got = self._cache.get_many([key], load, logged=False).get(key)  # key writes are not logged
        return None if got is None else int(got)

    def _read_owner(self, name: str, value: bytes) -> int | None:
        h, sql, _stmts = self._where(name, value)
        row = h.read(sql["get"], (name, value), one=True)
        return None if row is None or not int(row[0]) else int(row[0])

    # -- repair ----------------------------------------------------------------------------

    def rows(self, name: str) -> Iterable[tuple[bytes, int, int, ShardHandle]]:
        """Every row of unique key ``name``: (value, object_id, claimed_ms, where it is)."""
        for r in self._router.shard_map:
            for shard in r.shards():
                h = self._engines.shard(shard, r.master)
                sql = self._stmts_for(h).for_shard(shard)
                for _name, value, oid, ms in h.read(sql["scan"], (name,), one=False):
                    yield bytes(value), int(oid), int(ms), h

    def _stmts_for(self, h: ShardHandle) -> UniqueStatements:
        stmts = self._stmts.get(h.backend.name)
        if stmts is None:
            stmts = self._stmts[h.backend.name] = UniqueStatements(h.backend)
        return stmts

    def repair(
        self, objects: Callable[[str], Iterable[tuple[int, dict[str, Any]]]], *, dry_run: bool = False
    ) -> UniqueRepairReport:
        """Make every unique key's rows match the live objects.

        ``objects(type_name)`` yields every live object of the type. A row no
        live object backs, and older than the grace period, is removed; a
        value a live object holds with no row gets one; a row held by
        nobody alive while one live object holds the value points at it. A
        value several live objects hold is reported, not changed.
        """
        report = UniqueRepairReport()
        old_ms = _now_ms() - int(CLAIM_GRACE_S * 1000)
        for spec in self._config.unique.values():
            holders: dict[bytes, list[int]] = {}
            for id_, data in objects(spec.type):
                try:
                    c = self.claim_of(spec, data.get(spec.field))
                except DataError:
                    continue  # a value stored before the key was configured, that no key can hold
                if c is not None:
                    holders.setdefault(c.value, []).append(id_)
            rows: dict[bytes, tuple[int, int, ShardHandle]] = {}
            for value, oid, ms, h in self.rows(spec.name):
                rows[value] = (oid, ms, h)
                report.checked += 1
            for value, (oid, ms, h) in rows.items():
                ids = holders.get(value, [])
                if oid in ids or ms >= old_ms:
                    continue
                c = Claim(spec, value)
                if len(ids) == 1:
                    report.repointed[spec.name] = report.repointed.get(spec.name, 0) + 1
                    if not dry_run:
                        sql = self._stmts_for(h).for_shard(h.shard)
                        self._write(h, sql["take"], (ids[0], _now_ms(), spec.name, value, oid, ms))
                        self._invalidate([c])
                elif not ids:
                    report.removed[spec.name] = report.removed.get(spec.name, 0) + 1
                    if not dry_run:
                        self.release([c], oid)
            for value, ids in holders.items():
                if len(ids) > 1:
                    report.conflicts.append((spec.name, value.decode(), sorted(ids)))
                    continue
                if value in rows:
                    continue
                report.added[spec.name] = report.added.get(spec.name, 0) + 1
                if not dry_run:
                    h, sql, stmts = self._where(spec.name, value)
                    params = {"name": spec.name, "value": value, "oid": ids[0], "ms": _now_ms()}
                    try:
                        self._write(h, sql["claim"], stmts.args("claim", params))
                    except BackendError as exc:
                        if not exc.duplicate:
                            raise
                    self._invalidate([Claim(spec, value)])
        return report
