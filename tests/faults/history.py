"""Operation histories and their checkers, Jepsen/Elle style but small: owned by tests/faults.

Scenario workers record every operation they attempt in a `History`: the
invocation, then exactly one completion, ``ok`` (it happened), ``fail`` (it
definitely had no effect) or ``unknown`` (it may or may not have happened: a
timeout or a lost connection on a write). An operation never completed counts
as unknown. After the faults are over, a checker compares the history with the
state read back from the servers:

- `check_registers`: keys written with increasing integer versions; finds
  acknowledged writes that were lost and reads staler than a bound.
- `check_pairs`: relations linked and unlinked per (from_id, to_id); finds
  pairs whose presence contradicts the last acknowledged operation and pairs
  on one side of the relation and not the other.

Each report turns into a `ScenarioResult`, a row of the Markdown table that
`format_table` renders and tests/faults/conftest.py prints after the session.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
import enum
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar, overload

__all__ = [
    "CountMismatch",
    "History",
    "InverseMismatch",
    "LostWrite",
    "Op",
    "Outcome",
    "PairMismatch",
    "PairReport",
    "RegisterReport",
    "ScenarioResult",
    "StaleRead",
    "UnexplainedVersion",
    "check_pairs",
    "check_registers",
    "format_table",
]

T = TypeVar("T")
Pair = tuple[Hashable, Hashable]


class Outcome(enum.StrEnum):
    """How an operation ended; PENDING until it does (and counted as UNKNOWN)."""

    PENDING = "pending"
    OK = "ok"
    FAIL = "fail"
    UNKNOWN = "unknown"


@dataclass
class Op:
    """One operation: its invocation and, once completed, its outcome.

    ``History.ops()`` hands out copies; the handle from ``invoke()`` is the
    history's own record, to pass back to ``ok``/``fail``/``unknown``.
    """

    index: int
    kind: str
    key: Hashable
    value: Any
    invoked_at: float
    thread: str
    outcome: Outcome = Outcome.PENDING
    completed_at: float | None = None
    result: Any = None
    error: str | None = None

    @property
    def latency_s(self) -> float | None:
        """Completion minus invocation; None while pending."""
        return None if self.completed_at is None else self.completed_at - self.invoked_at

    @property
    def indeterminate(self) -> bool:
        """True when the operation may or may not have taken effect."""
        return self.outcome in (Outcome.UNKNOWN, Outcome.PENDING)


class History:
    """A thread-safe record of operations, in invocation order.

    ``clock`` (time.monotonic by default) stamps invocations and completions;
    tests of the checkers pass a fake one to place operations exactly.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ops: list[Op] = []

    def __len__(self) -> int:
        with self._lock:
            return len(self._ops)

    def invoke(self, kind: str, key: Hashable, value: Any = None) -> Op:
        """Record that an operation starts now; returns its handle."""
        with self._lock:
            op = Op(
                index=len(self._ops),
                kind=kind,
                key=key,
                value=value,
                invoked_at=self._clock(),
                thread=threading.current_thread().name,
            )
            self._ops.append(op)
            return op

    def ok(self, op: Op, result: Any = None) -> None:
        """``op`` took effect; ``result`` is what it returned (a read's version)."""
        self._complete(op, Outcome.OK, result, None)

    def fail(self, op: Op, error: BaseException | str) -> None:
        """``op`` definitely had no effect."""
        self._complete(op, Outcome.FAIL, None, error)

    def unknown(self, op: Op, error: BaseException | str) -> None:
        """``op`` may or may not have taken effect (a timeout, a lost connection)."""
        self._complete(op, Outcome.UNKNOWN, None, error)

    def _complete(self, op: Op, outcome: Outcome, result: Any, error: BaseException | str | None) -> None:
        with self._lock:
            if op.index >= len(self._ops) or self._ops[op.index] is not op:
                raise ValueError(f"op #{op.index} is not a handle from this history")
            if op.outcome is not Outcome.PENDING:
                raise ValueError(f"op #{op.index} ({op.kind} {op.key!r}) already completed as {op.outcome}")
            op.completed_at = self._clock()
            op.outcome = outcome
            op.result = result
            # Kept as text: an exception would keep its traceback's frames alive.
            op.error = None if error is None else error if isinstance(error, str) else repr(error)

    @overload
    def run(
        self,
        kind: str,
        key: Hashable,
        value: Any,
        fn: Callable[[], T],
        *,
        definite_failures: tuple[type[BaseException], ...] = (),
        reraise: Literal[True] = True,
    ) -> T: ...

    @overload
    def run(
        self,
        kind: str,
        key: Hashable,
        value: Any,
        fn: Callable[[], T],
        *,
        definite_failures: tuple[type[BaseException], ...] = (),
        reraise: bool,
    ) -> T | None: ...

    def run(
        self,
        kind: str,
        key: Hashable,
        value: Any,
        fn: Callable[[], T],
        *,
        definite_failures: tuple[type[BaseException], ...] = (),
        reraise: bool = True,
    ) -> T | None:
        """Invoke, call ``fn()``, and record ok with its result, or classify its exception.

        An exception of one of ``definite_failures`` is recorded as ``fail``
        (no effect), any other as ``unknown``. Then it is re-raised, or, with
        ``reraise=False``, swallowed and None returned. A read never has an
        effect, so reads can pass ``definite_failures=(Exception,)``.
        KeyboardInterrupt and the like are recorded as unknown and always
        re-raised.
        """
        op = self.invoke(kind, key, value)
        try:
            result = fn()
        except Exception as exc:
            if isinstance(exc, definite_failures):
                self.fail(op, exc)
            else:
                self.unknown(op, exc)
            if reraise:
                raise
            return None
        except BaseException as exc:
            self.unknown(op, exc)
            raise
        self.ok(op, result)
        return result

    def ops(self) -> list[Op]:
        """Copies of every operation so far, in invocation order."""
        with self._lock:
            return [copy.copy(op) for op in self._ops]


