"""The `ListBackend` on Redis: a list's cached head as one string, a meta and a version key.

The head is its members packed end to end in order (16 bytes each,
`encode_member`), stored whole by one ``SET``: a fill costs the server one
string however long the head, where a sorted set cost an insert per member.
A read is one ``MGET`` of the meta, the version and the head (one
command, atomic: it never sees a list half dropped); the client finds a
cursor's place by binary search over the head's bytes and picks the
members. No script runs on the read path: a Lua call cost the server
about twice an ``MGET`` (46-58 us against 26-34 per read, for heads of
102 and 1,000 entries), and reads are half the calls a store makes.

A fill is one Lua script that checks the version and replaces the list; an
invalidation is one Lua script that bumps the version and drops the list; a
writer's changes are one Lua script that updates each list in place if it
is at the version just before the change (else drops it, see
`store.cache.lists`), and the log's followers settle lists by one more.
Reads and fills of many lists go out as one pipeline (of ``MGET``
commands, of ``EVALSHA`` ones; each atomic on its own): one round trip for
all. A list key of another layout (a sorted set, left by an earlier version
of the store) reads as no head (``MGET`` answers nil for it) and the next
fill replaces it.

redis-py's defaults are unsafe for a cache (no socket timeout; retries that
stretch a dead server into seconds): this client has explicit short
timeouts, no retries, and a `Breaker`. An invalidation that fails marks the
cache dirty: before it is used again, the lists it named are dropped again
(their versions bumped), or, past `LOST_DROPS_MAX` of them, every key under
the store's prefix (SCAN + UNLINK, so a shared database is safe).

The connections of the script calls bypass redis-py's pool and so its
process id check: a child of ``os.fork()`` closes the ones it inherited
(locally: nothing is sent) and connects its own (`store.forks`).
"""

from __future__ import annotations

import os
import socket
import threading
from collections import deque
from collections.abc import Callable, Sequence
from hashlib import blake2b
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from store import green
from store.cache.lists import ListChange, ListRead, split_changes
from store.cache.stats import Breaker, CacheStats, LostInvalidations
from store.config import redis_server_name
from store.forks import at_fork

__all__ = ["LOST_DROPS_MAX", "RedisListBackend", "RedisListServers"]

# Lua shared by the scripts: where member m falls among the n packed members of s. Members are
# compared as four big-endian 32-bit words (struct), never with Lua's string "<", which follows
# the server's collation locale.
_CUT = """
local function cut_in(s, n, m, strict)
  -- the first index (0-based) whose member is after m (strict) or not before it
  local a1, a2, a3, a4 = struct.unpack('>I4I4I4I4', m)
  local lo, hi = 0, n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local b1, b2, b3, b4 = struct.unpack('>I4I4I4I4', s, 16 * mid + 1)
    local before
    if b1 ~= a1 then before = b1 < a1
    elseif b2 ~= a2 then before = b2 < a2
    elseif b3 ~= a3 then before = b3 < a3
    elseif b4 ~= a4 then before = b4 < a4
    else before = strict end
    if before then lo = mid + 1 else hi = mid end
  end
  return lo
end
"""

# KEYS: list, meta, version. ARGV: version seen ("" for none), n, ttl, read ms, the members
# packed end to end (16 bytes each, in order): stored as they come, one string; the
# database's list version the head was read at (0: unknown); the versions' TTL; 1 if the
# members are the list's newest entries (else its oldest). The meta is "n:cached:read
# ms:list version", cached negative for a head of the newest entries that is not the whole
# list (a reader of an earlier layout reads that as no head: never as the oldest). A fill never
# replaces a list held at a later list version, nor a versioned one when it knows no version:
# it drops that list instead (the next reader fills it again), so a list whose version is
# ahead of the database's (a shard restored from an older backup) cannot stay for good.
_FILL = """
local v = redis.call('GET', KEYS[3])
if (v or '') ~= ARGV[1] then return 0 end
local want = tonumber(ARGV[6])
local meta = redis.call('GET', KEYS[2])
if meta then
  local held = tonumber(string.match(meta, '^%d+:%-?%d+:%d+:(%d+)$') or '0')
  if held > want or (held > 0 and want == 0) then
    redis.call('INCR', KEYS[3])
    redis.call('EXPIRE', KEYS[3], tonumber(ARGV[7]))
    redis.call('DEL', KEYS[1], KEYS[2])
    return 0
  end
end
local ttl = tonumber(ARGV[3])
local packed = ARGV[5] or ''
local count = math.floor(#packed / 16)
if count > 0 then
  redis.call('SET', KEYS[1], packed, 'EX', ttl)
else
  redis.call('DEL', KEYS[1])
end
local cached = count
if ARGV[8] == '1' and count > 0 and count < tonumber(ARGV[2]) then cached = '-' .. count end
redis.call('SET', KEYS[2], ARGV[2] .. ':' .. cached .. ':' .. ARGV[4] .. ':' .. ARGV[6], 'EX', ttl)
return 1
"""

