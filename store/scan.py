"""Scans: every object of a type, shard by shard, in key order, by keyset pages through the live map.

A scan reads one page at a time: ``WHERE key > last ORDER BY key LIMIT
batch`` on one shard (the key is ``local_id`` for Pinterest IDs, the whole
``id`` for Instagram IDs), each page its own read on the shard's master as
the live map names it when the page is read. No transaction stays open
between pages, so a scan of a big table holds no locks and no snapshot.

A page refused because its shard moved (a tombstone, or the tables absent
while a move switches) read nothing: the map is reloaded and the same page,
from the same position, is read on the new host (`LiveMap.step`). The
target holds a copy with the same keys, so the scan goes on without
missing an object or returning one twice.

The position after each object is `Scan.resume_token`: a string that
`Store.scan(..., resume=token)` continues from. A token names its type and
whether deleted objects are included; it is a position, not a permission.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from store.config import StoreConfig
from store.engines import Engines
from store.exceptions import CursorError, IdError, LimitError, RoutingError, brief
from store.ids import encode_pinterest
from store.livemap import LiveMap
from store.specs import TypeSpec

__all__ = ["MAX_SCAN_BATCH", "Scan", "ScanRow", "scan_shards", "scan_token"]

#: The largest page a scan reads at once.
MAX_SCAN_BATCH = 100_000
_TOKEN_VERSION = 1
_MAX_TOKEN_CHARS = 1024
_KEY_MAX = (1 << 63) - 1


@dataclass(frozen=True)
class ScanRow:
    """One object row as a scan reads it (export needs more than ``(id, data)``)."""

    id: int
    shard: int
    key: int
    data: str
    version: int
    live: bool


def scan_shards(config: StoreConfig, shards: Iterable[int] | None) -> list[int]:
    """``shards`` checked and sorted (default: every shard); the error says which is wrong."""
    if shards is None:
        return list(range(config.shards))
    if isinstance(shards, str | bytes) or not isinstance(shards, Iterable):
        raise IdError(f"shards must be an iterable of shard numbers (a range, a list), got {brief(shards)}")
    out: set[int] = set()
    for s in shards:
        if type(s) is not int:
            raise IdError(f"shards must hold ints (shard numbers), got {brief(s)}")
        if not 0 <= s < config.shards:
            raise RoutingError(f"shard {s} is not a shard of this store: shards are 0-{config.shards - 1}")
        out.add(s)
    return sorted(out)


def scan_token(type_name: str, include_deleted: bool, shard: int, key: int) -> str:
    """The resume token of a scan of ``type_name`` positioned after row key ``key`` of ``shard``."""
    raw = orjson.dumps([_TOKEN_VERSION, type_name, int(include_deleted), shard, key])
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _decode_token(token: object, type_name: str, include_deleted: bool) -> tuple[int, int]:
    """(shard, key) of a token made by a scan of the same type with the same ``include_deleted``."""
    if type(token) is not str or len(token) > _MAX_TOKEN_CHARS:
        raise CursorError(f"resume must be a scan's resume_token (a str), got {brief(token)}")
    try:
        fields = orjson.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, TypeError) as exc:
        raise CursorError(f"resume {brief(token)} is not a scan's resume_token: pass it unchanged") from exc
    if (
        not isinstance(fields, list)
        or len(fields) != 5
        or fields[0] != _TOKEN_VERSION
        or type(fields[1]) is not str
        or fields[2] not in (0, 1)
        or type(fields[3]) is not int
        or type(fields[4]) is not int
        or not 0 <= fields[4] <= _KEY_MAX
    ):
        raise CursorError(f"resume {brief(token)} is not a scan's resume_token: pass it unchanged")
    _v, made_type, made_deleted, shard, key = fields
    if (made_type, bool(made_deleted)) != (type_name, include_deleted):
        raise CursorError(
            f"resume token was made by a scan of {brief(made_type)} with "
            f"include_deleted={bool(made_deleted)}, not of {brief(type_name)} with "
            f"include_deleted={include_deleted}: resume the same scan"
        )
    return shard, key


class Scan(Iterator[tuple[int, dict[str, Any]]]):
    """An iterator of ``(id, data)`` over every object of a type, in shard and key order.

    ``resume_token`` is the position after the last object returned (before
    the first, if none was): `Store.scan(..., resume=token)` goes on from
    there. Made by `Store.scan`; every argument is checked when it is made.
    """

    def __init__(
        self,
        *,
        config: StoreConfig,
        engines: Engines,
        live: LiveMap,
        spec: TypeSpec,
        decode: Callable[[str | bytes], dict[str, Any]],
        shards: Iterable[int] | None = None,
        batch: int = 1000,
        include_deleted: bool = False,
        resume: str | None = None,
    ) -> None:
        if type(batch) is not int or not 1 <= batch <= MAX_SCAN_BATCH:
            raise LimitError(f"batch must be an int in 1..{MAX_SCAN_BATCH}, got {brief(batch)}")
        if include_deleted is not True and include_deleted is not False:
            raise LimitError(f"include_deleted must be True or False, got {brief(include_deleted)}")
        self._config = config
        self._engines = engines
        self._live = live
        self._spec = spec
        self._decode = decode
        self._batch = batch
        self._include_deleted = include_deleted
        self._shards = scan_shards(config, shards)
        self._start: tuple[int, int] | None = None
        if resume is not None:
            self._start = _decode_token(resume, spec.name, include_deleted)
        first = self._shards[0] if self._shards else 0
        start_shard, start_key = self._start if self._start is not None else (first, 0)
        self.resume_token: str = scan_token(spec.name, include_deleted, start_shard, start_key)
        self._rows = self._walk()

    def __iter__(self) -> Scan:
        return self

    def __next__(self) -> tuple[int, dict[str, Any]]:
        row = next(self._rows)
        self.resume_token = scan_token(self._spec.name, self._include_deleted, row.shard, row.key)
        return row.id, self._decode(row.data)

    def rows(self) -> Iterator[ScanRow]:
        """The rows themselves (text, version, liveness), moving ``resume_token`` as `__next__` does."""
        for row in self._rows:
            self.resume_token = scan_token(self._spec.name, self._include_deleted, row.shard, row.key)
            yield row

    def _walk(self) -> Iterator[ScanRow]:
        for shard in self._shards:
            after = 0
            if self._start is not None:
                if shard < self._start[0]:
                    continue
                if shard == self._start[0]:
                    after = self._start[1]
            while True:
                page = self._page(shard, after)
                yield from page
                if len(page) < self._batch:
                    break
                after = page[-1].key

    def _page(self, shard: int, after: int) -> list[ScanRow]:
        """One page of ``shard`` after ``after``, read on the master the live map names now."""
        instagram = self._config.ids == "instagram"
        key = "id" if instagram else "local_id"
        # A pending object (version 0: a create that has not gone live) is no object yet.
        which = "version > 0" if self._include_deleted else "active = 1"
        type_id = self._spec.id

        def read() -> list[ScanRow]:
            h = self._engines.shard(shard, self._live.current.master(shard))
            sql = (
                f"SELECT {key}, data, version, active FROM {h.table(self._spec.table)} "
                f"WHERE {key} > {h.backend.param} AND {which} ORDER BY {key} LIMIT {int(self._batch)}"
            )
            return [
                ScanRow(
                    int(k) if instagram else encode_pinterest(shard, type_id, int(k)),
                    shard,
                    int(k),
                    str(data),
                    int(version),
                    bool(active),
                )
                for k, data, version, active in h.read(sql, (after,), one=False)
            ]

        return self._live.run(read)
