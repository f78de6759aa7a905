"""A TCP proxy on loopback that injects network faults: owned by tests/faults.

This machine has no netem or iptables, so a test puts a `FaultProxy` between a
client and one server (memcached, Redis, MariaDB, ...) and points the client at
``proxy.port``. The proxy then passes bytes through, delays them, swallows them
(a partition the client only notices by its own timeout), or resets
connections, switching at any time for open and new connections alike::

    with FaultProxy(11211) as proxy:
        client = connect(port=proxy.port)
        proxy.blackhole()   # client calls now time out; the server is fine
        proxy.restore()     # new connections work again

Every mode switch returns once every open connection has taken it up, so a
test never races the proxy's threads. Threads: one acceptor, one per open
connection; all wait in poll() and are woken through a socket pair on every
switch and on close(), and every buffer is capped (a full buffer stops reading,
a blackholed connection throws its bytes away).
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import math
import select
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from types import TracebackType

__all__ = ["FaultProxy", "Mode", "ProxyStats"]

LISTEN_HOST = "127.0.0.1"
CHUNK = 65536
# Per direction and connection: past this the proxy stops reading, so a slow
# reader or a long delay pushes back on the sender through TCP instead of
# growing memory.
MAX_BUFFERED = 1 << 20
# Wake-ups come through the wake socket pair; this cap only bounds how long a
# lost wake-up could go unnoticed.
POLL_CAP_S = 0.25
CONNECT_TIMEOUT_S = 2.0
# A switch waits for connections still connecting upstream (CONNECT_TIMEOUT_S).
SWITCH_WAIT_S = CONNECT_TIMEOUT_S + 1.0
JOIN_TIMEOUT_S = 5.0
ACCEPTS_PER_WAKE = 64

_READ = select.POLLIN | select.POLLPRI
_BROKEN = select.POLLERR | select.POLLNVAL


class Mode(enum.StrEnum):
    """What the proxy does with the bytes of every connection."""

    PASS_THROUGH = "pass_through"
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    RESET = "reset"
    REFUSE = "refuse"


@dataclass(frozen=True)
class ProxyStats:
    """A snapshot of the proxy's counters since it was made.

    ``bytes_to_server`` and ``bytes_to_client`` count bytes written onward;
    ``bytes_discarded`` counts bytes a blackhole read and threw away (both
    directions); ``resets`` counts connections the proxy closed with a RST.
    """

    accepted: int
    active: int
    bytes_to_server: int
    bytes_to_client: int
    bytes_discarded: int
    resets: int


def _abort(sock: socket.socket | None) -> None:
    """Close with SO_LINGER 0, so the kernel sends a RST instead of a FIN."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Direction:
    """Bytes on their way from one socket to the other."""

    __slots__ = ("eof", "out", "pending", "pending_bytes", "shut")

    def __init__(self) -> None:
        # (due time, chunk): held back until due; only the head is ever
        # released, so a shorter delay set later never reorders chunks.
        self.pending: deque[tuple[float, bytes]] = deque()
        self.pending_bytes = 0
        self.out = bytearray()  # due and not yet written
        self.eof = False  # the source sent FIN
        self.shut = False  # FIN passed on to the destination

    @property
    def buffered(self) -> int:
        return self.pending_bytes + len(self.out)

    def release(self, hold: bool, now: float) -> None:
        while self.pending and (not hold or self.pending[0][0] <= now):
            _, chunk = self.pending.popleft()
            self.pending_bytes -= len(chunk)
            self.out += chunk

    def next_due(self) -> float | None:
        return self.pending[0][0] if self.pending else None

    def discard(self) -> None:
        self.pending.clear()
        self.pending_bytes = 0
        self.out.clear()


