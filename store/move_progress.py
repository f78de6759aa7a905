"""A move's progress file: where it lies beside the journal, how it reads back, its metrics.

`store.admin.move.progress.MoveProgress` writes it while a move runs;
`read_move_progress` reads it back (``store serve``, ``store move
--status``) and `move_families` exports it to Prometheus (`store.metrics`).
Nothing here needs any part of the move itself.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["MOVE_PHASES", "move_families", "move_progress_path", "read_move_progress"]

#: The phases a move's journal names (the ``store_move_phase`` metric has one series each).
MOVE_PHASES = ("copy", "catch_up", "switch", "done", "aborted")


def move_progress_path(journal: str | Path) -> Path:
    """Where `store move` keeps the progress of the move journaled in ``journal`` (beside it)."""
    p = Path(journal)
    return p.with_name(p.stem + ".progress.json")


def read_move_progress(journal: str | Path) -> dict[str, Any] | None:
    """The progress `store move` last wrote for ``journal``, or None if there is none (or unreadable)."""
    try:
        data = json.loads(move_progress_path(journal).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def move_families(gauge: Any, journal: Path | None) -> Iterator[Any]:
    """The ``store_move_*`` metric families (``gauge``: `GaugeMetricFamily`) of the move journaled in
    ``journal``, from its progress file; none without one."""
    if journal is None:
        return
    p = read_move_progress(journal)
    if p is None:
        return
    phase = gauge("store_move_phase", "1 for the phase the move is in", labels=["phase"])
    for name in MOVE_PHASES:
        phase.add_metric([name], 1 if p.get("phase") == name else 0)
    yield phase
    for name, key, text in (
        ("store_move_rows_copied", "rows_copied", "Rows on the target so far"),
        ("store_move_rows_total", "rows_total", "Rows to copy"),
        ("store_move_bytes_copied", "bytes_copied", "Bytes of the dump loaded"),
        ("store_move_replication_lag_seconds", "lag_s", "Target's replication lag behind the source"),
        ("store_move_fenced_seconds", "fenced_s", "How long the source has been (or was) fenced"),
    ):
        value = p.get(key)
        if isinstance(value, int | float):
            g = gauge(name, text)
            g.add_metric([], float(value))
            yield g
