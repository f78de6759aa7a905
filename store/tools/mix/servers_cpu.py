"""CPU time of the server processes on this machine, for the mix's per-call server cost.

On a machine the servers share with the client, throughput follows the CPU
each operation costs everyone, not only the client: a system that makes
MariaDB or Redis work twice as hard per call is slower even when its own
process is not. The mix samples the servers' CPU time before and after each
phase and reports it per call beside the client's.

Read from Linux's ``/proc`` by program name, so it counts every instance of
a program on the machine (the servers of other work too: run the mix on a
quiet machine), each process from its own two samples (a server that forks a process per
connection, as PostgreSQL does, with its children). Elsewhere it is empty
and the report leaves the column out.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["SERVER_PROGRAMS", "server_cpu_s", "since"]

#: The programs counted, as ``/proc/PID/comm`` names them.
SERVER_PROGRAMS = ("mariadbd", "mysqld", "redis-server", "memcached", "postgres")

_PROC = Path("/proc")


def server_cpu_s(programs: tuple[str, ...] = SERVER_PROGRAMS) -> dict[tuple[str, int, int], float]:
    """CPU seconds (user + system) each running server of ``programs`` has used so far, by (program,
    pid, start time in clock ticks); {} without /proc. `since` sums two samples by program.

    A server that forks a process per connection (PostgreSQL's backends) is counted with its
    children of the same program, running or ended: a backend opened during a phase (a thread's
    new connection) would otherwise be missed, as one that started between the samples, and one
    that ended, as one that was gone at the second. A child's CPU is the parent's once it is reaped
    (Linux's cutime and cstime), so the server's total only grows."""
    try:
        tick = float(os.sysconf("SC_CLK_TCK"))
        entries = list(_PROC.iterdir())
    except (OSError, ValueError, AttributeError):
        return {}
    #: pid -> (program, parent pid, start time, own CPU and its reaped children's, in ticks)
    procs: dict[int, tuple[str, int, int, int]] = {}
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            if name not in programs:
                continue
            # Fields after the ")" closing the command name: the parent is the 2nd; utime, stime,
            # cutime and cstime the 12th to 15th; the start time the 20th.
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        used = sum(int(f) for f in fields[11:15])
        procs[int(entry.name)] = (name, int(fields[1]), int(fields[19]), used)
    out: dict[tuple[str, int, int], float] = {}
    for pid, (name, _parent, _start, used) in procs.items():
        root = pid
        for _hop in range(8):  # up to the first ancestor that is not the same program
            parent = procs[root][1]
            if parent not in procs or procs[parent][0] != name:
                break
            root = parent
        key = (name, root, procs[root][2])
        out[key] = out.get(key, 0.0) + used / tick
    return out


def since(
    before: dict[tuple[str, int, int], float], after: dict[tuple[str, int, int], float]
) -> dict[str, float]:
    """CPU seconds per program between two samples, over the processes running at both: one that
    ended meanwhile (another test's server, a restart) neither subtracts what it had used nor
    hides what the others used; one that started meanwhile is not counted."""
    out: dict[str, float] = {}
    for key, used in after.items():
        if key in before:
            out[key[0]] = out.get(key[0], 0.0) + max(0.0, used - before[key])
    return out
