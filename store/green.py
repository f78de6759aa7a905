"""The store's sync request path driven by an asyncio event loop, without a thread per call.

`start` (and `run`, which awaits it) runs a plain function in a greenlet of
its own, on the event loop's thread. Wherever that function would block (a
socket not ready, a sleep, a wait for a pooled connection), the store's I/O
calls `wait_fd`, `sleep`, `wait_event` or `await_` here instead, which
switch back to the loop with what the function waits for; the loop switches
in again when it is ready (a socket wait: the reader callback itself, one
turn of the loop). So one loop serves many calls at once, each through the
very code `Store` runs: routing, statements, the pair plan, leases and trust
rules are not written a second time (SQLAlchemy's asyncio extension drives
its ORM in greenlets the same way).

Any asyncio event loop serves: asyncio's own, or one written in C such as
uvloop (the loop uvicorn runs when it is installed). On asyncio's own a
wake-up switches into its call from the loop's callback that saw it; on a
loop in C it reaches the call through the loop's ready queue
(`_LoopCalls.direct`: libuv keeps a pointer into its own C stack while it
polls, which a call switched into from the poll would overwrite).

A started call always runs to its end: whoever awaits it may be cancelled
(and gets `asyncio.CancelledError` at once), but the call's own waits are
the loop's callbacks, not the caller's, so a write is never cut between
two of its requests.

Outside such a greenlet (any plain thread) `active()` is false and each
helper here blocks as plain code does, so one store, one pool and one
socket serve both kinds of caller.

The sockets: `GreenSocket` is a socket whose reads, writes and connect
wait on the loop in a greenlet `start` runs (a read parks the call on the
socket, which the loop watches for the rest of the call), and poll as a
socket with a timeout does anywhere else. The store makes its MariaDB
(PyMySQL), memcached and Redis sockets of that class when it opens them
inside such a greenlet (`connect_tcp`, `socket_module`); PostgreSQL's
connections are libpq's, and their waits go through `wait_fd` on libpq's
socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import functools
import select
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import greenlet  # type: ignore[import-untyped]

__all__ = [
    "GreenSocket",
    "Pause",
    "active",
    "await_",
    "begin",
    "connect_tcp",
    "current",
    "current_loop",
    "gather",
    "pause",
    "run",
    "sleep",
    "socket_class",
    "socket_module",
    "start",
    "wait",
    "wait_event",
    "wait_fd",
    "wake",
]

T = TypeVar("T")

_getcurrent = greenlet.getcurrent


class _Bridged(greenlet.greenlet):  # type: ignore[misc]
    """A greenlet `start` runs: it asks its loop for each wait (`_drive` arranges the wake-up)."""

    loop: asyncio.AbstractEventLoop
    #: What its loop keeps for the calls it runs (`_LoopCalls`): their deadlines, idle greenlets.
    on_loop: _LoopCalls
    #: The call's outcome, (True, value) or (False, error), from its end until `_drive` reads it.
    outcome: tuple[int, Any] | None = None
    #: The outcome of the call it runs now, settled when the call ends.
    done: asyncio.Future[Any] | None
    #: While it waits on a socket: (fd, writing).
    waiting: tuple[int, bool] | None = None
    #: While it waits on a `GreenSocket` it keeps watched: that socket.
    parked: GreenSocket | None = None
    #: While it waits to be woken (`pause`): that pause.
    pausing: Pause | None = None
    #: Where it stays listed until it ends (`begin`), if anywhere.
    live: set[Any] | None = None
    #: Pooled database connections it holds now (`store.pool`: one waiting for another host's
    #: connection while it holds one goes first in that host's queue).
    holding: int = 0


class _LoopCalls:
    """What one loop keeps for the calls it runs: the timeouts of their waits, behind one timer of
    the loop's at the earliest of them, and the greenlets of calls that ended, for the next calls.

    A wait with a timeout costs a dict entry here, not a timer of its own: a
    loop timer per wait (made, pushed on the loop's heap, cancelled, swept
    off it) cost 2-5 us each, and a call waits 1-15 times. The timer fires
    at the earliest deadline it was set for; waits that ended meanwhile are
    gone from the dict, and it is set again for the earliest one left.

    A greenlet runs one call after another (`_serve`): a new greenlet per
    call had its Python frame stack made and dropped with it, an ``mmap``
    and a ``munmap`` of 16 KB (and their page faults) per call.
    """

    __slots__ = ("at", "direct", "idle", "loop", "timer", "waits")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: Whether a wait's wake-up may switch into its call from the callback itself: on
        #: asyncio's own loops (written in Python). A loop in C may hold pointers into its own C
        #: stack while it runs callbacks (libuv, under uvloop, into the events array of its poll
        #: and the queue of its idle handles), and a call switched into from deeper in the stack
        #: than where its greenlet began would overwrite that stack: such a loop's wake-ups
        #: reach the call through its ready queue (`_resume`), where every call's greenlet began.
        self.direct = isinstance(loop, asyncio.BaseEventLoop)
        #: Each waiting call's deadline, in the loop's time.
        self.waits: dict[_Bridged, float] = {}
        self.timer: asyncio.TimerHandle | None = None
        self.at = float("inf")
        #: Greenlets whose call ended, each waiting for the next call (`_start`).
        self.idle: list[_Bridged] = []

    def add(self, child: _Bridged, timeout: float) -> None:
        when = self.loop.time() + timeout
        self.waits[child] = when
        if when < self.at:
            if self.timer is not None:
                self.timer.cancel()
            self.at = when
            self.timer = self.loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self.timer, self.at = None, float("inf")
        now = self.loop.time() + _RESOLUTION
        waits = self.waits
        expired = [child for child, when in waits.items() if when <= now]
        for child in expired:
            del waits[child]
        if waits:
            self.at = min(waits.values())
            self.timer = self.loop.call_at(self.at, self._fire)
        for child in expired:
            if child.parked is not None:
                _parked_expired(child)
            elif child.pausing is not None:
                _pause_expired(child)
            elif child.waiting is not None:
                _fd_expired(child)


_RESOLUTION = time.get_clock_info("monotonic").resolution
#: The most idle greenlets a loop keeps for its next calls.
IDLE_GREENLETS = 1024
_loop_calls: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopCalls] = weakref.WeakKeyDictionary()


def _calls_of(loop: asyncio.AbstractEventLoop) -> _LoopCalls:
    found = _loop_calls.get(loop)
    if found is None:
        found = _loop_calls[loop] = _LoopCalls(loop)
    return found


# What a bridged greenlet hands its loop when it switches out: a wait, or its end.
_FD, _PARKED, _PAUSED, _AWAIT, _END = range(5)
_ENDED = (_END, None)


def active() -> bool:
    """Whether the caller runs inside `run` (its waits must go through the event loop)."""
    return type(_getcurrent()) is _Bridged


def current() -> Any:
    """The call `run` runs that the caller is in (its ``holding`` counts the pooled connections
    it has checked out), or None outside one."""
    here = _getcurrent()
    return here if type(here) is _Bridged else None


def current_loop() -> asyncio.AbstractEventLoop | None:
    """The loop of the call `run` runs that the caller is in, or None outside one."""
    here = _getcurrent()
    return here.loop if type(here) is _Bridged else None


def await_(awaitable: Awaitable[T]) -> T:
    """Wait for ``awaitable`` on the event loop from a function `run` runs; its result.

    `RuntimeError` anywhere else: plain code has no loop to hand the wait to.
    """
    current = _getcurrent()
    if type(current) is not _Bridged:
        raise RuntimeError("store.green.await_ is for functions run by store.green.run")
    result: T = current.parent.switch((_AWAIT, awaitable))
    return result


def start(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    """Start ``fn(*args, **kwargs)`` in a greenlet of its own on the running loop; its outcome.

    ``fn`` runs now, up to its first wait, in a copy of the caller's
    `contextvars` context; each later step is run by the loop when what it
    waits for is ready (a socket wait costs one turn of the loop). The call
    runs to its end whatever becomes of the returned future: cancelling it
    only drops the outcome.
    """
    return _start(None, fn, args, kwargs)


def begin(live: set[Any], fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    """`start`, the call listed in ``live`` from now until it ends (whatever becomes of the
    returned future: a caller that awaits it and is cancelled cancels the future, not the call)."""
    return _start(live, fn, args, kwargs)


def _start(
    live: set[Any] | None, fn: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> asyncio.Future[T]:
    loop = asyncio.get_running_loop()
    here = _getcurrent()
    if type(here) is _Bridged:
        raise RuntimeError("store.green.start inside a call it runs: use store.green.gather")
    calls = _calls_of(loop)
    if calls.idle:
        child = calls.idle.pop()
        if child.parent is not here:
            child.parent = here
    else:
        child = _Bridged(_serve, parent=here)
        child.loop = loop
        child.on_loop = calls
    child.gr_context = contextvars.copy_context()
    done: asyncio.Future[T] = loop.create_future()
    child.done = done
    if live is not None:
        child.live = live
        live.add(child)
    _drive(child, (fn, args, kwargs))
    return done


async def run(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` run by `start`, awaited. A cancelled await leaves the call running."""
    return await start(fn, *args, **kwargs)


