"""A small stateless model checker: writes paused at their named steps, every order of their releases.

Each write runs in a thread that pauses where the code under test calls a
step hook (the pair protocol's `PairWriter.step`, the plans' `Steps.hook`);
a scheduler releases one paused thread at a time, and `explore` tries every
order of releases, depth first, replaying a prefix of choices from a fresh
state each time. A thread that does not reach its next step within `BLOCK_S`
is waiting on a database lock: it is left blocked, and the others go on.

The checks after each schedule belong to the test modules that use this
(`test_pair_interleavings`, `test_unique_interleavings`).
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from store import green

__all__ = [
    "ASK_EVERY_S",
    "BLOCK_S",
    "CONFIRM_S",
    "Hook",
    "Schedule",
    "Scheduler",
    "Waiting",
    "explore",
    "run_schedule",
]

#: How long a released thread may take to reach its next step before it counts as blocked on a lock.
BLOCK_S = 0.12

#: How long a thread judged blocked by `BLOCK_S` may go unconfirmed by a ``waiting`` oracle (see
#: `Scheduler`) before it is taken as blocked anyway (on something the oracle does not see).
CONFIRM_S = 10.0

#: How long between two questions to a ``waiting`` oracle: longer than the 100 ms for which
#: MariaDB's InnoDB lock tables keep showing what they showed at the last read.
ASK_EVERY_S = 0.15

#: What the code under test calls before each step, with the step's name.
Hook = Callable[[str], None]
#: How many of the schedule's writes wait on a database lock now (a query of the server's own).
Waiting = Callable[[], int]


@dataclass
class Schedule:
    """One run: the choices made, the options at each choice, what happened, in order."""

    taken: list[int] = field(default_factory=list)
    options: list[list[int]] = field(default_factory=list)
    #: The writes' indexes in the order they returned.
    returned: list[int] = field(default_factory=list)
    #: ("step", write, step name) at each release, ("return", write, "") as each write returned.
    events: list[tuple[str, int, str]] = field(default_factory=list)
    #: What each write returned, or the exception it raised.
    outcomes: list[object] = field(default_factory=list)
    #: At each release: (the write released, the writes then blocked, the writes then paused).
    releases: list[tuple[int, frozenset[int], frozenset[int]]] = field(default_factory=list)

    def commit_order(self) -> list[int]:
        """The writes in the order they committed: the order they returned in, but for a write that
        was blocked when the only write that could hold its lock (the one released; none other
        was paused) took its last step. That one committed first and the blocked one after it,
        whichever returned first (on a busy machine the blocked one, with less to do after its
        COMMIT, often does)."""
        last = {i: k for k, (i, _b, _p) in enumerate(self.releases)}
        order = list(self.returned)
        for k, (i, blocked, paused) in enumerate(self.releases):
            if last[i] != k or paused:
                continue
            for j in blocked:
                if j in order and i in order and order.index(j) < order.index(i):
                    order.remove(j)
                    order.insert(order.index(i) + 1, j)
        return order

    def steps(self, labels: Sequence[str] | None = None) -> str:
        """The schedule as text: "write:step" at each release, "write returned" as each returned."""
        out = []
        for kind, i, name in self.events:
            who = labels[i] if labels is not None else str(i)
            out.append(f"{who}:{name}" if kind == "step" else f"{who} returned")
        return ", ".join(out)


#: The scheduler and write index of the thread a write runs for, where another thread runs it
#: (`store.aio.AsyncStore` runs a call in its executor, carrying the caller's context there).
_WRITE: contextvars.ContextVar[tuple[Scheduler, int] | None] = contextvars.ContextVar("write", default=None)


class Scheduler:
    """Pauses each write thread at the protocol's steps; releases one at a time."""

    def __init__(self, n: int, waiting: Waiting | None = None) -> None:
        """``waiting``: where given, a thread that made no step for `BLOCK_S` counts as blocked
        only once the server shows as many writes waiting on locks as there are such threads (or
        after `CONFIRM_S`): on a busy machine a slow thread is not a blocked one, and taking it
        for one lets two writes run at once, so that the order they return in is not the order
        they committed in. The oracle is asked only after `BLOCK_S`, and then every
        `ASK_EVERY_S`: MariaDB's InnoDB lock tables are a cache refreshed only when it was not
        read for 100 ms, so that asking more often keeps showing the state before the write
        blocked (a write slow to reach its lock then counted as unconfirmed for `CONFIRM_S`)."""
        self.waiting = waiting
        self.cond = threading.Condition()
        self.state = ["running"] * n  # running -> paused <-> running -> done
        # From now: a thread still on its way to its first step is running, not blocked.
        self.changed = [time.monotonic()] * n
        self.at = [""] * n  # the step each paused thread waits to run
        self.go = [threading.Event() for _ in range(n)]
        self.local = threading.local()
        self.returned: list[int] = []
        self.events: list[tuple[str, int, str]] = []
        self.outcomes: list[object] = [None] * n
        self.errors: list[BaseException] = []
        self.releases: list[tuple[int, frozenset[int], frozenset[int]]] = []

    def hook(self, step: str) -> None:
        i = getattr(self.local, "index", None)
        if i is None:  # a write of a scheduled thread run by another (the async face's worker)?
            mine = _WRITE.get()
            i = mine[1] if mine is not None and mine[0] is self else None
        if i is None:  # a write outside the scheduled threads (setup): runs freely
            return
        with self.cond:
            self.state[i] = "paused"
            self.at[i] = step
            self.changed[i] = time.monotonic()
            self.cond.notify_all()
        # On `AsyncStore(io="native")` the write is a greenlet on the event loop: its pause is an
        # await, so the loop runs the other writes meanwhile (`store.green.wait_event`).
        green.wait_event(self.go[i], 30)
        self.go[i].clear()

    def run_thread(self, i: int, call: Callable[[], object]) -> None:
        self.local.index = i
        _WRITE.set((self, i))  # (carried into a worker thread that runs the write for this one)
        try:
            self.outcomes[i] = call()
        except BaseException as exc:  # surfaced by the test
            self.outcomes[i] = exc
            self.errors.append(exc)
        with self.cond:
            self.state[i] = "done"
            self.returned.append(i)
            self.events.append(("return", i, ""))
            self.changed[i] = time.monotonic()
            self.cond.notify_all()

    def settle(self) -> None:
        """Wait until no thread runs, counting as blocked those that made no step for `BLOCK_S`
        (and, with a ``waiting`` oracle, that the server shows waiting on a lock)."""
        while True:
            with self.cond:
                now = time.monotonic()
                running = [i for i, s in enumerate(self.state) if s == "running"]
                idle = all(now - self.changed[i] >= BLOCK_S for i in running)
                if idle and (not running or self.waiting is None):
                    return
                if not idle:
                    self.cond.wait(BLOCK_S / 4)
                    continue
                since = max(self.changed[i] for i in running)
            # Asked outside the condition: the threads report their steps under it.
            if self.waiting() >= len(running) or time.monotonic() - since >= CONFIRM_S:
                with self.cond:
                    # Still the same threads, none of them moved meanwhile.
                    if [i for i, s in enumerate(self.state) if s == "running"] == running and all(
                        self.changed[i] <= since for i in running
                    ):
                        return
                continue
            time.sleep(ASK_EVERY_S)

    def release(self, i: int) -> None:
        with self.cond:
            blocked = frozenset(k for k, s in enumerate(self.state) if s == "running")
            paused = frozenset(k for k, s in enumerate(self.state) if s == "paused" and k != i)
            self.releases.append((i, blocked, paused))
            self.state[i] = "running"
            self.changed[i] = time.monotonic()
            self.events.append(("step", i, self.at[i]))
        self.go[i].set()

    def paused(self) -> list[int]:
        with self.cond:
            return [i for i, s in enumerate(self.state) if s == "paused"]

    def all_done(self) -> bool:
        with self.cond:
            return all(s == "done" for s in self.state)


