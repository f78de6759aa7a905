"""Where a running move stands, for operators: the progress file beside the journal, its bars, its metrics.

`MoveProgress` writes the file at every step and while the move runs;
`progress_line` and `TerminalProgress` draw it on a terminal. Where the file
lies, how it reads back and its metric families are
`store.move_progress`'s (this module still exports them), so that its
readers (``store serve``, ``store move --status``, `store.metrics`) need no
part of the move. A move never depends on it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any, Protocol

from store.move_progress import MOVE_PHASES, move_families, move_progress_path, read_move_progress

__all__ = [
    "FENCE_BAR_S",
    "MOVE_PHASES",
    "PROGRESS_EVERY_S",
    "MoveProgress",
    "TerminalProgress",
    "move_families",
    "move_progress_path",
    "progress_line",
    "read_move_progress",
]


class Sampler(Protocol):
    """Where a move's target stands (`store.admin.move.engine.MoveEngine` is one)."""

    def sampler(self, target: str) -> Any:
        """A connection to ``target`` for the sampler."""
        ...

    def sample(self, conn: Any, step: str, low: int, high: int) -> dict[str, Any]:
        """The progress figures of the target at ``step``."""
        ...


class Tracked(Protocol):
    """The move a `MoveProgress` reports on (`store.admin.move.workflow.Mover` is one)."""

    journal_path: Path

    @property
    def engine(self) -> Sampler:
        """The move's engine, which samples the target."""
        ...


class Journaled(Protocol):
    """What `MoveProgress` reads of a move's journal (`store.admin.move.journal.Journal`)."""

    low: int
    high: int
    source: str
    target: str
    phase: str


#: How often a running move samples its target (rows loaded, replication lag) into its progress file.
PROGRESS_EVERY_S = 0.25

# Where the progress bar stands at each step (the load fills LOAD_FROM..LOAD_TO by rows on the target).
_STEP_AT = {
    "plan": 0.0,
    "dump": 0.02,
    "load": 0.1,
    "loaded": 0.6,
    "catch_up": 0.65,
    "fence": 0.8,
    "verify": 0.88,
    "switch": 0.95,
    "done": 1.0,
    "aborted": 0.0,
}
_LOAD_FROM, _LOAD_TO = 0.1, 0.6


