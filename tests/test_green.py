"""`store.green`: sync code on the event loop, each of its waits an await of the loop.

The property under test is that a wait inside `green.run` never holds the loop: while one call
waits (on a socket, a server's reply, a pooled connection), other calls on the same loop start
and finish. Each test shows it by order, not by time: the waiting call is still pending when
the other has finished, and where the other is what the first waits for, the first could not
have finished at all had the loop been held.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvloop
from sqlalchemy.engine import make_url

from store import StoreConfig, green
from store.backends.mysql.driver import mysql_connector
from store.exceptions import BackendError
from store.pool import ConnectionPool
from tests.conftest import PG_URL, require_port


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP socket listening on loopback (the peer a test talks to)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server
    server.close()


def test_outside_run_nothing_is_active_and_await_is_refused() -> None:
    assert not green.active()
    assert green.socket_class() is socket.socket
    pending = asyncio.sleep(0)
    with pytest.raises(RuntimeError, match=r"store\.green\.run"):
        green.await_(pending)
    pending.close()


def test_a_socket_read_waits_for_the_loop_that_sends_it_its_data(listener: socket.socket) -> None:
    """The call reads from a socket whose data another task on the same loop sends later: had
    the read held the loop, the sender could never run, and the read would time out."""

    def read() -> bytes:
        assert green.active()
        sock = green.connect_tcp("127.0.0.1", listener.getsockname()[1], 2.0)
        assert isinstance(sock, green.GreenSocket)
        with sock:
            return sock.recv(100)

    async def main() -> bytes:
        reader = asyncio.ensure_future(green.run(read))
        peer, _ = await asyncio.get_running_loop().sock_accept(listener)
        with peer:
            await asyncio.sleep(0.05)
            assert not reader.done()
            peer.send(b"hello")
            return await reader

    listener.setblocking(False)
    assert asyncio.run(main()) == b"hello"


def test_a_socket_stays_watched_by_its_loop_from_call_to_call(listener: socket.socket) -> None:
    """A loop watches a socket from the first wait one of its calls makes on it: that call's later
    reads and a later call's reuse the watch (no registration with the selector each); a reply that
    comes while no call waits ends it (no level-triggered callback spins on it)."""
    listener.setblocking(False)
    seen: dict[str, Any] = {}

    def first(port: int) -> None:
        loop = asyncio.get_running_loop()
        sock = green.connect_tcp("127.0.0.1", port, 2.0)
        seen["sock"] = sock
        assert sock.recv(5) == b"first"
        assert sock._watch is loop
        fd = sock.fileno()
        assert fd in loop._selector.get_map()  # type: ignore[attr-defined]
        key = loop._selector.get_key(fd)  # type: ignore[attr-defined]
        assert sock.recv(6) == b"second"
        assert loop._selector.get_key(fd) is key  # the same watch, not a new one
        green.sleep(0.1)  # the peer sends "third" while the call does not wait on the socket
        assert sock._watch is None  # readable with no one waiting: no longer watched
        assert fd not in loop._selector.get_map()  # type: ignore[attr-defined]
        assert sock.recv(5) == b"third"  # (there already: read with no wait)
        assert sock.recv(6) == b"fourth"  # watched again for this wait
        assert sock._watch is loop
        seen["fd"], seen["key"] = fd, loop._selector.get_key(fd)  # type: ignore[attr-defined]

    def second() -> None:
        loop = asyncio.get_running_loop()
        sock = seen["sock"]
        assert loop._selector.get_key(seen["fd"]) is seen["key"]  # type: ignore[attr-defined]
        assert sock.recv(5) == b"fifth"  # waited for on the watch the first call left
        assert loop._selector.get_key(seen["fd"]) is seen["key"]  # type: ignore[attr-defined]

    async def main() -> None:
        port = listener.getsockname()[1]
        task = asyncio.ensure_future(green.run(first, port))
        peer, _ = await asyncio.get_running_loop().sock_accept(listener)
        with peer:
            # (the call's sleep, 0.1 s, spans "third" and ends well before "fourth")
            for word, pause in ((b"first", 0.02), (b"second", 0.02), (b"third", 0.01), (b"fourth", 0.3)):
                await asyncio.sleep(pause)
                peer.send(word)
            await task
            task = asyncio.ensure_future(green.run(second))
            await asyncio.sleep(0.05)
            assert not task.done()
            peer.send(b"fifth")
            await task
            loop = asyncio.get_running_loop()
            assert seen["sock"]._watch is loop  # still watched, for the next call
            seen["sock"].close()
            assert seen["fd"] not in loop._selector.get_map()  # type: ignore[attr-defined]

    asyncio.run(main())


def test_a_socket_a_call_of_another_loop_waits_on_leaves_the_first_loop(listener: socket.socket) -> None:
    """Two loops in two threads take turns at one socket: each wait is woken by its own loop,
    and the loop a socket has left no longer watches it."""
    listener.setblocking(True)
    client = green.connect_tcp("127.0.0.1", listener.getsockname()[1], 2.0)
    peer, _ = listener.accept()
    loops: list[asyncio.AbstractEventLoop] = []

    def read(word: bytes) -> bytes:
        loops.append(asyncio.get_running_loop())
        return client.recv(len(word))

    def in_thread(word: bytes) -> bytes:
        async def main() -> bytes:
            task = asyncio.ensure_future(green.run(read, word))
            await asyncio.sleep(0.05)
            assert not task.done()
            peer.send(word)
            got = await task
            assert client._watch is asyncio.get_running_loop()
            return got

        return asyncio.run(main())

    with peer, client:
        held = asyncio.new_event_loop()  # a loop that stays open while the others take the socket
        try:

            async def first() -> bytes:
                task = asyncio.ensure_future(green.run(read, b"one"))
                await asyncio.sleep(0.05)
                peer.send(b"one")
                return await task

            assert held.run_until_complete(first()) == b"one"
            assert client._watch is held
            out: list[bytes] = []
            t = threading.Thread(target=lambda: out.append(in_thread(b"two")))
            t.start()
            t.join()
            assert out == [b"two"]
            assert client._watch is not held
            assert client.fileno() not in held._selector.get_map()  # type: ignore[attr-defined]
            assert held.run_until_complete(first()) == b"one"  # back on the first loop
            assert client._watch is held
        finally:
            held.close()


def test_a_socket_closed_within_its_call_is_no_longer_watched(listener: socket.socket) -> None:
    listener.setblocking(False)

    def call(port: int) -> int:
        loop = asyncio.get_running_loop()
        sock = green.connect_tcp("127.0.0.1", port, 2.0)
        assert sock.recv(2) == b"hi"
        fd = sock.fileno()
        assert fd in loop._selector.get_map()  # type: ignore[attr-defined]
        sock.close()
        assert fd not in loop._selector.get_map()  # type: ignore[attr-defined]
        return fd

    async def main() -> None:
        task = asyncio.ensure_future(green.run(call, listener.getsockname()[1]))
        peer, _ = await asyncio.get_running_loop().sock_accept(listener)
        with peer:
            await asyncio.sleep(0.01)
            peer.send(b"hi")
            await task

    asyncio.run(main())


@pytest.mark.parametrize("where", ["loop", "thread"])
def test_a_read_with_no_data_times_out_as_a_plain_socket_does(listener: socket.socket, where: str) -> None:
    sock = green.GreenSocket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    sock.connect(listener.getsockname())
    sock.settimeout(0.05)
    try:

        def read() -> bytes:
            return sock.recv(10)

        def in_place() -> bytes:
            return asyncio.run(green.run(read)) if where == "loop" else read()

        with pytest.raises(TimeoutError):
            in_place()
        assert sock.gettimeout() == 0.05
    finally:
        sock.close()


def test_a_connect_to_a_closed_port_fails_as_a_plain_one_does() -> None:
    port = _closed_port()

    async def main() -> None:
        with pytest.raises(ConnectionRefusedError):
            await green.run(green.connect_tcp, "127.0.0.1", port, 1.0)

    asyncio.run(main())
    with pytest.raises(ConnectionRefusedError):
        green.connect_tcp("127.0.0.1", port, 1.0)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    return port


#: The event loops the native face is shown on: asyncio's own, and uvloop (what uvicorn runs).
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_mariadb_query_that_runs_long_lets_other_calls_finish_meanwhile(loop: str) -> None:
    require_port("MariaDB", 3306)
    connect = mysql_connector(make_url("mysql+pymysql://root@127.0.0.1:3306"))

    def query(sql: str) -> Any:
        conn = connect()
        try:
            assert isinstance(conn._sock, green.GreenSocket)
            cur = conn.cursor()
            cur.execute(sql)
            return cur.fetchall()[0][0]
        finally:
            conn.close()

    _slow_one_lets_five_finish(query, "SELECT SLEEP(1.5)", 0, LOOPS[loop])


@pytest.mark.parametrize("loop", sorted(LOOPS))
@pytest.mark.parametrize("way", ["execute", "pipeline"])
def test_a_postgres_statement_that_runs_long_lets_other_calls_finish_meanwhile(
    postgres_ready: StoreConfig, way: str, loop: str
) -> None:
    """Both ways the store sends PostgreSQL statements: psycopg's cursor (its waits are the
    connection's) and the store's own libpq pipeline (`run_pipeline`)."""
    from store.backends.postgres.driver import postgres_connector

    connect = postgres_connector(make_url(PG_URL))

    def query(sql: str) -> Any:
        conn = connect()
        try:
            cur = conn.cursor()
            if way == "pipeline":
                [(_n, rows)] = cur.run_pipeline([(sql, None)])
                return rows[0][0]
            cur.execute(sql)
            return cur.fetchall()[0][0]
        finally:
            conn.close()

    _slow_one_lets_five_finish(query, "SELECT pg_sleep(1.5)::text", "", LOOPS[loop])


def _slow_one_lets_five_finish(
    query: Callable[[str], Any],
    slow_sql: str,
    slow_answer: Any,
    new_loop: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop,
) -> None:
    """``query(slow_sql)`` on the loop, then five quick ``SELECT i`` beside it: the five end
    whole while the slow one still waits for its answer."""

    async def main() -> None:
        slow = asyncio.ensure_future(green.run(query, slow_sql))
        quick = await asyncio.gather(*(green.run(query, f"SELECT {i}") for i in range(5)))
        assert quick == list(range(5))
        assert not slow.done()  # still waiting for its answer while five others ran whole
        assert await slow == slow_answer

    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(main())


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_loop_in_c_reaches_a_waiting_call_through_its_ready_queue(
    loop: str, listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On asyncio's own loops a wake-up switches into its call from the callback that saw it (a
    socket readable, a timeout); on a loop written in C (uvloop) it goes through the loop's ready
    queue, where every call's greenlet began. libuv keeps a pointer into its own C stack while it
    polls, and a call switched into from the poll that then watched a socket made libuv write
    through that pointer into the call's stack: the mix's async store died of a segmentation
    fault in `uv__platform_invalidate_fd` in about one uvloop run of three."""
    wakers = {"_readable", "_fd_ready", "_fire"}
    from_callbacks: list[str] = []
    drive = green._drive

    def spy(child: Any, value: Any = None, error: BaseException | None = None) -> None:
        frame = sys._getframe(1)
        for _ in range(3):  # (`_resume`, then the callback that saw the wake-up)
            if frame is None:
                break
            if frame.f_code.co_name in wakers:
                from_callbacks.append(frame.f_code.co_name)
            frame = frame.f_back
        drive(child, value, error)

    monkeypatch.setattr(green, "_drive", spy)
    listener.setblocking(False)

    def call(port: int) -> bytes:
        sock = green.connect_tcp("127.0.0.1", port, 2.0)
        with sock:
            got = sock.recv(5)  # woken by the socket
            sock.settimeout(0.05)
            with pytest.raises(TimeoutError):
                sock.recv(5)  # woken by its timeout
            return got

    async def main() -> bytes:
        task = asyncio.ensure_future(green.run(call, listener.getsockname()[1]))
        peer, _ = await asyncio.get_running_loop().sock_accept(listener)
        with peer:
            await asyncio.sleep(0.02)
            peer.send(b"hello")
            return await task

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        assert runner.run(main()) == b"hello"
    if loop == "asyncio":
        assert {"_readable", "_fire"} <= set(from_callbacks)  # (the spy sees the direct path)
    else:
        assert not from_callbacks