# KEYS: list, meta, version. ARGV: kind (rank, after, lex, all, meta), then for rank: start,
# stop, desc; for after: member, limit, desc; for lex: low, high, limit, desc.
# Returns {meta, version, the selected members packed end to end, last member of the head
# (lex only)}. Members are compared by `_CUT`.
#: Versions outlive the lists they guard, so a slow reader cannot see one vanish and reappear.
VERSION_TTL_S = 86_400
#: The most lists whose lost drops a server remembers to drop again; past it, every list is dropped.
LOST_DROPS_MAX = 1000

# KEYS: list, meta, version. ARGV: version seen ("" for none), the list version the head was
# read at, the new read ms. The list's read time becomes the new one if it is still cached at
# both versions (meta "n:cached:read ms:list version"); its TTL is left as it is.
_TOUCH = """
local v = redis.call('GET', KEYS[3])
if (v or '') ~= ARGV[1] then return 0 end
local meta = redis.call('GET', KEYS[2])
if not meta then return 0 end
local n, cached, at = string.match(meta, '^(%d+):(%-?%d+):%d+:(%d+)$')
if not n or at ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[2], n .. ':' .. cached .. ':' .. ARGV[3] .. ':' .. at, 'KEEPTTL')
return 1
"""

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


# KEYS: (list, meta, version) for each list, the D lists to drop first. ARGV: the versions'
# TTL, the cap on a head's entries, D, then for each list after the first D: the list version
# its change made, the kind (add, move, remove), the member now in place ("" for remove), the
# to_id whose entry goes (8 bytes, big-endian). The first D lists are dropped as by
# _INVALIDATE (their changes' versions unknown: `store.cache.lists.split_changes`). A change
# applies only to a head at the version just before it (see `store.cache.lists.apply_change`
# for the rules, the same in Python); a head at that version or later is left alone; any
# other is dropped as by _INVALIDATE, once in a call (a dropped list takes no change in
# place, so its later changes would only bump its version again). Returns how many lists
# were left cached.
_APPLY = (
    _CUT
    + """
local vttl, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local function cut(s, n, m) return cut_in(s, n, m, false) end
local function find(s, tail)  -- the index (0-based) of the member ending in tail, or nil
  local from = 1
  while true do
    local p = string.find(s, tail, from, true)
    if not p then return nil end
    if (p - 1) % 16 == 8 then return math.floor((p - 1) / 16) end
    from = p + 1
  end
end
local function one(k, version, kind, member, tail)  -- true: the list is current
  local meta = redis.call('GET', KEYS[k + 1])
  if not meta then return false end
  local total, cached, rms, held = string.match(meta, '^(%d+):(%-?%d+):(%d+):(%d+)$')
  held = tonumber(held or '0')
  if held > 0 and version > 0 and held >= version then return true end
  if held == 0 or version == 0 or held ~= version - 1 then return false end
  local s = redis.pcall('GET', KEYS[k])
  if type(s) == 'table' then return false end
  s = s or ''
  local n = math.floor(#s / 16)
  total = tonumber(total)
  cached = tonumber(cached)
  local newest = cached < 0  -- the head is the list's newest entries
  if math.abs(cached) ~= n or #s % 16 ~= 0 then return false end
  local at = find(s, tail)
  if at then
    if kind == 'add' then return false end
    s = string.sub(s, 1, 16 * at) .. string.sub(s, 16 * at + 17)
    n = n - 1
  elseif kind ~= 'add' and n == total then
    return false
  end
  if kind == 'remove' then
    total = total - 1
  else
    if kind == 'add' then total = total + 1 end
    local j = cut(s, n, member)
    local inside = j < n
    if newest then inside = j > 0 end
    if n == total - 1 or inside then
      s = string.sub(s, 1, 16 * j) .. member .. string.sub(s, 16 * j + 1)
      n = n + 1
    end
    if n > cap then
      if newest then s = string.sub(s, 16 * (n - cap) + 1) else s = string.sub(s, 1, 16 * cap) end
      n = cap
    end
  end
  local shown = n
  if newest and n > 0 and n < total then shown = '-' .. n end
  local ttl = redis.call('PTTL', KEYS[k + 1])
  if ttl <= 0 then return false end
  if n > 0 then redis.call('SET', KEYS[k], s, 'PX', ttl) else redis.call('DEL', KEYS[k]) end
  redis.call('SET', KEYS[k + 1], total .. ':' .. shown .. ':' .. rms .. ':' .. version, 'PX', ttl)
  return true
end
local dropped = {}  -- a list dropped in this call takes no change in place: dropped once
local function drop(k)
  if dropped[KEYS[k]] then return end
  dropped[KEYS[k]] = true
  redis.call('INCR', KEYS[k + 2])
  redis.call('EXPIRE', KEYS[k + 2], vttl)
  redis.call('DEL', KEYS[k], KEYS[k + 1])
end
local d = tonumber(ARGV[3])
for k = 1, 3 * d, 3 do drop(k) end
local kept = 0
for i = d, #KEYS / 3 - 1 do
  local k, a = 3 * i + 1, 4 * (i - d) + 4
  if dropped[KEYS[k]] then
  elseif one(k, tonumber(ARGV[a]), ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]) then
    kept = kept + 1
  else
    drop(k)
  end
end
return kept
"""
)

