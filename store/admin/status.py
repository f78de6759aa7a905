"""`store move --status`: where a move stands, from its journal and the progress file beside it.

Reads files only: no database is asked, so it answers while a move runs in
another process, after it crashed, or long after it finished.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from store.exceptions import MoveError

__all__ = ["format_move_status", "move_status"]

#: Progress fields copied into the status (see `store.admin.move.MoveProgress`).
_PROGRESS_FIELDS = (
    "step",
    "progress",
    "rows_total",
    "rows_copied",
    "bytes_total",
    "bytes_copied",
    "lag_s",
    "fenced_s",
    "started",
    "updated",
    "running",
    "pid",
    "error",
)


def move_status(journal_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The phase and figures of the move journaled in ``journal_path`` as one JSON-able dict.

    Keys: ``journal``, ``phase``, ``shards`` ("A-B"), ``low``, ``high``,
    ``source``, ``target``, ``slave``, ``map_version``, ``switched_version``,
    ``timings`` (seconds per phase, as the journal keeps them),
    ``fenced_s`` (how long writers to the moving shards waited, if fenced),
    and ``progress``: the progress file's fields (``step``, ``progress``
    0..1, ``rows_copied``/``rows_total``, ``bytes_copied``/``bytes_total``,
    ``lag_s``, ``running``, ``error`` ...), or None if there is none.
    `MoveError` if there is no journal or it cannot be read.
    """
    from store.admin.move import Journal
    from store.metrics import move_progress_path

    path = Path(journal_path)
    if not path.exists():
        raise MoveError(f"no move journal at {path}: no move has run with this --journal")
    j = Journal.load(path)
    progress: dict[str, Any] | None = None
    ppath = move_progress_path(path)
    try:
        raw = json.loads(ppath.read_text())
        if isinstance(raw, dict):
            progress = {k: raw.get(k) for k in _PROGRESS_FIELDS}
    except (OSError, ValueError):
        progress = None
    fenced = j.timings.get("fenced_s")
    if fenced is None and progress is not None:
        fenced = progress.get("fenced_s")
    return {
        "journal": str(path),
        "phase": j.phase,
        "shards": f"{j.low}-{j.high}",
        "low": j.low,
        "high": j.high,
        "source": j.source,
        "target": j.target,
        "slave": j.slave,
        "map_version": j.map_version,
        "switched_version": j.switched_version,
        "gtid": j.gtid,
        "timings": dict(j.timings),
        "copy_bytes": j.timings.get("copy_bytes"),
        "fenced_s": fenced,
        "progress_file": str(ppath),
        "progress": progress,
    }


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def _mb(n: Any) -> str:
    return "-" if not isinstance(n, int | float) else f"{n / 1e6:.1f} MB"


def format_move_status(status: dict[str, Any]) -> list[str]:
    """`move_status` as the lines `store move --status` prints."""
    s = status
    slave = f" (slave {s['slave']})" if s["slave"] else ""
    lines = [
        f"move of shards {s['shards']} from {s['source']} to {s['target']}{slave}: phase {s['phase']}",
        f"journal: {s['journal']}; map version {s['map_version']}"
        + (f" -> {s['switched_version']}" if s["switched_version"] else ""),
    ]
    timings = {k: v for k, v in s["timings"].items() if k.endswith("_s")}
    if timings:
        lines.append("timings: " + ", ".join(f"{k[:-2]} {v:.3f} s" for k, v in timings.items()))
    p = s["progress"]
    if p is None:
        lines.append("progress: no progress file")
    else:
        share = p.get("progress")
        pct = f"{share * 100:.0f}%" if isinstance(share, int | float) else "-"
        state = "running" if p.get("running") else "not running"
        lines.append(f"progress: step {p.get('step')}, {pct}, {state} (pid {p.get('pid')})")
        lines.append(
            f"rows copied: {p.get('rows_copied')} of about {p.get('rows_total')}; "
            f"bytes copied: {_mb(p.get('bytes_copied'))} of {_mb(p.get('bytes_total'))}"
        )
        lag = p.get("lag_s")
        lines.append(f"replication lag: {'-' if lag is None else f'{lag:.1f} s'}")
        lines.append(f"started {_when(p.get('started'))}, updated {_when(p.get('updated'))}")
        if p.get("error"):
            lines.append(f"error: {p['error']}")
    fenced = s["fenced_s"]
    lines.append(f"fenced: {'-' if fenced is None else f'{fenced:.3f} s'}")
    return lines
