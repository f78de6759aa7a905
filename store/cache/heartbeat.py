"""Heartbeats: the daemon vouches for a host in the caches; store processes read them, no database query.

A heartbeat of host H is the memcached item ``<prefix>hb:<H>`` holding two
times in ms since the Unix epoch, ``T S``: every write to H that committed
before T has had its cache keys deleted after its commit (by its writer or
by the daemon), and the daemon has done so without a break since S. The
trust rule that follows from it is in `store.invalidate`'s docstring.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

__all__ = [
    "HEARTBEAT_EVERY_S",
    "HEARTBEAT_TTL_S",
    "Heartbeat",
    "HeartbeatTrust",
    "decode_heartbeat",
    "encode_heartbeat",
    "heartbeat_key",
]

#: How often the daemon publishes a host's heartbeat, and how often a store process reads them.
HEARTBEAT_EVERY_S = 0.5
#: How long a heartbeat item lives in memcached (readers judge its age by T, not by this).
HEARTBEAT_TTL_S = 60


class Heartbeat(NamedTuple):
    """``covered_ms``: writes committed before it are invalidated; ``since_ms``: without a break since."""

    covered_ms: int
    since_ms: int


def heartbeat_key(prefix: str, host: str) -> str:
    """The cache key of ``host``'s heartbeat."""
    return f"{prefix}hb:{host}"


def encode_heartbeat(beat: Heartbeat) -> bytes:
    """The item's value: ``T S`` in ASCII."""
    return b"%d %d" % (beat.covered_ms, beat.since_ms)


def decode_heartbeat(value: bytes | None) -> Heartbeat | None:
    """The heartbeat in an item's value; None if there is none or it does not parse."""
    if not value:
        return None
    parts = value.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return Heartbeat(int(parts[0]), int(parts[1]))


class Peeker(Protocol):
    """What heartbeats are read through (`store.cache.memcached.MemcachedLeaseStore.peek_many`)."""

    def peek_many(self, keys: Sequence[str]) -> Mapping[str, bytes]:
        """The value under each key that holds one."""
        ...


class HeartbeatTrust:
    """A `store.cache.leases.TrustSource` from the heartbeats of the hosts of the live map.

    The caches are asked at most once every ``every_s`` per process (on the
    read path, by whichever thread finds the last answer too old; the others
    use the last answer meanwhile). While every host of the map that
    ``hosts()`` names has a heartbeat whose T is within the window, every
    entry read since the latest S is trusted at any age (`trusted_since_ms`,
    no per-key work). Otherwise an entry is judged by its own host, which
    ``host_of`` finds from its key (`key_trusted_since_ms`): a host without
    a fresh heartbeat (down, not followed, its daemon dead) brings its own
    entries back to the window, and no other host's.
    """

    def __init__(
        self,
        cache: Peeker,
        prefix: str,
        hosts: Callable[[], Iterable[str]],
        *,
        every_s: float = HEARTBEAT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
        host_of: Callable[[str], str | None] | None = None,
    ) -> None:
        """``host_of``: the host whose heartbeat covers a cache key (None: not known, so the window
        only); without it, one host without a fresh heartbeat brings every entry to the window."""
        self._cache = cache
        self._host_of = host_of
        self._prefix = prefix
        self._hosts = hosts
        self._every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._asked = -1e18
        self._beats: dict[str, Heartbeat | None] = {}
        #: How many times the caches were asked (tests count them).
        self.reads = 0

    def heartbeats(self) -> dict[str, Heartbeat | None]:
        """Each host's last heartbeat read (None: none found), asking the caches if the answer is old."""
        now = self._clock()
        if now - self._asked >= self._every_s and self._lock.acquire(blocking=False):
            try:
                self._asked = now
                names = sorted(set(self._hosts()))
                keys = [heartbeat_key(self._prefix, h) for h in names]
                got = self._cache.peek_many(keys)
                self.reads += 1
                self._beats = {h: decode_heartbeat(got.get(k)) for h, k in zip(names, keys, strict=True)}
            finally:
                self._lock.release()
        return self._beats

    def trusted_since_ms(self, now_ms: int, window_ms: int) -> int | None:
        """Entries read at or after this time are trusted at any age; None: only the window holds."""
        beats = self.heartbeats()
        if not beats:
            return None
        since = 0
        for beat in beats.values():
            if beat is None or beat.covered_ms < now_ms - window_ms:
                return None
            since = max(since, beat.since_ms)
        return since

    def key_trusted_since_ms(self, key: str, now_ms: int, window_ms: int) -> int | None:
        """The entry under ``key`` is trusted at any age if read at or after this time: its host's
        heartbeat is within the window (then its S); None: only the window holds."""
        if self._host_of is None:
            return self.trusted_since_ms(now_ms, window_ms)
        host = self._host_of(key)
        beat = None if host is None else self.heartbeats().get(host)
        if beat is None or beat.covered_ms < now_ms - window_ms:
            return None
        return beat.since_ms
