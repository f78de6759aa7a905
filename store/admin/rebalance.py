"""`store rebalance`: spread the shards evenly over a set of MariaDB hosts, one `store move` at a time.

The plan (`plan_rebalance`) is pure: from the live map, the hosts to spread
over and (if known) each shard's row count, it lists moves of contiguous
shard ranges from one host to another such that

* every given host ends with ``floor`` or ``ceil`` of ``shards / len(hosts)``
  shards (the ``ceil`` quotas go to the hosts that hold the most already, so
  the fewest shards move);
* a host never loses a shard unless it holds more than its quota, and it
  then sheds exactly its surplus; hosts that are not given are drained;
* each host sheds whole contiguous ranges at the ends of its runs, the
  candidates compared by rows (so lighter shards go first) and, without row
  counts, the end of its last run;
* receivers take the shed shards in shard order, so each receives as few,
  as contiguous ranges as possible.

Every move's source is a host that only sheds, so each move's range is held
by its source when its turn comes, whatever ran before it.

Slaves: a range's slave replicates its master's host, so it cannot follow
the range to another host. Each move gives the range the target's slave
(when every range the target masters names the same one; otherwise none),
and the plan's line says what becomes of the slave the range had
(`PlannedMove.line`).

`run_rebalance` runs the plan move by move with `store.admin.move.Mover`,
recording in one rebalance journal (JSON) the plan and which moves are
done. Each move is journaled by the Mover in the rebalance journal's name +
``.move``; after a crash, `run_rebalance` with no plan resumes the
interrupted move, then carries on with the rest. `cleanup_rebalance` drops
the archive databases of every move of a finished rebalance (each move's
journal is kept in the rebalance journal), not only the last one's.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from store.backends import backend_for
from store.config import StoreConfig
from store.exceptions import ConfigError, MoveError
from store.mapsource import require_changeable
from store.shardmap import ShardMap
from store.store import Store

__all__ = [
    "PlannedMove",
    "apply_plan",
    "check_hosts",
    "cleanup_rebalance",
    "estimate_shard_rows",
    "minimum_shards_moved",
    "move_journal_path",
    "plan_rebalance",
    "plan_summary",
    "quotas",
    "run_rebalance",
    "target_slave",
]

#: How long the row estimate waits for each host to answer (a dry run then falls back to shard counts).
ESTIMATE_CONNECT_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class PlannedMove:
    """Move shards ``low..high`` (inclusive) from ``source`` to ``target``."""

    low: int
    high: int
    source: str
    target: str
    #: Rows in the range (InnoDB's estimate), or None when they were not measured.
    rows: int | None = None
    #: True when ``source`` is not among the hosts to spread over (it is being emptied).
    drain: bool = False
    #: The slave the range has after the move: the target's (`target_slave`), or None.
    slave: str | None = None
    #: The slaves the range had on its source (they replicate the source: they do not follow it).
    old_slaves: tuple[str, ...] = ()

    @property
    def shards(self) -> int:
        """How many shards the move carries."""
        return self.high - self.low + 1

    def line(self) -> str:
        """``move shards A-B from X to Y (N rows)``, as `store rebalance` prints it, and what
        becomes of the range's slave if it has or gets one."""
        rows = "rows not measured" if self.rows is None else f"{self.rows} rows"
        line = f"move shards {self.low}-{self.high} from {self.source} to {self.target} ({rows})"
        lost = [s for s in self.old_slaves if s != self.slave]
        if lost:
            line += (
                f"; slave {', '.join(lost)} stays with {self.source} (it replicates {self.source}, "
                f"not {self.target})"
            )
        if self.slave is not None:
            line += f"; slave {self.slave} ({self.target}'s)"
        elif lost:
            line += f": the range has no slave after the move ({self.target} has no single slave in the map)"
        return line


# -- the plan (pure) ---------------------------------------------------------------