def _serve(call: tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None) -> None:
    """A greenlet's life: run each call it is given, its outcome left on it (`_drive` reads it)."""
    me = _getcurrent()
    while call is not None:
        try:
            me.outcome = (True, call[0](*call[1], **call[2]))
        except BaseException as exc:  # the call's outcome, raised to whoever awaits it
            me.outcome = (False, exc)
        call = None  # (an idle greenlet holds nothing of its last call)
        call = me.parent.switch(_ENDED)


def _drive(child: _Bridged, value: Any = None, error: BaseException | None = None) -> None:
    """Switch into ``child`` (sending ``value``, or raising ``error`` at its wait) and arrange
    the wake-up of the wait it switches out for, or settle its outcome."""
    asked = child.switch(value) if error is None else child.throw(error)
    kind, what = asked[0], asked[1]
    if kind == _PARKED:  # (the socket's reader callback wakes it: `GreenSocket._readable`)
        child.parked = what
        timeout = asked[2]
        if timeout is not None:
            child.on_loop.add(child, timeout)
    elif kind == _PAUSED:  # (`wake` resumes it)
        child.pausing = what
        timeout = asked[2]
        if timeout is not None:
            child.on_loop.add(child, timeout)
    elif kind == _FD:
        fd, writing, timeout = what, asked[2], asked[3]
        loop = child.loop
        child.waiting = (fd, writing)
        if timeout is not None:
            child.on_loop.add(child, timeout)
        if writing:
            loop.add_writer(fd, _fd_ready, child)
        else:
            loop.add_reader(fd, _fd_ready, child)
    elif kind == _AWAIT:
        future = asyncio.ensure_future(what, loop=child.loop)
        future.add_done_callback(functools.partial(_awaited, child))
    else:  # (_ENDED: the call ran to its end; its greenlet waits for the next one)
        outcome, child.outcome = child.outcome, None
        live, child.live = child.live, None
        if live is not None:
            live.discard(child)
        done, child.done = child.done, None
        calls = child.on_loop
        if len(calls.idle) < IDLE_GREENLETS:
            child.gr_context = None
            calls.idle.append(child)
        assert outcome is not None
        assert done is not None
        if not done.done():  # (cancelled by its caller: the outcome is dropped)
            if outcome[0]:
                done.set_result(outcome[1])
            else:
                done.set_exception(outcome[1])


