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


#: Run in the killed move's process: `store` whose stdout SIGKILLs the process itself right after
#: writing a line that starts with the phase (argv[1]). The kill comes at that line, not whenever a
#: loaded test process gets round to reading it (it once came after the move had finished).
_DIE_AT_PHASE = """
import os, signal, sys
phase = sys.argv.pop(1)
real = sys.stdout

class DieAtPhase:
    def write(self, text):
        written = real.write(text)
        if isinstance(text, str) and text.startswith(phase):
            real.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        return written

    def __getattr__(self, name):
        return getattr(real, name)

sys.stdout = DieAtPhase()
sys.argv[0] = "store"
from store.cli import main
main()
"""


def kill_move_in_phase(
    config_file: Path, journal: Path, phase: str, *, shards: str = "8-15", to: str = "B"
) -> None:
    """Run `store move` in a process of its own, SIGKILLed as it prints the first line of ``phase``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _DIE_AT_PHASE, phase, "move", "--shards", shards, "--to", to, "--yes",
         "--config", str(config_file), "--journal", str(journal)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert proc.stdout is not None
    seen = proc.stdout.readlines()
    proc.wait()
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, seen
    assert seen, "the move printed nothing"
    assert seen[-1].startswith(phase), seen  # died at that line, not before or after


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