def target_slave(shard_map: ShardMap, host: str) -> str | None:
    """The slave of every range ``host`` masters in ``shard_map`` if they all name the same one, else None.

    A range moved to ``host`` gets that slave: it replicates ``host``, so it
    receives the moved shards through it (the copy and the catch-up are
    written on ``host``; its binlog must carry replicated events,
    ``log_slave_updates``, for the catch-up to reach the slave).
    """
    slaves = {r.slave for r in shard_map.ranges if r.master == host}
    if len(slaves) != 1:
        return None
    return slaves.pop()


def _slaves(shard_map: ShardMap, low: int, high: int) -> tuple[str, ...]:
    """The slaves the ranges holding shards ``low..high`` name, in shard order."""
    out = [r.slave for r in shard_map.ranges if r.slave and r.end >= low and r.start <= high]
    return tuple(dict.fromkeys(s for s in out if s))


def _targets(hosts: Sequence[str]) -> list[str]:
    targets = list(dict.fromkeys(hosts))
    if not targets:
        raise ConfigError("store rebalance needs at least one host: --hosts H1,H2,...")
    return targets


def quotas(shard_map: ShardMap, hosts: Sequence[str]) -> dict[str, int]:
    """How many shards each of ``hosts`` holds after the rebalance: floor or ceil of shards / hosts.

    The ``shards % len(hosts)`` ceil quotas go to the hosts that hold the most
    shards now (ties: in the order given), which keeps the most shards in place.
    """
    targets = _targets(hosts)
    base, extra = divmod(shard_map.shards, len(targets))
    held = Counter(shard_map.master(s) for s in range(shard_map.shards))
    order = sorted(range(len(targets)), key=lambda i: (-held[targets[i]], i))
    ceil = {targets[i] for i in order[:extra]}
    return {h: base + (1 if h in ceil else 0) for h in targets}


def minimum_shards_moved(shard_map: ShardMap, hosts: Sequence[str]) -> int:
    """The fewest shards any rebalance onto ``hosts`` must move (what `plan_rebalance` moves)."""
    q = quotas(shard_map, hosts)
    held = Counter(shard_map.master(s) for s in range(shard_map.shards))
    return sum(max(0, n - q.get(h, 0)) for h, n in held.items())


def _runs(owner: list[str], host: str) -> list[tuple[int, int]]:
    """The maximal contiguous runs (low, high) of shards whose master is ``host``."""
    runs: list[tuple[int, int]] = []
    for s, h in enumerate(owner):
        if h != host:
            continue
        if runs and runs[-1][1] == s - 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    return runs


def _take(runs: list[tuple[int, int]], count: int, *, from_end: bool) -> list[tuple[int, int]]:
    """``count`` shards from ``runs``, whole runs first, from the end (or the start) of the host's shards."""
    out: list[tuple[int, int]] = []
    for low, high in reversed(runs) if from_end else runs:
        if count <= 0:
            break
        n = min(count, high - low + 1)
        out.append((high - n + 1, high) if from_end else (low, low + n - 1))
        count -= n
    return sorted(out)


def _shed(
    runs: list[tuple[int, int]], count: int, weight: Callable[[int, int], int]
) -> list[tuple[int, int]]:
    """Which ranges a host with ``runs`` gives up to shed ``count`` shards: the lightest candidate.

    Candidates, in order of preference when they weigh the same: the end of
    each run long enough (last run first), the start of each such run, then
    whole runs from the end, then from the start.
    """
    held = sum(high - low + 1 for low, high in runs)
    if count >= held:
        return list(runs)
    candidates: list[list[tuple[int, int]]] = []
    for low, high in reversed(runs):
        if high - low + 1 >= count:
            candidates.append([(high - count + 1, high)])
    for low, high in reversed(runs):
        if high - low + 1 >= count:
            candidates.append([(low, low + count - 1)])
    candidates.append(_take(runs, count, from_end=True))
    candidates.append(_take(runs, count, from_end=False))
    return min(candidates, key=lambda c: sum(weight(a, b) for a, b in c))  # min keeps the first of equals