class _Conn:
    """A stand-in for a DBAPI connection: the pool only opens, keeps and closes them."""

    def close(self) -> None:
        pass


def test_a_call_waiting_for_a_pooled_connection_lets_its_holder_give_it_back() -> None:
    """One connection, two calls: the second waits on the loop until the first, which runs on
    that same loop, gives it back (a wait that held the loop would never see it back)."""
    pool = ConnectionPool(_Conn, name="h", max_open=1, max_idle=1, timeout_s=5.0)
    order: list[str] = []

    def hold() -> None:
        conn, born = pool.checkout()
        order.append("first has it")
        green.sleep(0.05)
        order.append("first gives it back")
        pool.checkin(conn, born)

    def wait() -> None:
        conn, born = pool.checkout()
        order.append("second has it")
        pool.checkin(conn, born)

    async def main() -> None:
        first = asyncio.ensure_future(green.run(hold))
        await asyncio.sleep(0)
        await asyncio.gather(first, green.run(wait))

    asyncio.run(main())
    assert order == ["first has it", "first gives it back", "second has it"]
    assert pool.waiting == 0
    assert pool.in_use == 0


def test_a_call_that_finds_no_free_connection_in_time_gets_the_pool_s_error() -> None:
    pool = ConnectionPool(_Conn, name="h", max_open=1, max_idle=1, timeout_s=0.1)
    held = pool.checkout()
    try:

        async def main() -> None:
            with pytest.raises(BackendError, match="no free connection to h"):
                await green.run(pool.checkout)

        asyncio.run(main())
        assert pool.waiting == 0
    finally:
        pool.checkin(*held)