def _resume(child: _Bridged, value: Any = None, error: BaseException | None = None) -> None:
    """`_drive` from a callback of the loop's own: at once on a loop that allows it, else from
    the loop's ready queue (`_LoopCalls.direct`)."""
    if child.on_loop.direct:
        _drive(child, value, error)
    else:
        child.loop.call_soon(_drive, child, value, error)


def _end_fd_wait(child: _Bridged) -> None:
    assert child.waiting is not None
    fd, writing = child.waiting
    child.waiting = None
    if writing:
        child.loop.remove_writer(fd)
    else:
        child.loop.remove_reader(fd)


def _parked_expired(child: _Bridged) -> None:
    """Its wait's deadline passed (`_LoopCalls`): it leaves the socket and gets `TimeoutError`."""
    sock, child.parked = child.parked, None
    if sock is not None:
        sock._waiter = None
    _resume(child, error=TimeoutError("timed out"))


def _pause_expired(child: _Bridged) -> None:
    """Its pause's deadline passed (`_LoopCalls`): `wait` returns False."""
    pause, child.pausing = child.pausing, None
    if pause is not None:
        pause.state = _TIMED_OUT
    _resume(child, False)


def _fd_ready(child: _Bridged) -> None:
    _end_fd_wait(child)
    child.on_loop.waits.pop(child, None)
    _resume(child)


def _fd_expired(child: _Bridged) -> None:
    _end_fd_wait(child)
    _resume(child, error=TimeoutError("timed out"))


