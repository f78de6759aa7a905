"""CPU time of the server processes on this machine, for the mix's per-call server cost.

On a machine the servers share with the client, throughput follows the CPU
each operation costs everyone, not only the client: a system that makes
MariaDB or Redis work twice as hard per call is slower even when its own
process is not. The mix samples the servers' CPU time before and after each
phase and reports it per call beside the client's.

Read from Linux's ``/proc`` by program name, so it counts every instance of
a program on the machine (the servers of other work too: run the mix on a
quiet machine). Elsewhere it is empty and the report leaves the column out.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SERVER_PROGRAMS", "server_cpu_s", "since"]

#: The programs counted, as ``/proc/PID/comm`` names them.
SERVER_PROGRAMS = ("mariadbd", "mysqld", "redis-server", "memcached", "postgres")

_PROC = Path("/proc")


def server_cpu_s(programs: tuple[str, ...] = SERVER_PROGRAMS) -> dict[str, float]:
    """CPU seconds (user + system) each program's running processes have used so far; {} without /proc."""
    try:
        tick = float(os.sysconf("SC_CLK_TCK"))
        entries = list(_PROC.iterdir())
    except (OSError, ValueError, AttributeError):
        return {}
    out: dict[str, float] = {}
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            if name not in programs:
                continue
            # Fields after the ")" closing the command name: utime and stime are the 12th and 13th.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """CPU seconds per program between two samples (programs in both; a restarted one can go negative: 0)."""
    return {name: max(0.0, after[name] - before[name]) for name in after if name in before}
