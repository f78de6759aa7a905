"""The mix's report: tables for the terminal, the raw numbers as JSON, and PNG charts."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from store.tools.mix.runner import Check, OpSamples, Phase
from store.tools.mix.workload import MIX

__all__ = ["as_json", "charts", "machine", "markdown", "tables"]


def _pct(values: Sequence[int], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def _procs(processes: int) -> str:
    """`` x P process(es)`` after a thread count, or nothing for one process."""
    return f" x {processes} process(es)" if processes > 1 else ""


def _all(phase: Phase) -> list[int]:
    out: list[int] = []
    for s in phase.ops.values():
        out += s.wall_ns
    return out


def summary(phase: Phase) -> dict[str, Any]:
    """ops/s, overall percentiles (ms) and CPU per call (us) of a phase.

    With several processes, ``process_calls`` holds each one's calls.
    """
    walls = _all(phase)
    calls = max(1, phase.calls)
    per_process: dict[str, Any] = {"process_calls": phase.process_calls} if phase.processes > 1 else {}
    if phase.connections is not None:
        per_process["connections"] = phase.connections
    if any(phase.cache_faults.values()):
        per_process["cache_faults"] = phase.cache_faults
    return {
        "system": phase.system,
        "threads": phase.threads,
        "processes": phase.processes,
        **per_process,
        "temperature": phase.temperature,
        "seconds": round(phase.seconds, 3),
        "calls": phase.calls,
        "errors": phase.errors,
        "ops_per_s": round(phase.ops_per_s, 1),
        "p50_ms": _pct(walls, 0.5) / 1e6,
        "p99_ms": _pct(walls, 0.99) / 1e6,
        "p999_ms": _pct(walls, 0.999) / 1e6,
        "process_cpu_us_per_call": 1e6 * phase.cpu_s / calls,
        # The machine's database and cache servers (`store.tools.mix.servers_cpu`), per call.
        "server_cpu_us_per_call": {name: round(1e6 * s / calls, 1) for name, s in phase.server_cpu_s.items()},
        # Every delete the caches counted in the phase, over its writes (None: not measured).
        "cache_deletes_per_write": deletes_per_write(phase),
    }


def deletes_per_write(phase: Phase) -> float | None:
    """The caches' deletes during ``phase`` over its writes; None where not measured or no write."""
    from store.tools.mix.invalidation import WRITES

    writes = sum(len(phase.ops[op].wall_ns) for op in WRITES if op in phase.ops)
    if not phase.cache_deletes or not writes:
        return None
    return round(sum(phase.cache_deletes.values()) / writes, 2)


def _server_total(s: dict[str, Any]) -> str:
    """The servers' CPU per call, all programs together, or "-" where it was not measured."""
    per: dict[str, float] = s.get("server_cpu_us_per_call") or {}
    return f"{sum(per.values()):.0f}" if per else "-"


def cpu_vs(s: dict[str, Any], base: dict[str, Any]) -> float | None:
    """All the CPU a call of ``s`` costs (the client's and the servers'), as a multiple of
    ``base``'s; None where the servers' CPU was not measured.

    Where the servers share the client's cores, throughput follows it: a system at 1.25x the
    floor's CPU per call runs at about 0.8x its ops/s (BENCHMARKS.md).
    """
    mine, theirs = s.get("server_cpu_us_per_call") or {}, base.get("server_cpu_us_per_call") or {}
    if not mine or not theirs:
        return None
    total = s["process_cpu_us_per_call"] + sum(mine.values())
    floor = base["process_cpu_us_per_call"] + sum(theirs.values())
    return total / floor if floor > 0 else None


def per_op(s: OpSamples) -> dict[str, Any]:
    """One operation's figures in a phase."""
    return {
        "calls": len(s.wall_ns),
        "errors": s.errors,
        "first_error": s.first_error,
        "p50_ms": _pct(s.wall_ns, 0.5) / 1e6,
        "p99_ms": _pct(s.wall_ns, 0.99) / 1e6,
        "p999_ms": _pct(s.wall_ns, 0.999) / 1e6,
        "cpu_p50_us": _pct(s.cpu_ns, 0.5) / 1e3,
    }