# -- reports ---------------------------------------------------------------------


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario's row of the fault report."""

    name: str
    attempted: int
    acknowledged: int
    failed: int
    unknown: int
    missing: int
    stale_beyond_bound: int
    inverse_mismatches: int
    worst_latency_s: float
    notes: str = ""

    HEADERS: ClassVar[tuple[str, ...]] = (
        "scenario",
        "attempted",
        "acknowledged",
        "failed",
        "unknown",
        "missing",
        "stale beyond bound",
        "inverse mismatches",
        "worst latency (s)",
        "notes",
    )

    @property
    def passed(self) -> bool:
        """No lost write, no stale read beyond the bound, no inverse mismatch."""
        return self.missing == 0 and self.stale_beyond_bound == 0 and self.inverse_mismatches == 0

    def as_row(self) -> str:
        """The Markdown table row, columns as in HEADERS."""
        cells = [
            self.name,
            self.attempted,
            self.acknowledged,
            self.failed,
            self.unknown,
            self.missing,
            self.stale_beyond_bound,
            self.inverse_mismatches,
            f"{self.worst_latency_s:.3f}",
            self.notes,
        ]
        return "| " + " | ".join(_cell(c) for c in cells) + " |"

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields, plus ``passed``."""
        return {**dataclasses.asdict(self), "passed": self.passed}


def format_table(results: Iterable[ScenarioResult]) -> str:
    """A Markdown table: the header line, the alignment line, one row per result."""
    header = "| " + " | ".join(ScenarioResult.HEADERS) + " |"
    align = (
        "|" + "|".join(":---" if h in ("scenario", "notes") else "---:" for h in ScenarioResult.HEADERS) + "|"
    )
    return "\n".join([header, align, *(r.as_row() for r in results)])


@dataclass(frozen=True)
class _Tally:
    attempted: int
    acknowledged: int
    failed: int
    unknown: int
    worst_latency_s: float
    worst_latency_by_kind: dict[str, float]


def _tally(ops: Sequence[Op]) -> _Tally:
    by_kind: dict[str, float] = {}
    for op in ops:
        latency = op.latency_s
        if latency is not None:
            by_kind[op.kind] = max(by_kind.get(op.kind, 0.0), latency)
    return _Tally(
        attempted=len(ops),
        acknowledged=sum(op.outcome is Outcome.OK for op in ops),
        failed=sum(op.outcome is Outcome.FAIL for op in ops),
        unknown=sum(op.indeterminate for op in ops),
        worst_latency_s=max(by_kind.values(), default=0.0),
        worst_latency_by_kind=by_kind,
    )


# -- registers -------------------------------------------------------------------


@dataclass(frozen=True)
class LostWrite:
    """A key whose final version is below its highest acknowledged write."""

    key: Hashable
    acknowledged_version: int
    final_version: int | None


@dataclass(frozen=True)
class StaleRead:
    """A read that returned ``version_read`` although ``newer_version`` had been
    acknowledged ``lag_s`` seconds before the read started (lag_s > the bound)."""

    key: Hashable
    read_index: int
    read_started_at: float
    version_read: int | None
    newer_version: int
    newer_write_index: int
    newer_acknowledged_at: float
    lag_s: float


@dataclass(frozen=True)
class UnexplainedVersion:
    """A version found (``where``: "final" or "read #N") that no ok, unknown or
    pending write produced: a write recorded as failed took effect, or data
    appeared from nowhere."""

    key: Hashable
    version: int
    where: str


@dataclass(frozen=True)
class RegisterReport:
    """What `check_registers` found. Counts are over every operation in the history."""

    attempted: int
    acknowledged: int
    failed: int
    unknown: int
    missing: list[LostWrite]
    stale_reads: list[StaleRead]
    unexplained: list[UnexplainedVersion]
    stale_bound_s: float
    worst_latency_s: float
    worst_latency_by_kind: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Nothing lost, nothing stale beyond the bound, nothing unexplained."""
        return not (self.missing or self.stale_reads or self.unexplained)

    def to_result(self, name: str, notes: str = "") -> ScenarioResult:
        """The report row; unexplained versions, which have no column, go into the notes."""
        if self.unexplained:
            extra = f"{len(self.unexplained)} unexplained versions"
            notes = f"{notes}; {extra}" if notes else extra
        return ScenarioResult(
            name=name,
            attempted=self.attempted,
            acknowledged=self.acknowledged,
            failed=self.failed,
            unknown=self.unknown,
            missing=len(self.missing),
            stale_beyond_bound=len(self.stale_reads),
            inverse_mismatches=0,
            worst_latency_s=self.worst_latency_s,
            notes=notes,
        )


