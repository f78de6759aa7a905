"""A `LeaseStore` over one or more memcached servers (text protocol, pipelined).

Why not pymemcache: the lease protocol needs ``add`` and ``cas`` of many keys
in one round trip per server, which pymemcache sends one key at a time; and
every call here needs a deadline (pymemcache has no timeout by default) and
deletes that wait for the reply (pymemcache sends them with noreply).

Keys go to servers by rendezvous hashing over *all* configured servers, so
a server that fails is skipped (its keys are misses) and never silently
replaced by another server that would then hold copies no invalidation
reaches. Each server has a `Breaker`: after repeated failures it is left
alone for a cool-down. A delete that could not be delivered marks the server
dirty; before it is used again it is flushed, since it may hold a value the
database no longer has.
"""

from __future__ import annotations

import socket
import threading
import time
import zlib
from collections import deque
from collections.abc import Mapping, Sequence

from store.cache.stats import Breaker, CacheStats

__all__ = ["MemcachedLeaseStore", "MemcachedServer"]


class _ProtocolError(Exception):
    """The server said something this client does not expect."""


class _Conn:
    """One socket with a read buffer; every read honours a deadline."""

    __slots__ = ("buf", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def send(self, data: bytes, deadline: float) -> None:
        self.sock.settimeout(max(0.0005, deadline - time.monotonic()))
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("memcached reply took longer than the timeout")
        self.sock.settimeout(left)
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("memcached closed the connection")
        self.buf += chunk

    def line(self, deadline: float) -> bytes:
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                out = bytes(self.buf[:end])
                del self.buf[: end + 2]
                return out
            self._fill(deadline)

    def exact(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n + 2:
            self._fill(deadline)
        out = bytes(self.buf[:n])
        del self.buf[: n + 2]
        return out

    def values(self, deadline: float) -> dict[str, tuple[bytes, int]]:
        """Read ``VALUE key flags bytes cas`` blocks up to ``END``."""
        out: dict[str, tuple[bytes, int]] = {}
        while True:
            head = self.line(deadline)
            if head == b"END":
                return out
            parts = head.split()
            if len(parts) != 5 or parts[0] != b"VALUE":
                raise _ProtocolError(f"unexpected reply {head[:80]!r}")
            out[parts[1].decode()] = (self.exact(int(parts[3]), deadline), int(parts[4]))

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:  # already gone
            return


class MemcachedServer:
    """One server: a small pool of sockets, timeouts, and a breaker."""

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
        self._where = (host or "127.0.0.1", int(port))
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self.breaker = breaker
        self._stats = stats
        self._idle: deque[_Conn] = deque()
        self._flush_lock = threading.Lock()

    def _connect(self) -> _Conn:
        sock = socket.create_connection(self._where, timeout=self._connect_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _Conn(sock)

    def run(self, request: bytes, read: _Reader) -> object:
        """Send ``request`` and parse the reply with ``read``; None if the server is unusable."""
        if not self.breaker.allow():
            self._stats.add(skipped=1)
            return None
        if self.breaker.dirty and not self._flush():
            return None
        return self._call(request, read)

    def _call(self, request: bytes, read: _Reader) -> object:
        deadline = time.monotonic() + self._timeout_s
        conn: _Conn | None = None
        try:
            try:
                conn = self._idle.pop()
            except IndexError:
                conn = self._connect()
            conn.send(request, deadline)
            result = read(conn, deadline)
        except (OSError, _ProtocolError, ValueError) as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, TimeoutError):
                # A hung server already cost a whole timeout: leave it alone at
                # once, so that no call pays the timeout twice.
                self.breaker.trip()
            else:
                self.breaker.failure()
            self._stats.add(errors=1)
            return None
        self._idle.append(conn)
        self.breaker.success()
        return result

    def close(self) -> None:
        """Close every idle socket."""
        while True:
            try:
                self._idle.pop().close()
            except IndexError:
                return

    def _flush(self) -> bool:
        """Empty a server that may hold values whose invalidation was lost."""
        with self._flush_lock:
            if not self.breaker.dirty:
                return True
            ok = self._call(b"flush_all\r\n", _expect_line(b"OK")) is True
            if ok:
                self.breaker.dirty = False
            return ok


class _Reader:
    """Callable protocol for reply parsers (kept as a class for mypy)."""

    def __call__(self, conn: _Conn, deadline: float) -> object:
        raise NotImplementedError


class _expect_line(_Reader):  # noqa: N801 - used like a function
    def __init__(self, expected: bytes) -> None:
        self.expected = expected

    def __call__(self, conn: _Conn, deadline: float) -> object:
        line = conn.line(deadline)
        if line != self.expected:
            raise _ProtocolError(f"expected {self.expected!r}, got {line[:80]!r}")
        return True


class _read_values(_Reader):  # noqa: N801
    def __call__(self, conn: _Conn, deadline: float) -> object:
        return conn.values(deadline)


class _read_status(_Reader):  # noqa: N801
    """``n`` one-line replies, then (optionally) a ``gets`` reply."""

    def __init__(self, n: int, then_values: bool = False) -> None:
        self.n = n
        self.then_values = then_values

    def __call__(self, conn: _Conn, deadline: float) -> object:
        lines = [conn.line(deadline) for _ in range(self.n)]
        for line in lines:
            if line.startswith((b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR")):
                raise _ProtocolError(line[:80].decode(errors="replace"))
        if self.then_values:
            return lines, conn.values(deadline)
        return lines


_VALUES = _read_values()


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

    def gets_many(self, keys: Sequence[str]) -> dict[str, tuple[bytes, int]]:
        """Value and cas token of every key present on a reachable server."""
        out: dict[str, tuple[bytes, int]] = {}
        for server, group in self._group(keys).items():
            got = server.run(b"gets " + " ".join(group).encode() + b"\r\n", _VALUES)
            if isinstance(got, dict):
                out.update(got)
        return out

    def lease_many(
        self, keys: Sequence[str], token: bytes, ttl_s: int, *, replace: Sequence[str] = ()
    ) -> dict[str, int]:
        """``add`` the marker to each key (deleting ``replace`` first) and read it back; cas tokens held."""
        out: dict[str, int] = {}
        head = f" 0 {ttl_s} {len(token)}\r\n".encode()
        old = set(replace)
        for server, group in self._group(keys).items():
            deletes = [k for k in group if k in old]
            request = b"".join(b"delete " + k.encode() + b"\r\n" for k in deletes)
            request += b"".join(b"add " + k.encode() + head + token + b"\r\n" for k in group)
            request += b"gets " + " ".join(group).encode() + b"\r\n"
            got = server.run(request, _read_status(len(deletes) + len(group), then_values=True))
            if got is None:
                continue
            assert isinstance(got, tuple)
            _lines, values = got
            for key, (value, cas) in values.items():
                if value == token:
                    out[key] = cas
        return out

    def cas_many(self, items: Mapping[str, tuple[bytes, int]], ttl_s: int) -> int:
        """``cas`` each value against its token; how many were stored."""
        stored = 0
        for server, group in self._group(list(items)).items():
            request = b"".join(
                f"cas {k} 0 {ttl_s} {len(items[k][0])} {items[k][1]}\r\n".encode() + items[k][0] + b"\r\n"
                for k in group
            )
            got = server.run(request, _read_status(len(group)))
            if isinstance(got, list):
                stored += sum(1 for line in got if line == b"STORED")
        return stored

    def delete_many(self, keys: Sequence[str]) -> None:
        """Delete each key and wait for the replies; a server that misses one is marked dirty."""
        for server, group in self._group(keys).items():
            request = b"".join(b"delete " + k.encode() + b"\r\n" for k in group)
            got = server.run(request, _read_status(len(group)))
            if got is None:
                # The delete may not have arrived: this server may now hold a
                # stale value. Empty it before it is trusted again.
                server.breaker.dirty = True

    def close(self) -> None:
        """Close every server's idle sockets."""
        for server in self.servers:
            server.close()