def machine(servers: dict[str, str]) -> dict[str, Any]:
    """What the numbers were measured on."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
                break
    except OSError:
        pass
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
        **servers,
    }


def tables(
    phases: list[Phase],
    checks: list[Check],
    trips: dict[str, dict[str, float]],
    floor: str = "floor",
    idle: dict[str, float] | None = None,
) -> str:
    """The report for the terminal: throughput per phase with ratios, then per operation."""
    lines: list[str] = []
    by = {(p.system, p.threads, p.temperature): p for p in phases}
    systems = list(dict.fromkeys(p.system for p in phases))
    keys = list(dict.fromkeys((p.threads, p.temperature) for p in phases))
    procs = _procs(max((p.processes for p in phases), default=1))
    if any(p.system == "store:async" for p in phases):
        lines.append(
            "store:async: its thread count is tasks on one event loop, awaiting an AsyncStore "
            "(its calls greenlets on the loop with --async-io native, else its executor's workers)"
        )
    head = (
        f"{'':<22}{'ops/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>10}{'cpu us':>9}{'srv us':>9}"
        f"{'errors':>8}  vs floor"
    )
    for threads, temp in keys:
        lines.append(f"\n{threads} thread(s){procs}, {temp}")
        lines.append(head)
        base = by.get((floor, threads, temp))
        for name in systems:
            p = by.get((name, threads, temp))
            if p is None:
                continue
            s = summary(p)
            ratio = ""
            if base is not None and name != floor and base.ops_per_s:
                b = summary(base)
                speed = s["ops_per_s"] / b["ops_per_s"]
                ratio = f"  {speed:.2f}x ops/s, p99 {s['p99_ms'] / max(b['p99_ms'], 1e-9):.2f}x"
                cpu = cpu_vs(s, b)
                if cpu is not None:
                    ratio += f", CPU per call {cpu:.2f}x"
            lines.append(
                f"{name:<22}{s['ops_per_s']:>9,.0f}{s['p50_ms']:>9.2f}{s['p99_ms']:>9.2f}{s['p999_ms']:>10.2f}"
                f"{s['process_cpu_us_per_call']:>9.0f}{_server_total(s):>9}{s['errors']:>8}{ratio}"
            )
        conns = [
            f"{name} {p.connections}"
            for name in systems
            if (p := by.get((name, threads, temp))) is not None and p.connections is not None
        ]
        if conns:
            lines.append(f"most database connections in use at once (all hosts): {', '.join(conns)}")
        faults = [
            f"{name} {cache} {n:,}"
            for name in systems
            if (p := by.get((name, threads, temp))) is not None
            for cache, n in p.cache_faults.items()
            if n
        ]
        if faults:
            lines.append(f"cache calls failed or skipped (a breaker open): {', '.join(faults)}")
    if keys:
        threads, temp = max(k[0] for k in keys), "warm"
        lines.append(
            f"\nper operation, {threads} thread(s){procs}, {temp}: p50 / p99 ms, CPU us (p50), round trips"
        )
        lines.append(f"{'':<14}" + "".join(f"{n:>34}" for n in systems))
        for op in MIX:
            cells = []
            for name in systems:
                p = by.get((name, threads, temp))
                if p is None:
                    cells.append(f"{'-':>34}")
                    continue
                o = per_op(p.ops[op])
                rt = trips.get(name, {}).get(op)
                rts = "-" if rt is None else f"{rt:.1f}"
                cells.append(f"{o['p50_ms']:>9.2f} /{o['p99_ms']:>7.2f}{o['cpu_p50_us']:>8.0f}{rts:>8}")
            lines.append(f"{op:<14}" + "".join(cells))
        lines.append(f"\nserver CPU us per call by program, {threads} thread(s){procs}, {temp}:")
        for name in systems:
            p = by.get((name, threads, temp))
            if p is not None and p.server_cpu_s:
                per = summary(p)["server_cpu_us_per_call"]
                lines.append(f"  {name:<20}" + ", ".join(f"{k} {v:.0f}" for k, v in sorted(per.items())))
    if any(p.cache_deletes for p in phases) or idle:
        lines.append(
            "\ninvalidation: cache deletes per write (every deleter), database queries a second at rest"
        )
        for name in systems:
            per = [
                f"{p.threads}t {p.temperature} {d:.2f}"
                for p in phases
                if p.system == name and (d := deletes_per_write(p)) is not None
            ]
            rest = "-" if not idle or name not in idle else f"{idle[name]:.1f}"
            lines.append(f"  {name:<20} deletes/write: {', '.join(per) or '-'}; queries/s at rest: {rest}")
    lines.append("")
    for c in checks:
        verdict = "all answers match the database" if not c.mismatches else f"{len(c.mismatches)} MISMATCHES"
        if c.stale:
            verdict = (
                f"{len(c.stale)} stale from its caches (a fill without a lease raced a write); "
                f"with its caches emptied, {verdict}"
            )
        lines.append(f"check {c.system}: {c.checked} answers compared, {verdict}")
        lines += [f"  {m}" for m in c.mismatches[:10]]
        lines += [f"  stale: {m}" for m in c.stale[:10]]
    errs = [(p, op, bad) for p in phases for op, bad in p.ops.items() if bad.errors]
    for p, op, bad in errs[:10]:
        lines.append(
            f"errors: {p.system} {p.threads}t {p.temperature} {op}: {bad.errors} ({bad.first_error})"
        )
    return "\n".join(lines)


def as_json(
    phases: list[Phase],
    checks: list[Check],
    trips: dict[str, dict[str, float]],
    meta: dict[str, Any],
) -> dict[str, Any]:
    """Every figure of the run, raw percentiles per operation included."""
    return {
        **meta,
        "phases": [{**summary(p), "operations": {op: per_op(s) for op, s in p.ops.items()}} for p in phases],
        "round_trips": trips,
        "checks": [
            {"system": c.system, "checked": c.checked, "mismatches": c.mismatches, "stale": c.stale}
            for c in checks
        ],
    }


def charts(phases: list[Phase], out: Path) -> list[Path]:
    """Latency per operation per system (the most threads, warm) and throughput against threads."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[Path] = []
    systems = list(dict.fromkeys(p.system for p in phases))
    threads = sorted({p.threads for p in phases})
    processes = max((p.processes for p in phases), default=1)
    # One colour per system (the same in both charts); cold dashed, warm solid.
    colours = {name: f"C{i % 10}" for i, name in enumerate(systems)}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in systems:
        for temp, style in (("cold", "--"), ("warm", "-")):
            xs = [
                t
                for t in threads
                if any(p.system == name and p.threads == t and p.temperature == temp for p in phases)
            ]
            ys = [
                next(
                    p.ops_per_s
                    for p in phases
                    if p.system == name and p.threads == t and p.temperature == temp
                )
                for t in xs
            ]
            if xs:
                ax.plot(xs, ys, style, marker="o", color=colours[name], label=f"{name} ({temp})")
    ax.set_xlabel("threads" if processes == 1 else f"threads per process ({processes} processes)")
    ax.set_ylabel("operations per second")
    ax.set_xscale("log", base=2)
    ax.set_xticks(threads, [str(t) for t in threads])
    ax.set_title("Mix throughput against threads")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    path = out / "mix-throughput.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    made.append(path)

    top = max(threads)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ops = list(MIX)
    width = 0.8 / max(1, len(systems))
    for i, name in enumerate(systems):
        p = next(
            (p for p in phases if p.system == name and p.threads == top and p.temperature == "warm"), None
        )
        if p is None:
            continue
        p50 = [_pct(p.ops[o].wall_ns, 0.5) / 1e6 for o in ops]
        p99 = [_pct(p.ops[o].wall_ns, 0.99) / 1e6 for o in ops]
        pos = [j + i * width for j in range(len(ops))]
        ax.bar(pos, p99, width, alpha=0.35, color=colours[name], label=f"{name} p99")
        ax.bar(pos, p50, width, color=colours[name], label=f"{name} p50")
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(ops))], ops, rotation=30, ha="right")
    ax.set_ylabel("ms")
    ax.set_yscale("log")
    ax.set_title(f"Latency per operation, {top} threads{_procs(processes)}, warm")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = out / "mix-latency.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    made.append(path)
    return made