def test_a_connection_given_back_by_a_thread_wakes_a_call_on_the_loop() -> None:
    pool = ConnectionPool(_Conn, name="h", max_open=1, max_idle=1, timeout_s=5.0)
    held = pool.checkout()
    giver = threading.Timer(0.05, pool.checkin, held)

    async def main() -> None:
        giver.start()
        conn, born = await green.run(pool.checkout)
        pool.checkin(conn, born)

    asyncio.run(main())
    giver.join()
    assert pool.in_use == 0


def test_calls_waiting_for_a_connection_get_it_in_the_order_they_came() -> None:
    """Fifty calls on one connection: each slot given back goes to the call that waited longest,
    never to one arriving meanwhile, and every call gets it once."""
    pool = ConnectionPool(_Conn, name="h", max_open=1, max_idle=1, timeout_s=10.0)
    order: list[int] = []

    def use(i: int) -> None:
        conn, born = pool.checkout()
        order.append(i)
        green.sleep(0)  # hold it across an await: the others queue meanwhile
        pool.checkin(conn, born)

    async def main() -> None:
        await asyncio.gather(*(green.run(use, i) for i in range(50)))

    asyncio.run(main())
    assert order == list(range(50))
    assert (pool.in_use, pool.waiting, pool.peak_in_use) == (0, 0, 1)


