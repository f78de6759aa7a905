"""`store promote`: after a master dies, make its slave the master of its ranges in the map.

Promotion is refused unless the slave is caught up:

* if the master still answers, promotion is refused outright: its copy
  would go on taking writes from processes holding the old map (a planned
  switch is a `store move`, which fences the source first);
* with the master gone, the slave must have applied everything it received
  from it (its relay log read and executed to the same position). A slave
  that was still behind would lose those writes: ``--force`` promotes it
  anyway, with a loud warning.

The slave's replication is stopped, then the map is written (version + 1)
with the slave as master and no slave.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from store.backends.mysql.driver import mysql_connector
from store.exceptions import PromoteError
from store.shardmap import ShardMap
from store.store import Store

__all__ = ["PromoteError", "promote"]


def _status_rows(cur: Any) -> list[dict[str, Any]]:
    cur.execute("SHOW ALL SLAVES STATUS")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=False)) for row in cur.fetchall()]


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
    hosts = store.config.hosts
    try:
        probe = mysql_connector(hosts[master])()
    except Exception:
        master_alive = False
    else:
        probe.close()
        master_alive = True
    if master_alive and not force:
        raise PromoteError(
            f"the master {master} still answers: promoting would leave its copy taking writes from "
            "processes with the old map. Use store move for a planned switch (it fences first), or --force"
        )
    conn = mysql_connector(hosts[slave])()
    try:
        cur = conn.cursor()
        behind = [
            f"{row.get('Connection_name') or 'default'} read {row.get('Read_Master_Log_Pos')} "
            f"executed {row.get('Exec_Master_Log_Pos')}"
            for row in _status_rows(cur)
            if (row.get("Master_Log_File"), row.get("Read_Master_Log_Pos"))
            != (row.get("Relay_Master_Log_File"), row.get("Exec_Master_Log_Pos"))
        ]
        if behind and not force:
            raise PromoteError(
                f"the slave {slave} has not applied everything it received ({'; '.join(behind)}): "
                "wait for it, or --force to promote and lose those writes"
            )
        if behind or master_alive:
            say(
                f"WARNING: promoting {slave} with --force: "
                + ("the master still answers and is not fenced; " if master_alive else "")
                + (f"unapplied changes will be lost ({'; '.join(behind)})" if behind else "")
            )
        cur.execute("STOP ALL SLAVES")
    finally:
        conn.close()
    new = m.with_move(low, high, slave, None)
    store.map_source.write(new, expected_version=m.version)
    store.refresh_map(force=True)
    say(f"promoted {slave} to master of shards {low}-{high} (map version {new.version})")
    return new
