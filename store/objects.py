"""Objects: `ObjectService` (IDs, routing, the object cache) over `ObjectRepository` (rows, SQL).

The service routes and caches: it turns 64-bit IDs into shards and local
ids, reads through the object cache, batches reads by host, claims unique
values, and invalidates after each write. The repository
(`store.object_rows`, whose names this module still exports) knows shards,
tables and local ids, never 64-bit IDs or the map.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, Protocol

import store.unique as _keys
from store import green
from store.cache.follower import log_entries
from store.cache.leases import ObjectCache, nothing_owed
from store.config import StoreConfig
from store.engines import Engines, ShardHandle
from store.exceptions import (
    ConflictError,
    DataError,
    DuplicateKeyError,
    IdError,
    NotFound,
    ShardFullError,
    StoreError,
    UnknownTypeError,
    WriteTimeoutError,
    brief,
)
from store.ids import MAX_ID, encode_pinterest, makes_ids_again
from store.object_rows import ObjectRepository, Updater, Versioned, applied
from store.relations.inputs import id_list
from store.relations.service import RelationService
from store.routing import MAX_LOCAL_ID, Router
from store.specs import TypeSpec
from store.steps import Steps
from store.unique import Claim, Claimed, Holder, UniqueKeys

__all__ = ["ObjectRepository", "ObjectService", "Sweep", "Updater", "Versioned"]

#: A create whose pending row is abandoned before it goes live (a repair ran) starts over this often.
_CREATE_ATTEMPTS = 3


class Sweep(Protocol):
    """What takes a deleted object out of its lists (`store.relations.bulk.BulkPairs`)."""

    def lists_read(self, type_name: str, obj: int, h: ShardHandle) -> tuple[str, list[int]] | None:
        """The query of the first page of the object's lists on ``h``, to run with the mark; None
        if its type has none."""
        ...

    def remove_object(self, type_name: str, obj: int, first: Sequence[Sequence[Any]] | None = None) -> int:
        """Take the object out of its lists (``first``: the rows `lists_read`'s query read); pairs
        removed."""
        ...


class _KeysMovedError(Exception):
    """The object's unique values under the lock are not the ones claimed: claim again."""


class ObjectService:
    """Objects by 64-bit ID: routed, cached aside, batched by host; a delete also empties their lists.

    Reads look in the object cache first (one round trip per cache server
    for a batch) and read only the misses, one query per host (per shard
    where each shard has a pool of its own). Writes commit first, then
    invalidate; a create is a write too where an ID can be made again (a
    Pinterest local id after a reset or a restore from an older backup; see
    `makes_ids_again`).
    """

    def __init__(
        self,
        *,
        config: StoreConfig,
        router: Router,
        engines: Engines,
        repo: ObjectRepository,
        relations: RelationService,
        cache: ObjectCache | None,
        prefix: str,
        unique: UniqueKeys | None = None,
        steps: Steps | None = None,
        sweep: Sweep,
    ) -> None:
        self._config = config
        self._steps = steps or Steps()
        self._unique = unique
        self._router = router
        self._engines = engines
        self.repo = repo
        self._relations = relations
        #: Takes a deleted object out of its lists (`BulkPairs`).
        self._sweep = sweep
        self._cache = cache
        self._prefix = prefix
        self._instagram = config.ids == "instagram"
        #: A plain create drops the caches' entries under its new ID only where IDs repeat.
        self._ids_again = makes_ids_again(config.ids)
        self._object_prefix = prefix + "o:"

    # -- writes ----------------------------------------------------------------
    #
    # Each write is a plan of steps (`store.steps`): one statement or transaction on one
    # shard each, routed when it runs, run again alone if its shard moved. The first step
    # that commits the object decides the call's result; later steps (unique keys, lists)
    # finish or are left for `store relations repair`, and never apply ``changes`` again.

    def _at(self, shard: int) -> ShardHandle:
        """The handle of ``shard`` on its master by the map current now (each step routes anew)."""
        return self._engines.shard(shard, self._router.shard_map.master(shard))

    def create(self, type_name: str, data: dict[str, Any], *, near: int | None, shard: int | None) -> int:
        """Store a new object on the shard ``near``/``shard`` name (else a random open one); its ID.

        Without unique keys, one step: the insert. With them: insert the object pending,
        claim each key in its new ID's name, make it live (see `store.unique`).
        """
        spec = self._router.type(type_name)
        text = self.repo.encode(data)
        if near is not None and shard is not None:
            raise IdError("give near= or shard=, not both")
        shards = self._router.shard_map.shards
        if near is not None:
            # An object's ID (of any type), not just any number with shard bits: routed in full.
            if self._instagram:
                if near == 0:
                    raise IdError("near=0 is no object's ID; pass the ID of the object to sit beside")
                target = self._router.shard_of(near)
            else:
                target = self._router.route(near)[0]
        elif shard is not None:
            if type(shard) is not int or not 0 <= shard < shards:
                raise IdError(f"shard must be an int in 0..{shards - 1}, got {brief(shard)}")
            target = shard
        else:
            target = self._router.pick_shard()
        unique = self._unique
        claims = unique.claims(spec.name, data) if unique is not None else []
        if claims:
            assert unique is not None
            return self._create_claimed(unique, claims, spec, target, text)
        new, _key = self._steps("insert", lambda: self._insert(spec, target, text, pending=False))
        if self._ids_again:
            self._created(new, spec)
        self._steps.mark("created")
        return new

    def _create_claimed(
        self, unique: UniqueKeys, claims: list[Claim], spec: TypeSpec, target: int, text: str
    ) -> int:
        """Insert pending, claim every key in the new ID's name, then make the object live."""
        for _attempt in range(_CREATE_ATTEMPTS):
            new, key = self._steps("insert pending", lambda: self._insert(spec, target, text, pending=True))
            claimed: list[Claim] = []
            try:
                for c in claims:
                    unique.claim(c, new, holders=self)
                    claimed.append(c)
                live = self._steps(
                    "activate",
                    lambda key=key: self.repo.activate(self._at(target), spec.table, key),  # type: ignore[misc]
                )
            except BaseException:
                # Nothing went live: the pending row goes, and so do the claims made in its name.
                self._undo_create(unique, claimed, new, spec, target, key)
                raise
            if live:
                # (whatever the IDs: a read of the object, by a lookup of a key claimed in
                # its name, may have cached its absence while it was pending)
                self._created(new, spec)
                unique.invalidate(claimed)  # a lookup that read the row while it was pending said None
                self._steps.mark("created")
                return new
            # Abandoned before it went live (by `store relations repair`, or a takeover after
            # a stall past the grace period): its claims are not to be trusted; start again.
            self._undo_create(unique, claimed, new, spec, target, key)
        raise WriteTimeoutError(
            f"the create of a {spec.name} was abandoned {_CREATE_ATTEMPTS} times before it went live "
            "(a repair running, or the database stalling past the claims' grace period); try again"
        )

    def _undo_create(
        self, unique: UniqueKeys, claimed: list[Claim], new: int, spec: TypeSpec, target: int, key: int
    ) -> None:
        """Best effort: whatever is left is a row of a dead object that claims and repair take over."""
        with contextlib.suppress(StoreError):
            self._steps("remove pending", lambda: self.repo.remove(self._at(target), spec.table, key))
        with contextlib.suppress(StoreError):
            unique.release(claimed, new)

    def _insert(self, spec: TypeSpec, target: int, text: str, *, pending: bool) -> tuple[int, int]:
        """Insert on ``target``'s master (as the map is now): (the new ID, its row's key)."""
        h = self._at(target)
        key = self.repo.insert(h, spec.table, text, pending=pending)
        if self._instagram:
            return key, key  # the database made the whole ID
        if key > MAX_LOCAL_ID:
            self.repo.remove(h, spec.table, key)
            raise ShardFullError(
                f"shard {target} table {spec.table} has used all {MAX_LOCAL_ID} local ids; "
                "create the object on another shard"
            )
        return encode_pinterest(target, spec.id, key), key

    def _created(self, new: int, spec: TypeSpec) -> None:
        """A create is a write: drop whatever the caches hold under the new ID.

        The object's entry and its lists are in two caches: the memcached delete is sent first
        and its reply read after the lists' (one round trip for both, where each took one).
        """
        lists = [(r.name, new) for r in self._config.relations.values() if r.from_type == spec.name]
        finish = self._invalidate_begin(new, spec)
        try:
            self._relations.invalidate(lists)
        finally:
            finish()

    # -- the objects that unique-key rows name (`store.unique.Holders`) ----------------

    def holder(self, type_name: str, id_: int) -> tuple[Holder, dict[str, Any] | None]:
        """What object ``id_`` is now (live, pending or dead), and its data if live."""
        try:
            shard, spec, key, _host = self._router.route(id_, type_name)
        except IdError:
            return Holder.DEAD, None  # no object of this type can have that ID
        got = self._steps("read holder", lambda: self.repo.state(self._at(shard), spec.table, key))
        if got is None:
            return Holder.DEAD, None
        live, version, text = got
        if live:
            return Holder.LIVE, self.repo.decode(text)
        return (Holder.PENDING if version == 0 else Holder.DEAD), None

    def abandon(self, type_name: str, id_: int) -> bool:
        """Make the pending object ``id_`` unable ever to go live; False if it is not pending."""
        try:
            shard, spec, key, _host = self._router.route(id_, type_name)
        except IdError:
            return False
        return self._steps("abandon", lambda: self.repo.abandon(self._at(shard), spec.table, key))

    def update(
        self,
        id: int,  # noqa: A002
        changes: Updater,
        *,
        type_name: str | None,
        if_version: int | None = None,
    ) -> dict[str, Any]:
        """Merge ``changes`` into the object under a row lock, in one transaction; the new object."""
        if not callable(changes) and not isinstance(changes, dict):
            raise DataError(f"changes must be a dict or a function old -> new, got {type(changes).__name__}")
        if if_version is not None and (type(if_version) is not int or not 1 <= if_version <= MAX_ID):
            raise DataError(
                f"if_version must be a version from get_with_version (an int >= 1), got {brief(if_version)}"
            )
        shard, spec, local_id, _host = self._router.route(id, type_name)
        if isinstance(changes, dict):
            # Whatever the merge would refuse is in the changes: refused here, before any I/O.
            self.repo.encode(changes)
        unique = self._unique
        if unique is None or not unique.indexes(spec.name):
            try:
                return self._steps(
                    "update",
                    lambda: self.repo.update(
                        self._at(shard),
                        spec.table,
                        local_id,
                        changes,
                        what=str(id),
                        if_version=if_version,
                        logged=self._logged(id, spec),
                    ),
                )
            finally:
                # Also after a failure: the commit may have happened before the
                # error (a lost connection), and a needless delete is harmless.
                self._invalidate(id, spec)
        deadline = time.monotonic() + self._config.write_timeout_s
        for attempt in itertools.count(1):
            try:
                return self._update_keyed(unique, shard, spec, local_id, id, changes, if_version)
            except _KeysMovedError:
                pass  # the object changed between the claim and the lock: claim again
            finally:
                self._invalidate(id, spec)
            if time.monotonic() >= deadline:
                raise WriteTimeoutError(
                    f"object {id} kept changing its unique values while this update claimed them "
                    f"({attempt} attempts in write_timeout_s = {self._config.write_timeout_s:g} s); "
                    "nothing of this update was written"
                )
            # Writers that keep missing each other's values: apart by a random, growing pause.
            green.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))
        raise AssertionError("unreachable")

    def _update_keyed(
        self,
        unique: UniqueKeys,
        shard: int,
        spec: TypeSpec,
        local_id: int,
        id_: int,
        changes: Updater,
        if_version: int | None,
    ) -> dict[str, Any]:
        """An update of an object with unique keys: read, claim the new values, write, free the old.

        The steps: read the object; apply ``changes`` and claim the values
        it adds, in the object's name (never while the row lock is held: on
        SQLite a key's shard may be the object's own file); lock and write,
        where the values the write adds must be the ones claimed (else
        everything is undone and `_KeysMovedError` raised); after the commit,
        release the values the write dropped, as read under the lock. If the
        object is still at the version read, ``changes`` is not applied again
        under the lock: a function runs once per attempt, and an attempt runs
        again only if another writer changed the object's unique values.
        """
        seen = self._steps("read", lambda: self.repo.get_with_version(self._at(shard), spec.table, local_id))
        if seen is None:
            raise NotFound(f"no live object {id_}")
        if if_version is not None and seen[1] != if_version:
            raise ConflictError(
                f"object {id_} is at version {seen[1]}, not {if_version}: it changed since it was "
                "read; read it again (get_with_version) and retry",
                expected=if_version,
                actual=seen[1],
            )
        old = self.repo.decode(seen[0])
        new = applied(changes, old, str(id_))
        self.repo.encode(new)  # data the write would refuse is refused before any claim
        before = {c.spec.name: c for c in unique.claims(spec.name, old)}
        after = {c.spec.name: c for c in unique.claims(spec.name, new)}
        wanted = [c for name, c in after.items() if before.get(name) != c]
        # The rows of the values this write drops, as they are before it: after the commit each
        # goes only if it is still that row (a later write of this object may renew it and
        # hold the value again; a renewal moves the row's time on).
        rows = {c: unique.owner_of(c) for name, c in before.items() if after.get(name) != c}
        claimed: dict[Claim, Claimed] = {}
        claimed_at = time.monotonic()
        dropped: list[Claim] = []
        added: list[Claim] = []

        def check(locked_old: dict[str, Any], locked_new: dict[str, Any]) -> None:
            self._steps.mark("locked")
            now_before = {c.spec.name: c for c in unique.claims(spec.name, locked_old)}
            now_after = {c.spec.name: c for c in unique.claims(spec.name, locked_new)}
            needed = [c for name, c in now_after.items() if now_before.get(name) != c]
            gone = [c for name, c in now_before.items() if now_after.get(name) != c]
            if any(c not in claimed for c in needed) or any(c not in rows for c in gone):
                raise _KeysMovedError
            if needed and time.monotonic() - claimed_at > _keys.CLAIM_GRACE_S / 2:
                # Claimed long ago (a stall): a takeover may have passed; look before writing.
                for c in needed:
                    row = unique.owner_of(c)
                    if row is None or row[0] != id_:
                        raise _KeysMovedError
            # (As of this attempt: a transaction run again after a deadlock checks again.)
            dropped[:] = gone
            added[:] = needed

        try:
            for c in wanted:
                claimed[c] = unique.claim_row(c, id_, holders=self)
            result = self._steps(
                "write",
                lambda: self.repo.update(
                    self._at(shard),
                    spec.table,
                    local_id,
                    changes,
                    what=str(id_),
                    if_version=if_version,
                    before_write=check,
                    logged=self._logged(id_, spec),
                    known=(seen[1], new),
                ),
            )
        except (DataError, DuplicateKeyError, ConflictError, NotFound, _KeysMovedError):
            # Refused before the write: the claims this write made go back (a row that was the
            # object's already stays: another write of it may rely on it).
            for c, made in claimed.items():
                if made.fresh:
                    unique.drop(c, id_, made.ms)
            raise
        # Committed: what follows finishes, or is left for repair; it never writes the object again.
        unique.invalidate(added)  # a lookup between the claim and the commit found it not held yet
        for c in dropped:
            row = rows[c]
            if row is not None and row[0] == id_:
                unique.drop(c, id_, row[1])
        self._steps.mark("updated")
        return result

    def delete(self, id: int, *, type_name: str | None) -> bool:  # noqa: A002
        """Mark the object inactive, release its unique values, take it out of every list.

        Steps: the mark (with unique keys, in one transaction with a read of
        the values the object holds, under its row lock); the release of
        those values; the removal of the pairs that reach it through an
        inverse, a page of its lists at a time: a step reads the page, a
        step removes its pairs as a batch (`BulkPairs.remove_object`). The
        result is the first step's: True if the object was
        live. Run again, a delete finishes what an earlier one left.
        """
        shard, spec, local_id, _host = self._router.route(id, type_name)
        unique = self._unique
        keyed = unique is not None and bool(unique.indexes(spec.name))
        held: list[Claim] = []
        first: list[Any] | None = None  # the first page of its lists, read with the mark

        def mark() -> bool:
            nonlocal held, first
            h = self._at(shard)
            logged = self._logged(id, spec)
            read = self._sweep.lists_read(spec.name, id, h)
            if keyed:
                assert unique is not None
                was_live, data, first = self.repo.delete_held(
                    h, spec.table, local_id, logged=logged, read=read
                )
                held = [] if data is None else unique.held_by(spec.name, data)
                return was_live
            if read is None:
                return self.repo.delete(h, spec.table, local_id, logged=logged)
            was_live, first = self.repo.delete_reading(h, spec.table, local_id, read, logged=logged)
            return was_live

        try:
            was_live = self._steps("delete", mark)
        except BaseException:
            self._invalidate(id, spec)  # (the mark may have committed before the error)
            raise
        # The object's entry goes while its lists are swept: the memcached delete is sent now
        # and its reply read when the sweep is done (one round trip less).
        finish = self._invalidate_begin(id, spec)
        try:
            if unique is not None and held:
                unique.release(held, id)  # only rows this object holds: a value another took stays
            self._sweep.remove_object(spec.name, id, first)
        finally:
            finish()
        self._steps.mark("deleted")
        return was_live

    def lookup(self, name: str, value: str | int) -> int | None:
        """The ID of the live object whose unique key ``name`` is ``value``, or None."""
        if self._unique is None:
            raise UnknownTypeError(f"no unique key {brief(name)}; add a unique: section to the config")
        return self._unique.lookup(name, value, holders=self)

    # -- reads -------------------------------------------------------------------

    def get(self, id: int, *, type_name: str | None) -> dict[str, Any] | None:  # noqa: A002
        """The live object with ``id``, or None."""
        shard, spec, local_id, host = self._router.route(id, type_name)
        cache = self._cache
        if cache is None:
            text = self.repo.get(self._engines.shard(shard, host), spec.table, local_id)
            return None if text is None else self.repo.decode(text)
        key = self.key(id, spec)

        def load(_missing: list[str]) -> dict[str, bytes]:
            text = self.repo.get(self._engines.shard(shard, host), spec.table, local_id)
            return {} if text is None else {key: text.encode()}

        value = cache.get_many([key], load).get(key)
        return None if value is None else self.repo.decode(value)

    def get_with_version(self, id: int, *, type_name: str | None) -> Versioned | None:  # noqa: A002
        """The live object with ``id`` and its version, read from its master (never a cache), or None."""
        shard, spec, local_id, host = self._router.route(id, type_name)
        got = self.repo.get_with_version(self._engines.shard(shard, host), spec.table, local_id)
        return None if got is None else Versioned(self.repo.decode(got[0]), got[1])

    def get_many(
        self, ids: Iterable[int], *, type_name: str | None, bounded: bool = True
    ) -> dict[int, dict[str, Any]]:
        """Live objects by ID, absent and deleted ones left out.

        Every ID is checked before any I/O, and more than ``limits.max_ids``
        is a `LimitError` (unless not ``bounded``: the store's own reads of
        the objects of pages it read). A query carries at most ``limits.id_chunk`` IDs
        (a host given more gets several, run at once); with a cache, a call
        over that many goes through it in batches of ``id_chunk`` per master
        host, so that neither a cache batch nor a query is unbounded.
        """
        wanted = id_list(ids, "ids", unique=False, limit=self._config.max_ids if bounded else None)
        if type_name is not None:
            self._router.type(type_name)
        chunk = self._config.id_chunk
        cache = self._cache
        if cache is not None and not self._instagram:
            # The hot path (a page's objects): Pinterest IDs name their cache
            # keys, so only the misses are routed in full.
            self._router.check_ids(wanted, type_name)
            if len(wanted) <= chunk:
                return self._get_cached(cache, wanted, type_name)
            out: dict[int, dict[str, Any]] = {}
            step = self._slice(chunk)
            for k in range(0, len(wanted), step):
                out.update(self._get_cached(cache, wanted[k : k + step], type_name))
            return out
        if self._instagram:
            return self._get_instagram(cache, list(dict.fromkeys(wanted)), type_name)
        route = self._router.route
        routed = {id_: route(id_, type_name) for id_ in wanted}
        decode = self.repo.decode
        return {id_: decode(text) for id_, text in self._read_texts(routed).items()}

    def _get_instagram(
        self, cache: ObjectCache | None, wanted: list[int], type_name: str | None
    ) -> dict[int, dict[str, Any]]:
        """`get_many` of distinct Instagram IDs: each ID is its row's key, in one type's table."""
        by_host = self._router.by_host_instagram  # checks every ID, and type_name
        groups = by_host(wanted, type_name)
        if not groups:
            return {}
        assert type_name is not None  # (by_host_instagram refuses None)
        spec = self._router.type(type_name)
        decode = self.repo.decode
        if cache is None:
            return {id_: decode(text) for id_, text in self._read_by_host(groups, spec.table).items()}
        p = f"{self._object_prefix}{spec.id}:"  # `key`'s form
        keys = {f"{p}{id_}": id_ for id_ in wanted}

        def load(missing: list[str]) -> dict[str, bytes]:
            texts = self._read_by_host(by_host([keys[k] for k in missing], type_name), spec.table)
            return {f"{p}{i}": text.encode() for i, text in texts.items()}

        key_list = list(keys)
        chunk = self._config.id_chunk
        if len(key_list) <= chunk:
            return {keys[k]: decode(v) for k, v in cache.get_many(key_list, load).items()}
        found: dict[int, dict[str, Any]] = {}
        step = self._slice(chunk)
        for k in range(0, len(key_list), step):
            got = cache.get_many(key_list[k : k + step], load)
            found.update({keys[key]: decode(v) for key, v in got.items()})
        return found

    def _read_by_host(self, groups: dict[str, dict[int, list[int]]], table: str) -> dict[int, str]:
        """`_read_texts` for IDs that are their rows' keys, in one table, grouped by host and shard."""
        chunk = self._config.id_chunk
        jobs: list[Callable[[], list[Any]]] = []
        for host, shards in groups.items():
            parts = [(shard, table, ids) for shard, ids in shards.items()]
            # (one query per shard where each shard file has a pool of its own)
            batches = [[part] for part in parts] if self._engines.backend(host).pool_per_shard else [parts]
            for batch in batches:
                h = self._engines.shard(batch[0][0], host)
                for piece in _pieces(batch, chunk):
                    jobs.append(partial(self.repo.get_many_rows, h, piece))
        out: dict[int, str] = {}
        for rows in self._engines.run_all(jobs):
            for _part, key, text in rows:
                out[key] = text
        return out

    def _slice(self, chunk: int) -> int:
        """IDs per cache batch of a call over ``chunk``: about ``chunk`` per master host (one query each)."""
        return chunk * len({r.master for r in self._router.shard_map})

    def _get_cached(
        self, cache: ObjectCache, wanted: list[int], type_name: str | None
    ) -> dict[int, dict[str, Any]]:
        """Checked Pinterest IDs through the object cache; the misses routed and read."""
        route = self._router.route
        p = self._object_prefix
        by_key = {f"{p}{id_}": id_ for id_ in wanted}

        def load_ids(missing: list[str]) -> dict[str, bytes]:
            routed = {by_key[k]: route(by_key[k], type_name) for k in missing}
            return {f"{p}{i}": text.encode() for i, text in self._read_texts(routed).items()}

        decode = self.repo.decode
        return {by_key[k]: decode(v) for k, v in cache.get_many(list(by_key), load_ids).items()}

    def _read_texts(self, routed: dict[int, tuple[int, TypeSpec, int, str]]) -> dict[int, str]:
        """JSON text of live objects from the databases, one query per host (or per shard).

        A host (shard file) given more than ``limits.id_chunk`` IDs gets
        several queries of at most that many; all of them run at once.
        """
        by_host: dict[str, dict[tuple[int, str], list[int]]] = {}
        keys: dict[tuple[int, str, int], int] = {}
        for id_, (shard, spec, local_id, host) in routed.items():
            groups = by_host.get(host)
            if groups is None:
                groups = by_host[host] = {}
            group = groups.get((shard, spec.table))
            if group is None:
                group = groups[(shard, spec.table)] = []
            group.append(local_id)
            keys[(shard, spec.table, local_id)] = id_
        chunk = self._config.id_chunk
        jobs: list[Callable[[], list[tuple[int, str, int, str]]]] = []
        for host, groups in by_host.items():
            parts = [(shard, table, local_ids) for (shard, table), local_ids in groups.items()]
            # A server host answers for all its shards in one query; where
            # each shard has a pool of its own (SQLite's files), one per shard.
            if self._engines.backend(host).pool_per_shard:
                by_shard: dict[int, list[tuple[int, str, list[int]]]] = {}
                for part in parts:
                    by_shard.setdefault(part[0], []).append(part)
                batches = list(by_shard.values())
            else:
                batches = [parts]
            for batch in batches:
                h = self._engines.shard(batch[0][0], host)
                for piece in _pieces(batch, chunk):
                    jobs.append(partial(self.repo.get_many, h, piece))
        out: dict[int, str] = {}
        # Several hosts (or shard files) are asked at once, not one after another.
        for rows in self._engines.run_all(jobs):
            for shard, table, local_id, text in rows:
                out[keys[(shard, table, local_id)]] = text
        return out

    # -- cache keys ------------------------------------------------------------------

    def key(self, id: int, spec: TypeSpec) -> str:  # noqa: A002
        """The object cache's key of ``id``."""
        # A Pinterest ID carries its type; an Instagram ID does not, so its key
        # names the type: a board is never answered for a pin with its ID.
        if self._instagram:
            return f"{self._object_prefix}{spec.id}:{id}"
        return f"{self._object_prefix}{id}"

    def _logged(self, id: int, spec: TypeSpec) -> str:  # noqa: A002
        """What a write of ``id`` logs for the followers ("" where nothing is cached or logged)."""
        if self._cache is None or not self._engines.logging:
            return ""
        return log_entries(objects=[self.key(id, spec)])

    def _invalidate(self, id: int, spec: TypeSpec) -> None:  # noqa: A002
        if self._cache is not None:
            self._cache.invalidate([self.key(id, spec)])

    def _invalidate_begin(self, id: int, spec: TypeSpec) -> Callable[[], None]:  # noqa: A002
        """`_invalidate`, sent now; the returned function waits for it (call it in a ``finally``)."""
        if self._cache is None:
            return nothing_owed
        return self._cache.invalidate_begin([self.key(id, spec)])


def _pieces(parts: list[tuple[int, str, list[int]]], cap: int) -> list[list[tuple[int, str, list[int]]]]:
    """``parts`` (shard, table, local ids) cut into queries of at most ``cap`` local ids each."""
    if sum(len(ids) for _s, _t, ids in parts) <= cap:
        return [parts]
    out: list[list[tuple[int, str, list[int]]]] = []
    run: list[tuple[int, str, list[int]]] = []
    n = 0
    for shard, table, ids in parts:
        k = 0
        while k < len(ids):
            take = min(cap - n, len(ids) - k)
            run.append((shard, table, ids[k : k + take]))
            n += take
            k += take
            if n == cap:
                out.append(run)
                run, n = [], 0
    if run:
        out.append(run)
    return out
