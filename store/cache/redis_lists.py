"""The `ListBackend` on Redis: a sorted set per list, a meta and a version key.

All members have score 0 and sort by their bytes (`encode_member`), so one
``ZRANGE ... BYLEX`` serves a cursor page and one ``ZRANGE`` by rank serves an
offset page. A read is one Lua call (meta, version, members: one command, one
reply to parse), so it never sees a list half dropped. A fill is one Lua script that checks the
version and replaces the list; an invalidation is one MULTI/EXEC that bumps
the version and drops the list. Reads of many lists go out as one
MULTI/EXEC of plain commands and fills of many lists as one pipeline of the
fill script (``EVALSHA``; each list's fill is atomic on its own): one round
trip for all of them.

redis-py's defaults are unsafe for a cache (no socket timeout; retries that
stretch a dead server into seconds): this client has explicit short
timeouts, no retries, and a `Breaker`. An invalidation that fails marks the
cache dirty: before it is used again, every key under the store's prefix is
dropped (SCAN + UNLINK, so a shared database is safe).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from store.cache.lists import ListRead
from store.cache.stats import Breaker, CacheStats

__all__ = ["RedisListBackend"]

# KEYS: list, meta, version. ARGV: version seen ("" for none), n, ttl, read ms, the members
# packed end to end (16 bytes each: one argument to pack and send, not one per member).
_FILL = """
local v = redis.call('GET', KEYS[3])
if (v or '') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
local ttl = tonumber(ARGV[3])
local packed = ARGV[5] or ''
local count = math.floor(#packed / 16)
local batch = {}
for i = 0, count - 1 do
  batch[#batch + 1] = 0
  batch[#batch + 1] = string.sub(packed, 16 * i + 1, 16 * i + 16)
  if #batch >= 1000 then
    redis.call('ZADD', KEYS[1], unpack(batch))
    batch = {}
  end
end
if #batch > 0 then redis.call('ZADD', KEYS[1], unpack(batch)) end
if count > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
redis.call('SET', KEYS[2], ARGV[2] .. ':' .. count .. ':' .. ARGV[4], 'EX', ttl)
return 1
"""

# KEYS: list, meta, version. ARGV: kind (rank, after, lex, all, meta), then for rank: start,
# stop, desc; for after: member, limit, desc; for lex: low, high, limit, desc.
# Returns {meta, version, members, last member of the head (lex only)}.
_READ = """
local meta = redis.call('GET', KEYS[2])
local ver = redis.call('GET', KEYS[3])
local members = {}
local last = false
local kind = ARGV[1]
if kind == 'lex' then
  if ARGV[5] == '1' then
    members = redis.call('ZRANGE', KEYS[1], ARGV[3], ARGV[2], 'BYLEX', 'REV', 'LIMIT', 0, ARGV[4])
  else
    members = redis.call('ZRANGE', KEYS[1], ARGV[2], ARGV[3], 'BYLEX', 'LIMIT', 0, ARGV[4])
  end
  last = redis.call('ZRANGE', KEYS[1], -1, -1)[1] or false
elseif kind == 'all' then
  if meta then
    local n, cached = string.match(meta, '^(%d+):(%d+)')
    if n == cached then members = redis.call('ZRANGE', KEYS[1], 0, -1) end
  end
elseif kind == 'rank' then
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
return {meta or false, ver or false, members, last}
"""

#: Versions outlive the lists they guard, so a slow reader cannot see one vanish and reappear.
VERSION_TTL_S = 86_400

# KEYS: (list, meta, version) for each list to drop; ARGV: the versions' TTL. One
# script instead of MULTI/INCR/EXPIRE/DEL/EXEC: a writer's client packs and
# parses one command, not three per list and two more (a quarter of a link's
# client CPU went to the pipeline).
_INVALIDATE = """
local ttl = tonumber(ARGV[1])
for i = 1, #KEYS, 3 do
  redis.call('INCR', KEYS[i + 2])
  redis.call('EXPIRE', KEYS[i + 2], ttl)
  redis.call('DEL', KEYS[i], KEYS[i + 1])
end
return 1
"""


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
        self._invalidate = self.client.register_script(_INVALIDATE)
        #: Idle connections of the script calls (`_script`): taking and returning one is
        #: one atomic deque operation, no lock.
        self._idle: deque[Any] = deque()
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

    def _script(self, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """``EVALSHA`` of ``script`` on a connection of this backend's own, its raw reply.

        The request path's calls (a list read, a fill, an invalidation) skip
        redis-py's client layer (pool checkout with a socket poll, retry
        wrapper, per-command instrumentation): a third of a warm list read's
        client CPU. The script is loaded when the server says it does not
        know it (after a restart), then sent again. A connection that fails
        is closed, not reused.
        """
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self.client.connection_pool.make_connection()
        try:
            for attempt in (1, 2):
                conn.send_command("EVALSHA", script.sha, len(keys), *keys, *args)
                try:
                    reply = conn.read_response()
                except redis.exceptions.NoScriptError:
                    if attempt == 2:
                        raise
                    self.client.script_load(script.script)
                    continue
                break
        except BaseException:
            conn.disconnect()
            raise
        self._idle.append(conn)
        return reply

    def read(self, key: str, op: tuple[object, ...]) -> ListRead | None:
        """Meta, version and selected members in one Lua call; None on failure."""
        if op[0] == "all":
            return self.read_many([key], [op])[0]
        if not self._guard():
            return None
        try:
            reply = self._script(self._read, self._keys(key), _read_args(op))
        except redis.RedisError as exc:
            self._failed(exc)
            return None
        self.breaker.success()
        return _list_read(reply)

    def read_many(self, keys: Sequence[str], ops: Sequence[tuple[object, ...]]) -> list[ListRead | None]:
        """`read` of each key with its op, all in one MULTI/EXEC: one round trip; all None on failure.

        Plain commands in a transaction rather than the read script: each
        list's meta, version and members are read together (nothing runs
        between them), and no member is copied into Lua and back, which cost
        a whole list's read 1.35x a plain ``ZRANGE``.
        """
        if not keys:
            return []
        if not self._guard():
            return [None] * len(keys)
        commands: list[tuple[Any, ...]] = []
        sizes: list[int] = []
        for key, op in zip(keys, ops, strict=True):
            lkey, mkey, vkey = self._keys(key)
            members = _members_commands(lkey, op)
            commands += [("GET", mkey), ("GET", vkey), *members]
            sizes.append(2 + len(members))
        try:
            replies = self._transaction(commands)
        except redis.RedisError as exc:
            self._failed(exc)
            return [None] * len(keys)
        self.breaker.success()
        out: list[ListRead | None] = []
        at = 0
        for op, size in zip(ops, sizes, strict=True):
            meta_raw, version, *rest = replies[at : at + size]
            at += size
            members = rest[0] if rest else []
            last = (rest[1][0] if rest[1] else None) if op[0] == "lex" else None
            got = _list_read([meta_raw, version, members, last])
            if op[0] == "all" and not got.complete:
                got = ListRead(got.meta, [], got.version, got.read_ms)
            out.append(got)
        return out

    def _transaction(self, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
        """``commands`` in one MULTI/EXEC sent as one request; the EXEC reply.

        On the connection directly: redis-py's transaction pipeline costs
        about 30 us more per call in Python. A connection that failed half way
        is dropped (it may hold unread replies).
        """
        pool = self.client.connection_pool
        conn: Any = pool.get_connection()  # (redis-py leaves the connection's methods untyped)
        try:
            conn.send_packed_command(conn.pack_commands([("MULTI",), *commands, ("EXEC",)]))
            for _ in range(len(commands) + 1):
                conn.read_response()  # OK, then QUEUED for each command
            reply = conn.read_response()
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if not isinstance(reply, list) or len(reply) != len(commands):
            raise redis.ResponseError(f"unexpected EXEC reply {reply!r:.80}")
        for r in reply:
            if isinstance(r, Exception):
                raise r
        return reply

    def fill_many(self, items: Sequence[tuple[str, bytes | None, int, bytes, int]], ttl_s: int) -> int:
        """`fill` of each (key, version, n, members, read_ms): one pipeline; how many were filled."""
        if not items or not self._guard():
            return 0
        calls = [
            (self._keys(key), [version or b"", n, ttl_s, read_ms, members])
            for key, version, n, members, read_ms in items
        ]
        try:
            done = self._pipelined(self._fill, calls)
        except redis.RedisError as exc:
            self._failed(exc)
            return 0
        self.breaker.success()
        return sum(1 for d in done if d)

    def _pipelined(self, script: Any, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Each call of ``script`` as ``EVALSHA`` in one pipeline (no MULTI); their replies.

        redis-py's own script-in-pipeline support asks ``SCRIPT EXISTS`` first,
        a second round trip every time: here the script is loaded only when
        the server says it does not know it (after a restart), then sent again.
        """
        for attempt in (1, 2):
            pipe = self.client.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            replies = pipe.execute(raise_on_error=False)
            unknown = any(isinstance(r, redis.exceptions.NoScriptError) for r in replies)
            if unknown and attempt == 1:
                self.client.script_load(script.script)
                continue
            for r in replies:
                if isinstance(r, Exception):
                    raise r
            return list(replies)
        raise AssertionError("unreachable")

    def fill(self, key: str, version: bytes | None, n: int, members: bytes, ttl_s: int, read_ms: int) -> bool:
        """Replace the list if the version is unchanged (one Lua call)."""
        if not self._guard():
            return False
        try:
            args: list[bytes | int] = [version or b"", n, ttl_s, read_ms, members]
            done = self._script(self._fill, self._keys(key), args)
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
            self._script(self._invalidate, [k for key in keys for k in self._keys(key)], [VERSION_TTL_S])
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
        """Close the connection pool and this backend's own connections."""
        while self._idle:
            self._idle.pop().disconnect()
        self.client.close()


def _read_args(op: tuple[object, ...]) -> list[Any]:
    """The read script's arguments for ``op`` (see `ListBackend.read`)."""
    kind = op[0]
    if kind in ("meta", "all"):
        return [kind]
    if kind == "lex":
        _k, low, high, limit, desc = op
        return [kind, low, high, limit, "1" if desc else "0"]
    _k, a, b, desc = op
    return [kind, a, b, "1" if desc else "0"]


def _members_commands(lkey: str, op: tuple[object, ...]) -> list[tuple[Any, ...]]:
    """The plain commands that read the members ``op`` selects (see `ListBackend.read`)."""
    kind = op[0]
    if kind == "meta":
        return []
    if kind == "all":
        return [("ZRANGE", lkey, 0, -1)]
    if kind == "rank":
        _k, start, stop, desc = op
        return [("ZRANGE", lkey, start, stop, "REV") if desc else ("ZRANGE", lkey, start, stop)]
    if kind == "after":
        _k, member, limit, desc = op
        assert isinstance(member, bytes)
        if desc:
            return [("ZRANGE", lkey, b"(" + member, b"-", "BYLEX", "REV", "LIMIT", 0, limit)]
        return [("ZRANGE", lkey, b"(" + member, b"+", "BYLEX", "LIMIT", 0, limit)]
    _k, low, high, limit, desc = op  # lex
    read: tuple[Any, ...] = ("ZRANGE", lkey, low, high, "BYLEX", "LIMIT", 0, limit)
    if desc:
        read = ("ZRANGE", lkey, high, low, "BYLEX", "REV", "LIMIT", 0, limit)
    return [read, ("ZRANGE", lkey, -1, -1)]


def _list_read(reply: Any) -> ListRead:
    """A `ListRead` from the read script's reply."""
    meta_raw, version, members = reply[0], reply[1], reply[2]
    last = reply[3] if len(reply) > 3 else None
    meta, read_ms = None, 0
    if meta_raw is not None:
        parts = meta_raw.split(b":")
        meta = (int(parts[0]), int(parts[1]))
        read_ms = int(parts[2]) if len(parts) > 2 else 0  # no time: an entry from before, too old
    return ListRead(meta, members if isinstance(members, list) else [], version, read_ms, last)
