"""`store promote`: after a master dies, make its slave the master of its ranges in the map.

A slave is a MariaDB/MySQL replica (``SHOW ALL SLAVES STATUS``) or a PostgreSQL
streaming hot standby (``pg_is_in_recovery()``); each host's backend reads and
promotes it (`Backend.replica_state`, `Backend.promote_replica`). A kind of
host that has no slaves (SQLite) is refused.

Promotion is refused unless the slave is caught up:

* if the master still answers, promotion is refused outright: its copy
  would go on taking writes from processes holding the old map (a planned
  switch is a `store move`, which fences the source first). The master is
  probed with its own backend's driver, and counts as dead only where
  nothing answered (refused, timed out: `Backend.unreachable`); any other
  failure (a login refused, a database missing, a name that does not
  resolve) may come from a server that is up, and refuses too;
* with the master gone, the slave must be replicating and have applied
  everything it received from it (its relay log read and executed to the
  same position; a standby's WAL replayed up to what it received). A slave
  that was still behind would lose those writes: ``--force`` promotes it
  anyway, with a loud warning.

The slave's replication is stopped (MariaDB) or its recovery ended
(PostgreSQL), then the map is written (version + 1) with the slave as master
and no slave. If the slave's server fails part-way, the map is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.engine import URL

from store.backends import Backend, backend_for, backend_named, backend_names
from store.exceptions import PromoteError
from store.mapsource import require_changeable
from store.shardmap import ShardMap
from store.store import Store

__all__ = ["PromoteError", "promote"]

T = TypeVar("T")


def _one_line(exc: BaseException) -> str:
    """``exc`` as ``Type: message`` on one line (drivers' messages end in hints on lines of their own)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _probe(backend: Backend, url: URL) -> tuple[str, str] | None:
    """None if nothing answered at the master ``url`` (it is dead); else how it answered, in words:
    (``still answers`` or ``may still answer``, and why, where it may)."""
    try:
        conn = backend.admin_connector(url)()
    except Exception as exc:
        if backend.unreachable(exc):
            return None
        return (
            "may still answer",
            f": its probe failed, but not as a server that is down does ({_one_line(exc)})",
        )
    conn.close()
    return "still answers", ""


def _promotable(role: str, host: str, backend: Backend) -> None:
    """`PromoteError` unless a ``role`` (master, slave) of this ``backend`` can take part in a promotion."""
    if backend.can_promote:
        return
    kinds = ", ".join(n for n in backend_names() if backend_named(n).can_promote)
    raise PromoteError(
        f"the {role} {host} is a {backend.name} host, which has no slaves to promote: "
        f"store promote works on {kinds} hosts"
    )


def _slave_step(slave: str, low: int, high: int, backend: Backend, step: Callable[[], T]) -> T:
    """``step()`` on the slave, its driver's error a `PromoteError` that says the map is unchanged."""
    try:
        return step()
    except PromoteError:
        raise
    except Exception as exc:
        if not backend.is_driver_error(exc):
            raise
        raise PromoteError(
            f"promote of shards {low}-{high} stopped, the map unchanged: the slave's server failed "
            f"({_one_line(exc)}); promote needs the slave {slave} up and reachable"
        ) from exc


def promote(
    store: Store, low: int, high: int, *, force: bool = False, say: Callable[[str], None] = print
) -> ShardMap:
    """Make the slave of shards ``low..high`` their master in the live map; the new map."""
    store.refresh_map(force=True)
    m = store.shard_map
    if not 0 <= low <= high < m.shards:
        raise PromoteError(f"--shards {low}-{high} must lie within 0-{m.shards - 1}")
    pairs = {(m.range_for(s).master, m.range_for(s).slave) for s in range(low, high + 1)}
    if len(pairs) != 1:
        raise PromoteError(f"shards {low}-{high} span several host pairs: promote one pair's range at a time")
    master, slave = pairs.pop()
    if slave is None:
        raise PromoteError(f"shards {low}-{high} have no slave in the map: nothing to promote")
    require_changeable(store.map_source, "a promote")
    hosts, names = store.config.hosts, store.config.names
    slave_backend = backend_for(hosts[slave], names)
    master_backend = backend_for(hosts[master], names)
    _promotable("slave", slave, slave_backend)
    _promotable("master", master, master_backend)
    answered = _probe(master_backend, hosts[master])
    if answered is not None and not force:
        raise PromoteError(
            f"the master {master} {answered[0]}{answered[1]}: promoting would leave its copy taking "
            "writes from processes with the old map. Use store move for a planned switch (it fences "
            "first), or --force"
        )
    state = _slave_step(slave, low, high, slave_backend, lambda: slave_backend.replica_state(hosts[slave]))
    behind = list(state.unapplied)
    if state.not_replicating is not None and not force:
        raise PromoteError(
            f"the slave {slave} is not replicating ({state.not_replicating}): its copy may lack the "
            "master's writes. Check it, or --force (to finish a promote that stopped after promoting it)"
        )
    if behind and not force:
        raise PromoteError(
            f"the slave {slave} has not applied everything it received ({'; '.join(behind)}): "
            "wait for it, or --force to promote and lose those writes"
        )
    risks = [
        *([f"the master {answered[0]} and is not fenced"] if answered is not None else []),
        *([f"it is not replicating ({state.not_replicating})"] if state.not_replicating is not None else []),
        *([f"unapplied changes will be lost ({'; '.join(behind)})"] if behind else []),
    ]
    if risks:
        say(f"WARNING: promoting {slave} with --force: {'; '.join(risks)}")
    _slave_step(slave, low, high, slave_backend, lambda: slave_backend.promote_replica(hosts[slave]))
    new = m.with_move(low, high, slave, None)
    store.map_source.write(new, expected_version=m.version)
    store.refresh_map(force=True)
    say(f"promoted {slave} to master of shards {low}-{high} (map version {new.version})")
    return new