def test_a_call_holding_another_pool_s_connection_goes_first_in_the_queue() -> None:
    """Ten calls queue for host B's one connection; then a call that already holds host A's (a
    pair write takes both before it begins) joins the queue: it is served next, not after the
    ten, so A's connection does not sit idle behind B's whole queue."""
    pool_a = ConnectionPool(_Conn, name="a", max_open=1, max_idle=1, timeout_s=10.0)
    pool_b = ConnectionPool(_Conn, name="b", max_open=1, max_idle=1, timeout_s=10.0)
    order: list[str] = []

    def use_b(name: str) -> None:
        conn, born = pool_b.checkout()
        order.append(name)
        green.sleep(0.001)
        pool_b.checkin(conn, born)

    def pair() -> None:
        a = pool_a.checkout()
        assert green.current().holding == 1
        use_b("pair")
        assert green.current().holding == 1
        pool_a.checkin(*a)
        assert green.current().holding == 0

    async def main() -> None:
        first = asyncio.ensure_future(green.run(use_b, "first"))  # takes B's connection
        await asyncio.sleep(0)
        queued = [asyncio.ensure_future(green.run(use_b, f"q{i}")) for i in range(10)]
        await asyncio.sleep(0)
        await asyncio.gather(first, *queued, green.run(pair))

    asyncio.run(main())
    assert order == ["first", "pair", *(f"q{i}" for i in range(10))]
    assert green.current() is None


def test_a_call_whose_caller_is_cancelled_runs_to_its_end_and_gives_its_connection_back() -> None:
    """Callers waiting for the one connection are cancelled: they get `CancelledError` at once,
    while their calls queue on, each takes the connection in turn and gives it back, and the pool
    ends with none in use and no one waiting."""
    pool = ConnectionPool(_Conn, name="h", max_open=1, max_idle=1, timeout_s=10.0)
    got: list[int] = []

    def use(i: int) -> None:
        conn, born = pool.checkout()
        got.append(i)
        green.sleep(0.001)
        pool.checkin(conn, born)

    async def main() -> None:
        tasks = [asyncio.ensure_future(green.run(use, i)) for i in range(20)]
        await asyncio.sleep(0.003)
        for t in tasks[5::2]:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert sum(t.cancelled() for t in tasks) == 8
        for _ in range(1000):  # (bounded) the cancelled callers' calls finish on their own
            if len(got) == 20:
                break
            await asyncio.sleep(0.005)
        conn, born = await green.run(pool.checkout)  # the slot is free again
        pool.checkin(conn, born)

    asyncio.run(main())
    assert got == list(range(20))
    assert (pool.in_use, pool.waiting) == (0, 0)
    assert not pool._green_waiters


def test_gather_runs_every_job_before_it_raises_the_first_error() -> None:
    done: list[int] = []

    def job(i: int) -> int:
        green.sleep(0.01 * (3 - i))
        done.append(i)
        if i in (1, 2):
            raise ValueError(f"job {i}")
        return i

    def all_jobs() -> list[int]:
        return green.gather([lambda i=i: job(i) for i in range(4)])

    async def main() -> None:
        with pytest.raises(ValueError, match="job 1"):
            await green.run(all_jobs)

    asyncio.run(main())
    assert sorted(done) == [0, 1, 2, 3]


def test_a_call_cannot_start_another_from_inside_itself() -> None:
    def nested() -> None:
        green.start(lambda: None)

    async def main() -> None:
        with pytest.raises(RuntimeError, match="gather"):
            await green.run(nested)

    asyncio.run(main())


def test_run_carries_the_caller_s_context_and_raises_the_call_s_error() -> None:
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    def read() -> str:
        green.sleep(0)
        return var.get()

    def fail() -> None:
        green.sleep(0)
        raise KeyError("inside")

    async def main() -> None:
        var.set("caller's")
        assert await green.run(read) == "caller's"
        with pytest.raises(KeyError, match="inside"):
            await green.run(fail)

    asyncio.run(main())


