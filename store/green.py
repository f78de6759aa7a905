"""The store's sync request path driven by an asyncio event loop, without a thread per call.

`run` (a coroutine) runs a plain function in a greenlet of its own, on the
event loop's thread. Wherever that function would block (a socket not
ready, a sleep, a wait for a pooled connection), the store's I/O calls
`wait_fd`, `sleep` or `wait_event` here instead, which switch back to
`run`; `run` awaits the readiness on the loop, and switches in again. So one
loop serves many calls at once, each through the very code `Store` runs:
routing, statements, the pair plan, leases and trust rules are not written a
second time (SQLAlchemy's asyncio extension drives its ORM the same way).

Outside such a greenlet (any plain thread) `active()` is false and each
helper here blocks as plain code does, so one store, one pool and one
socket serve both kinds of caller.

The sockets: `GreenSocket` is a socket whose reads, writes and connect
wait through `wait_fd` in a greenlet `run` drives, and poll as a socket
with a timeout does anywhere else. The store makes its MariaDB (PyMySQL),
memcached and Redis sockets of that class when it opens them inside such a
greenlet (`socket_class`, `connect_tcp`); PostgreSQL's connections are
libpq's, and their waits go through `wait_fd` on libpq's socket.
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import select
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import greenlet  # type: ignore[import-untyped]

__all__ = [
    "GreenSocket",
    "active",
    "await_",
    "connect_tcp",
    "gather",
    "run",
    "sleep",
    "socket_class",
    "socket_module",
    "wait_event",
    "wait_fd",
]

T = TypeVar("T")

_getcurrent = greenlet.getcurrent


class _Bridged(greenlet.greenlet):  # type: ignore[misc]
    """A greenlet `run` drives: its waits are awaits on the loop that runs `run`."""


def active() -> bool:
    """Whether the caller runs inside `run` (its waits must go through the event loop)."""
    return type(_getcurrent()) is _Bridged


def await_(awaitable: Awaitable[T]) -> T:
    """Wait for ``awaitable`` on the event loop from a function `run` runs; its result.

    `RuntimeError` anywhere else: plain code has no loop to hand the wait to.
    """
    current = _getcurrent()
    if type(current) is not _Bridged:
        raise RuntimeError("store.green.await_ is for functions run by store.green.run")
    result: T = current.parent.switch(awaitable)
    return result


async def run(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in a greenlet of its own, each of its waits awaited here.

    ``fn`` runs in a copy of the caller's `contextvars` context. An exception
    raised while awaiting one of its waits (a timeout, a cancellation) is
    raised inside ``fn`` at that wait, so its own cleanup runs.
    """
    child = _Bridged(fn, parent=_getcurrent())
    child.gr_context = contextvars.copy_context()
    pending: Any = child.switch(*args, **kwargs)
    while not child.dead:
        try:
            value = await pending
        except BaseException:  # handed to fn at its wait, where its cleanup runs
            pending = child.throw(*sys.exc_info())
        else:
            pending = child.switch(value)
    result: T = pending
    return result


def _ready(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _expired(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError("timed out"))


def wait_fd(fd: int, *, writing: bool, timeout: float | None) -> None:
    """Wait until ``fd`` is readable (or writable); `TimeoutError` after ``timeout`` seconds.

    Through the event loop inside `run`; with ``poll`` anywhere else.
    """
    if type(_getcurrent()) is not _Bridged:
        _poll(fd, writing, timeout)
        return
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    if writing:
        loop.add_writer(fd, _ready, future)
    else:
        loop.add_reader(fd, _ready, future)
    timer = None if timeout is None else loop.call_later(timeout, _expired, future)
    try:
        await_(future)
    finally:
        if writing:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)
        if timer is not None:
            timer.cancel()


def _poll(fd: int, writing: bool, timeout: float | None) -> None:
    poller = select.poll()
    poller.register(fd, select.POLLOUT if writing else select.POLLIN)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if poller.poll(None if left is None else left * 1000):
            return
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError("timed out")


def sleep(seconds: float) -> None:
    """`time.sleep`, or inside `run` a sleep that lets the loop run other calls."""
    if type(_getcurrent()) is _Bridged:
        await_(asyncio.sleep(seconds))
    else:
        time.sleep(seconds)


def wait_event(event: Any, timeout: float | None) -> bool:
    """``event.wait(timeout)`` of a `threading.Event` set by another thread; inside `run` the wait
    is handed to a thread of the loop's default executor, so the loop runs on meanwhile."""
    if type(_getcurrent()) is not _Bridged or event.is_set():
        return bool(event.wait(timeout))
    loop = asyncio.get_running_loop()
    return bool(await_(loop.run_in_executor(None, event.wait, timeout)))


