"""The fault scenarios' workload: writers and readers on real servers, every operation recorded.

Three kinds of keys, each owned by one worker so that its history is simple:

* object registers ``("obj", pin)``: ``update(pin, {"v": k})`` with k rising,
  read back with ``get`` (memcached);
* list registers ``("list", board)``: the k-th write links pin k to the board
  with sequence k; a read is the newest entry of the list (Redis);
* pairs ``(board, pin)``: link and unlink in turn, on pairs whose two sides
  live on different hosts where the scenario has two.

`final_state` reads everything back from the databases with a store that has
no cache, and `verdict` turns the history and the final state into a
`ScenarioResult` row.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from store import (
    NotFound,
    RoutingError,
    ShardMovedError,
    ShardNotInitializedError,
    StaleMapError,
    Store,
)
from tests.faults.history import History, ScenarioResult, check_pairs, check_registers

BHP = "board_has_pins"
POB = "pin_owned_by_board"
#: Errors after which the write certainly did not happen (refused before anything was written).
DEFINITE: tuple[type[BaseException], ...] = (
    ShardMovedError,
    ShardNotInitializedError,
    RoutingError,
    StaleMapError,
    NotFound,
)


@dataclass
class Owned:
    """What one worker writes: its object registers, its board (a list register) and its pairs."""

    pins: list[int]
    board: int
    spare: list[int]  # pins that the list register's writes link, one per write
    pairs: list[tuple[int, int]]
    versions: dict[Any, int] = field(default_factory=dict)
    linked: dict[tuple[int, int], bool] = field(default_factory=dict)


def prepare(store: Store, workers: int, *, shards: Sequence[int], per_worker: int = 4) -> list[Owned]:
    """Objects for ``workers`` workers, spread over ``shards``."""
    out = []
    rng = random.Random(7)
    for w in range(workers):
        pins = [store.create("pin", {"v": 0}, shard=rng.choice(shards)) for _ in range(per_worker)]
        board = store.create("board", {"w": w}, shard=rng.choice(shards))
        spare = [store.create("pin", {"spare": w, "k": k}, shard=rng.choice(shards)) for k in range(200)]
        pair_boards = [
            store.create("board", {"pairs": w}, shard=shards[(w + k) % len(shards)]) for k in range(2)
        ]
        pair_pins = [
            store.create("pin", {"pair": w}, shard=shards[(w + k + 1) % len(shards)]) for k in range(2)
        ]
        pairs = [(b, p) for b in pair_boards for p in pair_pins]
        out.append(Owned(pins, board, spare, pairs))
    return out


class Workload:
    """Worker threads that write and read until told to stop, recording everything in ``history``."""

    def __init__(
        self,
        writer: Store,
        owned: list[Owned],
        history: History,
        *,
        reader: Store | None = None,
        readers: int = 2,
        writers: bool = True,
        # Between two calls of a thread: about a hundred calls a second a thread, thousands in
        # each scenario's faults, at a third of the CPU of a 2 ms pause (the suite's CPU is
        # what its time is made of).
        pause_s: float = 0.006,
        seed: int = 1,
    ) -> None:
        self.writer = writer
        self.reader = reader or writer
        self.owned = owned
        self.history = history
        self.readers = readers
        self.writers = writers
        self.pause_s = pause_s
        self.seed = seed
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.crashes: list[BaseException] = []  # a bug in the workload itself, not a fault

    def start(self) -> Workload:
        """Start the writers (one per owned set, unless ``writers`` is False) and the readers."""
        for w, mine in enumerate(self.owned if self.writers else []):
            self.threads.append(
                threading.Thread(target=self._guard, args=(self._write, w, mine), name=f"w{w}")
            )
        for r in range(self.readers):
            self.threads.append(
                threading.Thread(target=self._guard, args=(self._read, r, None), name=f"r{r}")
            )
        for t in self.threads:
            t.start()
        return self

    def finish(self) -> None:
        """Stop every thread and wait for it."""
        self.stop.set()
        for t in self.threads:
            t.join(60)
        assert not [t for t in self.threads if t.is_alive()], "a workload thread did not stop"
        assert self.crashes == [], self.crashes

    def _guard(self, loop: Callable[[int, Any], None], i: int, mine: Any) -> None:
        try:
            loop(i, mine)
        except BaseException as exc:  # surfaced by finish()
            self.crashes.append(exc)

    def _write(self, w: int, mine: Owned) -> None:
        rng = random.Random(self.seed * 1000 + w)
        h, store = self.history, self.writer
        while not self.stop.is_set():
            r = rng.random()
            if r < 0.45:
                pin = rng.choice(mine.pins)
                v = mine.versions[("obj", pin)] = mine.versions.get(("obj", pin), 0) + 1
                h.run(
                    "write",
                    ("obj", pin),
                    v,
                    lambda p=pin, v=v: store.update(p, {"v": v}),
                    definite_failures=DEFINITE,
                    reraise=False,
                )
            elif r < 0.7:
                k = mine.versions[("list", mine.board)] = mine.versions.get(("list", mine.board), 0) + 1
                if k >= len(mine.spare):
                    continue
                h.run(
                    "write",
                    ("list", mine.board),
                    k,
                    lambda k=k: store.link(BHP, mine.board, mine.spare[k], sequence=k),
                    definite_failures=DEFINITE,
                    reraise=False,
                )
            else:
                pair = rng.choice(mine.pairs)
                link = not mine.linked.get(pair, False)
                mine.linked[pair] = link
                b, p = pair
                call: Callable[[], bool] = (
                    (lambda b=b, p=p: store.link(BHP, b, p))
                    if link
                    else (lambda b=b, p=p: store.unlink(BHP, b, p))
                )
                h.run(
                    "link" if link else "unlink", pair, None, call, definite_failures=DEFINITE, reraise=False
                )
            time.sleep(self.pause_s)

    def _read(self, r: int, _mine: None) -> None:
        rng = random.Random(self.seed * 1000 + 500 + r)
        h, store = self.history, self.reader
        everyone = self.owned
        while not self.stop.is_set():
            mine = rng.choice(everyone)
            if rng.random() < 0.6:
                pin = rng.choice(mine.pins)
                h.run(
                    "read",
                    ("obj", pin),
                    None,
                    lambda p=pin: _version(store.get(p)),
                    definite_failures=(Exception,),
                    reraise=False,
                )
            else:
                h.run(
                    "read",
                    ("list", mine.board),
                    None,
                    lambda m=mine: _newest(store.links(BHP, m.board, limit=1, newest_first=True), m),
                    definite_failures=(Exception,),
                    reraise=False,
                )
            time.sleep(self.pause_s)


def _version(obj: dict[str, Any] | None) -> int | None:
    return None if obj is None else int(obj["v"])


def _newest(ids: list[int], mine: Owned) -> int | None:
    return mine.spare.index(ids[0]) if ids else None


@dataclass
class Final:
    """The databases' state at the end, read without any cache."""

    registers: dict[Any, int | None]
    primary: set[tuple[int, int]]
    inverse: set[tuple[int, int]]
    count_mismatches: list[str]


