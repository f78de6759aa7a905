"""Unique keys (config ``unique:``): lookup rows sharded by a hash of the key, claimed in the ID's name.

A unique key ``user_by_username: {type: user, field: username}`` keeps one
row per value, ``(name, value) -> object_id``, in the ``unique_keys`` table
of the shard that a hash of (name, value) picks, whatever shard the object
lives on. The row's primary key is the lock: of two writers inserting it,
exactly one succeeds, on any backend. A row always names the object it is
for, before that object holds the value (`store.objects` runs the steps):

- **create** inserts the object *pending* (not live: active 0, version 0),
  claims each key in the new ID's name, then makes the object live in one
  statement that only a pending row passes. If a claim is refused, the
  pending row is removed and the claims made are given back.
- **update** claims the new values in the object's name before its
  transaction; under the row lock the new values must be the ones claimed;
  after the commit it releases the old values. A rename is held under both
  values for a moment, never under neither.
- **delete** reads what the object holds under its row lock, in the
  transaction that marks it deleted, then releases those values.

A writer that dies between steps leaves a row its owner does not back: a
pending object that never went live, a deleted object, or a live object
whose field says otherwise. The next claim of the value asks the owner
(`Holders`): a deleted or absent owner's row is taken over at once; a
pending owner is *abandoned* first (one statement that only a pending row
passes, so it can never go live) once its claim is older than
`CLAIM_GRACE_S`; a live owner that does not hold the value loses the row
after the grace period too (a rename of it may be under way). A live owner
that holds the value never loses it. Every takeover is a compare-and-set on
(owner, claimed time), and a claimant that finds the row already its own
renews it the same way, so a takeover decided on an older look at the owner
cannot win. ``store relations repair`` removes rows of dead owners at once,
points rows at the live object that holds their value, and adds missing
ones; ``store check`` reports both kinds.

Rows with owner 0 were written by creates of earlier versions, which
claimed before the ID was known: no takeover can tell who holds them, so a
claim meeting one is refused until repair points it at its holder or
removes it.

Values are strings (an int is taken as its decimal text), compared exactly
as UTF-8 bytes, at most `MAX_UNIQUE_VALUE_BYTES`: normalise case or spaces
before storing if the app wants that.
"""

from __future__ import annotations

import enum
import hashlib
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from sqlalchemy import MetaData, and_, bindparam, delete, insert, select, update

from store.backends import Backend
from store.backends.statements import Statements
from store.backends.tables import MAX_UNIQUE_VALUE_BYTES, unique_table
from store.cache.leases import ObjectCache
from store.config import StoreConfig
from store.engines import Engines, ShardHandle
from store.exceptions import BackendError, DataError, DuplicateKeyError, UnknownTypeError, brief
from store.routing import Router
from store.specs import UniqueSpec
from store.steps import Steps

__all__ = [
    "CLAIM_GRACE_S",
    "Claimed",
    "Holder",
    "Holders",
    "UniqueKeys",
    "UniqueRepairReport",
    "UniqueStatements",
    "key_shard",
]

#: How long a claim belongs to its claimant even if its object does not show the value (yet).
CLAIM_GRACE_S = 60.0