def _awaited(child: _Bridged, future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        _drive(child, error=asyncio.CancelledError())
    elif (exc := future.exception()) is not None:
        _drive(child, error=exc)
    else:
        _drive(child, future.result())


_WAITING, _WOKEN, _TIMED_OUT = range(3)


class Pause:
    """A call's pause (`pause`): it waits (`wait`) until something on its loop wakes it (`wake`),
    or its timeout passes. Waking it costs one callback of the loop: no future, no timer, no
    task (a queue of calls waiting for a pooled connection is the use)."""

    __slots__ = ("child", "state")

    def __init__(self, child: _Bridged) -> None:
        self.child = child
        #: _WAITING, then _WOKEN or _TIMED_OUT, once.
        self.state = _WAITING

    @property
    def waiting(self) -> bool:
        """Neither woken nor timed out yet."""
        return self.state == _WAITING

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop of the call that pauses: `wake` is called on its thread."""
        loop: asyncio.AbstractEventLoop = self.child.loop
        return loop


def pause() -> Pause:
    """A pause of the calling call (inside `run`; `RuntimeError` elsewhere), to `wait` on."""
    current = _getcurrent()
    if type(current) is not _Bridged:
        raise RuntimeError("store.green.pause is for functions run by store.green.run")
    return Pause(current)


def wait(pause: Pause, timeout: float | None) -> bool:
    """Let the loop run on until ``pause`` is woken (True) or ``timeout`` seconds pass (False)."""
    if pause.state != _WAITING:
        return pause.state == _WOKEN
    woken: bool = pause.child.parent.switch((_PAUSED, pause, timeout))
    return woken


def wake(pause: Pause) -> bool:
    """On the pause's loop thread: wake the call that waits on ``pause`` (it resumes at the loop's
    next turn) and True; False if it has timed out or was woken already."""
    if pause.state != _WAITING:
        return False
    pause.state = _WOKEN
    child = pause.child
    if child.pausing is pause:  # (else `wait` has not switched out yet: it returns at once)
        child.pausing = None
        child.on_loop.waits.pop(child, None)
        child.loop.call_soon(_drive, child, True)
    return True


def wait_fd(fd: int, *, writing: bool, timeout: float | None) -> None:
    """Wait until ``fd`` is readable (or writable); `TimeoutError` after ``timeout`` seconds.

    Through the event loop inside `run`; with ``poll`` anywhere else.
    """
    current = _getcurrent()
    if type(current) is not _Bridged:
        _poll(fd, writing, timeout)
        return
    current.parent.switch((_FD, fd, writing, timeout))


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

    Inside `run`, a loop watches the socket for reading from the first wait
    a call of that loop makes on it until it is readable while no call waits
    on it (a reply no call has asked for yet, or the peer gone: the watch is
    level-triggered, so it would fire again at every turn), until a call of
    another loop waits on it, or until it is closed. A pooled connection
    thus stays watched from call to call of one loop: a wait on it costs no
    registration with the loop's selector (a registration and its removal
    cost about 8 us, and sat under every call that waited on a socket).
    """

    __slots__ = ("_limit", "_waiter", "_watch", "_watched_fd")

    def __init__(
        self,
        family: int = -1,
        type: int = -1,  # noqa: A002 (socket.socket's own name)
        proto: int = -1,
        fileno: int | None = None,
    ) -> None:
        super().__init__(family, type, proto, fileno)
        self._limit: float | None = None
        #: The loop that watches this socket (`_wait`), and the call parked on it now.
        self._watch: asyncio.AbstractEventLoop | None = None
        self._waiter: _Bridged | None = None
        self._watched_fd = -1
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
        current = _getcurrent()
        if writing or type(current) is not _Bridged:
            wait_fd(self.fileno(), writing=writing, timeout=self._limit)
            return
        loop = current.loop
        if self._watch is not loop:
            self._unwatch()
            self._watched_fd = self.fileno()
            loop.add_reader(self._watched_fd, self._readable, loop)
            self._watch = loop
        self._waiter = current
        current.parent.switch((_PARKED, self, self._limit))

    def _readable(self, loop: asyncio.AbstractEventLoop) -> None:
        """``loop``'s reader callback: wake the call parked on this socket; with none parked (a
        reply no call has asked for yet, or the peer gone), stop watching (it is level-triggered)."""
        if self._watch is not loop:  # (a watch another loop's call has taken over: not ours)
            with contextlib.suppress(Exception):
                loop.remove_reader(self._watched_fd)
            return
        child = self._waiter
        if child is None:
            self._unwatch()
            return
        self._waiter = None
        child.parked = None
        child.on_loop.waits.pop(child, None)
        _resume(child)

    def _unwatch(self) -> None:
        """Stop the loop watching this socket (on that loop's thread but when the socket is closed)."""
        loop = self._watch
        if loop is None:
            return
        self._watch = None
        with contextlib.suppress(Exception):  # (a closed loop: nothing to remove)
            loop.remove_reader(self._watched_fd)

    def _real_close(self, *args: Any) -> None:
        self._unwatch()
        super()._real_close(*args)  # type: ignore[misc]

    def detach(self) -> int:
        """`socket.socket.detach`, the loop no longer watching it."""
        self._unwatch()
        return super().detach()

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
        try:
            sent = super().send(data, flags)
        except BlockingIOError:
            sent = 0
        size = len(data) if isinstance(data, bytes | bytearray) else memoryview(data).nbytes
        if sent == size:  # (a request fits the socket's buffer: all of it at once)
            return
        view = memoryview(data).cast("B")[sent:]
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
