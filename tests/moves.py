"""What the move tests share: a `store move` killed in a phase, then resumed or aborted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from store import Store
from store.admin.move import Journal, Mover

#: Each phase of a move (as its first line starts) and what to do after a SIGKILL there.
KILL_PHASES = [
    ("copy:", "resume"),
    ("catch up:", "abort"),
    ("fence:", "resume"),
    ("verify:", "abort"),
    ("switch:", "resume"),
]


def kill_move_in_phase(
    config_file: Path, journal: Path, phase: str, *, shards: str = "8-15", to: str = "B"
) -> None:
    """Run `store move` in a process of its own and SIGKILL it at the first line of ``phase``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "store.cli", "move", "--shards", shards, "--to", to, "--yes",
         "--config", str(config_file), "--journal", str(journal)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith(phase):
            os.kill(proc.pid, signal.SIGKILL)  # mid-phase, no chance to clean up
            break
    proc.wait()
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, seen


def finish_killed_move(
    store: Store, journal: Path, then: str, *, source: str = "A", target: str = "B"
) -> str:
    """Abort the killed move (``then == "abort"``, if its map switch never happened) or resume it;
    the host that masters the moving shards afterwards."""
    mover = Mover(store, journal, say=lambda _m: None)
    if then == "abort" and not mover._map_switched(Journal.load(journal)):
        mover.abort()
        return source
    mover.resume()
    return target