class MoveProgress:
    """Where a running move stands, for operators (`store serve`, metrics): a JSON file beside the journal.

    Written at every step and, while the move runs, every
    `PROGRESS_EVERY_S` by a sampler thread that reads the target's row count
    while the copy loads and its replication lag while it catches up. It is
    only ever read by others: a move never depends on it, and a sampler error
    is ignored.
    """

    def __init__(self, mover: Tracked, j: Journaled) -> None:
        self._mover = mover
        self.path = move_progress_path(mover.journal_path)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.data: dict[str, Any] = {
            "low": j.low,
            "high": j.high,
            "source": j.source,
            "target": j.target,
            "phase": j.phase,
            "step": j.phase,
            "progress": 0.0,
            "rows_total": 0,
            "rows_copied": 0,
            "bytes_total": 0,
            "bytes_copied": 0,
            "tables_total": 0,
            "tables_copied": 0,
            "disk_total": 0,
            "disk_copied": 0,
            "lag_s": None,
            "lag_max_s": None,
            "fence_started": None,
            "fence_ended": None,
            "fenced_s": None,
            "started": time.time(),
            "updated": time.time(),
            "pid": os.getpid(),
            "running": True,
            "error": "",
        }
        self._engine = mover.engine

    def set(self, **changes: Any) -> None:
        """Record ``changes`` (and the progress their step implies) and write the file."""
        with self._lock:
            self.data.update(changes)
            d = self.data
            at = _STEP_AT.get(str(d["step"]), d["progress"])
            if d["step"] == "load" and d["rows_total"]:
                share = min(1.0, d["rows_copied"] / d["rows_total"])
                at = _LOAD_FROM + (_LOAD_TO - _LOAD_FROM) * share
            if d["step"] not in ("aborted",):
                at = max(at, d["progress"])  # a bar never goes back
            d["progress"] = round(at, 4)
            if d["fence_started"] is not None:
                end = d["fence_ended"] if d["fence_ended"] is not None else time.time()
                d["fenced_s"] = round(end - d["fence_started"], 3)
            if d["lag_s"] is not None and (d["lag_max_s"] is None or d["lag_s"] > d["lag_max_s"]):
                d["lag_max_s"] = d["lag_s"]
            d["updated"] = time.time()
            text = json.dumps(d)
            seen = dict(d)
            with suppress(OSError):
                tmp = self.path.with_name(self.path.name + ".tmp")
                tmp.write_text(text)
                os.replace(tmp, self.path)
        watch = getattr(self._mover, "watch", None)
        if watch is not None:
            with suppress(Exception):  # a progress bar never disturbs the move
                watch(seen)

    def start(self) -> None:
        """Begin sampling the target in a background thread."""
        self.set()
        self._thread = threading.Thread(target=self._sample, name="store-move-progress", daemon=True)
        self._thread.start()

    def stop(self, **final: Any) -> None:
        """Stop sampling; write ``final`` changes with ``running`` false."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.set(running=False, **final)

    def _sample(self) -> None:
        """Every `PROGRESS_EVERY_S`, read where the target stands (`_read`) on a connection of its own."""
        conn: Any = None
        while not self._stop.wait(PROGRESS_EVERY_S):
            try:
                if conn is None:
                    conn = self._connect()
                self._read(conn, self.data["step"])
            except Exception:  # progress is for people: never let it disturb the move
                _close_quietly(conn)
                conn = None
        _close_quietly(conn)

    def _connect(self) -> Any:
        """A connection to the target for the sampler (the engine's)."""
        return self._engine.sampler(str(self.data["target"]))

    def _read(self, conn: Any, step: str) -> None:
        """Record where the target stands at ``step`` (`MoveEngine.sample`)."""
        self.set(**self._engine.sample(conn, step, int(self.data["low"]), int(self.data["high"])))


def _close_quietly(conn: Any) -> None:
    """Close a connection that may be broken or None (a sampler's)."""
    if conn is not None:
        with suppress(Exception):
            conn.close()


#: The fence's bar fills over this many seconds (the time writers may be held, as a budget).
FENCE_BAR_S = 1.0
_LABEL = 9  # "catch up" and a space


def _bar(share: float, width: int) -> str:
    n = round(max(0.0, min(1.0, share)) * width)
    return "[" + "#" * n + "-" * (width - n) + "]"


def progress_line(data: dict[str, Any], *, width: int = 24, now: float | None = None) -> str:
    """The bar of the phase a move is in, as one line for a terminal, from `MoveProgress` figures.

    copy: rows and tables on the target against the source's (InnoDB's
    estimates) and the bytes they take; catch up: the replication lag
    against the largest seen; fence (verify and switch too): how long the
    writers have been held, against `FENCE_BAR_S`. "" for other steps.
    """
    step = str(data.get("step"))
    label = ""
    if step == "dump":
        label, share = "copy", 0.0
        text = f"dumping {int(data.get('tables_total') or 0):,} tables"
    elif step in ("load", "loaded"):
        label = "copy"
        rows, rows_total = int(data.get("rows_copied") or 0), int(data.get("rows_total") or 0)
        tables, tables_total = int(data.get("tables_copied") or 0), int(data.get("tables_total") or 0)
        disk, disk_total = int(data.get("disk_copied") or 0), int(data.get("disk_total") or 0)
        if step == "loaded":
            share, rows, tables, disk = 1.0, max(rows, rows_total), tables_total, max(disk, disk_total)
        else:
            share = min(1.0, rows / rows_total) if rows_total else 0.0
        text = (
            f"{share:4.0%}  {min(rows, rows_total) if rows_total else rows:,}/{rows_total:,} rows  "
            f"{min(tables, tables_total) if tables_total else tables}/{tables_total} tables  "
            f"{disk / 1e6:.1f}/{disk_total / 1e6:.1f} MB"
        )
    elif step == "catch_up":
        label = "catch up"
        lag, top = data.get("lag_s"), data.get("lag_max_s")
        if lag is None:
            share, text = 0.0, "lag -"
        else:
            share = 1.0 - float(lag) / float(top) if top else 1.0
            text = f"lag {float(lag):.0f} s" + (f" (at most {float(top):.0f} s)" if top else "")
    elif step in ("fence", "verify", "switch") and data.get("fence_started") is not None:
        label = "fence"
        end = data.get("fence_ended")
        held = (end if end is not None else (time.time() if now is None else now)) - data["fence_started"]
        share = held / FENCE_BAR_S
        text = f"writers held {held:.2f} s ({step})"
    else:
        return ""
    return f"{label:<{_LABEL}}{_bar(share, width)} {text}"


class TerminalProgress:
    """Draws `progress_line` in place on a terminal: one live bar under the move's lines.

    Give `say` as the `Mover`'s ``say`` and `update` as its ``watch``: a
    line said clears the bar, is written, and the bar comes back under it.
    Redraws at most every ``every_s`` unless the step changed.
    """

    def __init__(self, stream: Any, *, every_s: float = 0.1, width: int = 24) -> None:
        self._stream = stream
        self._every_s = every_s
        self._width = width
        self._lock = threading.Lock()
        self._line = ""
        self._drawn = 0.0
        self._step_drawn = ""

    def _draw(self, line: str) -> None:
        self._stream.write("\r" + line.ljust(len(self._line)))
        self._stream.flush()
        self._line = line

    def _clear(self) -> None:
        if self._line:
            self._stream.write("\r" + " " * len(self._line) + "\r")
            self._line = ""

    def update(self, data: dict[str, Any]) -> None:
        """Redraw the bar for ``data`` (`MoveProgress` figures)."""
        line = progress_line(data, width=self._width)
        with self._lock:
            if not line:
                self._clear()
                self._stream.flush()
                return
            step = str(data.get("step"))
            if step == self._step_drawn and time.monotonic() - self._drawn < self._every_s:
                return
            self._draw(line)
            self._drawn, self._step_drawn = time.monotonic(), step

    def say(self, msg: str) -> None:
        """Write ``msg`` as a line of its own above the bar."""
        with self._lock:
            line = self._line
            self._clear()
            self._stream.write(msg + "\n")
            if line:
                self._draw(line)
            self._stream.flush()

    def close(self) -> None:
        """Take the bar away (the move's last line stays)."""
        with self._lock:
            self._clear()
            self._stream.flush()
