"""`store bench mix --processes P`: one system's phases in P worker processes at once.

Each worker is started with the "spawn" method (the parent has threads and
open sockets, so it is never forked), builds its own system from the same
config, and replays its own request streams on the same loaded copy of the
data set, with the phase's T threads: P x T callers in all. The workers
live from the first phase of the run to the last, so a warm phase follows
its cold one in the same processes.

A phase goes: the parent sends it to every worker; each starts its threads
and says it is ready; when all are, the parent sets one Event and every
worker starts its clock; each sends back its `Phase` (its process CPU time
included), when its clock started, and the objects it created. The parent
merges them (`merge_processes`): ops/s is all calls over the wall time
from the first worker's start to the last one's end.

Every wait is bounded, and a worker's error comes back as its message
(`WorkerError`), never as a hang.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
import traceback
from collections.abc import Callable
from typing import Any

from store.config import StoreConfig
from store.exceptions import StoreError
from store.tools.mix.dataset_db import Copy
from store.tools.mix.options import MixOptions
from store.tools.mix.runner import Phase, merge_processes, run_phase
from store.tools.mix.system import MixSchema
from store.tools.mix.systems import make_system
from store.tools.mix.workload import make_data_set

__all__ = ["PROCESS_SEED_STEP", "WorkerError", "Workers"]

#: Process ``i`` replays the streams of seed ``seed + i * PROCESS_SEED_STEP`` (process 0: the seed itself).
PROCESS_SEED_STEP = 10_000_000
#: Seconds a worker may take to start and build its system.
START_TIMEOUT = 180.0
#: Seconds the workers may take to start a phase's threads.
READY_TIMEOUT = 120.0
#: Seconds a worker waits for the parent's go before giving up on the phase.
GO_TIMEOUT = 300.0
#: Seconds beyond the phase's length before a worker that has not answered is given up on.
SLACK = 300.0
#: A phase of ``--requests`` calls per thread may take this long at most.
REQUESTS_TIMEOUT = 3600.0


class WorkerError(StoreError):
    """A worker process failed, died or did not answer in time; the message says which and why."""


def _worker(
    conn: Any,
    go: Any,
    name: str,
    config: StoreConfig,
    schema: MixSchema,
    options: MixOptions,
    copy: Copy,
) -> None:
    """A worker process's life: build the system, then run phases until told to stop."""
    try:
        data = make_data_set(options.shape)
        system = make_system(name, config, schema, options)
    except BaseException as exc:
        conn.send(("error", _describe(exc), []))
        return
    started = [0.0]

    def gate() -> None:
        conn.send(("ready",))
        if not go.wait(GO_TIMEOUT):
            raise TimeoutError(f"the parent did not start the phase within {GO_TIMEOUT:.0f} s")
        started[0] = time.monotonic()

    try:
        conn.send(("up",))
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # the parent has gone
                return
            if msg[0] == "stop":
                return
            _, threads, temperature, seconds, requests_per_thread, seed = msg
            first = len(copy.created)
            try:
                phase = run_phase(
                    system,
                    data,
                    copy,
                    threads=threads,
                    temperature=temperature,
                    seconds=seconds,
                    requests_per_thread=requests_per_thread,
                    seed=seed,
                    gate=gate,
                )
            except BaseException as exc:
                conn.send(("error", _describe(exc), copy.created[first:]))
                continue
            conn.send(("done", phase, started[0], copy.created[first:]))
    finally:
        system.close()
        conn.close()


def _describe(exc: BaseException) -> str:
    """The error and where it was raised, for the parent's message."""
    where = traceback.extract_tb(exc.__traceback__)
    at = f" (at {where[-1].filename.rsplit('/', 1)[-1]}:{where[-1].lineno})" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"[:1000]