def plan_rebalance(
    shard_map: ShardMap, hosts: Sequence[str], rows_per_shard: Mapping[int, int] | None = None
) -> list[PlannedMove]:
    """The moves that leave each of ``hosts`` with floor/ceil(shards / hosts) shards, moving the fewest.

    Shards on hosts outside ``hosts`` are drained onto them. The number of
    shards moved is the minimum (`minimum_shards_moved`); among the ways to
    shed a host's surplus as ranges at the ends of its runs, the one with the
    fewest rows (``rows_per_shard``, missing shards counting 0) is taken.
    The moves can run in the order given: each source holds its whole range
    until its move runs. Pure: nothing is read or written.
    """
    targets = _targets(hosts)
    n = shard_map.shards
    owner = [shard_map.master(s) for s in range(n)]
    prefix = [0]
    for s in range(n):
        prefix.append(prefix[-1] + (int(rows_per_shard.get(s, 0)) if rows_per_shard else 0))

    def weight(low: int, high: int) -> int:
        return prefix[high + 1] - prefix[low]

    q = quotas(shard_map, targets)
    held = Counter(owner)
    shed: list[tuple[int, int, str]] = []  # low, high, source
    for host in dict.fromkeys(owner):  # every host holding shards, in shard order
        surplus = held[host] - q.get(host, 0)
        if surplus > 0:
            shed.extend((a, b, host) for a, b in _shed(_runs(owner, host), surplus, weight))
    shed.sort()
    # Receivers in the order of the shards they hold (empty ones last, as given), so that
    # the shed stream, in shard order, lands next to what each holds where it can.
    first: dict[str, int] = {}
    for s, h in enumerate(owner):
        first.setdefault(h, s)
    receivers = sorted(
        (h for h in targets if q[h] > held[h]), key=lambda h: (first.get(h, n), targets.index(h))
    )
    need = {h: q[h] - held[h] for h in receivers}
    moves: list[PlannedMove] = []
    r = 0
    for low, high, source in shed:
        s = low
        while s <= high:
            while need[receivers[r]] == 0:
                r += 1
            target = receivers[r]
            end = min(high, s + need[target] - 1)
            need[target] -= end - s + 1
            last = moves[-1] if moves else None
            if last is not None and (last.source, last.target, last.high + 1) == (source, target, s):
                moves[-1] = PlannedMove(last.low, end, source, target, None, last.drain)
            else:
                moves.append(PlannedMove(s, end, source, target, None, source not in q))
            s = end + 1
    return [
        replace(
            m,
            rows=None if rows_per_shard is None else weight(m.low, m.high),
            slave=target_slave(shard_map, m.target),
            old_slaves=_slaves(shard_map, m.low, m.high),
        )
        for m in moves
    ]


def apply_plan(shard_map: ShardMap, plan: Sequence[PlannedMove]) -> ShardMap:
    """The map after ``plan``, move by move; `MoveError` if a move's source does not hold its range then."""
    m = shard_map
    for mv in plan:
        masters = {m.master(s) for s in range(mv.low, mv.high + 1)}
        if masters != {mv.source}:
            raise MoveError(
                f"shards {mv.low}-{mv.high} are on {', '.join(sorted(masters))}, not {mv.source}, "
                "when their move comes"
            )
        m = m.with_move(mv.low, mv.high, mv.target, mv.slave)
    return m


def plan_summary(shard_map: ShardMap, hosts: Sequence[str], plan: Sequence[PlannedMove]) -> dict[str, Any]:
    """Shards per host before and after ``plan``, and the shards and rows it moves."""
    after = apply_plan(shard_map, plan)
    before_n = Counter(shard_map.master(s) for s in range(shard_map.shards))
    after_n = Counter(after.master(s) for s in range(after.shards))
    names = list(dict.fromkeys([*before_n, *_targets(hosts)]))
    rows = None if any(m.rows is None for m in plan) else sum(m.rows or 0 for m in plan)
    return {
        "shards": shard_map.shards,
        "moves": len(plan),
        "shards_moved": sum(m.shards for m in plan),
        "rows_moved": rows,
        "hosts": {h: {"before": before_n[h], "after": after_n[h]} for h in names},
        "drained": [h for h in before_n if h not in set(hosts)],
    }


# -- what the plan needs from the hosts ------------------------------------------------