def key_shard(name: str, value: bytes, shards: int) -> int:
    """The shard holding key ``name``'s row for ``value``: a stable hash, not the object's shard."""
    digest = hashlib.blake2b(name.encode() + b"\0" + value, digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Holder(enum.Enum):
    """What the object a unique-key row names is now."""

    LIVE = "live"
    #: Inserted by a create that has not made it live yet (or never will: it died).
    PENDING = "pending"
    #: Deleted, abandoned, or absent: it never holds a value again.
    DEAD = "dead"


class Holders(Protocol):
    """The objects that unique-key rows name (`store.objects.ObjectService` is one)."""

    def holder(self, type_name: str, id_: int) -> tuple[Holder, dict[str, Any] | None]:
        """What object ``id_`` of ``type_name`` is now, and its data if it is live."""
        ...

    def abandon(self, type_name: str, id_: int) -> bool:
        """Make the pending object ``id_`` unable ever to go live; False if it is not pending."""
        ...


class UniqueStatements(Statements):
    """The statements of a shard's ``unique_keys`` table (parameters in the order named).

    - claim (name, value, object_id, claimed_ms); get (name, value): object_id, claimed_ms;
    - take (object_id, claimed_ms, name, value, old object_id, old claimed_ms): a claim over a dead row;
    - release (name, value, object_id); drop (name, value, object_id, claimed_ms): a release that
      only the row as read passes; scan (name): name, value, object_id, claimed_ms.
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
        self._add("release", delete(t).where(key, t.c.object_id == p("oid")), ["name", "value", "oid"])
        drop = delete(t).where(key, t.c.object_id == p("oid"), t.c.claimed_ms == p("ms"))
        self._add("drop", drop, ["name", "value", "oid", "ms"])
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
    #: (key, value, owner) of rows whose owner does not hold the value (dead, or renamed away).
    dead_owners: list[tuple[str, str, int]] = field(default_factory=list)
    #: (key, value, object ID) of values a live object holds with no row.
    unclaimed: list[tuple[str, str, int]] = field(default_factory=list)


class Claimed(NamedTuple):
    """A claim made: its time, and whether the row is the claim's own (see `UniqueKeys.claim_row`)."""

    ms: int
    fresh: bool


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
        self,
        *,
        config: StoreConfig,
        router: Router,
        engines: Engines,
        cache: ObjectCache | None,
        prefix: str,
        steps: Steps | None = None,
    ) -> None:
        self._config = config
        self._steps = steps or Steps()
        self._router = router
        self._engines = engines
        self._cache = cache
        self._prefix = prefix + "k:"
        self._by_type: dict[str, list[UniqueSpec]] = {}
        for spec in config.unique.values():
            self._by_type.setdefault(spec.type, []).append(spec)
        self._stmts: dict[str, UniqueStatements] = {}

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

    def held_by(self, type_name: str, data: Mapping[str, Any]) -> list[Claim]:
        """The values ``data`` holds that a key can hold (a value no key can hold, stored before the
        key was configured, is left out rather than refused)."""
        out: list[Claim] = []
        for spec in self._by_type.get(type_name, ()):
            try:
                c = self.claim_of(spec, data.get(spec.field))
            except DataError:
                continue
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

    def claim(self, c: Claim, owner: int, *, holders: Holders) -> int:
        """Take ``c`` in the name of object ``owner``; the claim's time (milliseconds).

        A row another object holds is asked about (``holders``, see the
        module's text) and taken over only if that object cannot be holding
        the value. Raises `DuplicateKeyError` if another object holds it,
        may still come to (a create or rename under way), or an earlier
        version's create left it with owner 0.
        """
        return self.claim_row(c, owner, holders=holders).ms

    def claim_row(self, c: Claim, owner: int, *, holders: Holders) -> Claimed:
        """`claim`, saying whether the row is this claim's own (new, or taken from another object)
        or was ``owner``'s already (then renewed: another write of the same object may rely on
        it, so only a compare-and-set on its time may drop it, and a refused write leaves it)."""
        return self._steps(f"claim {c.spec.name}", lambda: self._claim(c, owner, holders))

    def _claim(self, c: Claim, owner: int, holders: Holders) -> Claimed:
        h, sql, stmts = self._where(c.spec.name, c.value)
        for _attempt in range(5):
            ms = _now_ms()
            params = {"name": c.spec.name, "value": c.value, "oid": owner, "ms": ms}
            try:
                h.write(sql["claim"], stmts.args("claim", params))
                self._invalidate([c])  # a cached "free" must not outlive the claim
                return Claimed(ms, True)
            except BackendError as exc:
                if not exc.duplicate:
                    raise
            row = h.read(sql["get"], (c.spec.name, c.value), one=True)
            if row is None:
                continue  # released meanwhile: claim again
            holder, claimed_ms = int(row[0]), int(row[1])
            ours = holder == owner
            if ours or self._free(c, holder, claimed_ms, ms, holders):
                # Ours already (a rename back to a value it kept), or free to take: either
                # way a compare-and-set on what was read, so that a takeover decided on an
                # older look at the holder cannot win. A renewal moves the time on strictly:
                # a drop decided on the time before it then misses.
                ms = max(ms, claimed_ms + 1)
                took = h.write(sql["take"], (owner, ms, c.spec.name, c.value, holder, claimed_ms))
                if took:
                    self._invalidate([c])
                    return Claimed(ms, not ours)
                continue  # changed hands meanwhile: look again
            raise DuplicateKeyError(
                f"{c.spec.field} {c.text!r} is taken ({c.spec.name}, held by "
                f"{holder if holder else 'a create of an earlier version; run store relations repair'}"
                "); pick another value",
                key=c.spec.name,
                value=c.text,
                owner=holder,
            )
        raise DuplicateKeyError(
            f"{c.spec.field} {c.text!r} ({c.spec.name}) kept changing hands while claimed; try again",
            key=c.spec.name,
            value=c.text,
            owner=0,
        )

    def _free(self, c: Claim, holder: int, claimed_ms: int, now_ms: int, holders: Holders) -> bool:
        """Whether the row (``holder``, ``claimed_ms``) may be taken over: its holder cannot hold ``c``."""
        if holder == 0:
            return False  # an earlier version's create: nobody can tell who holds it
        old = claimed_ms < now_ms - CLAIM_GRACE_S * 1000
        state, data = holders.holder(c.spec.type, holder)
        if state is Holder.DEAD:
            return True
        if state is Holder.PENDING:
            # A create under way, or one that died: once past the grace period it is
            # abandoned (it can never go live after this), and then the row is free.
            return old and (holders.abandon(c.spec.type, holder) or self._dead(c, holder, holders))
        assert data is not None
        return old and self.held(c.spec, data) != c.value

    @staticmethod
    def _dead(c: Claim, holder: int, holders: Holders) -> bool:
        return holders.holder(c.spec.type, holder)[0] is Holder.DEAD

    def held(self, spec: UniqueSpec, data: Mapping[str, Any]) -> bytes | None:
        """The value of ``spec`` that ``data`` holds (None: none, or none a key can hold)."""
        try:
            c = self.claim_of(spec, data.get(spec.field))
        except DataError:
            return None
        return None if c is None else c.value

    def owner_of(self, c: Claim) -> tuple[int, int] | None:
        """(owner, claimed time) of ``c``'s row, read from its master; None if there is none. One
        step, "read row"."""

        def read() -> tuple[int, int] | None:
            h, sql, _stmts = self._where(c.spec.name, c.value)
            row = h.read(sql["get"], (c.spec.name, c.value), one=True)
            return None if row is None else (int(row[0]), int(row[1]))

        return self._steps("read row", read)

    def drop(self, c: Claim, owner: int, claimed_ms: int) -> None:
        """Give up ``c`` if its row is still ``owner``'s claim made at ``claimed_ms``: one step."""

        def drop() -> None:
            h, sql, _stmts = self._where(c.spec.name, c.value)
            h.write(sql["drop"], (c.spec.name, c.value, owner, claimed_ms))
            self._invalidate([c])

        self._steps(f"release {c.spec.name}", drop)

    def release(self, claims: Iterable[Claim], owner: int) -> None:
        """Give up each of ``claims`` if ``owner`` holds it: one step each."""
        for c in claims:
            self._steps(f"release {c.spec.name}", lambda c=c: self._release(c, owner))  # type: ignore[misc]

    def _release(self, c: Claim, owner: int) -> None:
        h, sql, _stmts = self._where(c.spec.name, c.value)
        h.write(sql["release"], (c.spec.name, c.value, owner))
        self._invalidate([c])

    # -- reads -----------------------------------------------------------------------------

    def lookup(self, name: str, value: str | int, *, holders: Holders) -> int | None:
        """The ID of the live object whose unique key ``name`` is ``value``, or None.

        The row names a candidate; on a cache miss its object is read too: the
        answer is a live object that holds the value, or that claimed it
        within the grace period (a rename under way holds both names for a
        moment, never neither); never a create still pending, a deleted
        object, or a rename that claimed the value and died long ago. A
        value `lookup` answers for is one `create` refuses.
        """
        spec = self._spec(name)
        found = self.claim_of(spec, value)
        if found is None:
            raise DataError(f"lookup of {name} needs a value, got None")
        raw = found.value
        if self._cache is None:
            return self._read_owner(spec, raw, holders)
        key = self.cache_key(name, raw)

        def load(_missing: list[str]) -> dict[str, bytes]:
            owner = self._read_owner(spec, raw, holders)
            return {} if owner is None else {key: b"%d" % owner}

        got = self._cache.get_many([key], load, logged=False).get(key)  # key writes are not logged
        return None if got is None else int(got)

    def _read_owner(self, spec: UniqueSpec, value: bytes, holders: Holders) -> int | None:
        h, sql, _stmts = self._where(spec.name, value)
        row = h.read(sql["get"], (spec.name, value), one=True)
        if row is None or not int(row[0]):
            return None
        owner, claimed_ms = int(row[0]), int(row[1])
        state, data = holders.holder(spec.type, owner)
        if state is not Holder.LIVE or data is None:
            return None
        young = claimed_ms >= _now_ms() - CLAIM_GRACE_S * 1000
        return owner if young or self.held(spec, data) == value else None

    def invalidate(self, claims: Iterable[Claim]) -> None:
        """Drop the cached lookups of ``claims`` (after the commit that made their object hold them)."""
        self._invalidate(claims)

    # -- repair ----------------------------------------------------------------------------

    def rows(
        self, name: str, shards: Collection[int] | None = None
    ) -> Iterable[tuple[bytes, int, int, ShardHandle]]:
        """Every row of key ``name`` (on ``shards`` only, if given): (value, object_id, claimed_ms, where)."""
        for r in self._router.shard_map:
            for shard in r.shards():
                if shards is not None and shard not in shards:
                    continue
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
        self,
        objects: Callable[[str], Iterable[tuple[int, dict[str, Any]]]],
        *,
        holders: Holders,
        dry_run: bool = False,
        shards: Collection[int] | None = None,
    ) -> UniqueRepairReport:
        """Make every unique key's rows match the live objects.

        ``objects(type_name)`` yields every live object of the type (on
        ``shards``, if given: then only the rows stored on ``shards`` are
        scanned, and a value an object there holds whose row belongs on
        another shard is looked up there, and added if it has none). A row
        whose owner is dead (deleted, absent, or a pending create, which is
        abandoned first so it can never go live) goes at once, or is
        pointed at the one live object that holds its value; a row whose
        live owner does not hold its value is treated so once it is older
        than the grace period (a rename may still be under way), as is a
        row of owner 0 (an earlier version's create). A value one live
        object holds with no row gets one. A value several live objects
        hold is reported, not changed.
        """
        report = UniqueRepairReport()
        old_ms = _now_ms() - int(CLAIM_GRACE_S * 1000)
        for spec in self._config.unique.values():
            holding: dict[bytes, list[int]] = {}
            for id_, data in objects(spec.type):
                value = self.held(spec, data)
                if value is not None:
                    holding.setdefault(value, []).append(id_)
            rows: dict[bytes, tuple[int, int, ShardHandle]] = {}
            for value, oid, ms, h in self.rows(spec.name, shards):
                rows[value] = (oid, ms, h)
                report.checked += 1
            for value, (oid, ms, h) in rows.items():
                ids = holding.get(value, [])
                if oid in ids or not self._unbacked(spec, value, oid, ms, old_ms, holders, dry_run):
                    continue
                c = Claim(spec, value)
                if oid != 0:
                    report.dead_owners.append((spec.name, value.decode(errors="replace"), oid))
                if len(ids) == 1:
                    report.repointed[spec.name] = report.repointed.get(spec.name, 0) + 1
                    if not dry_run:
                        sql = self._stmts_for(h).for_shard(h.shard)
                        h.write(sql["take"], (ids[0], _now_ms(), spec.name, value, oid, ms))
                        self._invalidate([c])
                elif not ids:
                    report.removed[spec.name] = report.removed.get(spec.name, 0) + 1
                    if not dry_run:
                        sql = self._stmts_for(h).for_shard(h.shard)
                        h.write(sql["drop"], (spec.name, value, oid, ms))
                        self._invalidate([c])
            for value, ids in holding.items():
                if len(ids) > 1:
                    report.conflicts.append((spec.name, value.decode(), sorted(ids)))
                    continue
                if value in rows or self._row_elsewhere(spec, value, shards):
                    continue
                report.added[spec.name] = report.added.get(spec.name, 0) + 1
                report.unclaimed.append((spec.name, value.decode(errors="replace"), ids[0]))
                if not dry_run:
                    h, sql, stmts = self._where(spec.name, value)
                    params = {"name": spec.name, "value": value, "oid": ids[0], "ms": _now_ms()}
                    try:
                        h.write(sql["claim"], stmts.args("claim", params))
                    except BackendError as exc:
                        if not exc.duplicate:
                            raise
                    self._invalidate([Claim(spec, value)])
        return report

    def _row_elsewhere(self, spec: UniqueSpec, value: bytes, shards: Collection[int] | None) -> bool:
        """Whether ``value``'s row exists on a shard outside ``shards`` (its own repair checks it)."""
        if shards is None or key_shard(spec.name, value, self._router.shard_map.shards) in shards:
            return False  # scanned already
        h, sql, _stmts = self._where(spec.name, value)
        return h.read(sql["get"], (spec.name, value), one=True) is not None

    def _unbacked(
        self,
        spec: UniqueSpec,
        value: bytes,
        oid: int,
        ms: int,
        old_ms: int,
        holders: Holders,
        dry_run: bool,
    ) -> bool:
        """Whether the row (``oid``, ``ms``) of ``value`` backs nothing and may be fixed now."""
        if oid == 0:
            return ms < old_ms  # an earlier version's create: it may still be under way
        state, data = holders.holder(spec.type, oid)
        if state is Holder.LIVE:
            assert data is not None
            # Backed after all (it took the value after the scan), or a rename may still be under way.
            return self.held(spec, data) != value and ms < old_ms
        if state is Holder.PENDING and not dry_run:
            # A create that died (or one under way, which then starts again): it must never go
            # live holding a value its row no longer promises it.
            return holders.abandon(spec.type, oid) or holders.holder(spec.type, oid)[0] is Holder.DEAD
        return True