def _version(op: Op, what: Any) -> int:
    if not isinstance(what, int) or isinstance(what, bool):
        raise ValueError(f"op #{op.index} ({op.kind} {op.key!r}): versions are ints, not {what!r}")
    return what


def check_registers(
    history: History,
    final: Mapping[Hashable, int | None],
    *,
    stale_bound_s: float,
    write_kind: str = "write",
    read_kind: str = "read",
) -> RegisterReport:
    """Check registers: keys written with strictly increasing integer versions.

    A write's ``value`` is its version; an ok read's ``result`` is the version
    it saw (None: absent). ``final`` is each key's version read back at the
    end (a key left out counts as absent).

    - missing: keys whose final version is below the highest acknowledged
      write (an unknown write may have landed on top, hence >=, not ==).
    - stale reads: ok reads started at s that returned v while a write of
      the key with a version > v had been acknowledged before
      s - stale_bound_s. With stale_bound_s=0 that is the strict check: no
      read may miss a write acknowledged before it started.
    - unexplained: final versions and read results that no ok, unknown or
      pending write produced (every version must come from a recorded write).
    """
    if stale_bound_s < 0:
        raise ValueError(f"stale_bound_s must be >= 0, not {stale_bound_s!r}")
    ops = history.ops()
    acked: dict[Hashable, list[Op]] = defaultdict(list)
    possible: dict[Hashable, set[int]] = defaultdict(set)
    for op in ops:
        if op.kind != write_kind:
            continue
        version = _version(op, op.value)
        if op.outcome is Outcome.OK:
            acked[op.key].append(op)
        if op.outcome is not Outcome.FAIL:
            possible[op.key].add(version)

    missing: list[LostWrite] = []
    unexplained: list[UnexplainedVersion] = []
    for key in sorted(set(acked) | set(final), key=repr):
        highest = max((int(w.value) for w in acked.get(key, [])), default=None)
        got = final.get(key)
        if highest is not None and (got is None or got < highest):
            missing.append(LostWrite(key, highest, got))
        if got is not None and got not in possible.get(key, set()):
            unexplained.append(UnexplainedVersion(key, got, "final"))

    # Per key, the acknowledged writes by completion time with a running
    # maximum, so each read needs one bisection.
    timeline: dict[Hashable, tuple[list[float], list[Op]]] = {}
    for key, writes in acked.items():
        writes.sort(key=lambda w: w.completed_at or 0.0)
        newest: list[Op] = []
        for w in writes:
            newest.append(w if not newest or w.value > newest[-1].value else newest[-1])
        timeline[key] = ([w.completed_at or 0.0 for w in writes], newest)

    stale: list[StaleRead] = []
    for op in ops:
        if op.kind != read_kind or op.outcome is not Outcome.OK:
            continue
        seen = None if op.result is None else _version(op, op.result)
        if seen is not None and seen not in possible.get(op.key, set()):
            unexplained.append(UnexplainedVersion(op.key, seen, f"read #{op.index}"))
        if op.key not in timeline:
            continue
        times, newest = timeline[op.key]
        # Writes acknowledged strictly before the cutoff.
        before = bisect.bisect_left(times, op.invoked_at - stale_bound_s)
        if before == 0:
            continue
        newer = newest[before - 1]
        if seen is None or newer.value > seen:
            acked_at = newer.completed_at or 0.0
            stale.append(
                StaleRead(
                    key=op.key,
                    read_index=op.index,
                    read_started_at=op.invoked_at,
                    version_read=seen,
                    newer_version=newer.value,
                    newer_write_index=newer.index,
                    newer_acknowledged_at=acked_at,
                    lag_s=op.invoked_at - acked_at,
                )
            )

    t = _tally(ops)
    return RegisterReport(
        attempted=t.attempted,
        acknowledged=t.acknowledged,
        failed=t.failed,
        unknown=t.unknown,
        missing=missing,
        stale_reads=stale,
        unexplained=unexplained,
        stale_bound_s=stale_bound_s,
        worst_latency_s=t.worst_latency_s,
        worst_latency_by_kind=t.worst_latency_by_kind,
    )


