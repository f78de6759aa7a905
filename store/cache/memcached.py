"""A `LeaseStore` over one or more memcached servers: pymemcache clients speaking the meta protocol.

Each server has a pymemcache `PooledClient`: its pool of connections, each
made with explicit connect and read timeouts (pymemcache has none by
default) and TCP_NODELAY. A batch sends its meta commands for a server as
one pipelined request closed by ``mn`` on one of those connections and reads
the replies up to ``MN``: one round trip per server per batch. The replies
are read here, not with `Client.raw_command`: pymemcache 4.0's segment reader
drops what arrived before the last read when a reply spans several reads,
as a pipelined reply of 50 keys does. Deletes wait for their replies
(pymemcache would send them with noreply by default), so a lost one is known.

Keys go to servers by rendezvous hashing over *all* configured servers, so
a server that fails is skipped (its keys are misses) and never silently
replaced by another server that would then hold copies no invalidation
reaches. Each server has a `Breaker`: after repeated failures it is left
alone for a cool-down, and a timeout leaves it alone at once. A delete that
could not be delivered marks the server dirty; before it is used again it is
flushed, since it may hold a value the database no longer has.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from pymemcache.client.base import PooledClient
from pymemcache.exceptions import MemcacheError

from store.cache.leases import Lookup
from store.cache.stats import Breaker, CacheStats

__all__ = ["MemcachedLeaseStore", "MemcachedServer", "POOL_SIZE"]

T = TypeVar("T")
#: Sockets kept per server and process.
POOL_SIZE = 16
_END = b"MN\r\n"


class _ProtocolError(Exception):
    """The server said something this client does not expect."""


class MemcachedServer:
    """One server: a pymemcache pooled client with timeouts, and a breaker."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float,
        connect_timeout_s: float,
        breaker: Breaker,
        stats: CacheStats,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.address = address
        self.client = PooledClient(
            (host or "127.0.0.1", int(port)),
            connect_timeout=connect_timeout_s,
            timeout=timeout_s,
            no_delay=True,
            max_pool_size=POOL_SIZE,
            default_noreply=False,
        )
        self.breaker = breaker
        self._stats = stats
        self._flush_lock = threading.Lock()

    def pipeline(self, commands: Sequence[bytes], parse: Callable[[bytes], T]) -> T | None:
        """Send ``commands`` as one request closed by ``mn``; the parsed replies, or None if the server
        is unusable (down, cooling down, or dirty and not yet flushed)."""
        if not self.breaker.allow():
            self._stats.add(skipped=1)
            return None
        if self.breaker.dirty and not self._flush():
            return None
        request = b"\r\n".join([*commands, b"mn"]) + b"\r\n"
        return self._call(lambda: parse(self._exchange(request)))

    def _exchange(self, request: bytes) -> bytes:
        """Send ``request`` on a pooled connection; every byte of the reply before ``MN``."""
        with self.client.client_pool.get_and_release(destroy_on_fail=True) as client:
            if client.sock is None:
                client.version()  # connects, with the client's timeouts, and checks the server
            sock = client.sock
            sock.sendall(request)
            buf = bytearray()
            while True:
                chunk = sock.recv(65536)  # the socket's timeout is the client's
                if not chunk:
                    raise ConnectionError("memcached closed the connection")
                buf += chunk
                # Replies are lines and values free of CR LF: the reply ends with MN.
                if buf.endswith(_END) and (
                    len(buf) == len(_END) or buf[-len(_END) - 2 : -len(_END)] == b"\r\n"
                ):
                    return bytes(buf[: -len(_END)])

    def _call(self, call: Callable[[], T]) -> T | None:
        try:
            result = call()
        except (OSError, MemcacheError, _ProtocolError, ValueError) as exc:
            if isinstance(exc, TimeoutError):
                # A hung server already cost a whole timeout: leave it alone at
                # once, so that no call pays the timeout twice.
                self.breaker.trip()
            else:
                self.breaker.failure()
            self._stats.add(errors=1)
            return None
        self.breaker.success()
        return result

    def _flush(self) -> bool:
        """Empty a server that may hold values whose invalidation was lost."""
        with self._flush_lock:
            if not self.breaker.dirty:
                return True
            if self._call(lambda: self.client.flush_all(noreply=False)) is True:
                self.breaker.dirty = False
            return not self.breaker.dirty

    def close(self) -> None:
        """Close every pooled socket."""
        self.client.close()