def markdown(doc: dict[str, Any], floor: str = "floor") -> str:
    """The run's tables as Markdown (what BENCHMARKS.md shows), from the JSON document."""
    phases = doc["phases"]
    systems = list(dict.fromkeys(p["system"] for p in phases))
    keys = list(dict.fromkeys((p["threads"], p["temperature"]) for p in phases))
    by = {(p["system"], p["threads"], p["temperature"]): p for p in phases}
    processes = max((p.get("processes", 1) for p in phases), default=1)
    column = "threads" if processes == 1 else "threads x processes"
    out = [
        f"| {column} | caches | system | ops/s | p50 ms | p99 ms | p99.9 ms | CPU us/call "
        "| server CPU us/call | ops/s vs floor | p99 vs floor | CPU per call vs floor |"
    ]
    out.append("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for threads, temp in keys:
        base = by.get((floor, threads, temp))
        for name in systems:
            p = by.get((name, threads, temp))
            if p is None:
                continue
            ratio = p99 = cpu_ratio = ""
            if base is not None and name != floor and base["ops_per_s"]:
                ratio = f"{p['ops_per_s'] / base['ops_per_s']:.2f}x"
                p99 = f"{p['p99_ms'] / max(base['p99_ms'], 1e-9):.2f}x"
                cpu_vs_floor = cpu_vs(p, base)
                cpu_ratio = "-" if cpu_vs_floor is None else f"{cpu_vs_floor:.2f}x"
            times = f"{p['p50_ms']:.2f} | {p['p99_ms']:.2f} | {p['p999_ms']:.2f}"
            cpu = f"{p['process_cpu_us_per_call']:.0f} | {_server_total(p)}"
            who = f"{threads}" if processes == 1 else f"{threads} x {processes}"
            out.append(
                f"| {who} | {temp} | {name} | {p['ops_per_s']:,.0f} | {times} | {cpu} | {ratio} | {p99} "
                f"| {cpu_ratio} |"
            )
    if keys:
        top = max(k[0] for k in keys)
        out += [
            "",
            f"Per operation, {top} threads{_procs(processes)}, warm: "
            "p50 ms / p99 ms / CPU us (p50) / round trips",
            "",
        ]
        out.append("| operation | " + " | ".join(systems) + " |")
        out.append("|---|" + "---:|" * len(systems))
        for op in MIX:
            cells = []
            for name in systems:
                p = by.get((name, top, "warm"))
                if p is None:
                    cells.append("-")
                    continue
                o = p["operations"][op]
                rt = doc.get("round_trips", {}).get(name, {}).get(op)
                rts = "-" if rt is None else f"{rt:.1f}"
                cells.append(f"{o['p50_ms']:.2f} / {o['p99_ms']:.1f} / {o['cpu_p50_us']:.0f} / {rts}")
            out.append(f"| {op} | " + " | ".join(cells) + " |")
    rest = doc.get("queries_per_s_at_rest") or {}
    if rest or any(p.get("cache_deletes_per_write") is not None for p in phases):
        out += [
            "",
            "Invalidation: cache deletes per write (every deleter), database queries a second at rest",
            "",
        ]
        out.append(
            "| system | " + " | ".join(f"{t}{_procs(processes)} {temp}" for t, temp in keys) + " | at rest |"
        )
        out.append("|---|" + "---:|" * (len(keys) + 1))
        for name in systems:
            cells = []
            for threads, temp in keys:
                d = by.get((name, threads, temp), {}).get("cache_deletes_per_write")
                cells.append("-" if d is None else f"{d:.2f}")
            q = rest.get(name)
            out.append(f"| {name} | " + " | ".join(cells) + f" | {'-' if q is None else f'{q:.1f}'} |")
    faulted = [p for p in phases if p.get("cache_faults")]
    if faulted:
        out += ["", "Cache calls failed or skipped (a breaker open): those phases ran partly uncached", ""]
        for p in faulted:
            what = ", ".join(f"{cache} {n:,}" for cache, n in p["cache_faults"].items() if n)
            out.append(f"- {p['system']}, {p['threads']} {p['temperature']}: {what}")
    out.append("")
    for c in doc.get("checks", []):
        verdict = "all match the database" if not c["mismatches"] else f"{len(c['mismatches'])} mismatches"
        if c.get("stale"):
            stale = len(c["stale"])
            verdict = f"{stale} stale from its caches (fills without leases); with them emptied, {verdict}"
        out.append(f"- check {c['system']}: {c['checked']} answers compared, {verdict}")
    return "\n".join(out) + "\n"