# -- pairs (relations) -----------------------------------------------------------


@dataclass(frozen=True)
class PairMismatch:
    """A pair whose presence on the primary side no history explains.

    ``expected_present`` follows the last acknowledged op (``last_acknowledged``,
    e.g. "link #12"; None: no op was acknowledged, so the pair should be absent).
    """

    pair: Pair
    observed_present: bool
    expected_present: bool
    last_acknowledged: str | None


@dataclass(frozen=True)
class InverseMismatch:
    """A pair on one side of the relation and not the other."""

    pair: Pair
    on_primary: bool
    on_inverse: bool


@dataclass(frozen=True)
class CountMismatch:
    """A count that disagrees with the rows, as the scenario passed it in."""

    row: object


@dataclass(frozen=True)
class PairReport:
    """What `check_pairs` found. Counts are over every operation in the history."""

    attempted: int
    acknowledged: int
    failed: int
    unknown: int
    missing: list[PairMismatch]
    inverse_mismatches: list[InverseMismatch | CountMismatch]
    worst_latency_s: float
    worst_latency_by_kind: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every pair as acknowledged, both sides and the counts agreeing."""
        return not (self.missing or self.inverse_mismatches)

    def to_result(self, name: str, notes: str = "") -> ScenarioResult:
        """The report row (no stale-read column for pairs: 0)."""
        return ScenarioResult(
            name=name,
            attempted=self.attempted,
            acknowledged=self.acknowledged,
            failed=self.failed,
            unknown=self.unknown,
            missing=len(self.missing),
            stale_beyond_bound=0,
            inverse_mismatches=len(self.inverse_mismatches),
            worst_latency_s=self.worst_latency_s,
            notes=notes,
        )


def check_pairs(
    history: History,
    primary: AbstractSet[Pair],
    inverse: AbstractSet[Pair],
    counts_ok: bool | Sequence[object] = True,
    *,
    link_kind: str = "link",
    unlink_kind: str = "unlink",
    unknowns_may_land_late: bool = False,
) -> PairReport:
    """Check a relation against a history of links and unlinks of (from_id, to_id) pairs.

    ``primary`` holds the pairs found on the primary side, ``inverse`` those
    found on the inverse side, both as (from_id, to_id) of the primary
    orientation. ``counts_ok`` is True, False, or the list of count rows that
    disagree (empty: fine).

    - missing: pairs (of the history) whose presence on the primary side is
      not what their last acknowledged op left (absent if none was), unless
      an unknown or pending op after it would leave exactly what was found.
      Ops on a pair are taken in invocation order (one worker per pair).
      With ``unknowns_may_land_late``, an unknown op before the last
      acknowledged one may explain it too (it may land after its timeout).
    - inverse mismatches: every pair on one side and not the other, whatever
      the history, then the count mismatches.
    """
    ops = history.ops()
    per_pair: dict[Pair, list[Op]] = defaultdict(list)
    for op in ops:
        if op.kind in (link_kind, unlink_kind):
            if not (isinstance(op.key, tuple) and len(op.key) == 2):
                raise ValueError(f"op #{op.index} ({op.kind}): keys are (from_id, to_id), not {op.key!r}")
            per_pair[op.key].append(op)

    missing: list[PairMismatch] = []
    for key in sorted(per_pair, key=repr):
        pair_ops = per_pair[key]
        acked = [i for i, op in enumerate(pair_ops) if op.outcome is Outcome.OK]
        last = pair_ops[acked[-1]] if acked else None
        expected = last is not None and last.kind == link_kind
        observed = key in primary
        if observed == expected:
            continue
        since = 0 if unknowns_may_land_late or not acked else acked[-1] + 1
        if any(op.indeterminate and (op.kind == link_kind) == observed for op in pair_ops[since:]):
            continue
        missing.append(
            PairMismatch(
                pair=key,
                observed_present=observed,
                expected_present=expected,
                last_acknowledged=None if last is None else f"{last.kind} #{last.index}",
            )
        )

    mismatches: list[InverseMismatch | CountMismatch] = [
        InverseMismatch(pair, pair in primary, pair in inverse)
        for pair in sorted(primary ^ inverse, key=repr)
    ]
    if counts_ok is False:
        mismatches.append(CountMismatch("counts disagree with the rows"))
    elif not isinstance(counts_ok, bool):
        mismatches.extend(CountMismatch(row) for row in counts_ok)

    t = _tally(ops)
    return PairReport(
        attempted=t.attempted,
        acknowledged=t.acknowledged,
        failed=t.failed,
        unknown=t.unknown,
        missing=missing,
        inverse_mismatches=mismatches,
        worst_latency_s=t.worst_latency_s,
        worst_latency_by_kind=t.worst_latency_by_kind,
    )