def _replies(raw: bytes) -> list[tuple[bytes, bytes | None]]:
    """Meta replies in order: (status line, value or None). Values never hold CR or LF."""
    out: list[tuple[bytes, bytes | None]] = []
    lines = raw.split(b"\r\n")
    i = 0
    while i < len(lines) - 1:  # the text ends with CR LF: the last piece is empty
        line = lines[i]
        if line.startswith((b"CLIENT_ERROR", b"SERVER_ERROR", b"ERROR")):
            raise _ProtocolError(line[:80].decode(errors="replace"))
        if line.startswith(b"VA "):
            value = lines[i + 1]
            if len(value) != int(line.split(b" ", 2)[1]):
                raise _ProtocolError(f"a value of {len(value)} bytes, announced {line[:40]!r}")
            out.append((line, value))
            i += 2
        else:
            out.append((line, None))
            i += 1
    return out


def _flags(line: bytes) -> dict[bytes, bytes]:
    """The flags of a meta status line (``VA 5 c123 W`` -> {b"c": b"123", b"W": b""})."""
    return {tok[:1]: tok[1:] for tok in line.split(b" ")[1:] if tok and not tok.isdigit()}


class MemcachedLeaseStore:
    """memcached servers behind the `LeaseStore` operations."""

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        timeout_s: float = 0.05,
        connect_timeout_s: float = 0.05,
        failures_to_trip: int = 3,
        cooldown_s: float = 5.0,
    ) -> None:
        if not addresses:
            raise ValueError("at least one memcached address is needed")
        self.stats = CacheStats("memcached")
        self.servers = [
            MemcachedServer(
                a,
                timeout_s=timeout_s,
                connect_timeout_s=connect_timeout_s,
                breaker=Breaker(failures_to_trip=failures_to_trip, cooldown_s=cooldown_s),
                stats=self.stats,
            )
            for a in addresses
        ]
        self._seeds = [zlib.crc32(a.encode()) for a in addresses]

    def server_for(self, key: str) -> MemcachedServer:
        """The one server that owns ``key`` (rendezvous hashing over all servers)."""
        if len(self.servers) == 1:
            return self.servers[0]
        k = key.encode()
        best = max(range(len(self.servers)), key=lambda i: zlib.crc32(k, self._seeds[i]))
        return self.servers[best]

    def _group(self, keys: Sequence[str]) -> dict[MemcachedServer, list[str]]:
        groups: dict[MemcachedServer, list[str]] = {}
        for key in keys:
            groups.setdefault(self.server_for(key), []).append(key)
        return groups

    def lookup_many(
        self, keys: Sequence[str], *, lease_ttl_s: int, drop: Sequence[str] = ()
    ) -> dict[str, Lookup]:
        """``mg key v c N<ttl>`` per key (after ``md`` of each of ``drop``): entries, or leases won."""
        out: dict[str, Lookup] = {}
        gone = set(drop)
        for server, group in self._group(keys).items():
            deletes = [b"md " + k.encode() for k in group if k in gone]
            gets = [b"mg " + k.encode() + b" v c N%d" % lease_ttl_s for k in group]

            def parse(raw: bytes, group: list[str] = group, skip: int = len(deletes)) -> dict[str, Lookup]:
                found: dict[str, Lookup] = {}
                for key, (line, value) in zip(group, _replies(raw)[skip:], strict=True):
                    if not line.startswith(b"VA "):  # N vivifies a miss: every reply is a value
                        raise _ProtocolError(f"unexpected reply {line[:80]!r}")
                    flags = _flags(line)
                    found[key] = Lookup(value or None, int(flags.get(b"c") or 0), b"W" in flags)
                return found

            got = server.pipeline([*deletes, *gets], parse)
            if got is not None:
                out.update(got)
        return out

    def fill_many(self, items: Mapping[str, tuple[bytes, int]], ttl_s: int) -> int:
        """``ms key <len> C<cas> T<ttl>`` per item; how many were stored."""
        stored = 0
        for server, group in self._group(list(items)).items():
            commands = [
                b"ms %s %d C%d T%d\r\n%s" % (k.encode(), len(items[k][0]), items[k][1], ttl_s, items[k][0])
                for k in group
            ]
            got = server.pipeline(commands, _replies)
            if got is not None:
                stored += sum(1 for line, _v in got if line.startswith(b"HD"))
        return stored

    def delete_many(self, keys: Sequence[str]) -> None:
        """``md`` each key and wait for the replies; a server that misses one is marked dirty."""
        for server, group in self._group(keys).items():
            got = server.pipeline([b"md " + k.encode() for k in group], _replies)
            if got is None:
                # The delete may not have arrived: this server may now hold a
                # stale value. Empty it before it is trusted again.
                server.breaker.dirty = True

    def peek_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """``mg key v`` per key: what each holds (no lease taken)."""
        out: dict[str, bytes] = {}
        for server, group in self._group(keys).items():
            got = server.pipeline([b"mg " + k.encode() + b" v" for k in group], _replies)
            for key, (line, value) in zip(group, got or [], strict=False):
                if line.startswith(b"VA ") and value is not None:
                    out[key] = value
        return out

    def close(self) -> None:
        """Close every server's pooled sockets."""
        for server in self.servers:
            server.close()