class _Connection:
    """One client connection and its upstream; run() is its thread."""

    def __init__(self, proxy: FaultProxy, client: socket.socket, *, blackholed: bool) -> None:
        self.proxy = proxy
        self.client = client
        self.upstream: socket.socket | None = None
        # Once blackholed, the byte streams have holes in them, so the
        # connection is never forwarded again: a later switch closes it.
        self.blackholed = blackholed
        self.applied = -1  # the last mode generation this connection acted on
        self.wake_r, self.wake_w = socket.socketpair()
        self.wake_r.setblocking(False)
        self.wake_w.setblocking(False)
        self.to_server = _Direction()
        self.to_client = _Direction()

    def wake(self) -> None:
        """Interrupt poll(); called with the proxy lock held, so never after close_wake()."""
        # A full pair already holds a pending wake-up, which is all it takes.
        with contextlib.suppress(OSError):
            self.wake_w.send(b"w")

    def close_wake(self) -> None:
        self.wake_r.close()
        self.wake_w.close()

    def run(self) -> None:
        try:
            if not self.blackholed and not self._connect():
                return
            self.client.setblocking(False)
            self.client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._loop()
        except OSError:
            self._abort_all()
        finally:
            if self.client.fileno() != -1:  # a bug in the loop: never leak the sockets
                self._abort_all()
            self.proxy._forget(self)

    def _connect(self) -> bool:
        try:
            upstream = socket.create_connection(
                (self.proxy.target_host, self.proxy.target_port), timeout=CONNECT_TIMEOUT_S
            )
        except OSError:
            # The server is down or unreachable: the client sees a reset, as
            # it would from a server host with nothing on the port.
            self._abort_all()
            return False
        upstream.setblocking(False)
        # Chunks go out as they come, so delays measure the proxy, not Nagle.
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.upstream = upstream
        return True

    def _abort_all(self) -> None:
        if self.client.fileno() != -1:
            self.proxy._count(resets=1)
        _abort(self.client)
        _abort(self.upstream)
        self.upstream = None

    def _close_all(self) -> None:
        self.client.close()
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self.wake_r, select.POLLIN)
        watched: dict[int, int] = {}
        while True:
            stopping, mode, delay_s, generation = self.proxy._snapshot()
            if stopping or mode in (Mode.RESET, Mode.REFUSE):
                self._abort_all()
                return
            if mode is Mode.BLACKHOLE:
                if not self.blackholed:
                    self.blackholed = True
                    self.to_server.discard()
                    self.to_client.discard()
            elif self.blackholed:
                self._abort_all()
                return
            if generation != self.applied:
                self.proxy._applied(self, generation)

            now = time.monotonic()
            hold = mode is Mode.DELAY
            for d in (self.to_server, self.to_client):
                d.release(hold, now)
            if not self._pass_eof(mode):
                return

            client_mask, upstream_mask = self._interest(mode)
            wanted = {self.client.fileno(): client_mask}
            if self.upstream is not None:
                wanted[self.upstream.fileno()] = upstream_mask
            wanted = {fd: mask for fd, mask in wanted.items() if mask}
            # Before poll(), so a closed socket's descriptor, which the
            # kernel may already have handed to another connection, is
            # never polled.
            for fd in [fd for fd in watched if wanted.get(fd) != watched[fd]]:
                poller.unregister(fd)
                del watched[fd]
            for fd, mask in wanted.items():
                if fd not in watched:
                    poller.register(fd, mask)
                    watched[fd] = mask

            timeout_s = POLL_CAP_S
            if hold:
                dues = [t for t in (self.to_server.next_due(), self.to_client.next_due()) if t is not None]
                if dues:
                    timeout_s = min(timeout_s, max(0.0, min(dues) - now))
            for fd, event in poller.poll(math.ceil(timeout_s * 1000)):
                if fd == self.wake_r.fileno():
                    self._drain_wake()
                    continue
                if event & _BROKEN:
                    self._abort_all()
                    return
                if fd == self.client.fileno():
                    sock, mask, upstream = self.client, client_mask, False
                elif self.upstream is not None and fd == self.upstream.fileno():
                    sock, mask, upstream = self.upstream, upstream_mask, True
                else:
                    continue
                if self._serve(sock, event, mask, mode, delay_s, upstream=upstream):
                    return

    def _interest(self, mode: Mode) -> tuple[int, int]:
        """The poll masks for the client and the upstream socket."""
        discarding = mode is Mode.BLACKHOLE
        client = upstream = 0
        if not self.to_server.eof and (discarding or self.to_server.buffered < MAX_BUFFERED):
            client |= _READ
        if self.to_client.out:
            client |= select.POLLOUT
        if self.upstream is not None:
            if not self.to_client.eof and (discarding or self.to_client.buffered < MAX_BUFFERED):
                upstream |= _READ
            if self.to_server.out:
                upstream |= select.POLLOUT
        return client, upstream

    def _pass_eof(self, mode: Mode) -> bool:
        """Pass a FIN on once its direction is drained; False when the connection is over."""
        if mode is Mode.BLACKHOLE:
            if self.to_server.eof:  # the client left: nobody is waiting any more
                self._close_all()
                return False
            if self.to_client.eof and self.upstream is not None:
                # The server gave up; the client must not notice, so only
                # the upstream side goes.
                self.upstream.close()
                self.upstream = None
            return True
        for d, dst in ((self.to_server, self.upstream), (self.to_client, self.client)):
            if d.eof and not d.shut and not d.buffered:
                assert dst is not None  # only a blackhole drops the upstream
                dst.shutdown(socket.SHUT_WR)
                d.shut = True
        if self.to_server.shut and self.to_client.shut:
            self._close_all()
            return False
        return True

    def _serve(
        self, sock: socket.socket, event: int, mask: int, mode: Mode, delay_s: float, *, upstream: bool
    ) -> bool:
        """Read and write what poll() reported on ``sock``; True when the connection is over."""
        inbound, outbound = (self.to_client, self.to_server) if upstream else (self.to_server, self.to_client)
        try:
            if mask & _READ and event & (_READ | select.POLLHUP):
                try:
                    chunk = sock.recv(CHUNK)
                except BlockingIOError:
                    chunk = None
                if chunk == b"":
                    inbound.eof = True
                elif chunk is not None:
                    if mode is Mode.BLACKHOLE:
                        self.proxy._count(discarded=len(chunk))
                    else:
                        due = time.monotonic() + (delay_s if mode is Mode.DELAY else 0.0)
                        inbound.pending.append((due, chunk))
                        inbound.pending_bytes += len(chunk)
            if mask & select.POLLOUT and event & (select.POLLOUT | select.POLLHUP) and outbound.out:
                try:
                    sent = sock.send(outbound.out)
                except BlockingIOError:
                    sent = 0
                del outbound.out[:sent]
                if upstream:
                    self.proxy._count(to_server=sent)
                else:
                    self.proxy._count(to_client=sent)
        except OSError:
            # A reset or a broken pipe on one side: pass the reset on, as a
            # router dropping the connection would.
            self._abort_all()
            return True
        return False

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            self.wake_r.recv(4096)


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of one server, with switchable faults.

    The listening socket is bound at construction, so ``port`` is known before
    ``start()``. Modes (all apply to open and new connections alike, and each
    switch returns once every open connection has taken it up):

    - ``pass_through()``: bytes are forwarded as they come (the default).
    - ``delay(seconds)``: every chunk, either way, is held back ``seconds``;
      order is kept, so a request/reply round trip takes about 2 x seconds.
    - ``blackhole()``: connections stay open, bytes are read and thrown away
      both ways, and new connections are accepted and blackholed too: a client
      only notices by its own timeout. The server side stays open and is not
      told anything.
    - ``reset()``: every open connection is closed with a RST (both sides) and
      new connections are accepted and reset at once.
    - ``refuse()``: the same as reset(), under its own name for reports: the
      TCP handshake still completes (the kernel does it), then the first read
      or write fails with ConnectionResetError or BrokenPipeError.
    - ``restore()``: pass_through(). Connections that were ever blackholed are
      reset, because bytes went missing from their streams.

    When the server is down, a new connection is reset rather than refused.
    ``close()`` resets every connection, joins every thread and frees the port.
    """

    def __init__(self, target_port: int, *, target_host: str = "127.0.0.1", listen_port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self._lock = threading.Lock()
        self._switched = threading.Condition(self._lock)
        self._mode = Mode.PASS_THROUGH
        self._delay_s = 0.0
        self._generation = 0
        self._stopping = False
        self._conns: set[_Connection] = set()
        self._threads: list[threading.Thread] = []
        self._acceptor: threading.Thread | None = None
        self._ids = itertools.count(1)
        self._accepted = 0
        self._to_server = 0
        self._to_client = 0
        self._discarded = 0
        self._resets = 0
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((LISTEN_HOST, listen_port))
            listener.listen(128)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self.port: int = listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)

    def __repr__(self) -> str:
        return f"<FaultProxy {LISTEN_HOST}:{self.port} -> {self.target_host}:{self.target_port} {self.mode}>"

    @property
    def host(self) -> str:
        """The host clients connect to."""
        return LISTEN_HOST

    @property
    def address(self) -> str:
        """``host:port`` for clients, as configs write server addresses."""
        return f"{LISTEN_HOST}:{self.port}"

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> FaultProxy:
        """Start accepting connections; returns self."""
        with self._lock:
            if self._stopping:
                raise RuntimeError("FaultProxy is closed")
            if self._acceptor is not None:
                raise RuntimeError("FaultProxy is already started")
            self._acceptor = threading.Thread(
                target=self._accept_loop, name=f"{self._name()}-accept", daemon=True
            )
            self._acceptor.start()
        return self

    def close(self) -> None:
        """Reset every connection, stop accepting, join every thread. Idempotent."""
        with self._lock:
            self._stopping = True
            for conn in self._conns:
                conn.wake()
            with contextlib.suppress(OSError):
                self._wake_w.send(b"w")
            acceptor, threads = self._acceptor, list(self._threads)
        if acceptor is not None:
            acceptor.join(JOIN_TIMEOUT_S)
        # The acceptor starts no thread once stopping is set: this list is complete.
        for thread in threads:
            thread.join(JOIN_TIMEOUT_S)
        alive = [t.name for t in [acceptor, *threads] if t is not None and t.is_alive()]
        with self._lock:
            self._listener.close()
            self._wake_r.close()
            self._wake_w.close()
        if alive:
            raise RuntimeError(f"FaultProxy threads did not stop: {alive}")

    def __enter__(self) -> FaultProxy:
        if self._acceptor is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- modes ---------------------------------------------------------------

    @property
    def mode(self) -> Mode:
        """The current mode."""
        with self._lock:
            return self._mode

    @property
    def delay_s(self) -> float:
        """The delay of Mode.DELAY (0.0 in every other mode)."""
        with self._lock:
            return self._delay_s

    def pass_through(self) -> None:
        """Forward bytes as they come (the default); ends blackholed connections."""
        self._switch(Mode.PASS_THROUGH)

    def restore(self) -> None:
        """Back to pass_through(): new connections work; blackholed ones are reset."""
        self._switch(Mode.PASS_THROUGH)

    def delay(self, seconds: float) -> None:
        """Hold every chunk back ``seconds`` in either direction, keeping order."""
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"delay must be a finite number of seconds >= 0, not {seconds!r}")
        self._switch(Mode.DELAY, seconds)

    def blackhole(self) -> None:
        """Swallow every byte both ways and never reply; connections stay open."""
        self._switch(Mode.BLACKHOLE)

    def reset(self) -> None:
        """Reset (RST) every open connection and every new one at once."""
        self._switch(Mode.RESET)

    def refuse(self) -> None:
        """Reset new connections at once, and the open ones too."""
        self._switch(Mode.REFUSE)

    def _switch(self, mode: Mode, delay_s: float = 0.0) -> None:
        with self._switched:
            if self._stopping:
                raise RuntimeError("FaultProxy is closed")
            self._mode = mode
            self._delay_s = delay_s
            self._generation += 1
            generation = self._generation
            for conn in self._conns:
                conn.wake()
            deadline = time.monotonic() + SWITCH_WAIT_S
            while any(c.applied < generation for c in self._conns):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError(f"{self!r}: connections did not take up {mode} in {SWITCH_WAIT_S} s")
                self._switched.wait(remaining)

    # -- counters ------------------------------------------------------------

    def stats(self) -> ProxyStats:
        """All counters at once, consistent with each other."""
        with self._lock:
            return ProxyStats(
                accepted=self._accepted,
                active=len(self._conns),
                bytes_to_server=self._to_server,
                bytes_to_client=self._to_client,
                bytes_discarded=self._discarded,
                resets=self._resets,
            )

    @property
    def accepted(self) -> int:
        """Connections accepted, whatever became of them."""
        return self.stats().accepted

    @property
    def active(self) -> int:
        """Connections open now."""
        return self.stats().active

    @property
    def bytes_to_server(self) -> int:
        """Bytes written to the server."""
        return self.stats().bytes_to_server

    @property
    def bytes_to_client(self) -> int:
        """Bytes written to clients."""
        return self.stats().bytes_to_client

    @property
    def bytes_discarded(self) -> int:
        """Bytes a blackhole read and threw away, both directions."""
        return self.stats().bytes_discarded

    # -- for the threads -----------------------------------------------------

    def _name(self) -> str:
        return f"FaultProxy:{self.port}->{self.target_port}"

    def _snapshot(self) -> tuple[bool, Mode, float, int]:
        with self._lock:
            return self._stopping, self._mode, self._delay_s, self._generation

    def _applied(self, conn: _Connection, generation: int) -> None:
        with self._switched:
            conn.applied = generation
            self._switched.notify_all()

    def _forget(self, conn: _Connection) -> None:
        with self._switched:
            self._conns.discard(conn)
            conn.close_wake()
            self._switched.notify_all()

    def _count(self, *, to_server: int = 0, to_client: int = 0, discarded: int = 0, resets: int = 0) -> None:
        with self._lock:
            self._to_server += to_server
            self._to_client += to_client
            self._discarded += discarded
            self._resets += resets

    def _accept_loop(self) -> None:
        poller = select.poll()
        poller.register(self._listener, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            with self._lock:
                if self._stopping:
                    return
            for fd, _ in poller.poll(math.ceil(POLL_CAP_S * 1000)):
                if fd == self._wake_r.fileno():
                    with contextlib.suppress(BlockingIOError):
                        self._wake_r.recv(4096)
                else:
                    self._accept_some()

    def _accept_some(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                client, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                # Out of descriptors or the like: drop this one, keep serving.
                return
            with self._lock:
                self._accepted += 1
                if self._stopping or self._mode in (Mode.RESET, Mode.REFUSE):
                    self._resets += 1
                    _abort(client)
                    continue
                conn = _Connection(self, client, blackholed=self._mode is Mode.BLACKHOLE)
                self._conns.add(conn)
                self._threads = [t for t in self._threads if t.is_alive()]
                thread = threading.Thread(
                    target=conn.run, name=f"{self._name()}-conn{next(self._ids)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
