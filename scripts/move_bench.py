"""What `bench_move.py` and `bench_move_postgres.py` share: the command line, the writers that run
while the move does, and the report of one run."""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from store import Store
from store.admin.move import Journal, Mover

SHARDS, MOVING = 64, range(32, 64)
OBJECTS = 400_000  # 200,000 on the moving half
WRITERS = 4


def main(doc: str | None, bench: Callable[[int], dict[str, Any]]) -> None:
    """Run ``bench`` ``--runs`` times; one summary line per run at the end."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("objects", nargs="?", type=int, default=OBJECTS)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args()
    results = []
    for run in range(args.runs):
        print(f"-- run {run + 1} of {args.runs}")
        results.append(bench(args.objects))
    if args.runs > 1:
        print("-- every run")
        for i, r in enumerate(results):
            print(
                f"run {i + 1}: fence {r['fenced_s']:.3f} s ({r['breakdown']}); "
                f"copy {r['rows_s']:,.0f} rows/s; max write wait {r['max_wait_ms']:,.0f} ms; "
                f"other shards refused {r['refused']}"
            )


def move_under_writers(
    store: Store, journal_path: Path, pick: Callable[[random.Random, int], int], **update: Any
) -> tuple[Journal, int, list[float], list[BaseException]]:
    """Move `MOVING` to host B while `WRITERS` threads update objects of every shard (``pick``: an
    object of a shard); (the journal, the plan's row estimate, each moving shard's write time, the
    errors of writes to other shards)."""
    waits: list[float] = []
    other_errors: list[BaseException] = []
    done = threading.Event()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        while not done.is_set():
            shard = rng.randrange(SHARDS)
            obj = pick(rng, shard)
            t = time.perf_counter()
            try:
                store.update(obj, {"w": seed}, **update)
            except Exception as exc:
                if shard not in MOVING:
                    other_errors.append(exc)
                continue
            if shard in MOVING:
                waits.append(time.perf_counter() - t)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    mover = Mover(store, journal_path, say=print)
    try:
        plan = mover.plan(MOVING.start, MOVING.stop - 1, "B")
        journal = mover.start(plan)
        time.sleep(1)
    finally:
        done.set()
    for t in threads:
        t.join()
    return journal, plan.rows, waits, other_errors


def report(
    journal: Journal,
    rows: int,
    waits: list[float],
    other_errors: list[BaseException],
    *,
    rows_said: str = "",
    fence_said: str = "",
) -> dict[str, Any]:
    """Print one run's figures (``rows`` copied; ``rows_said`` and ``fence_said`` added to their lines);
    the summary `main` prints."""
    copy_s = journal.timings["copy_s"]
    mb = journal.timings["copy_bytes"] / 1e6
    rate = f"{rows / copy_s:,.0f} rows/s, {mb / copy_s:.1f} MB/s"
    print(f"copy: {rows:,} rows{rows_said} in {copy_s:.2f} s = {rate}")
    print(f"catch up: {journal.timings['catch_up_s']:.2f} s; fence held {journal.timings['fenced_s']:.3f} s")
    breakdown = ", ".join(f"{k[6:-2]} {v:.3f}" for k, v in journal.timings.items() if k.startswith("fence_"))
    print(f"fence: {breakdown}{fence_said}")
    q = statistics.quantiles(waits, n=100)
    print(
        f"writes to moving shards: {len(waits):,}, median {statistics.median(waits) * 1000:.1f} ms, "
        f"p99 {q[98] * 1000:.1f} ms, max {max(waits) * 1000:.1f} ms"
    )
    print(f"writes to other shards refused: {len(other_errors)}")
    return {
        "fenced_s": journal.timings["fenced_s"],
        "breakdown": breakdown,
        "rows_s": rows / copy_s,
        "max_wait_ms": max(waits) * 1000,
        "refused": len(other_errors),
    }
