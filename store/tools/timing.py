"""Timing a store call against its floor, alternating one call of each in the same loop."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["RAW_PREFIX", "PIN", "BenchResult", "pair"]

#: The floors' own cache keys begin with this, apart from the store's.
RAW_PREFIX = "bench:raw:"

PIN = {
    "title": "Granite countertop, honed, with an undermount sink",
    "description": "Kitchen remodel, second pass: the counters and the sink.",
    "link": "https://example.com/kitchen/remodel/counter-and-sink",
    "image": {"url": "https://img.example.com/p/5a/91/c3.jpg", "w": 736, "h": 1104},
    "likes": 12,
    "tags": ["kitchen", "granite", "remodel"],
}  # about 300 bytes of JSON, the size the design's floor was measured with


@dataclass
class BenchResult:
    """Timings of one case, in microseconds."""

    case: str
    store_median_us: float
    store_p99_us: float
    raw_median_us: float
    raw_p99_us: float
    store_mean_us: float = 0.0
    raw_mean_us: float = 0.0

    @property
    def ratio_median(self) -> float:
        """Store median over raw median."""
        return self.store_median_us / self.raw_median_us

    @property
    def ratio_p99(self) -> float:
        """Store p99 over raw p99."""
        return self.store_p99_us / self.raw_p99_us

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, ratios included."""
        return {**asdict(self), "ratio_median": self.ratio_median, "ratio_p99": self.ratio_p99}


def _p99(xs: list[float]) -> float:
    if len(xs) < 2:  # a case run once (a small -n): its one time is its p99
        return xs[0]
    return statistics.quantiles(xs, n=100, method="inclusive")[98]


def pair(
    case: str, store_op: Callable[[int], object], raw_op: Callable[[int], object], n: int
) -> BenchResult:
    for i in range(min(50, n)):  # warm pools, caches and code paths
        store_op(i)
        raw_op(i)
    a: list[float] = []
    b: list[float] = []
    clock = time.perf_counter_ns

    def back_to_back(
        first: Callable[[int], object], second: Callable[[int], object], i: int
    ) -> tuple[float, float]:
        t0 = clock()
        first(i)
        t1 = clock()
        second(i)
        t2 = clock()
        return (t1 - t0) / 1000, (t2 - t1) / 1000

    for i in range(n):
        # Which side goes first alternates: the second of two back-to-back calls
        # finds the server (and the CPU it runs on) already awake, and on a
        # loopback round trip of 40-100 us that alone can halve its time.
        if i % 2 == 0:
            store_us, raw_us = back_to_back(store_op, raw_op, i)
        else:
            raw_us, store_us = back_to_back(raw_op, store_op, i)
        a.append(store_us)
        b.append(raw_us)
    return BenchResult(
        case,
        statistics.median(a),
        _p99(a),
        statistics.median(b),
        _p99(b),
        statistics.fmean(a),
        statistics.fmean(b),
    )
