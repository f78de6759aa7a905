"""The fault harness's own tests: owned by tests/faults.

The proxy against a real memcached and an echo server, both of the tests'
own (pass-through, delay, blackhole, reset, refuse, restore, close);
the checkers on planted histories with a fake clock; the report end to end in
a child pytest.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.conftest import FaultReport
from tests.faults.history import (
    CountMismatch,
    History,
    InverseMismatch,
    LostWrite,
    Op,
    Outcome,
    PairMismatch,
    ScenarioResult,
    UnexplainedVersion,
    check_pairs,
    check_registers,
    format_table,
)
from tests.faults.proxy import FaultProxy, Mode
from tests.servers import free_port, start_memcached

REPO = Path(__file__).resolve().parents[2]
# Generous for a loaded two-CPU machine; "at once" means well under this.
PROMPT_S = 1.0


# -- helpers -----------------------------------------------------------------------


def eventually(predicate: Callable[[], bool], timeout_s: float = 2.0) -> bool:
    """Poll ``predicate`` until true or the deadline: the proxy counts after the bytes left."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def recv_until(sock: socket.socket, end: bytes, limit: int = 1 << 16) -> bytes:
    """Read until ``end`` closes the reply (bounded by ``limit`` bytes and the socket timeout)."""
    data = b""
    while not data.endswith(end) and len(data) < limit:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def version(sock: socket.socket) -> bytes:
    """memcached's ``version`` command on an open connection."""
    sock.sendall(b"version\r\n")
    return recv_until(sock, b"\r\n")


def connect(port: int, timeout_s: float = 2.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout_s)


def new_version(port: int) -> bytes:
    """``version`` on a new connection (a reset can already fail the connect on loopback)."""
    with connect(port) as sock:
        return version(sock)


def proxy_threads(proxy: FaultProxy) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(f"FaultProxy:{proxy.port}->")]


class EchoServer:
    """A loopback server that sends back what it gets and closes after the client's FIN."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port: int = self.listener.getsockname()[1]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="echo-accept", daemon=True)
        self._acceptor.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            thread = threading.Thread(target=self._echo, args=(conn,), name="echo-conn", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.05)
            while not self._stop.is_set():
                try:
                    data = conn.recv(65536)
                    if not data:
                        return
                    conn.settimeout(5.0)
                    conn.sendall(data)
                    conn.settimeout(0.05)
                except TimeoutError:
                    continue
                except OSError:
                    return

    def close(self) -> None:
        self._stop.set()
        self._acceptor.join(5)
        for thread in self._threads:
            thread.join(5)
        self.listener.close()


@pytest.fixture(scope="module")
def memcached() -> Iterator[int]:
    """A memcached of the module's own (its port)."""
    port = free_port()
    proc = start_memcached(port)
    try:
        yield port
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def mc_proxy(memcached: int) -> Iterator[FaultProxy]:
    with FaultProxy(memcached) as proxy:
        yield proxy


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    try:
        yield server
    finally:
        server.close()


# -- the proxy ---------------------------------------------------------------------


def test_passes_bytes_through_to_memcached(mc_proxy: FaultProxy) -> None:
    assert mc_proxy.mode is Mode.PASS_THROUGH
    with connect(mc_proxy.port) as sock:
        reply = version(sock)
        assert reply.startswith(b"VERSION ")
        assert version(sock) == reply  # the same connection keeps working
    assert eventually(lambda: mc_proxy.bytes_to_client == 2 * len(reply))
    stats = mc_proxy.stats()
    assert (stats.accepted, stats.bytes_to_server, stats.bytes_discarded) == (1, 2 * len(b"version\r\n"), 0)
    assert mc_proxy.address == f"127.0.0.1:{mc_proxy.port}"


def test_passes_megabytes_intact_and_half_closes(echo: EchoServer) -> None:
    payload = os.urandom(3 << 20)  # past the per-direction buffer cap: exercises the back-pressure
    with FaultProxy(echo.port) as proxy, connect(proxy.port, timeout_s=10) as sock:

        def send() -> None:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)  # the FIN must reach the echo server through the proxy

        sender = threading.Thread(target=send)
        sender.start()
        received = bytearray()
        while len(received) <= len(payload):  # ends at the echo server's FIN, passed back
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            received += chunk
        sender.join(10)
        assert bytes(received) == payload
        assert eventually(lambda: proxy.active == 0)
        assert proxy.stats().bytes_to_server == proxy.stats().bytes_to_client == len(payload)