def check_hosts(config: StoreConfig, hosts: Sequence[str], shard_map: ShardMap) -> None:
    """`ConfigError` naming ``hosts`` missing from the config, or any host involved that is not MariaDB."""
    unknown = [h for h in hosts if h not in config.hosts]
    if unknown:
        raise ConfigError(
            f"unknown host(s) {', '.join(unknown)} in --hosts: the config's hosts are "
            f"{', '.join(sorted(config.hosts))}"
        )
    masters = {shard_map.master(s) for s in range(shard_map.shards)}
    involved = list(dict.fromkeys([*hosts, *sorted(masters)]))
    not_mariadb = [h for h in involved if h in config.hosts and not backend_for(config.hosts[h]).can_move]
    if not_mariadb:
        raise ConfigError(
            f"host(s) {', '.join(not_mariadb)} are not MariaDB: a rebalance moves MariaDB shard databases"
        )


def estimate_shard_rows(store: Store, shard_map: ShardMap) -> tuple[dict[int, int] | None, str]:
    """Each shard's rows (InnoDB's estimate) from its master: one information_schema query per host.

    Returns ``(rows, "")``, or ``(None, why)`` if a host did not answer (the
    plan then counts shards only).
    """
    from store.backends.mysql.driver import mysql_connector

    rows: dict[int, int] = {}
    by_host: dict[str, set[int]] = {}
    for s in range(shard_map.shards):
        by_host.setdefault(shard_map.master(s), set()).add(s)
    for host, shards in by_host.items():
        url = store.config.hosts.get(host)
        if url is None:
            return None, f"{host} is not under hosts in the config"
        try:
            conn = mysql_connector(url, connect_timeout_s=ESTIMATE_CONNECT_TIMEOUT_S)()
            try:
                cur = conn.cursor()
                cur.execute(
                    "SELECT table_schema, COALESCE(SUM(table_rows), 0) FROM information_schema.tables "
                    "WHERE table_schema LIKE %s AND table_type = 'BASE TABLE' GROUP BY table_schema",
                    (store.config.names.databases_like,),
                )
                found = cur.fetchall()
            finally:
                conn.close()
        except Exception as exc:  # an estimate only: the plan falls back to shard counts
            return None, f"{host} did not answer ({type(exc).__name__}: {str(exc)[:120]})"
        for schema, count in found:
            shard = store.config.names.database_shard(str(schema))
            if shard is not None and shard in shards:
                rows[shard] = int(count)
    return rows, ""


# -- running it ------------------------------------------------------------------------


def move_journal_path(journal_path: str | os.PathLike[str]) -> Path:
    """Where each move of the rebalance journaled in ``journal_path`` keeps its `Mover` journal."""
    p = Path(journal_path)
    return p.with_name(p.name + ".move")


