"""`store invalidate`: one daemon per database host reads its commit log and deletes each key once.

With ``cache.invalidation: log`` writes log their keys in the server's
``store_log.cache_log`` (as with ``cache.follow``), and only the daemon reads
it. With ``binlog`` writes log nothing: the daemon reads the server's ROW
binlog (`store.invalidate.sources.BinlogSource`); with ``wal``, a PostgreSQL
server's WAL through a logical slot of its own (`store.invalidate.wal.WalSource`). One daemon per server
leads, holding the server's named lock on its own connection
(`store.invalidate.leader`); others wait as standbys and take over when the
leader's connection goes.

The trust rule. A heartbeat of host H says ``T S`` (`store.cache.heartbeat`):
every write to H that committed before T has had its keys deleted at some
moment after its commit, and the daemon has kept that up without a break
since S. A cache entry carries F, the time just before the database read
that filled it (after its lease was taken: `store.cache.leases`).

- A write that committed before F is in the entry (the read saw it).
- A write W that committed at C >= F and before T had a delete after C, so
  after the lease was taken: the delete removed the entry or made its fill
  fail. Such a write cannot be missing from a cached entry.
- Only writes that committed after T can be missing, and only until their
  delete lands.

So an entry is trusted at any age when F >= S (no break since before the
fill) and T >= now - max_stale_s: whatever it misses committed less than
max_stale_s ago, the same bound the window gives without a daemon
(F >= now - max_stale_s), which still holds as an alternative. Where the
heartbeat is missing or older, readers fall back to the window.

Why T is taken as it is. A log row is read only once it is committed, so a
pass that began at T and deleted what it read covers every write committed
before T. A binlog transaction is written before the engine commit makes it
visible, so a delete made as soon as it is read may come before the commit
and be undone by a reader that read the old row meanwhile. The binlog
source therefore takes t0 and the binlog's end (``SHOW MASTER STATUS``),
waits for the stream to pass that end, and only then deletes the keys of
the transactions up to it: every write acknowledged before t0 had its
commit before t0, so those deletes follow the commits, and T = t0.

Clocks: T is the daemon's wall clock and F the reader's; their skew adds to
the bound.
"""

from store.cache.heartbeat import HEARTBEAT_EVERY_S, Heartbeat, HeartbeatTrust, heartbeat_key
from store.invalidate.daemon import CacheDeleteError, Daemon, HostInvalidator

__all__ = [
    "HEARTBEAT_EVERY_S",
    "CacheDeleteError",
    "Daemon",
    "Heartbeat",
    "HeartbeatTrust",
    "HostInvalidator",
    "heartbeat_key",
]