def final_state(store: Store, owned: list[Owned]) -> Final:
    """Everything the workload wrote, read back from the databases (``store`` must have no cache)."""
    assert store.admin_context().caches.objects is None
    assert store.admin_context().caches.lists is None
    registers: dict[Any, int | None] = {}
    primary: set[tuple[int, int]] = set()
    inverse: set[tuple[int, int]] = set()
    wrong: list[str] = []
    for mine in owned:
        got = store.get_many(mine.pins)
        for pin in mine.pins:
            registers[("obj", pin)] = _version(got.get(pin))
        registers[("list", mine.board)] = _newest(
            store.links(BHP, mine.board, limit=1, newest_first=True), mine
        )
        boards = {b for b, _p in mine.pairs}
        pins = {p for _b, p in mine.pairs}
        for b in boards:
            linked = store.links(BHP, b, limit=100)
            primary |= {(b, p) for p in linked}
            if store.count(BHP, b) != len(linked):
                wrong.append(f"{BHP} {b}: count {store.count(BHP, b)}, rows {len(linked)}")
        for p in pins:
            owners = store.links(POB, p, limit=100)
            inverse |= {(b, p) for b in owners}
            if store.count(POB, p) != len(owners):
                wrong.append(f"{POB} {p}: count {store.count(POB, p)}, rows {len(owners)}")
    return Final(registers, primary, inverse, wrong)


def verdict(
    name: str, history: History, final: Final, *, stale_bound_s: float, notes: str = ""
) -> ScenarioResult:
    """One report row: registers and pairs checked, counts merged (missing, stale, mismatches)."""
    regs = check_registers(history, final.registers, stale_bound_s=stale_bound_s)
    pairs = check_pairs(history, final.primary, final.inverse, final.count_mismatches or True)
    ops = history.ops()
    detail = []
    if regs.missing:
        detail.append(f"lost: {regs.missing[:3]}")
    if regs.stale_reads:
        detail.append(f"stale: {regs.stale_reads[:3]}")
    if regs.unexplained:
        detail.append(f"unexplained: {regs.unexplained[:3]}")
    if pairs.missing:
        detail.append(f"pairs lost: {pairs.missing[:3]}")
    if pairs.inverse_mismatches:
        detail.append(f"inverse: {pairs.inverse_mismatches[:3]}")
    return ScenarioResult(
        name=name,
        attempted=len(ops),
        acknowledged=sum(1 for op in ops if op.outcome == "ok"),
        failed=sum(1 for op in ops if op.outcome == "fail"),
        unknown=sum(1 for op in ops if op.indeterminate),
        missing=len(regs.missing) + len(pairs.missing),
        stale_beyond_bound=len(regs.stale_reads),
        inverse_mismatches=len(pairs.inverse_mismatches),
        worst_latency_s=max((op.latency_s or 0.0) for op in ops) if ops else 0.0,
        notes="; ".join([notes, *detail]).strip("; "),
    )


def seed_history(history: History, owned: list[Owned]) -> None:
    """Record the objects' starting version 0 (written by `prepare`) as acknowledged writes."""
    for mine in owned:
        for pin in mine.pins:
            history.ok(history.invoke("write", ("obj", pin), 0))