def test_delay_holds_each_chunk_both_ways(mc_proxy: FaultProxy) -> None:
    with connect(mc_proxy.port) as sock:
        version(sock)  # opened before the switch: delays apply to open connections too
        mc_proxy.delay(0.2)
        assert (mc_proxy.mode, mc_proxy.delay_s) == (Mode.DELAY, 0.2)
        started = time.monotonic()
        assert version(sock).startswith(b"VERSION ")
        elapsed = time.monotonic() - started
        assert 0.4 <= elapsed < 0.4 + PROMPT_S  # 0.2 s on the way in, 0.2 s on the way back
        mc_proxy.restore()
        started = time.monotonic()
        version(sock)
        assert time.monotonic() - started < 0.2


def test_delay_keeps_order_when_shortened(echo: EchoServer) -> None:
    with FaultProxy(echo.port) as proxy, connect(proxy.port) as sock:
        proxy.delay(0.3)
        started = time.monotonic()
        sock.sendall(b"first")
        time.sleep(0.05)  # two chunks, not one
        proxy.delay(0.0)
        sock.sendall(b"second")
        # "second" is due at once but queues behind "first".
        assert recv_until(sock, b"second", limit=11) == b"firstsecond"
        assert time.monotonic() - started >= 0.3
        with pytest.raises(ValueError, match="delay"):
            proxy.delay(-1)


def test_blackhole_times_clients_out_and_restore_recovers(mc_proxy: FaultProxy, memcached: int) -> None:
    with connect(mc_proxy.port, timeout_s=0.3) as before:
        version(before)
        mc_proxy.blackhole()
        assert mc_proxy.mode is Mode.BLACKHOLE
        with connect(mc_proxy.port, timeout_s=0.3) as during:  # new connections are accepted...
            for sock in (before, during):
                sock.sendall(b"version\r\n")
                with pytest.raises(TimeoutError):  # ...and nothing ever answers
                    sock.recv(100)
            with connect(memcached) as direct:  # while the server is fine
                assert version(direct).startswith(b"VERSION ")
            assert eventually(lambda: mc_proxy.bytes_discarded >= 2 * len(b"version\r\n"))

            mc_proxy.restore()
            for sock in (before, during):  # their streams lost bytes: they are closed
                with pytest.raises(ConnectionError):
                    sock.recv(100)
    with connect(mc_proxy.port) as after:
        assert version(after).startswith(b"VERSION ")


def test_blackhole_discards_without_buffering(echo: EchoServer) -> None:
    with FaultProxy(echo.port) as proxy:
        proxy.blackhole()
        with connect(proxy.port, timeout_s=5) as sock:
            # Four times the buffer cap goes in: only reading and discarding lets sendall finish.
            sock.sendall(b"x" * (4 << 20))
            assert eventually(lambda: proxy.bytes_discarded == 4 << 20)
        assert proxy.bytes_to_server == 0


def test_reset_resets_open_and_new_connections(mc_proxy: FaultProxy) -> None:
    with connect(mc_proxy.port) as sock:
        version(sock)
        started = time.monotonic()
        mc_proxy.reset()
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
        assert time.monotonic() - started < PROMPT_S
    with pytest.raises(ConnectionError):
        new_version(mc_proxy.port)
    assert mc_proxy.stats().resets == 2
    mc_proxy.restore()
    with connect(mc_proxy.port) as sock:
        assert version(sock).startswith(b"VERSION ")


def test_refuse_resets_new_and_open_connections(mc_proxy: FaultProxy) -> None:
    with connect(mc_proxy.port) as sock:
        version(sock)
        mc_proxy.refuse()
        assert mc_proxy.mode is Mode.REFUSE
        with pytest.raises(ConnectionResetError):
            sock.recv(100)
    for _ in range(3):
        started = time.monotonic()
        with pytest.raises(ConnectionError):
            new_version(mc_proxy.port)
        assert time.monotonic() - started < PROMPT_S
    mc_proxy.restore()
    with connect(mc_proxy.port) as sock:
        assert version(sock).startswith(b"VERSION ")


def test_server_down_resets_the_client() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        dead_port = probe.getsockname()[1]  # free once the probe closes
    with FaultProxy(dead_port) as proxy, pytest.raises(ConnectionError):
        new_version(proxy.port)


def test_close_joins_every_thread_and_frees_the_port(mc_proxy: FaultProxy) -> None:
    socks = [connect(mc_proxy.port, timeout_s=2) for _ in range(3)]
    try:
        for sock in socks:
            version(sock)
        mc_proxy.blackhole()
        assert len(proxy_threads(mc_proxy)) == 4  # the acceptor and one per connection
        mc_proxy.close()
        assert proxy_threads(mc_proxy) == []
        for sock in socks:
            with pytest.raises(ConnectionError):
                sock.recv(100)
        with pytest.raises(ConnectionRefusedError):
            connect(mc_proxy.port).close()
        mc_proxy.close()  # idempotent
        with pytest.raises(RuntimeError, match="closed"):
            mc_proxy.restore()
    finally:
        for sock in socks:
            sock.close()


# -- the history -------------------------------------------------------------------


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def history(clock: FakeClock) -> History:
    return History(clock=clock)


def record(
    history: History,
    clock: FakeClock,
    kind: str,
    key: Hashable,
    value: Any = None,
    *,
    start: float,
    end: float,
    outcome: Outcome = Outcome.OK,
    result: Any = None,
) -> Op:
    """One op invoked at ``start`` and completed at ``end`` with ``outcome``."""
    clock.now = start
    op = history.invoke(kind, key, value)
    clock.now = end
    if outcome is Outcome.OK:
        history.ok(op, result)
    elif outcome is Outcome.FAIL:
        history.fail(op, "planted failure")
    elif outcome is Outcome.UNKNOWN:
        history.unknown(op, TimeoutError("planted timeout"))
    return op


def test_clean_history_reports_zeros(history: History, clock: FakeClock) -> None:
    record(history, clock, "write", "a", 1, start=0.0, end=0.1)
    record(history, clock, "read", "a", start=0.2, end=0.25, result=1)
    record(history, clock, "write", "a", 2, start=0.3, end=0.5)
    record(history, clock, "read", "a", start=0.4, end=0.45, result=1)  # concurrent with write 2
    record(history, clock, "read", "a", start=0.6, end=0.6, result=2)
    record(history, clock, "read", "b", start=0.6, end=0.7, result=None)
    record(history, clock, "link", (1, 2), start=0.0, end=0.1)
    record(history, clock, "link", (1, 3), start=0.0, end=0.1)
    record(history, clock, "unlink", (1, 3), start=0.2, end=0.3)

    regs = check_registers(history, {"a": 2, "b": None}, stale_bound_s=0.0)
    assert regs.ok
    assert (regs.attempted, regs.acknowledged, regs.failed, regs.unknown) == (9, 9, 0, 0)
    assert regs.worst_latency_s == pytest.approx(0.2)
    assert regs.worst_latency_by_kind == pytest.approx(
        {"write": 0.2, "read": 0.1, "link": 0.1, "unlink": 0.1}
    )
    pairs = check_pairs(history, {(1, 2)}, {(1, 2)}, counts_ok=True)
    assert pairs.ok
    row = regs.to_result("clean")
    assert (row.missing, row.stale_beyond_bound, row.inverse_mismatches, row.unknown) == (0, 0, 0, 0)
    assert row.passed


def test_finds_a_lost_acknowledged_write(history: History, clock: FakeClock) -> None:
    record(history, clock, "write", "a", 1, start=0.0, end=0.1)
    record(history, clock, "write", "a", 2, start=0.2, end=0.3)
    record(history, clock, "write", "b", 1, start=0.0, end=0.1)
    report = check_registers(history, {"a": 1}, stale_bound_s=1.0)
    assert report.missing == [LostWrite("a", 2, 1), LostWrite("b", 1, None)]
    assert report.to_result("lost").missing == 2
    assert not report.to_result("lost").passed


def test_unknown_writes_may_or_may_not_have_landed(history: History, clock: FakeClock) -> None:
    record(history, clock, "write", "a", 1, start=0.0, end=0.1)
    record(history, clock, "write", "a", 2, start=0.2, end=1.2, outcome=Outcome.UNKNOWN)
    clock.now = 1.3
    history.invoke("write", "a", 3)  # never completed: unknown too
    for final in (1, 2, 3):
        report = check_registers(history, {"a": final}, stale_bound_s=0.0)
        assert report.ok, final
        assert (report.acknowledged, report.unknown) == (1, 2)
    # Below the acknowledged version is a loss whatever the unknowns.
    report = check_registers(history, {"a": None}, stale_bound_s=0.0)
    assert report.missing == [LostWrite("a", 1, None)]


def test_finds_a_failed_write_that_took_effect(history: History, clock: FakeClock) -> None:
    record(history, clock, "write", "a", 1, start=0.0, end=0.1)
    record(history, clock, "write", "a", 2, start=0.2, end=0.3, outcome=Outcome.FAIL)
    record(history, clock, "read", "a", start=0.4, end=0.5, result=2)
    report = check_registers(history, {"a": 2}, stale_bound_s=0.0)
    assert report.missing == []
    assert report.unexplained == [UnexplainedVersion("a", 2, "final"), UnexplainedVersion("a", 2, "read #2")]
    assert "2 unexplained versions" in report.to_result("x").notes


def test_stale_reads_beyond_the_bound_only(history: History, clock: FakeClock) -> None:
    record(history, clock, "write", "a", 1, start=0.0, end=1.0)
    record(history, clock, "write", "a", 2, start=1.5, end=2.0)
    within = record(history, clock, "read", "a", start=2.3, end=2.4, result=1)  # 0.3 s after the ack
    beyond = record(history, clock, "read", "a", start=3.0, end=3.1, result=1)  # 1.0 s after
    absent = record(history, clock, "read", "a", start=3.5, end=3.6, result=None)  # 2.5 s after write 1

    report = check_registers(history, {"a": 2}, stale_bound_s=0.5)
    assert [s.read_index for s in report.stale_reads] == [beyond.index, absent.index]
    first = report.stale_reads[0]
    assert (first.version_read, first.newer_version, first.newer_write_index) == (1, 2, 1)
    assert first.lag_s == pytest.approx(1.0)
    assert report.stale_reads[1].newer_version == 2
    assert report.missing == []
    assert report.to_result("stale").stale_beyond_bound == 2

    strict = check_registers(history, {"a": 2}, stale_bound_s=0.0)
    assert [s.read_index for s in strict.stale_reads] == [within.index, beyond.index, absent.index]
    assert check_registers(history, {"a": 2}, stale_bound_s=10.0).stale_reads == []


def test_run_classifies_outcomes(history: History) -> None:
    assert history.run("write", "k", 1, lambda: "done") == "done"

    def timeout() -> None:
        raise TimeoutError("lost in the network")

    def refused() -> None:
        raise ConnectionRefusedError("nobody home")

    with pytest.raises(TimeoutError):
        history.run("write", "k", 2, timeout, definite_failures=(ConnectionRefusedError,))
    assert (
        history.run("write", "k", 3, refused, definite_failures=(ConnectionRefusedError,), reraise=False)
        is None
    )
    assert history.run("write", "k", 4, timeout, reraise=False) is None
    history.invoke("write", "k", 5)  # never completed

    ops = history.ops()
    assert [op.outcome for op in ops] == [
        Outcome.OK,
        Outcome.UNKNOWN,
        Outcome.FAIL,
        Outcome.UNKNOWN,
        Outcome.PENDING,
    ]
    assert ops[1].error == "TimeoutError('lost in the network')"
    report = check_registers(history, {"k": 5}, stale_bound_s=0.0)
    assert (report.attempted, report.acknowledged, report.failed, report.unknown) == (5, 1, 1, 3)
    with pytest.raises(ValueError, match="not a handle"):
        history.ok(history.ops()[0])  # a copy is no handle...
    op = history.invoke("read", "k")
    history.ok(op, 1)
    with pytest.raises(ValueError, match="already completed"):
        history.fail(op, "twice")  # ...and an op ends once


def test_pairs_find_inverse_and_count_mismatches(history: History, clock: FakeClock) -> None:
    record(history, clock, "link", (1, 2), start=0.0, end=0.1)
    record(history, clock, "link", (1, 3), start=0.0, end=0.1)
    report = check_pairs(history, {(1, 2), (1, 3)}, {(1, 2), (9, 9)}, counts_ok=[("board", 1, 2, 1)])
    assert report.missing == []
    assert report.inverse_mismatches == [
        InverseMismatch((1, 3), on_primary=True, on_inverse=False),
        InverseMismatch((9, 9), on_primary=False, on_inverse=True),
        CountMismatch(("board", 1, 2, 1)),
    ]
    assert report.to_result("inverse").inverse_mismatches == 3
    assert (
        len(check_pairs(history, {(1, 2), (1, 3)}, {(1, 2), (1, 3)}, counts_ok=False).inverse_mismatches) == 1
    )