# KEYS: (list, meta, version) for each list. ARGV: the versions' TTL, then each list's version
# named by the log (0: none). A list cached at that version or later is kept; any other dropped.
_SETTLE = """
local vttl = tonumber(ARGV[1])
for i = 0, #KEYS / 3 - 1 do
  local k, want = 3 * i + 1, tonumber(ARGV[i + 2])
  local meta = redis.call('GET', KEYS[k + 1])
  local held = 0
  if meta then held = tonumber(string.match(meta, '^%d+:%-?%d+:%d+:(%d+)$') or '0') end
  if not (held > 0 and want > 0 and held >= want) then
    redis.call('INCR', KEYS[k + 2])
    redis.call('EXPIRE', KEYS[k + 2], vttl)
    redis.call('DEL', KEYS[k], KEYS[k + 1])
  end
end
return 1
"""


class _LoopAwareConnection(redis.Connection):
    """redis-py's TCP connection, opened as a `store.green.GreenSocket` inside an event loop's call."""

    def _connect(self) -> Any:
        if not green.active():
            return super()._connect()  # type: ignore[no-untyped-call]
        sock = green.connect_tcp(self.host, self.port, self.socket_connect_timeout)
        sock.settimeout(self.socket_timeout)
        return sock


class RedisListBackend:
    """Relation lists in one Redis database, keys under ``prefix``.

    ``stats`` may be shared with other servers' backends (`RedisListServers`).
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "s:",
        timeout_s: float = 0.05,
        connect_timeout_s: float = 0.05,
        failures_to_trip: int = 3,
        cooldown_s: float = 5.0,
        stats: CacheStats | None = None,
    ) -> None:
        self.stats = stats or CacheStats("redis")
        if stats is None:  # (shared: its owner reads what every server owes)
            self.stats.before_read = self.read_owed
        #: ``host:port/db``: the server's name in errors and metrics, and its seed in placement.
        self.address = redis_server_name(url)
        self.breaker = Breaker(failures_to_trip=failures_to_trip, cooldown_s=cooldown_s)
        #: Lists whose drops may not have arrived, dropped again before the server is trusted
        #: (`_clean`); more than `LOST_DROPS_MAX` of them, and every list is dropped instead.
        self.lost = LostInvalidations(self.breaker, LOST_DROPS_MAX)
        self.prefix = prefix
        self.client = redis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry=Retry(NoBackoff(), 0),
            retry_on_timeout=False,
            health_check_interval=0,
        )
        pool = self.client.connection_pool
        if pool.connection_class is redis.Connection:  # TCP: inside an event loop's call, the loop's waits
            pool.connection_class = _LoopAwareConnection
        self._fill = self.client.register_script(_FILL)
        self._invalidate = self.client.register_script(_INVALIDATE)
        self._apply = self.client.register_script(_APPLY)
        self._settle = self.client.register_script(_SETTLE)
        self._touch = self.client.register_script(_TOUCH)
        #: Whether the server is known to hold the fill script: until a fill that waited for
        #: its reply says so, fills wait (a fill not waited for that finds it gone is lost).
        self._fill_known = False
        #: Idle connections of the script calls (`_script`): taking and returning one is
        #: one atomic deque operation, no lock.
        self._idle: deque[Any] = deque()
        self._clean_lock = threading.Lock()
        #: The process whose connections ``_idle`` holds.
        self._pid = os.getpid()
        at_fork(self, RedisListBackend._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: close the inherited connections here only (redis-py shuts a socket
        down only in the process that opened it), make the lock again. redis-py's own pool, used
        by the cleaning and script loading, checks the process id itself."""
        if self._pid == os.getpid():
            return
        self._clean_lock = threading.Lock()  # a parent's cleaning thread may have held it
        inherited, self._idle = self._idle, deque()
        self._pid = os.getpid()
        for conn in inherited:
            conn.disconnect()

    def _new_connection(self) -> Any:
        """A connection for `_script`, made as redis-py's pool would make one but not counted by
        it: the pool counts every connection it ever made against ``max_connections`` (100 in
        redis-py 8) and never uncounts one closed outside it, so replaced connections, and more
        than 100 calls at once (tasks on an event loop), would end in ``MaxConnectionsError``.
        How many are open is bounded by the calls in flight, as for memcached's."""
        pool = self.client.connection_pool
        return pool.connection_class(**pool.connection_kwargs)

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
        self.stats.error(f"redis {self.address}", exc)

    def _script(self, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """``EVALSHA`` of ``script`` on a connection of this backend's own, its raw reply (`_pipelined`).

        The request path's calls (a list read, a fill, an invalidation) skip
        redis-py's client layer (pool checkout with a socket poll, retry
        wrapper, per-command instrumentation): a third of a warm list read's
        client CPU.
        """
        return self._pipelined(script, [(keys, args)])[0]

    def read(self, key: str, op: tuple[object, ...]) -> ListRead | None:
        """Meta, version and selected members from one ``MGET``; None on failure."""
        return self.read_many([key], [op])[0]

    def read_many(self, keys: Sequence[str], ops: Sequence[tuple[object, ...]]) -> list[ListRead | None]:
        """`read` of each key with its op: an ``MGET`` of each list's meta, version and head, in
        one pipeline (one round trip); all None on failure."""
        if not keys:
            return []
        if not self._guard():
            return [None] * len(keys)
        request = b"".join(_mget(self._keys(key)) for key in keys)
        try:
            replies = self._send(request, len(keys))
        except redis.RedisError as exc:
            self._failed(exc)
            return [None] * len(keys)
        self.breaker.success()
        return [_list_read(r, op) for r, op in zip(replies, ops, strict=True)]

    def fill_many(
        self,
        items: Sequence[tuple[str, bytes | None, int, bytes, int, bool]],
        ttl_s: int,
        *,
        later: Callable[[int], None] | None = None,
    ) -> int:
        """`fill` of each (key, version, n, members, read_ms, newest): one pipeline; how many were filled."""
        if not items or not self._guard():
            return 0
        calls = [
            (self._keys(key), [version or b"", n, ttl_s, read_ms, members, 0, VERSION_TTL_S, int(newest)])
            for key, version, n, members, read_ms, newest in items
        ]
        return self._fill_calls(calls, later)

    def _fill_calls(
        self, calls: Sequence[tuple[Sequence[str], Sequence[Any]]], later: Callable[[int], None] | None
    ) -> int:
        """The fill script's ``calls`` in one request; how many lists were filled. With ``later``,
        once the server is known to hold the script: sent without waiting (`_posted`), 0."""
        if later is not None and self._fill_known:
            self._posted(calls, later)
            return 0
        try:
            done = self._pipelined(self._fill, calls)
        except redis.RedisError as exc:
            self._failed(exc)
            return 0
        self._fill_known = True
        self.breaker.success()
        return sum(1 for d in done if d)

    def _posted(
        self, calls: Sequence[tuple[Sequence[str], Sequence[Any]]], later: Callable[[int], None]
    ) -> None:
        """The fill script's ``calls`` sent without waiting for their replies (`_send` with a
        reader): a fill only hopes to store, and nothing the caller returns depends on it. The
        replies are read before the connection's next ones (or at `read_owed`), and ``later`` is
        told how many lists were filled. Sent only once a fill that waited has found the script
        on the server; if one of these finds it gone (a restart), it is lost, and the next fill
        waits again (loading the script)."""
        n = len(calls)

        def read(replies: list[Any]) -> None:
            if any(isinstance(r, redis.exceptions.NoScriptError) for r in replies):
                self._fill_known = False  # (the next fill waits: it loads the script and is sent again)
            for r in replies:
                if isinstance(r, Exception) and not isinstance(r, redis.exceptions.NoScriptError):
                    self.stats.error(f"redis {self.address}", r)
            later(sum(1 for r in replies if r and not isinstance(r, Exception)))

        try:
            self._send(b"".join(_evalsha(self._fill.sha, k, a) for k, a in calls), n, later=read)
        except redis.RedisError as exc:
            self._failed(exc)
            return
        self.breaker.success()

    def _pipelined(self, script: Any, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]) -> list[Any]:
        """Each call of ``script`` as ``EVALSHA``, all sent at once on a connection of this
        backend's own (no MULTI: each is atomic on its own); their replies.

        redis-py's own script-in-pipeline support asks ``SCRIPT EXISTS`` first,
        a second round trip every time: here the script is loaded only when
        the server says it does not know it (after a restart), then sent again.
        A connection that fails is closed, not reused; an error reply is
        raised once every reply is read (the connection stays in step).
        """
        return self._send(b"".join(_evalsha(script.sha, k, a) for k, a in calls), len(calls), script)

    def _send(
        self,
        request: bytes,
        count: int,
        script: Any = None,
        *,
        later: Callable[[list[Any]], None] | None = None,
    ) -> list[Any]:
        """Send ``request`` (``count`` commands in RESP) on a connection of this backend's own;
        the replies (see `_pipelined`). If the server does not know ``script``, it is loaded
        and the request sent again.

        With ``later``: nothing is waited for (and [] returned); the connection reads the
        replies before its next request's and gives them to ``later`` (error replies as
        exceptions, not raised)."""
        if self._pid != _getpid():  # a fork the hook missed
            self._after_fork()
        try:
            conn = self._idle.pop()
        except IndexError:
            conn = self._new_connection()
        else:
            if type(conn._sock) is socket.socket and green.active():
                # Opened outside an event loop's call: inside one it would hold the loop at each
                # reply. Replaced (what it owed is dropped: fills only hoped to store).
                conn.disconnect()
                conn = self._new_connection()
        try:
            owed: list[tuple[int, Callable[[list[Any]], None]]] | None = getattr(conn, "store_owed", None)
            replies: list[Any] = []
            if later is not None:
                conn.send_packed_command([request])
                if owed is None:
                    owed = conn.store_owed = []
                owed.append((count, later))
            else:
                for attempt in (1, 2):
                    conn.send_packed_command([request])
                    if owed:  # what earlier requests owe comes first
                        _pay(conn)
                        owed = None
                    replies = _responses(conn, count)  # (an error reply: the next ones still follow)
                    unknown = any(isinstance(r, redis.exceptions.NoScriptError) for r in replies)
                    if unknown and attempt == 1 and script is not None:
                        self.client.script_load(script.script)
                        continue
                    break
        except BaseException:
            conn.disconnect()
            raise
        if conn.pid == self._pid:
            self._idle.append(conn)
        else:  # taken before this process was forked
            conn.disconnect()
        for r in replies:
            if isinstance(r, Exception):
                raise r
        return replies

    def fill(
        self,
        key: str,
        version: bytes | None,
        n: int,
        members: bytes,
        ttl_s: int,
        read_ms: int,
        list_version: int = 0,
        newest: bool = False,
        later: Callable[[int], None] | None = None,
    ) -> bool:
        """Replace the list if the version is unchanged and it holds no later list version (one Lua call)."""
        if not self._guard():
            return False
        args: list[bytes | int] = [
            version or b"",
            n,
            ttl_s,
            read_ms,
            members,
            list_version,
            VERSION_TTL_S,
            int(newest),
        ]
        return self._fill_calls([(self._keys(key), args)], later) == 1

    def read_owed(self) -> None:
        """Read the replies this backend's idle connections owe (fills not waited for), now; a
        connection that fails is closed."""
        owing: list[Any] = []
        for _ in range(len(self._idle)):
            try:
                owing.append(self._idle.pop())
            except IndexError:
                break
        for conn in owing:
            try:
                _pay(conn)
            except redis.RedisError as exc:
                conn.disconnect()
                self._failed(exc)
                continue
            self._idle.append(conn)

    def touch(self, key: str, version: bytes | None, list_version: int, read_ms: int) -> bool:
        """A new read time for the list if it is still cached at both versions (one Lua call); False
        on failure (the list stays as old as it was: it is read again)."""
        if not self._guard():
            return False
        try:
            reply = self._script(self._touch, self._keys(key), [version or b"", list_version, read_ms])
        except redis.RedisError as exc:
            self._failed(exc)
            return False
        self.breaker.success()
        return bool(reply)

    def invalidate(self, keys: Sequence[str], ttl_s: int) -> None:
        """Bump versions and drop lists; on failure, mark the cache dirty."""
        self._dropping(self._invalidate, [k for key in keys for k in self._keys(key)], [VERSION_TTL_S])

    def apply(self, changes: Sequence[ListChange], ttl_s: int, cap: int) -> int:
        """Each change in place, or its list dropped (one Lua call; a list with a change of unknown
        version only dropped, `split_changes`); on failure, mark the cache dirty."""
        drops, in_place = split_changes(changes)
        keys = [k for key in drops for k in self._keys(key)]
        keys += [k for c in in_place for k in self._keys(c[0])]
        args: list[Any] = [VERSION_TTL_S, cap, len(drops)]
        for _key, version, kind, member, to_id in in_place:
            args += [version, kind, member, to_id.to_bytes(8, "big")]
        kept = self._dropping(self._apply, keys, args)
        return 0 if kept is None else int(kept)

    def settle(self, entries: Sequence[tuple[str, int]], ttl_s: int) -> None:
        """Drop each list not cached at the given version or later (one Lua call); on failure, mark dirty."""
        keys = [k for key, _v in entries for k in self._keys(key)]
        self._dropping(self._settle, keys, [VERSION_TTL_S, *(v for _k, v in entries)])

    def _dropping(self, script: Any, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """A script that may drop lists, or the reply None: a call that was skipped or failed may
        have lost a drop, so the cache is marked dirty (cleaned before it is trusted again)."""
        if not self.breaker.allow():
            self.stats.add(skipped=1)
            self.lost.lose(keys[0::3])  # (each list's three keys: `_keys`)
            return None
        try:
            reply = self._script(script, keys, args)
        except redis.RedisError as exc:
            self._failed(exc)
            self.lost.lose(keys[0::3])
            return None
        self.breaker.success()
        return reply

    def _clean(self) -> bool:
        """After lost invalidations: drop those lists again (their versions bumped, as
        `invalidate` does), or, past `LOST_DROPS_MAX` of them, every cached list (not the
        versions)."""
        with self._clean_lock:
            if not self.breaker.dirty:
                return True
            generation, lists = self.lost.pending()
            if lists is not None:
                try:
                    if lists:
                        self._script(
                            self._invalidate, [k for key in lists for k in self._keys(key)], [VERSION_TTL_S]
                        )
                except redis.RedisError as exc:
                    self._failed(exc)
                    return False
                return self.lost.sent(generation, lists)
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
            return self.lost.sent(generation, None)

    def cache_servers(self) -> list[RedisListBackend]:
        """This one server (`store.cache.stats.CacheServers`)."""
        return [self]

    def close(self) -> None:
        """Close the connection pool and this backend's own connections."""
        while self._idle:
            self._idle.pop().disconnect()
        self.client.close()


_getpid = os.getpid


def _pay(conn: Any) -> None:
    """Read the replies ``conn`` owes to requests sent without waiting, giving each its reader."""
    owed = getattr(conn, "store_owed", None)
    if owed:
        conn.store_owed = []
        for n, reader in owed:
            reader(_responses(conn, n))


def _responses(conn: Any, n: int) -> list[Any]:
    """The next ``n`` replies on ``conn``, an error reply as its exception (not raised)."""
    out: list[Any] = []
    for _ in range(n):
        try:
            out.append(conn.read_response())
        except redis.ResponseError as exc:
            out.append(exc)
    return out


def _evalsha(sha: str, keys: Sequence[str], args: Sequence[Any]) -> bytes:
    """``EVALSHA sha len(keys) *keys *args`` in RESP, packed in one pass (`_command`)."""
    return _command((b"EVALSHA", sha, len(keys), *keys, *args))


def _mget(keys: Sequence[str]) -> bytes:
    """``MGET`` of a list's keys (`_keys`) in RESP, meta and version first, then the head."""
    head, meta, version = keys
    return _command((b"MGET", meta, version, head))


def _command(words: Sequence[Any]) -> bytes:
    """A command in RESP, packed in one pass.

    redis-py's packer runs each argument through its encoder and a generator
    (11 us for a list update's 19 arguments, against 4 us here). Arguments
    are str (UTF-8), bytes or int, as the scripts take them.
    """
    parts = [b"*%d\r\n" % len(words)]
    for a in words:
        kind = type(a)
        if kind is bytes:
            b = a
        elif kind is str:
            b = a.encode()
        elif kind is int:
            b = b"%d" % a
        else:
            raise redis.DataError(f"a list script argument must be str, bytes or int, not {kind.__name__}")
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


def _list_read(reply: Any, op: tuple[object, ...]) -> ListRead:
    """A `ListRead` from an `_mget` reply: the members ``op`` picks from the head.

    The head is cached only if it holds as many members as its meta says (a
    head and its meta apart, one of them evicted, is not cached)."""
    meta_raw, version, head = reply
    if meta_raw is None:
        return ListRead(None, [], version)
    parts = meta_raw.split(b":")
    cached = int(parts[1])
    newest = cached < 0  # the head is the list's newest entries
    meta = (int(parts[0]), -cached if newest else cached)
    read_ms = int(parts[2]) if len(parts) > 2 else 0  # no time: an entry from before, too old
    at = int(parts[3]) if len(parts) > 3 else 0
    if op[0] == "meta":
        return ListRead(meta, [], version, read_ms, None, newest, at)
    s: bytes = head or b""
    n, odd = divmod(len(s), 16)
    if meta[1] != n or odd:
        return ListRead(None, [], version)
    members, last = _pick(s, n, meta[0], op, newest)
    return ListRead(meta, members, version, read_ms, last, newest, at)


def _pick(
    s: bytes, n: int, total: int, op: tuple[object, ...], newest: bool = False
) -> tuple[list[bytes], bytes | None]:
    """The members of the packed head ``s`` (``n`` of the list's ``total``) that ``op`` selects
    (see `store.cache.lists.ListBackend.read`), and for a ``lex`` read the head's inner edge (its
    last member, or its first if ``newest``)."""

    def span(i: int, j: int) -> list[bytes]:  # members i .. j - 1, in order
        return [s[k : k + 16] for k in range(16 * i, 16 * j, 16)]

    def back(i: int, j: int) -> list[bytes]:  # members j - 1 down to i
        return [s[k : k + 16] for k in range(16 * (j - 1), 16 * i - 1, -16)]

    kind = op[0]
    if kind == "all":
        return (span(0, n) if total == n else []), None
    if kind == "rank":
        _k, a, b, desc = op
        assert isinstance(a, int)
        assert isinstance(b, int)
        if a < 0:
            a = max(0, n + a)
        if b < 0:
            b = n + b
        b = min(b, n - 1)
        return (back(n - 1 - b, n - a) if desc else span(a, b + 1)), None
    if kind == "after":
        _k, member, limit, desc = op
        assert isinstance(member, bytes)
        assert isinstance(limit, int)
        if desc:
            j = _cut(s, n, member, strict=False)
            return back(max(0, j - limit), j), None
        i = _cut(s, n, member, strict=True)
        return span(i, min(n, i + limit)), None
    _k, low, high, limit, desc = op
    assert isinstance(low, bytes)
    assert isinstance(high, bytes)
    assert isinstance(limit, int)
    i, j = _bound(s, n, low, low=True), _bound(s, n, high, low=False)
    picked = back(max(i, j - limit), j) if desc else span(i, min(j, i + limit))
    if not n:
        return picked, None
    return picked, (s[:16] if newest else s[16 * n - 16 : 16 * n])


def _cut(s: bytes, n: int, m: bytes, *, strict: bool) -> int:
    """The first index of the head ``s`` whose member is after ``m`` (strict) or not before it.

    Members are compared as bytes: their byte order is the order of (sequence, to_id)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) // 2
        b = s[16 * mid : 16 * mid + 16]
        if b < m or (strict and b == m):
            lo = mid + 1
        else:
            hi = mid
    return lo


def _bound(s: bytes, n: int, bound: bytes, *, low: bool) -> int:
    """Where a `store.cache.lists.lex_bound` bound cuts the head ``s``."""
    if bound == b"-":
        return 0
    if bound == b"+":
        return n
    inclusive = bound[:1] == b"["
    return _cut(s, n, bound[1:], strict=not inclusive if low else inclusive)


class RedisListServers:
    """Relation lists over several Redis servers: each list, all its keys, on one of them.

    The server of a list is chosen by rendezvous (highest random weight)
    hashing of the list's key over *all* configured servers, as objects are
    on memcached (`store.cache.memcached.MemcachedLeaseStore.server_for`):
    a function of the list and the configured servers only. A server that
    is down is never replaced by another: its lists are misses (reads go to
    the database, writes' changes to them are skipped and mark that server
    dirty), and no survivor ever holds a copy of them that an invalidation
    sent while the server was down would have had to reach. Each server is
    a `RedisListBackend` with its own breaker, connections and cleaning
    (a server whose invalidation was lost is emptied of lists before it is
    trusted again); the counters are shared. A batch goes to each server
    it touches as one pipeline, server after server.
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        prefix: str = "s:",
        timeout_s: float = 0.05,
        connect_timeout_s: float = 0.05,
        failures_to_trip: int = 3,
        cooldown_s: float = 5.0,
    ) -> None:
        if not urls:
            raise ValueError("at least one Redis URL is needed")
        self.stats = CacheStats("redis")
        self.prefix = prefix
        self.servers = [
            RedisListBackend(
                url,
                prefix=prefix,
                timeout_s=timeout_s,
                connect_timeout_s=connect_timeout_s,
                failures_to_trip=failures_to_trip,
                cooldown_s=cooldown_s,
                stats=self.stats,
            )
            for url in urls
        ]
        self._salts = [s.address.encode() + b"\n" for s in self.servers]
        self.stats.before_read = self.read_owed  # (fills counted when their replies are read)

    def index_for(self, key: str) -> int:
        """The index (in the configured order) of the server that holds the list ``key``.

        Each server's weight is a BLAKE2b digest of its name and the key (CRC-32
        seeded by the server's name, as memcached's placement has it, is affine in
        its seed: with three servers one of them drew half the lists).
        """
        k = key.encode()
        return max(range(len(self._salts)), key=lambda i: blake2b(self._salts[i] + k, digest_size=8).digest())

    def server_for(self, key: str) -> RedisListBackend:
        """The one server that holds the list ``key`` (and its meta and version keys)."""
        return self.servers[self.index_for(key)]

    def _group(self, keys: Sequence[str]) -> dict[int, list[int]]:
        """Positions of ``keys`` by the index of their server."""
        groups: dict[int, list[int]] = {}
        for pos, key in enumerate(keys):
            groups.setdefault(self.index_for(key), []).append(pos)
        return groups

    def read(self, key: str, op: tuple[object, ...]) -> ListRead | None:
        """`RedisListBackend.read` on the list's server."""
        return self.server_for(key).read(key, op)

    def read_many(self, keys: Sequence[str], ops: Sequence[tuple[object, ...]]) -> list[ListRead | None]:
        """`RedisListBackend.read_many`, one pipeline per server; None for each list of a failed server."""
        out: list[ListRead | None] = [None] * len(keys)
        for i, positions in self._group(keys).items():
            got = self.servers[i].read_many([keys[p] for p in positions], [ops[p] for p in positions])
            for p, read in zip(positions, got, strict=True):
                out[p] = read
        return out

    def fill(
        self,
        key: str,
        version: bytes | None,
        n: int,
        members: bytes,
        ttl_s: int,
        read_ms: int,
        list_version: int = 0,
        newest: bool = False,
        later: Callable[[int], None] | None = None,
    ) -> bool:
        """`RedisListBackend.fill` on the list's server."""
        return self.server_for(key).fill(
            key, version, n, members, ttl_s, read_ms, list_version, newest, later=later
        )

    def fill_many(
        self,
        items: Sequence[tuple[str, bytes | None, int, bytes, int, bool]],
        ttl_s: int,
        *,
        later: Callable[[int], None] | None = None,
    ) -> int:
        """`RedisListBackend.fill_many`, one pipeline per server; how many were filled."""
        groups = self._group([item[0] for item in items])
        return sum(
            self.servers[i].fill_many([items[p] for p in ps], ttl_s, later=later) for i, ps in groups.items()
        )

    def read_owed(self) -> None:
        """`RedisListBackend.read_owed` on each server."""
        for server in self.servers:
            server.read_owed()

    def touch(self, key: str, version: bytes | None, list_version: int, read_ms: int) -> bool:
        """`RedisListBackend.touch` on the list's server."""
        return self.server_for(key).touch(key, version, list_version, read_ms)

    def invalidate(self, keys: Sequence[str], ttl_s: int) -> None:
        """`RedisListBackend.invalidate` on each server (a server that misses one is marked dirty)."""
        for i, positions in self._group(keys).items():
            self.servers[i].invalidate([keys[p] for p in positions], ttl_s)

    def apply(self, changes: Sequence[ListChange], ttl_s: int, cap: int) -> int:
        """`RedisListBackend.apply` on each server, each list's changes in their order; how many kept."""
        groups = self._group([c[0] for c in changes])
        return sum(self.servers[i].apply([changes[p] for p in ps], ttl_s, cap) for i, ps in groups.items())

    def settle(self, entries: Sequence[tuple[str, int]], ttl_s: int) -> None:
        """`RedisListBackend.settle` on each server."""
        for i, positions in self._group([key for key, _v in entries]).items():
            self.servers[i].settle([entries[p] for p in positions], ttl_s)

    def cache_servers(self) -> list[RedisListBackend]:
        """Every configured server (`store.cache.stats.CacheServers`)."""
        return list(self.servers)

    def close(self) -> None:
        """Close every server's connections."""
        for server in self.servers:
            server.close()