def test_a_call_waiting_for_an_event_lets_the_loop_run_the_task_that_sets_it() -> None:
    event = threading.Event()
    ticks: list[int] = []

    async def tick() -> None:
        for i in range(3):
            ticks.append(i)
            await asyncio.sleep(0.01)
        event.set()

    async def main() -> bool:
        waiter = asyncio.ensure_future(green.run(green.wait_event, event, 5.0))
        await tick()
        return await waiter

    assert asyncio.run(main()) is True
    assert ticks == [0, 1, 2]


def test_a_pause_ends_once_woken_or_timed_out_never_both() -> None:
    """`green.wait` returns True when woken, False when its timeout passes; a pause that timed out
    cannot be woken afterwards (had it been resumed twice, the second resumption would land in the
    call's next wait, the sleep below, and end it early with a wrong value)."""
    seen: dict[str, Any] = {}

    def times_out() -> tuple[bool, bool]:
        pause = green.pause()
        seen["late"] = pause
        ended = green.wait(pause, 0.05)
        green.sleep(0.1)  # a second resumption would land here
        return ended, pause.waiting

    def woken() -> bool:
        pause = green.pause()
        seen["early"] = pause
        return green.wait(pause, 5.0)

    async def main() -> None:
        late = asyncio.ensure_future(green.run(times_out))
        early = asyncio.ensure_future(green.run(woken))
        await asyncio.sleep(0.02)
        assert not early.done()
        assert green.wake(seen["early"])
        assert not green.wake(seen["early"])  # once
        assert await early is True
        await asyncio.sleep(0.08)  # the late one has timed out: its wake comes too late
        assert not green.wake(seen["late"])
        assert await late == (False, False)

    asyncio.run(main())
    with pytest.raises(RuntimeError, match=r"store\.green\.run"):
        green.pause()


@pytest.mark.parametrize("loop", sorted(LOOPS))
@pytest.mark.parametrize("kind", ["parked", "fd"])
def test_a_reply_that_came_in_time_is_read_when_the_loop_was_late(
    listener: socket.socket, loop: str, kind: str
) -> None:
    """The peer answers at once, then something holds the loop past the read's timeout: when
    the loop turns again the deadline has passed, but the reply is there, so it is read (on
    uvloop the timers run before the poll in a turn; a busy loop of many calls is this case).
    ``kind``: a read parked on a watched `GreenSocket`, or a plain `green.wait_fd`."""

    def call(port: int) -> bytes:
        sock = green.connect_tcp("127.0.0.1", port, 2.0)
        with sock:
            sock.settimeout(0.05)
            if kind == "fd":
                green.wait_fd(sock.fileno(), writing=False, timeout=0.05)
            return sock.recv(5)

    async def main() -> bytes:
        task = asyncio.ensure_future(green.run(call, listener.getsockname()[1]))
        peer, _ = await asyncio.get_running_loop().sock_accept(listener)
        with peer:
            await asyncio.sleep(0.01)  # (the call waits on its read now)
            peer.send(b"hello")
            time.sleep(0.2)  # the loop held: four timeouts pass before it polls again
            return await task

    listener.setblocking(False)
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        assert runner.run(main()) == b"hello"


def test_a_read_that_got_nothing_still_times_out_after_a_late_loop(listener: socket.socket) -> None:
    """The other side of the check above: nothing came, so the late deadline is a timeout."""

    def call(port: int) -> bytes:
        sock = green.connect_tcp("127.0.0.1", port, 2.0)
        with sock:
            sock.settimeout(0.05)
            return sock.recv(5)

    async def main() -> None:
        task = asyncio.ensure_future(green.run(call, listener.getsockname()[1]))
        peer, _ = await asyncio.get_running_loop().sock_accept(listener)
        with peer:
            await asyncio.sleep(0.01)
            time.sleep(0.2)
            with pytest.raises(TimeoutError):
                await task

    listener.setblocking(False)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