def run_schedule(
    install: Callable[[Hook | None], None],
    calls: Sequence[Callable[[], object]],
    choices: list[int],
    *,
    quiet: frozenset[str] = frozenset(),
    waiting: Waiting | None = None,
) -> Schedule:
    """Run ``calls`` at once, one step at a time: ``choices`` first, then the first runnable write.

    ``install(hook)`` makes the code under test call ``hook`` before each
    step (``install(None)`` undoes it). Steps named in ``quiet`` run
    without a pause: steps that touch nothing another write of the schedule
    reads or writes, whose order relative to the others' steps cannot
    change any result. ``waiting``: see `Scheduler`.
    """
    sched = Scheduler(len(calls), waiting)
    out = Schedule()

    def hook(step: str) -> None:
        if step not in quiet:
            sched.hook(step)

    install(hook)
    try:
        threads = [threading.Thread(target=sched.run_thread, args=(i, c)) for i, c in enumerate(calls)]
        for t in threads:
            t.start()
        sched.settle()
        deadline = time.monotonic() + 60
        while not sched.all_done():
            assert time.monotonic() < deadline, "the writes did not finish: a lock cycle?"
            runnable = sched.paused()
            if not runnable:  # every thread waits on a lock held by... nobody paused: wait
                sched.settle()
                time.sleep(BLOCK_S / 4)
                continue
            k = len(out.taken)
            pick = choices[k] if k < len(choices) and choices[k] in runnable else runnable[0]
            out.options.append(runnable)
            out.taken.append(pick)
            sched.release(pick)
            sched.settle()
        for t in threads:
            t.join(30)
        out.returned = list(sched.returned)
        out.events = list(sched.events)
        out.outcomes = list(sched.outcomes)
        out.releases = list(sched.releases)
    finally:
        install(None)
    return out


def explore(
    run: Callable[[list[int]], tuple[Schedule, Callable[[], None]]],
    *,
    twins: tuple[int, int] | None = None,
) -> int:
    """Run every schedule; the number of schedules run.

    ``run(prefix)`` sets up a fresh state, runs the writes with the choices
    ``prefix`` first (`run_schedule`), and returns the schedule with the
    check of its outcome, called once per distinct schedule.

    ``twins`` (i, j), i < j: two writes that are one write twice, on a state
    that tells them apart by nothing but their labels (the same call on the
    same object, or on two objects made alike whose IDs the code under test
    only compares for equality), with checks that do the same. Then each
    schedule whose first release of the two is j's, chosen while i could
    have gone instead, is the mirror of one where i goes first (swap the two
    writes and their labels throughout: every choice and every outcome
    mirrors), and is not run: its mirror is. A schedule where j went first
    because i could not (blocked on a lock) is still run.
    """
    todo: list[list[int]] = [[]]
    seen: set[tuple[int, ...]] = set()
    runs = 0
    while todo:
        prefix = todo.pop()
        schedule, check = run(prefix)
        runs += 1
        key = tuple(schedule.taken)
        if key in seen:
            continue
        seen.add(key)
        check()
        for k in range(len(prefix), len(schedule.taken)):
            # The second twin, chosen here before either went while the first could: a mirror.
            mirror = (
                twins is not None
                and twins[0] in schedule.options[k]
                and not set(twins) & set(schedule.taken[:k])
            )
            for alt in schedule.options[k]:
                if alt != schedule.taken[k] and not (mirror and twins is not None and alt == twins[1]):
                    todo.append([*schedule.taken[:k], alt])
    return runs