class Workers:
    """P worker processes for one system, started once and kept for every phase of the run."""

    def __init__(
        self,
        name: str,
        config: StoreConfig,
        schema: MixSchema,
        options: MixOptions,
        copy: Copy,
        processes: int,
    ) -> None:
        """Start the processes (without waiting for them: see `wait_up`)."""
        ctx = multiprocessing.get_context("spawn")
        self.name = name
        self._go = ctx.Event()
        self._conns: list[Any] = []
        self._procs: list[Any] = []
        self._broken = False
        try:
            for i in range(processes):
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=_worker,
                    args=(child, self._go, name, config, schema, options, copy),
                    name=f"mix-{name}-{i}",
                    daemon=True,
                )
                proc.start()
                child.close()
                self._conns.append(parent)
                self._procs.append(proc)
        except BaseException:
            self.close()
            raise

    @property
    def processes(self) -> int:
        """How many worker processes there are."""
        return len(self._procs)

    def _receive(self, i: int, deadline: float, tick: Callable[[], None] | None = None) -> tuple[Any, ...]:
        """Worker ``i``'s next message, waiting until ``deadline`` (``time.monotonic``) at most."""
        conn, proc = self._conns[i], self._procs[i]
        while True:
            if tick is not None:
                tick()
            try:
                if conn.poll(max(0.0, min(0.25, deadline - time.monotonic()))):
                    return tuple(conn.recv())
            except (EOFError, OSError):
                proc.join(2)  # its pipe closed: it is exiting
            else:
                if proc.is_alive() and time.monotonic() < deadline:
                    continue
            self._broken = True
            if not proc.is_alive():
                raise WorkerError(f"{self.name} worker {i} exited (code {proc.exitcode}) without an answer")
            raise WorkerError(f"{self.name} worker {i} did not answer in time")

    def _gather(
        self, want: str, deadline: float, tick: Callable[[], None] | None = None
    ) -> tuple[list[tuple[Any, ...]], list[str], list[int]]:
        """Every worker's next message: those of kind ``want``, the errors, and the IDs created."""
        got: list[tuple[Any, ...]] = []
        errors: list[str] = []
        created: list[int] = []
        for i in range(len(self._conns)):
            try:
                msg = self._receive(i, deadline, tick)
            except WorkerError as exc:
                errors.append(str(exc))
                continue
            if msg[0] == "error":
                self._broken = True
                errors.append(f"{self.name} worker {i}: {msg[1]}")
                created += msg[2]
            elif msg[0] == want:
                got.append(msg)
                if want == "done":
                    created += msg[3]
            else:
                self._broken = True
                errors.append(f"{self.name} worker {i}: {msg[0]!r} where {want!r} was expected")
        return got, errors, created

    def wait_up(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until every worker has built its system; a `WorkerError` if one failed."""
        _, errors, _ = self._gather("up", time.monotonic() + timeout)
        if errors:
            raise WorkerError("; ".join(errors))

    def run_phase(
        self,
        copy: Copy,
        *,
        threads: int,
        temperature: str,
        seconds: float,
        requests_per_thread: int | None,
        seed: int,
        tick: Callable[[float], None] | None = None,
    ) -> Phase:
        """One phase in every worker at once, merged; the objects they created are added to ``copy``."""
        if self._broken:
            raise WorkerError(f"{self.name}: a worker failed in an earlier phase")
        for i, conn in enumerate(self._conns):
            try:
                conn.send(
                    (
                        "phase",
                        threads,
                        temperature,
                        seconds,
                        requests_per_thread,
                        seed + i * PROCESS_SEED_STEP,
                    )
                )
            except OSError as exc:
                self._broken = True
                raise WorkerError(f"{self.name} worker {i}: {exc}") from None
        _, errors, _ = self._gather("ready", time.monotonic() + READY_TIMEOUT)
        if errors:
            raise WorkerError("; ".join(errors))
        go = time.monotonic()
        self._go.set()

        def progress() -> None:
            if tick is not None and requests_per_thread is None and seconds > 0:
                tick(min(1.0, (time.monotonic() - go) / seconds))

        limit = REQUESTS_TIMEOUT if requests_per_thread is not None else seconds + SLACK
        try:
            done, errors, created = self._gather("done", go + limit, progress)
        finally:
            self._go.clear()
        copy.created += created
        if errors:
            raise WorkerError("; ".join(errors))
        if tick is not None:
            tick(1.0)
        parts: list[Phase] = [m[1] for m in done]
        starts: list[float] = [m[2] for m in done]
        window = max(s + p.seconds for s, p in zip(starts, parts, strict=True)) - min(starts)
        return merge_processes(parts, window)

    def close(self) -> None:
        """Stop the workers (each closes its system); those that do not stop in time are terminated."""
        for conn in self._conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("stop",))
        wait = 0.5 if self._broken else 15.0
        deadline = time.monotonic() + wait
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []
