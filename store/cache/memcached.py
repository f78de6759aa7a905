"""A `LeaseStore` over one or more memcached servers: pymemcache clients speaking the meta protocol.

Each server keeps idle pymemcache `Client`s (one connection each, made with
explicit connect and read timeouts, which pymemcache has none of by default,
and TCP_NODELAY) in a deque that threads take from and give back to. A batch
sends its meta commands for a server as one pipelined request closed by
``mn`` on one of those connections and reads the replies up to ``MN``: one
round trip per server per batch. The replies
are read here, not with `Client.raw_command`: pymemcache 4.0's segment reader
drops what arrived before the last read when a reply spans several reads,
as a pipelined reply of 50 keys does. Deletes wait for their replies
(pymemcache would send them with noreply by default), so a lost one is known.

Keys go to servers by rendezvous hashing over *all* configured servers, so
a server that fails is skipped (its keys are misses) and never silently
replaced by another server that would then hold copies no invalidation
reaches. Each server has a `Breaker`: after repeated failures it is left
alone for a cool-down, and a timeout leaves it alone at once. A delete that
could not be delivered marks the server dirty: it may hold a value the
database no longer has. Before it is used again the deletes it may have
missed are sent again (the keys are remembered, up to `LOST_DELETES_MAX`);
only past that many is it flushed. A reply that came late (a pause of the
process, a loaded machine) thus costs one more request, not the whole cache.

The idle clients are the process's own: a child of ``os.fork()`` closes the
ones it inherited (locally: nothing is sent) and connects its own
(`store.forks`).
"""

from __future__ import annotations

import os
import re
import socket
import threading
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TypeVar

from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheError

from store import green
from store.cache.leases import Lookups
from store.cache.stats import Breaker, CacheStats, LostInvalidations
from store.forks import at_fork

__all__ = ["LOST_DELETES_MAX", "MemcachedLeaseStore", "MemcachedServer", "POOL_SIZE"]

T = TypeVar("T")
#: Idle sockets kept per server and process (as many are open as calls use the server at once:
#: a thread each, or with `AsyncStore(io="native")` a task each; one closed is made again).
POOL_SIZE = 256
#: The most keys whose lost deletes a server remembers to send again; past it, it is flushed.
LOST_DELETES_MAX = 1000
_END = b"MN\r\n"
_END_LEN = len(_END)
_LAST = b"\r\n" + _END
_RECV_SIZE = 16384
_ERRORS = (b"CLIENT_ERROR", b"SERVER_ERROR", b"ERROR")


class _ProtocolError(Exception):
    """The server said something this client does not expect."""


#: What a failed exchange raises: the server is then counted as failing.
_FAILURES = (OSError, MemcacheError, _ProtocolError, ValueError)


class _Client(Client):  # type: ignore[misc]
    """A pymemcache client that knows the process it was made in (`store.forks`), and the replies
    its connection owes: one per request sent without waiting (`MemcachedServer.post`), each
    given to its reader once it is read, before the next request's."""

    store_pid: int = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.owed: list[Callable[[bytes], None]] = []