def test_pairs_find_missing_unless_an_unknown_op_explains_it(history: History, clock: FakeClock) -> None:
    record(history, clock, "link", (1, 1), start=0.0, end=0.1)  # acknowledged, then lost
    record(history, clock, "link", (1, 2), start=0.0, end=0.1)
    record(history, clock, "unlink", (1, 2), start=0.2, end=1.2, outcome=Outcome.UNKNOWN)  # may have landed
    record(history, clock, "link", (1, 3), start=0.0, end=0.1)
    record(history, clock, "link", (1, 3), start=0.2, end=1.2, outcome=Outcome.UNKNOWN)  # cannot unlink
    record(history, clock, "link", (1, 4), start=0.0, end=1.0, outcome=Outcome.UNKNOWN)
    record(history, clock, "unlink", (1, 4), start=1.1, end=1.2)  # the link may land late
    record(history, clock, "link", (1, 5), start=0.0, end=0.1, outcome=Outcome.FAIL)  # yet it is there

    primary = {(1, 4), (1, 5)}
    report = check_pairs(history, primary, primary)
    assert report.missing == [
        PairMismatch((1, 1), observed_present=False, expected_present=True, last_acknowledged="link #0"),
        PairMismatch((1, 3), observed_present=False, expected_present=True, last_acknowledged="link #3"),
        PairMismatch((1, 4), observed_present=True, expected_present=False, last_acknowledged="unlink #6"),
        PairMismatch((1, 5), observed_present=True, expected_present=False, last_acknowledged=None),
    ]
    assert report.inverse_mismatches == []
    lenient = check_pairs(history, primary, primary, unknowns_may_land_late=True)
    assert [m.pair for m in lenient.missing] == [(1, 1), (1, 3), (1, 5)]
    assert (report.attempted, report.acknowledged, report.failed, report.unknown) == (8, 4, 1, 3)


def test_table_has_a_header_and_escapes_cells() -> None:
    rows = [
        ScenarioResult("memcached blackhole", 10, 8, 1, 1, 0, 0, 0, 0.5123),
        ScenarioResult("a|b", 1, 1, 0, 0, 1, 2, 3, 2.0, notes="line\nbreak"),
    ]
    lines = format_table(rows).splitlines()
    assert lines[0] == (
        "| scenario | attempted | acknowledged | failed | unknown | missing | stale beyond bound"
        " | inverse mismatches | worst latency (s) | notes |"
    )
    assert lines[1].startswith("|:---|---:|")
    assert lines[2] == "| memcached blackhole | 10 | 8 | 1 | 1 | 0 | 0 | 0 | 0.512 |  |"
    assert lines[3] == r"| a\|b | 1 | 1 | 0 | 0 | 1 | 2 | 3 | 2.000 | line break |"
    assert rows[0].as_dict()["passed"] is True
    assert format_table([]).count("\n") == 1


# -- the report --------------------------------------------------------------------


def test_fault_report_fixture_and_marker(fault_report: FaultReport, request: pytest.FixtureRequest) -> None:
    assert isinstance(fault_report, FaultReport)
    assert request.node.get_closest_marker("faults") is not None
    with pytest.raises(TypeError):
        fault_report.add({"name": "not a row"})  # type: ignore[arg-type]


CHILD_TEST = """
from tests.faults.history import ScenarioResult


def test_records(fault_report, request):
    assert any(m.startswith("faults:") for m in request.config.getini("markers"))
    fault_report.add(ScenarioResult("planted | row", 3, 2, 0, 1, 0, 0, 0, 0.25, notes="child"))
"""


def test_report_is_printed_and_written_as_json(tmp_path: Path) -> None:
    # A child pytest of its own, so the planted row stays out of this session's report.
    (tmp_path / "test_child.py").write_text(CHILD_TEST)
    out = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "STORE_FAULT_REPORT": str(out)}
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.faults.conftest",
         "test_child.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert child.returncode == 0, child.stdout + child.stderr
    assert "fault scenarios" in child.stdout
    assert "| scenario | attempted |" in child.stdout
    assert r"| planted \| row | 3 | 2 | 0 | 1 | 0 | 0 | 0 | 0.250 | child |" in child.stdout
    results = json.loads(out.read_text())["results"]
    assert results == [
        {
            "name": "planted | row",
            "attempted": 3,
            "acknowledged": 2,
            "failed": 0,
            "unknown": 1,
            "missing": 0,
            "stale_beyond_bound": 0,
            "inverse_mismatches": 0,
            "worst_latency_s": 0.25,
            "notes": "child",
            "passed": True,
        }
    ]