def _save(path: Path, state: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.replace(tmp, path)


def _planned(raw: dict[str, Any]) -> PlannedMove:
    """A `PlannedMove` from its journaled form (JSON has no tuples)."""
    return PlannedMove(**{**raw, "old_slaves": tuple(raw.get("old_slaves") or ())})


def _load(path: Path) -> dict[str, Any]:
    try:
        state = json.loads(path.read_text())
        [_planned(m) for m in state["moves"]]
        if len(state["done"]) != len(state["moves"]):
            raise ValueError("done and moves differ in length")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise MoveError(f"cannot read the rebalance journal {path}: {exc}") from exc
    return dict(state)


def run_rebalance(
    store: Store,
    plan: Sequence[PlannedMove] | None,
    journal_path: str | os.PathLike[str],
    say: Callable[[str], None] = print,
    watch: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run ``plan`` move by move with `Mover`, journaled in ``journal_path``; the final journal state.

    ``watch`` becomes each Mover's ``watch`` (a progress bar).

    With ``plan`` None, resume the rebalance journaled there: a move that
    stopped part-way is resumed from its own journal (`move_journal_path`),
    then the remaining moves run. A new plan is refused while the journal
    holds an unfinished rebalance. A move whose range the live map already
    gives its target counts as done; one whose source no longer holds its
    range stops the rebalance with `MoveError` (plan again). Without a
    ``map_source`` (`require_changeable`) it is refused with `ConfigError`
    before the journal is written.
    """
    from store.admin.move import Journal, Mover

    # Before the journal is written: a plan that cannot run leaves no journal to --resume.
    require_changeable(store.map_source, "a rebalance")
    path = Path(journal_path)
    if plan is None:
        if not path.exists():
            raise MoveError(f"no rebalance journal at {path}: nothing to resume")
        state = _load(path)
        if all(state["done"]):
            raise MoveError(f"the rebalance journaled in {path} is already done")
    else:
        if path.exists():
            old = _load(path)
            if not all(old["done"]):
                left = old["done"].count(False)
                raise MoveError(
                    f"a rebalance journaled in {path} has {left} move(s) left: run store rebalance --resume"
                )
        state = {
            "targets": sorted({m.target for m in plan}),
            "map_version": store.shard_map.version,
            "moves": [asdict(m) for m in plan],
            "done": [False] * len(plan),
            "journals": [None] * len(plan),
        }
        _save(path, state)
    moves = [_planned(m) for m in state["moves"]]
    mj = move_journal_path(path)
    for i, mv in enumerate(moves):
        if state["done"][i]:
            continue
        say(f"rebalance: move {i + 1} of {len(moves)}: {mv.line()}")
        mover = Mover(store, mj, say=say)
        mover.watch = watch
        j: Journal | None = None
        if mj.exists():
            prior = Journal.load(mj)
            if prior.phase not in ("done", "aborted"):
                if (prior.low, prior.high, prior.target) != (mv.low, mv.high, mv.target):
                    raise MoveError(
                        f"{mj} holds an unfinished move of shards {prior.low}-{prior.high} to "
                        f"{prior.target}, not this rebalance's next move: finish or abort it with "
                        f"store move --journal {mj}"
                    )
                j = mover.resume()
        if j is None:
            store.refresh_map(force=True)
            m = store.shard_map
            masters = {m.master(s) for s in range(mv.low, mv.high + 1)}
            if masters == {mv.target}:
                say(f"rebalance: shards {mv.low}-{mv.high} are already on {mv.target}")
            elif masters != {mv.source}:
                raise MoveError(
                    f"the live map (version {m.version}) gives shards {mv.low}-{mv.high} to "
                    f"{', '.join(sorted(masters))}, not {mv.source} as planned: plan the rebalance again"
                )
            else:
                j = mover.start(mover.plan(mv.low, mv.high, mv.target, mv.slave))
        state["done"][i] = True
        state["journals"][i] = None if j is None else asdict(j)
        _save(path, state)
    say(f"rebalance: done, {len(moves)} move(s); map version {store.shard_map.version}")
    return state


def cleanup_rebalance(
    store: Store, journal_path: str | os.PathLike[str], say: Callable[[str], None] = print
) -> list[str]:
    """Drop the archive databases of every move of the finished rebalance journaled in ``journal_path``.

    Each move's own journal is kept in the rebalance journal, so every
    source is reached, not only the last move's (which is all the ``.move``
    journal still names). Refused while moves are left. Idempotent: the
    databases are dropped ``IF EXISTS``, and a move that found its shards
    on the target already has nothing archived. The databases dropped.
    """
    from store.admin.move import Journal, Mover

    # Before the journal is written: a plan that cannot run leaves no journal to --resume.
    require_changeable(store.map_source, "a rebalance")
    path = Path(journal_path)
    if not path.exists():
        raise MoveError(f"no rebalance journal at {path}: nothing to clean up")
    state = _load(path)
    if not all(state["done"]):
        raise MoveError(
            f"the rebalance journaled in {path} has {state['done'].count(False)} move(s) left: "
            "finish it with store rebalance --resume before cleaning up"
        )
    mover = Mover(store, move_journal_path(path), say=say)
    dropped: list[str] = []
    for i, raw in enumerate(state.get("journals") or []):
        if raw is None:
            continue  # the shards were on the target already: that move archived nothing
        j = Journal(**raw)
        here = mover.cleanup_journaled(j)
        say(f"rebalance: cleanup of move {i + 1}: dropped {len(here)} archive database(s) on {j.source}")
        dropped.extend(here)
    return dropped