class MemcachedServer:
    """One server: idle pymemcache clients with timeouts, and a breaker."""

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
        self._server = (host or "127.0.0.1", int(port))
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        # Idle clients, each with its own socket. deque.pop and .append are
        # atomic, so taking and returning one needs no lock (pymemcache's
        # ObjectPool takes one and builds a context manager per call).
        self._idle: deque[_Client] = deque()
        self.breaker = breaker
        self._stats = stats
        self._flush_lock = threading.Lock()
        #: Keys whose deletes may not have arrived, sent again before the server is used
        #: (`_flush`); more than `LOST_DELETES_MAX` of them, and it is flushed instead.
        self.lost = LostInvalidations(breaker, LOST_DELETES_MAX)
        #: The process whose sockets ``_idle`` holds.
        self._pid = os.getpid()
        at_fork(self, MemcachedServer._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: close the inherited sockets here only (pymemcache's ``close`` sends
        nothing; the parent's descriptors stay open), make the lock again."""
        if self._pid == os.getpid():
            return
        self._flush_lock = threading.Lock()
        inherited, self._idle = self._idle, deque()
        self._pid = os.getpid()
        for client in inherited:
            client.close()

    def _take(self) -> _Client:
        if self._pid != _getpid():  # a fork the hook missed
            self._after_fork()
        wanted = green.socket_module()  # an event loop's call: sockets whose waits are the loop's
        while True:
            try:
                client = self._idle.pop()
            except IndexError:
                break
            if client.socket_module is wanted or wanted is socket:
                return client
            # Opened outside an event loop's call: inside one it would hold the loop at each reply.
            client.close()
        client = _Client(
            self._server,
            connect_timeout=self._connect_timeout_s,
            timeout=self._timeout_s,
            no_delay=True,
            default_noreply=False,
            socket_module=wanted,
        )
        client.store_pid = self._pid
        return client

    def _give_back(self, client: _Client) -> None:
        if client.store_pid != self._pid:  # taken before this process was forked
            client.close()
        elif len(self._idle) < POOL_SIZE:
            self._idle.append(client)
        else:
            client.close()

    @contextmanager
    def borrow(self) -> Iterator[Client]:
        """A pymemcache `Client` on one of this server's pooled connections, given back after.

        For tools and benchmarks (the store's own calls go through `pipeline`):
        a floor measured on the same connection is served by the same memcached
        worker thread as the store's calls. A client that raised is closed.
        """
        client = self._take()
        try:
            _settle(client)  # (pymemcache's own reads must start at their reply)
            yield client
        except BaseException:
            client.close()
            raise
        self._give_back(client)

    def pipeline(self, commands: Sequence[bytes], parse: Callable[[bytes], T]) -> T | None:
        """Send ``commands`` as one request closed by ``mn``; the parsed replies, or None if the server
        is unusable (down, cooling down, or dirty and not yet flushed)."""
        if not self._ready():
            return None
        try:
            result = parse(self._exchange(_request(commands)))
        except _FAILURES as exc:
            self._failed(exc)
            return None
        self.breaker.success()
        return result

    def post(self, commands: Sequence[bytes], reader: Callable[[bytes], None]) -> bool:
        """Send ``commands`` as one request closed by ``mn`` and return without waiting for the
        reply: the connection reads it (and gives it to ``reader``) before the next request's, so
        a caller that only hopes the commands work (a lease's fill) does not wait a round trip
        for them. The server has the request when this returns. False if the server is unusable
        (down, cooling down, or dirty and not yet flushed) or the send failed."""
        if not self._ready():
            return False
        try:
            self._exchange(_request(commands), later=reader)
        except _FAILURES as exc:
            self._failed(exc)
            return False
        self.breaker.success()
        return True

    def _ready(self) -> bool:
        """Whether the server may be asked now: not cooling down, and flushed if it was dirty."""
        if not self.breaker.allow():
            self._stats.add(skipped=1)
            return False
        return not (self.breaker.dirty and not self._flush())

    def begin(self, commands: Sequence[bytes]) -> Callable[[], bool] | None:
        """Send ``commands`` as one request closed by ``mn`` now, and hold the connection until the
        returned function is called: it reads the reply (True if the server answered) and gives
        the connection back. So a caller can do other work while the server answers (another
        cache's round trip) and still know the commands ran before it returns. It must call the
        function, in a ``finally``. None if the server is unusable or the send failed."""
        if not self._ready():
            return None
        client = self._take()
        try:
            sock = self._connected(client)
            sock.sendall(_request(commands))
        except _FAILURES as exc:
            client.close()
            self._failed(exc)
            return None
        except BaseException:
            client.close()
            raise

        def finish() -> bool:
            try:
                _reply(sock, client)
            except _FAILURES as exc:
                client.close()
                self._failed(exc)
                return False
            except BaseException:
                client.close()  # its socket may hold half a reply
                raise
            self._give_back(client)
            self.breaker.success()
            return True

        return finish

    @staticmethod
    def _connected(client: _Client) -> socket.socket:
        """``client``'s socket, connected first if it has none."""
        if client.sock is None:
            client.owed.clear()  # (a new socket owes nothing)
            client.version()  # connects, with the client's timeouts, and checks the server
        sock: socket.socket = client.sock
        return sock

    def _exchange(self, request: bytes, *, later: Callable[[bytes], None] | None = None) -> bytes:
        """Send ``request`` on an idle connection; every byte of the reply before ``MN`` (with
        ``later``: nothing, the reply is read and given to it with the connection's next one)."""
        client = self._take()
        try:
            sock = self._connected(client)
            sock.sendall(request)
            if later is not None:
                client.owed.append(later)
                reply = b""
            else:
                reply = _reply(sock, client)
        except BaseException:
            client.close()  # its socket may hold half a reply
            raise
        self._give_back(client)
        return reply

    def read_owed(self) -> None:
        """Read what this server's idle connections owe (a connection that fails is closed)."""
        owing: list[_Client] = []
        for _ in range(len(self._idle)):
            try:
                client = self._idle.pop()
            except IndexError:
                break
            owing.append(client)
        for client in owing:
            try:
                _settle(client)
            except _FAILURES as exc:
                client.close()
                self._failed(exc)
                continue
            self._give_back(client)

    def note(self, exc: BaseException) -> None:
        """Count an error a reply read later showed (the exchange it came with went on)."""
        self._stats.error(self.address, exc)

    def _failed(self, exc: BaseException) -> None:
        if isinstance(exc, TimeoutError):
            # A hung server already cost a whole timeout: leave it alone at
            # once, so that no call pays the timeout twice.
            self.breaker.trip()
        else:
            self.breaker.failure()
        self._stats.error(self.address, exc)

    def _flush(self) -> bool:
        """Clean a server that may hold values whose invalidation was lost: its lost deletes sent
        again, or (too many of them, or not known) the server flushed."""
        # Inside an event loop's call a lock held across I/O must not be waited for (the holder
        # may be another call on this very thread): the server counts as not yet emptied.
        if not self._flush_lock.acquire(blocking=not green.active()):
            return False
        try:
            return self._flush_held()
        finally:
            self._flush_lock.release()

    def _flush_held(self) -> bool:
        """`_flush`, its lock held: the lost deletes sent again, or the server flushed."""
        if not self.breaker.dirty:
            return True
        generation, keys = self.lost.pending()
        try:
            if keys is None:
                done = self._flush_all()
            else:
                replies = _replies(self._exchange(_request([b"md " + k.encode() for k in keys])))
                # Deleted or not found, each: anything else, and it is tried again next time.
                done = len(replies) == len(keys) and all(line[:2] in (b"HD", b"NF") for line, _v in replies)
        except _FAILURES as exc:
            self._failed(exc)
            return False
        self.breaker.success()
        return done and self.lost.sent(generation, keys)

    def _flush_all(self) -> bool:
        """``flush_all`` on an idle connection; True if the server said it was done."""
        client = self._take()
        try:
            _settle(client)
            flushed = client.flush_all(noreply=False)
        except BaseException:
            client.close()
            raise
        self._give_back(client)
        return flushed is True

    def close(self) -> None:
        """Close every idle socket."""
        while self._idle:
            self._idle.pop().close()


_getpid = os.getpid


def _request(commands: Sequence[bytes]) -> bytes:
    """``commands`` as one request, closed by ``mn`` (its reply ends at the line ``MN``)."""
    return b"\r\n".join([*commands, b"mn"]) + b"\r\n"


def _settle(client: _Client) -> None:
    """Read what ``client``'s connection owes, before pymemcache's own calls use it (a connection
    closed since owes nothing: its replies went with its socket)."""
    if not client.owed:
        return
    if client.sock is None:
        client.owed.clear()
    else:
        _read(client.sock, client, reply=False)


def _reply(sock: socket.socket, client: _Client) -> bytes:
    """Read the reply to the request just sent on ``client``'s connection (after the replies it
    owes, each given to its reader): every byte before its ``MN`` line."""
    if client.owed:
        return _read(sock, client)
    # The socket's timeout is the client's. Small reads: recv allocates
    # its whole size up front (64 KiB per call cost 30 us here); 16 KiB holds a
    # 50-key reply whole.
    chunk: bytes = sock.recv(_RECV_SIZE)
    # Replies are lines, and values free of CR LF that never read "MN"
    # (an entry starts with its tag): the reply ends with a line MN.
    if chunk == _END or chunk.endswith(_LAST):
        return chunk[:-_END_LEN]
    buf = bytearray(chunk)
    while True:
        if not chunk:
            raise ConnectionError("memcached closed the connection")
        chunk = sock.recv(_RECV_SIZE)
        buf += chunk
        if buf == _END or buf.endswith(_LAST):
            return bytes(buf[:-_END_LEN])


def _read(sock: socket.socket, client: _Client, *, reply: bool = True) -> bytes:
    """Read the replies ``client``'s connection owes, giving each to its reader, then (``reply``)
    the reply to the request just sent, which this returns (else b""). A reply ends at a line
    ``MN``, which no value can be."""
    owed = client.owed
    want = len(owed) + (1 if reply else 0)
    ends: list[int] = []  # the offset just past each MN line read
    buf = bytearray()
    while len(ends) < want:
        chunk = sock.recv(_RECV_SIZE)
        if not chunk:
            raise ConnectionError("memcached closed the connection")
        start = max(0, len(buf) - 3)  # (an MN line may begin in the last chunk)
        buf += chunk
        at = buf.find(_END, start)
        while at != -1:
            if at == 0 or buf[at - 2 : at] == b"\r\n":
                ends.append(at + _END_LEN)
            at = buf.find(_END, at + 1)
    client.owed = []
    begin = 0
    for reader, end in zip(owed, ends, strict=False):
        reader(bytes(buf[begin : end - _END_LEN]))
        begin = end
    return bytes(buf[begin : ends[-1] - _END_LEN]) if reply else b""


def _replies(raw: bytes) -> list[tuple[bytes, bytes | None]]:
    """Meta replies in order: (status line, value or None). Values never hold CR or LF."""
    out: list[tuple[bytes, bytes | None]] = []
    lines = raw.split(b"\r\n")
    i = 0
    while i < len(lines) - 1:  # the text ends with CR LF: the last piece is empty
        line = lines[i]
        if line.startswith(_ERRORS):
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


class _Stored:
    """Reads the replies to fills sent without waiting: tells ``later`` how many were stored (an
    error reply counts as an error of the server, as it would have in the call)."""

    __slots__ = ("later", "n", "server")

    def __init__(self, n: int, later: Callable[[int], None], server: MemcachedServer) -> None:
        self.n = n
        self.later = later
        self.server = server

    def __call__(self, raw: bytes) -> None:
        lines = raw.split(b"\r\n")[:-1]
        if any(line.startswith(_ERRORS) for line in lines) or len(lines) != self.n:
            self.server.note(_ProtocolError(f"{len(lines)} reply lines to {self.n} fills: {raw[:80]!r}"))
        self.later(sum(1 for line in lines if line.startswith(b"HD")))


class _LookupParser:
    """Reads the replies to a batch: ``skip`` deletes' lines, then one ``mg k v c N<ttl>`` per key."""

    __slots__ = ("keys", "skip")

    def __init__(self, keys: list[str], skip: int) -> None:
        self.keys = keys
        self.skip = skip

    def __call__(self, raw: bytes) -> Lookups:
        # This is the warm read path: no Python work per key here. N vivifies a miss, so every
        # lookup's reply is a line "VA <size> c<cas>" (then W if this caller won) and a value
        # line; a delete's reply is one line. Values hold no CR or LF (an entry starts with its
        # tag), so the lines fall in place: checked by their count, by every head line starting
        # "VA ", and by the sizes the heads announce adding up to the values' (all in C).
        lines = raw.split(b"\r\n")
        n, skip = len(self.keys), self.skip
        if len(lines) != skip + 2 * n + 1:  # the text ends with CR LF
            raise _ProtocolError(f"{len(lines) - 1} reply lines to {skip + n} commands")
        for line in lines[:skip]:
            if line.startswith(_ERRORS):
                raise _ProtocolError(line[:80].decode(errors="replace"))
        heads = lines[skip:-1:2]
        values = lines[skip + 1 :: 2]
        sizes = _HEAD_SIZE.findall(b"\n".join(heads))
        if len(sizes) != n or sum(map(int, sizes)) != sum(map(len, values)):
            raise _ProtocolError(f"unexpected replies to lookups: {raw[:80]!r}")
        return Lookups(self.keys, values, heads)


#: A lookup's reply line: its size (the check of `_LookupParser`), then the cas token.
_HEAD_SIZE = re.compile(rb"^VA (\d+) c\d+(?= |$)", re.MULTILINE)


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
        self.stats.before_read = self.read_owed  # (fills counted when their replies are read)

    def server_for(self, key: str) -> MemcachedServer:
        """The one server that owns ``key`` (rendezvous hashing over all servers)."""
        if len(self.servers) == 1:
            return self.servers[0]
        k = key.encode()
        best = max(range(len(self.servers)), key=lambda i: zlib.crc32(k, self._seeds[i]))
        return self.servers[best]

    def _group(self, keys: Sequence[str]) -> dict[MemcachedServer, list[str]]:
        if len(self.servers) == 1:
            return {self.servers[0]: list(keys)}
        groups: dict[MemcachedServer, list[str]] = {}
        for key in keys:
            groups.setdefault(self.server_for(key), []).append(key)
        return groups

    def lookup_many(self, keys: Sequence[str], *, lease_ttl_s: int, drop: Sequence[str] = ()) -> Lookups:
        """``mg key v c N<ttl>`` per key (after ``md`` of each of ``drop``): entries, or leases won
        (a server that fails leaves its keys out)."""
        out = Lookups([], [], [])
        gone = set(drop)
        for server, group in self._group(keys).items():
            deletes = [b"md " + k.encode() for k in group if k in gone]
            flags = b" v c N%d" % lease_ttl_s
            gets = [b"mg " + k.encode() + flags for k in group]
            got = server.pipeline([*deletes, *gets], _LookupParser(group, len(deletes)))
            if got is not None:
                out.extend(got)
        return out

    def fill_many(
        self,
        items: Mapping[str, tuple[bytes, int]],
        ttl_s: int,
        *,
        later: Callable[[int], None] | None = None,
    ) -> int:
        """``ms key <len> C<cas> T<ttl>`` per item; how many were stored.

        With ``later``: the replies are not waited for (`MemcachedServer.post`: a fill only
        hopes to store, and nothing the caller returns depends on it); 0, and ``later`` is
        told how many a server stored when its replies are read (before the connection's next
        reply, or by `read_owed`)."""
        for key, (value, _cas) in items.items():
            if b"\r" in value or b"\n" in value or value == b"MN":
                raise ValueError(
                    f"cannot cache {key!r}: values must hold no CR, LF and must not read MN "
                    "(they would break the framing of a pipelined reply)"
                )
        stored = 0
        for server, group in self._group(list(items)).items():
            commands = [
                b"ms %s %d C%d T%d\r\n%s" % (k.encode(), len(items[k][0]), items[k][1], ttl_s, items[k][0])
                for k in group
            ]
            if later is not None:
                server.post(commands, _Stored(len(commands), later, server))
                continue
            got = server.pipeline(commands, _replies)
            if got is not None:
                stored += sum(1 for line, _v in got if line.startswith(b"HD"))
        return stored

    def read_owed(self) -> None:
        """Read the replies the idle connections owe (fills not waited for), now."""
        for server in self.servers:
            server.read_owed()

    def delete_many(self, keys: Sequence[str]) -> None:
        """``md`` each key and wait for the replies; a server that misses one is marked dirty."""
        for server, group in self._group(keys).items():
            got = server.pipeline([b"md " + k.encode() for k in group], _replies)
            if got is None:
                # The delete may not have arrived: this server may now hold a
                # stale value. Delete again before it is trusted again.
                server.lost.lose(group)

    def delete_many_begin(self, keys: Sequence[str]) -> Callable[[], None]:
        """`delete_many`, sent now: the returned function waits for the replies (call it in a
        ``finally``), so the caller's next round trip overlaps this one."""
        held: list[tuple[MemcachedServer, list[str], Callable[[], bool] | None]] = [
            (server, group, server.begin([b"md " + k.encode() for k in group]))
            for server, group in self._group(keys).items()
        ]

        def finish() -> None:
            for server, group, reply in held:
                if reply is None or not reply():
                    server.lost.lose(group)  # (as in delete_many)

        return finish

    def set_many(self, items: Mapping[str, bytes], ttl_s: int) -> bool:
        """``ms key <len> T<ttl>`` per item, unconditionally (heartbeats); True if every server took
        its items."""
        ok = True
        for server, group in self._group(list(items)).items():
            commands = [b"ms %s %d T%d\r\n%s" % (k.encode(), len(items[k]), ttl_s, items[k]) for k in group]
            got = server.pipeline(commands, _replies)
            ok = ok and got is not None and all(line.startswith(b"HD") for line, _v in got)
        return ok

    def peek_many(self, keys: Sequence[str]) -> dict[str, bytes]:
        """``mg key v`` per key: what each holds (no lease taken)."""
        out: dict[str, bytes] = {}
        for server, group in self._group(keys).items():
            got = server.pipeline([b"mg " + k.encode() + b" v" for k in group], _replies)
            for key, (line, value) in zip(group, got or [], strict=False):
                if line.startswith(b"VA ") and value is not None:
                    out[key] = value
        return out

    def cache_servers(self) -> list[MemcachedServer]:
        """Every configured server (`store.cache.stats.CacheServers`)."""
        return list(self.servers)

    def close(self) -> None:
        """Close every server's pooled sockets."""
        for server in self.servers:
            server.close()
