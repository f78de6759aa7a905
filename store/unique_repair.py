"""Unique keys' rows made to match the live objects: the scan behind ``store repair`` and an import.

`repair_unique` reads every live object of each keyed type (config
``unique:``), shard by shard, and hands them to `store.unique.UniqueKeys.repair`,
which adds the missing key rows and removes those that back nothing. It
runs from the admin commands (`store.admin.repair`, `store.admin.check`)
and after an import (`store.exchange`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from store.context import HasAdminContext
from store.ids import encode_pinterest
from store.unique import UniqueRepairReport

__all__ = ["repair_unique"]


def repair_unique(
    store: HasAdminContext, *, dry_run: bool = False, shards: Iterable[int] | None = None
) -> UniqueRepairReport:
    """Make the unique keys' rows (config ``unique:``) match the live objects; see `UniqueKeys.repair`.

    Reads every live object of each keyed type, shard by shard (on ``shards`` only, if given,
    and then only the key rows stored there are scanned).
    """
    ctx = store.admin_context()
    if ctx.unique is None:
        return UniqueRepairReport()
    instagram = ctx.config.ids == "instagram"
    only = None if shards is None else frozenset(shards)

    def objects(type_name: str) -> Iterable[tuple[int, dict[str, Any]]]:
        spec = ctx.router.type(type_name)
        decode = ctx.objects.repo.decode
        for r in ctx.shard_map:
            for shard in r.shards():
                if only is not None and shard not in only:
                    continue
                h = ctx.engines.shard(shard, r.master)
                key = "id" if instagram else "local_id"
                sql = f"SELECT {key}, data FROM {h.table(spec.table)} WHERE active = 1"
                for k, text in h.read(sql, (), one=False):
                    yield (int(k) if instagram else encode_pinterest(shard, spec.id, int(k))), decode(text)

    return ctx.unique.repair(objects, holders=ctx.objects, dry_run=dry_run, shards=only)
