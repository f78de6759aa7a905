"""Every system of `store bench mix`, built by its name: the floors, the peer, the store and its variants.

A name is one `store.tools.mix.options` knows (``store:KEY=VALUE`` applies cache knobs). The run
builds each system here, and so does each worker process and each process held open at rest.
"""

from __future__ import annotations

from dataclasses import replace

from store.config import StoreConfig
from store.store import Store
from store.tools.mix.options import ASYNC_SYSTEM, MixOptions, system_config
from store.tools.mix.pg import PgFloor
from store.tools.mix.store_system import StoreSystem
from store.tools.mix.system import MixSchema, System

__all__ = ["make_system"]


def make_system(name: str, config: StoreConfig, schema: MixSchema, options: MixOptions) -> System:
    """System ``name`` (as ``--systems`` names it) over ``config``, its pools sized for the run."""
    pool = max(options.threads)
    pg = config.ids == "instagram"
    if name == "floor":
        from store.tools.mix.floor import Floor

        floor = PgFloor if pg else Floor
        return floor(schema, memcached=list(config.cache.memcached), redis_url=config.cache.redis[0])
    if name == "floor:promised":
        from store.tools.mix.promised import PromisedFloor
        from store.tools.mix.promised_pg import PgPromisedFloor

        promised = PgPromisedFloor if pg else PromisedFloor
        return promised(schema, memcached=list(config.cache.memcached), redis_url=config.cache.redis[0])
    if name == "horizontal_shard":
        from store.tools.mix.peer import ShardedPeer
        from store.tools.mix.peer_pg import PgShardedPeer

        peer = PgShardedPeer if pg else ShardedPeer
        return peer(schema, pool_size=pool)
    if name == ASYNC_SYSTEM:
        from store.tools.mix.async_system import AsyncStoreSystem

        size = options.async_pool if options.async_pool is not None else max(config.pool_size, pool)
        return AsyncStoreSystem(
            Store(replace(config, pool_size=size, pool_overflow=options.async_overflow)),
            name=name,
            max_workers=options.async_workers,
            io=options.async_io,
            loop=options.async_loop,
        )
    cfg = system_config(name, config, options)
    assert cfg is not None
    return StoreSystem(Store(replace(cfg, pool_size=max(cfg.pool_size, pool))), name=name)