def gather(jobs: Sequence[Callable[[], T]]) -> list[T]:
    """Inside `run`: every job at once, each in a greenlet of its own; their results in order.

    Every job ends before the first error (in job order) is raised.
    """
    results = await_(asyncio.gather(*(run(job) for job in jobs), return_exceptions=True))
    out: list[T] = []
    for r in results:
        if isinstance(r, BaseException):
            raise r
        out.append(r)
    return out


class GreenSocket(socket.socket):
    """A socket whose waits go through the event loop inside `run`, and poll anywhere else.

    The OS socket is always non-blocking; ``settimeout`` keeps the timeout
    for the waits (`wait_fd`), so a reply that does not come within it is
    `TimeoutError`, as on a plain socket with a timeout.
    """

    __slots__ = ("_limit",)

    def __init__(
        self,
        family: int = -1,
        type: int = -1,  # noqa: A002 (socket.socket's own name)
        proto: int = -1,
        fileno: int | None = None,
    ) -> None:
        super().__init__(family, type, proto, fileno)
        self._limit: float | None = None
        super().settimeout(0.0)

    def settimeout(self, value: float | None) -> None:
        """Keep ``value`` as the longest wait for readiness (the OS socket stays non-blocking)."""
        self._limit = value

    def gettimeout(self) -> float | None:
        """The longest wait for readiness."""
        return self._limit

    def setblocking(self, flag: bool) -> None:
        """As `socket.socket.setblocking`: no limit on waits, or none at all."""
        self._limit = None if flag else 0.0

    def _wait(self, writing: bool) -> None:
        if self._limit == 0.0:
            raise BlockingIOError(errno.EAGAIN, "the socket is not ready")
        wait_fd(self.fileno(), writing=writing, timeout=self._limit)

    def recv(self, bufsize: int, flags: int = 0, /) -> bytes:
        """`socket.socket.recv`, waiting for data as described in the class's text."""
        while True:
            try:
                return super().recv(bufsize, flags)
            except BlockingIOError:
                self._wait(False)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        """`socket.socket.recv_into`, waiting for data as described in the class's text."""
        while True:
            try:
                return super().recv_into(buffer, nbytes, flags)
            except BlockingIOError:
                self._wait(False)

    def send(self, data: Any, flags: int = 0, /) -> int:
        """`socket.socket.send`, waiting for room as described in the class's text."""
        while True:
            try:
                return super().send(data, flags)
            except BlockingIOError:
                self._wait(True)

    def sendall(self, data: Any, flags: int = 0, /) -> None:
        """`socket.socket.sendall`, waiting for room as described in the class's text."""
        view = memoryview(data).cast("B")
        while view:
            view = view[self.send(view, flags) :]

    def connect(self, address: Any, /) -> None:
        """`socket.socket.connect`, its wait for the handshake as described in the class's text."""
        code = self.connect_ex(address)
        if code:
            raise OSError(code, f"connect to {address!r}: {errno.errorcode.get(code, code)}")

    def connect_ex(self, address: Any, /) -> int:
        """`socket.socket.connect_ex`, its wait for the handshake as described in the class's text."""
        code = super().connect_ex(address)
        if code in (errno.EINPROGRESS, errno.EAGAIN, errno.EWOULDBLOCK):
            try:
                self._wait(True)
            except TimeoutError:
                return errno.ETIMEDOUT
            code = self.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        return code


def socket_class() -> type[socket.socket]:
    """The class of socket to open here: `GreenSocket` inside `run`, else the plain one."""
    return GreenSocket if type(_getcurrent()) is _Bridged else socket.socket


class _GreenSocketModule:
    """The `socket` module, with `GreenSocket` as its ``socket`` (for pymemcache's ``socket_module``)."""

    socket = GreenSocket

    def __getattr__(self, name: str) -> Any:
        return getattr(socket, name)


_GREEN_SOCKET_MODULE = _GreenSocketModule()


def socket_module() -> Any:
    """What a client that takes a ``socket_module`` should be given here (see `socket_class`)."""
    return _GREEN_SOCKET_MODULE if type(_getcurrent()) is _Bridged else socket


def connect_tcp(host: str, port: int, timeout: float | None) -> socket.socket:
    """A `GreenSocket` connected to ``host:port`` (TCP_NODELAY, keepalive), waiting at most ``timeout``."""
    if type(_getcurrent()) is _Bridged:
        loop = asyncio.get_running_loop()
        infos = await_(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM))
    else:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _name, address in infos:
        sock = GreenSocket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        return sock
    raise error or OSError(f"{host}:{port} has no address")
