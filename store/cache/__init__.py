"""Caches: objects in memcached (or in-process), relation lists in Redis (or in-process).

The cache is never needed for correctness: every cache error or timeout is
a miss, writes commit to the database first and invalidate after, and a
reader can never put back a value that a writer's invalidation removed
(leases for objects, versions for lists). See `leases` and `lists`.
"""

from __future__ import annotations

from dataclasses import dataclass

from store.cache.leases import LeaseStore, MemoryLeaseStore, ObjectCache
from store.cache.lists import ListBackend, ListCache, MemoryListBackend
from store.cache.stats import Breaker, CacheServer, CacheServers, CacheStats
from store.config import CacheConfig
from store.naming import DEFAULT_NAMES, Names

__all__ = [
    "Breaker",
    "CacheServer",
    "CacheServers",
    "CacheStats",
    "Caches",
    "LeaseStore",
    "ListBackend",
    "ListCache",
    "MemoryLeaseStore",
    "MemoryListBackend",
    "ObjectCache",
    "build_caches",
]


@dataclass(frozen=True)
class Caches:
    """The object cache and the list cache a store uses (either may be None)."""

    objects: ObjectCache | None = None
    lists: ListCache | None = None
    prefix: str = "s:"

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters of each cache, by name."""
        out = {}
        for cache in (self.objects, self.lists):
            if cache is not None:
                out[cache.stats.name] = cache.stats.as_dict()
        return out

    def servers(self) -> dict[str, list[CacheServer]]:
        """The servers of each cache on servers, by kind (``memcached``, ``redis``); in-process caches,
        and backends that name no servers (`CacheServers`), have none."""
        out: dict[str, list[CacheServer]] = {}
        for kind, backend in (
            ("memcached", None if self.objects is None else self.objects.store),
            ("redis", None if self.lists is None else self.lists.backend),
        ):
            if isinstance(backend, CacheServers):
                out[kind] = list(backend.cache_servers())
        return out

    def last_errors(self) -> dict[str, str]:
        """The latest error of each cache that had one, by name."""
        return {
            cache.stats.name: cache.stats.last_error
            for cache in (self.objects, self.lists)
            if cache is not None and cache.stats.last_error
        }

    def close(self) -> None:
        """Release network connections."""
        for backend in (
            self.objects.store if self.objects else None,
            self.lists.backend if self.lists else None,
        ):
            close = getattr(backend, "close", None)
            if close is not None:
                close()


def build_caches(config: CacheConfig, names: Names = DEFAULT_NAMES) -> Caches:
    """The caches ``config`` asks for: memcached and/or Redis, else in-process if ``memory``.

    Keys start with ``config.prefix``, after ``NAME:`` where ``names`` has a namespace, so two
    stores of different namespaces share memcached and Redis without meeting.
    """
    prefix = names.cache_prefix(config.prefix)
    timeout_s, connect_timeout_s = config.timeout_ms / 1000, config.connect_timeout_ms / 1000
    objects: ObjectCache | None = None
    lists: ListCache | None = None
    if config.memcached:
        from store.cache.memcached import MemcachedLeaseStore

        store: LeaseStore = MemcachedLeaseStore(
            config.memcached,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            failures_to_trip=config.failures_to_trip,
            cooldown_s=config.cooldown_s,
        )
        objects = ObjectCache(
            store, ttl_s=config.ttl_s, lease_ttl_s=config.lease_ttl_s, max_stale_s=config.max_stale_s
        )
    elif config.memory:
        objects = ObjectCache(
            MemoryLeaseStore(name="memory-objects"), ttl_s=config.ttl_s, max_stale_s=config.max_stale_s
        )
    if config.redis:
        from store.cache.redis_lists import RedisListBackend, RedisListServers

        backend: ListBackend
        if len(config.redis) == 1:
            backend = RedisListBackend(
                config.redis[0],
                prefix=prefix,
                timeout_s=timeout_s,
                connect_timeout_s=connect_timeout_s,
                failures_to_trip=config.failures_to_trip,
                cooldown_s=config.cooldown_s,
            )
        else:
            backend = RedisListServers(
                config.redis,
                prefix=prefix,
                timeout_s=timeout_s,
                connect_timeout_s=connect_timeout_s,
                failures_to_trip=config.failures_to_trip,
                cooldown_s=config.cooldown_s,
            )
        lists = ListCache(
            backend, entries=config.list_entries, ttl_s=config.ttl_s, max_stale_s=config.max_stale_s
        )
    elif config.memory:
        lists = ListCache(
            MemoryListBackend(),
            entries=config.list_entries,
            ttl_s=config.ttl_s,
            max_stale_s=config.max_stale_s,
        )
    return Caches(objects, lists, prefix)
