"""The `ListBackend` on Redis: a sorted set per list, a meta and a version key.

All members have score 0 and sort by their bytes (`encode_member`), so one
``ZRANGE ... BYLEX`` serves a cursor page and one ``ZRANGE`` by rank serves an
offset page. A read is one Lua call (meta, version, members: one command, one
reply to parse), so it never sees a list half dropped. A fill is one Lua script that checks the
version and replaces the list; an invalidation is one MULTI/EXEC that bumps
the version and drops the list.

redis-py's defaults are unsafe for a cache (no socket timeout; retries that
stretch a dead server into seconds): this client has explicit short
timeouts, no retries, and a `Breaker`. An invalidation that fails marks the
cache dirty: before it is used again, every key under the store's prefix is
dropped (SCAN + UNLINK, so a shared database is safe).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from store.cache.lists import ListRead
from store.cache.stats import Breaker, CacheStats

__all__ = ["RedisListBackend"]

# KEYS: list, meta, version. ARGV: version seen ("" for none), n, ttl, read ms, members...
_FILL = """
local v = redis.call('GET', KEYS[3])
if (v or '') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
local ttl = tonumber(ARGV[3])
local batch = {}
for i = 5, #ARGV do
  batch[#batch + 1] = 0
  batch[#batch + 1] = ARGV[i]
  if #batch >= 1000 then
    redis.call('ZADD', KEYS[1], unpack(batch))
    batch = {}
  end
end
if #batch > 0 then redis.call('ZADD', KEYS[1], unpack(batch)) end
if #ARGV >= 5 then redis.call('EXPIRE', KEYS[1], ttl) end
redis.call('SET', KEYS[2], ARGV[2] .. ':' .. (#ARGV - 4) .. ':' .. ARGV[4], 'EX', ttl)
return 1
"""

# KEYS: list, meta, version. ARGV: kind (rank, after, meta), then for rank: start, stop, desc;
# for after: member, limit, desc. Returns {meta, version, members}.
_READ = """
local meta = redis.call('GET', KEYS[2])
local ver = redis.call('GET', KEYS[3])
local members = {}
local kind = ARGV[1]
if kind == 'rank' then
  if ARGV[4] == '1' then
    members = redis.call('ZRANGE', KEYS[1], ARGV[2], ARGV[3], 'REV')
  else
    members = redis.call('ZRANGE', KEYS[1], ARGV[2], ARGV[3])
  end
elseif kind == 'after' then
  if ARGV[4] == '1' then
    members = redis.call('ZRANGE', KEYS[1], '(' .. ARGV[2], '-', 'BYLEX', 'REV', 'LIMIT', 0, ARGV[3])
  else
    members = redis.call('ZRANGE', KEYS[1], '(' .. ARGV[2], '+', 'BYLEX', 'LIMIT', 0, ARGV[3])
  end
end
return {meta or false, ver or false, members}
"""

#: Versions outlive the lists they guard, so a slow reader cannot see one vanish and reappear.
VERSION_TTL_S = 86_400


class RedisListBackend:
    """Relation lists in one Redis database, keys under ``prefix``."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "s:",
        timeout_s: float = 0.05,
        connect_timeout_s: float = 0.05,
        failures_to_trip: int = 3,
        cooldown_s: float = 5.0,
    ) -> None:
        self.stats = CacheStats("redis")
        self.breaker = Breaker(failures_to_trip=failures_to_trip, cooldown_s=cooldown_s)
        self.prefix = prefix
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        self._fill = self.client.register_script(_FILL)
        self._read = self.client.register_script(_READ)
        self._clean_lock = threading.Lock()

    def _keys(self, key: str) -> tuple[str, str, str]:
        return key, key + ":m", key + ":v"

    def _guard(self) -> bool:
        if not self.breaker.allow():
            self.stats.add(skipped=1)
            return False
        if self.breaker.dirty:
            # Cleaning scans the keyspace: do it off the request path and
            # treat the cache as absent until it is done.
            self.stats.add(skipped=1)
            if self._clean_lock.acquire(blocking=False):
                self._clean_lock.release()
                threading.Thread(target=self._clean, name="store-redis-clean", daemon=True).start()
            return False
        return True

    def _failed(self, exc: Exception) -> None:
        if isinstance(exc, redis.TimeoutError):
            self.breaker.trip()  # a hung server already cost a whole timeout
        else:
            self.breaker.failure()
        self.stats.error("redis", exc)

    def read(self, key: str, op: tuple[object, ...]) -> ListRead | None:
        """Meta, version and selected members in one Lua call; None on failure."""
        if not self._guard():
            return None
        try:
            meta_raw, version, members = self._read(keys=self._keys(key), args=_read_args(op))
        except redis.RedisError as exc:
            self._failed(exc)
            return None
        self.breaker.success()
        meta, read_ms = None, 0
        if meta_raw is not None:
            parts = meta_raw.split(b":")
            meta = (int(parts[0]), int(parts[1]))
            read_ms = int(parts[2]) if len(parts) > 2 else 0  # no time: an entry from before, too old
        return ListRead(meta, members if isinstance(members, list) else [], version, read_ms)

    def fill(
        self, key: str, version: bytes | None, n: int, members: Sequence[bytes], ttl_s: int, read_ms: int
    ) -> bool:
        """Replace the list if the version is unchanged (one Lua call)."""
        if not self._guard():
            return False
        try:
            args: list[bytes | int] = [version or b"", n, ttl_s, read_ms, *members]
            done = self._fill(keys=list(self._keys(key)), args=args)
        except redis.RedisError as exc:
            self._failed(exc)
            return False
        self.breaker.success()
        return bool(done)

    def invalidate(self, keys: Sequence[str], ttl_s: int) -> None:
        """Bump versions and drop lists; on failure, mark the cache dirty."""
        if not self.breaker.allow():
            self.stats.add(skipped=1)
            self.breaker.dirty = True
            return
        try:
            pipe = self.client.pipeline(transaction=True)
            for key in keys:
                lkey, mkey, vkey = self._keys(key)
                pipe.incr(vkey)
                pipe.expire(vkey, VERSION_TTL_S)
                pipe.delete(lkey, mkey)
            pipe.execute()
        except redis.RedisError as exc:
            self._failed(exc)
            self.breaker.dirty = True
            return
        self.breaker.success()

    def _clean(self) -> bool:
        """Drop every cached list (not the versions) after a lost invalidation."""
        with self._clean_lock:
            if not self.breaker.dirty:
                return True
            try:
                batch: list[Any] = []
                for k in self.client.scan_iter(match=self.prefix + "l:*", count=1000):
                    if not k.endswith(b":v"):
                        batch.append(k)
                    if len(batch) >= 500:
                        self.client.unlink(*batch)
                        batch = []
                if batch:
                    self.client.unlink(*batch)
            except redis.RedisError as exc:
                self._failed(exc)
                return False
            self.breaker.dirty = False
            return True

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()


def _read_args(op: tuple[object, ...]) -> list[Any]:
    """The read script's arguments for ``op`` (see `ListBackend.read`)."""
    kind = op[0]
    if kind == "meta":
        return ["meta"]
    _k, a, b, desc = op
    return [kind, a, b, "1" if desc else "0"]
