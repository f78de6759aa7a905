"""What the operator page shows, as plain data: each panel is one method and one JSON endpoint.

Everything is read when asked (the page polls about once a second): the
live map from its source (the last one, and its age, when the source
cannot be read), each host's shards, rows and bytes from
``information_schema``, its ping (a ``SELECT 1`` on a pooled connection) and
the replication connections it runs, each cache server's own hit counters
and this process's breaker on it, the progress file of a running
`store move`, and the last `store check` result kept with ``--result-file``, and each
server's invalidation daemon as it publishes itself in the caches.
No URL is ever shown with its password.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from store.admin.check import load_report
from store.cache.invalidators import invalidators
from store.exceptions import StoreError
from store.metrics import cache_breakers, read_move_progress, redis_address, redis_servers
from store.store import Store

__all__ = ["PALETTE", "Panels", "host_colour"]

#: Colours of the hosts' bars, in the order the config names the hosts.
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f")

_SHARD_TABLES = (
    "SELECT COUNT(DISTINCT table_schema), COALESCE(SUM(table_rows), 0), "
    "COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables "
    "WHERE table_schema REGEXP '^db[0-9]{5}$' AND table_type = 'BASE TABLE' AND table_name <> %s"
)


def host_colour(hosts: list[str], host: str) -> str:
    """The bar colour of ``host`` among ``hosts``."""
    i = hosts.index(host) if host in hosts else len(hosts)
    return PALETTE[i % len(PALETTE)]


class Panels:
    """The page's panels over an (admin) store, a move journal and a saved check result."""

    def __init__(self, store: Store, *, journal: str | Path | None, check_file: str | Path | None) -> None:
        self.store = store
        self.journal = None if journal is None else Path(journal)
        self.check_file = None if check_file is None else Path(check_file)
        self._seen: dict[int, float] = {}
        self.started = time.time()

    # -- the map ---------------------------------------------------------------

    def map(self) -> dict[str, Any]:
        """The live map: version, when it changed, its age, and its ranges with their hosts' colours.

        The map is read from its source first; a source that cannot be read
        leaves the last map on show, with ``source_error`` saying why and
        ``age_s`` how long ago the source last confirmed it.
        """
        error = ""
        try:
            self.store.refresh_map(force=True)
        except StoreError as exc:
            error = str(exc)
        status = self.store.admin_context().live.status()
        m = self.store.shard_map
        hosts = list(self.store.config.hosts)
        changed = self._changed_at(m.version)
        return {
            "version": m.version,
            "shards": m.shards,
            "changed_at": changed,
            "source": status.source,
            "age_s": None if status.age_s is None else round(status.age_s, 3),
            "since_change_s": None if status.since_change_s is None else round(status.since_change_s, 3),
            "source_error": error,
            "source_checks": status.checks,
            "source_check_errors": status.check_errors,
            "ranges": [
                {
                    "start": r.start,
                    "end": r.end,
                    "shards": len(r),
                    "master": r.master,
                    "slave": r.slave,
                    "colour": host_colour(hosts, r.master),
                }
                for r in m.ranges
            ],
        }

    def _changed_at(self, version: int) -> float:
        source = self.store.config.map_source
        if source is not None and source[0] == "file":
            try:
                return os.stat(source[1]).st_mtime
            except OSError:
                pass
        return self._seen.setdefault(version, time.time())

    # -- hosts -----------------------------------------------------------------

    def hosts(self) -> list[dict[str, Any]]:
        """Per host: its shards in the live map, rows, bytes, ping and replication connections."""
        ctx = self.store.admin_context()
        m = self.store.shard_map
        names = list(self.store.config.hosts)
        out = []
        for host in names:
            url = self.store.config.hosts[host]
            shards = [s for r in m.ranges if r.master == host for s in r.shards()]
            slaves = sorted({r.slave for r in m.ranges if r.master == host and r.slave})
            row: dict[str, Any] = {
                "host": host,
                "url": url.render_as_string(hide_password=True),
                "colour": host_colour(names, host),
                "shards": len(shards),
                "slaves": slaves,
                "rows": None,
                "bytes": None,
                "databases": None,
                "ping_ms": None,
                "replication": [],
                "error": "",
            }
            backend = ctx.engines.backend(host)
            if backend.pool_per_shard and not shards:
                out.append(row)  # a file host with no shard: opening one would make it
                continue
            try:
                handle = ctx.engines.shard(shards[0] if shards else 0, host)
                t0 = time.perf_counter()
                handle.read("SELECT 1", (), one=True)
                row["ping_ms"] = round((time.perf_counter() - t0) * 1000, 2)
                if backend.can_move:
                    from store.naming import TOMBSTONE_TABLE

                    dbs, rows, size = handle.read(_SHARD_TABLES, (TOMBSTONE_TABLE,), one=True)
                    row.update(databases=int(dbs), rows=int(rows), bytes=int(size))
                    row["replication"] = _replication(handle)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"[:200]
            out.append(row)
        for row in out:  # the replication state of each host's slave, where the map names one
            row["slave_state"] = [
                {"slave": s, "replication": next((h["replication"] for h in out if h["host"] == s), [])}
                for s in row["slaves"]
            ]
        return out

    # -- caches ----------------------------------------------------------------

    def caches(self) -> list[dict[str, Any]]:
        """Each cache server: its own hit and miss counters, hit ratio, and this process's breaker on it."""
        caches = self.store.admin_context().caches
        breakers = cache_breakers(self.store)
        out: list[dict[str, Any]] = []
        if caches.objects is not None:
            for server in caches.servers().get("memcached", []):
                address = server.address
                row: dict[str, Any] = {"kind": "memcached", "server": address, "hits": None, "misses": None}
                try:
                    from pymemcache.client.base import Client

                    host, _, port = address.rpartition(":")
                    client = Client((host or "127.0.0.1", int(port)), connect_timeout=0.5, timeout=0.5)
                    try:
                        stats = client.stats()
                    finally:
                        client.close()
                    row["hits"] = int(stats.get(b"get_hits", 0))
                    row["misses"] = int(stats.get(b"get_misses", 0))
                    row["up"] = True
                except Exception as exc:
                    row["up"] = False
                    row["error"] = type(exc).__name__
                row["breaker"] = "open" if breakers.get(("memcached", address)) else "closed"
                out.append(row)
        for backend in [] if caches.lists is None else redis_servers(caches.lists.backend):
            address = redis_address(backend)
            row = {"kind": "redis", "server": address, "hits": None, "misses": None}
            try:
                info = backend.client.info("stats")
                row["hits"] = int(info.get("keyspace_hits", 0))
                row["misses"] = int(info.get("keyspace_misses", 0))
                row["up"] = True
            except Exception as exc:
                row["up"] = False
                row["error"] = type(exc).__name__
            row["breaker"] = "open" if breakers.get(("redis", address)) else "closed"
            out.append(row)
        for row in out:
            hits, misses = row["hits"], row["misses"]
            total = (hits or 0) + (misses or 0)
            row["hit_ratio"] = None if not total else round((hits or 0) / total, 4)
        return out

    # -- invalidators -------------------------------------------------------------

    def invalidators(self) -> list[dict[str, Any]]:
        """Per server a `store invalidate` daemon follows: leader, standby, position, lag, heartbeat
        ages, keys deleted, as the daemons publish them in the caches (empty: no daemon configured)."""
        return invalidators(self.store)

    # -- the move and the check --------------------------------------------------

    def move(self) -> dict[str, Any]:
        """The move journaled at ``journal``: phase, progress, rows, lag and fence timer (or none)."""
        if self.journal is None:
            return {"journal": None, "present": False}
        try:
            journal = json.loads(self.journal.read_text())
        except (OSError, ValueError):
            journal = None
        progress = read_move_progress(self.journal) or {}
        if journal is None and not progress:
            return {"journal": str(self.journal), "present": False}
        out: dict[str, Any] = {"journal": str(self.journal), "present": True, **progress}
        if journal is not None:
            out["phase"] = journal.get("phase", out.get("phase"))
            out.update({k: journal.get(k) for k in ("low", "high", "source", "target", "switched_version")})
        if out.get("fence_started") and not out.get("fence_ended") and out.get("running"):
            out["fenced_s"] = round(time.time() - float(out["fence_started"]), 3)
        if out.get("phase") == "done":
            out["progress"] = 1.0
        out.setdefault("progress", 0.0)
        return out

    def check(self) -> dict[str, Any]:
        """The last `store check` result kept with ``--result-file`` (or none)."""
        if self.check_file is None:
            return {"present": False, "file": None}
        doc = load_report(self.check_file)
        if doc is None:
            return {"present": False, "file": str(self.check_file)}
        return {"present": True, "file": str(self.check_file), **doc}


def _replication(handle: Any) -> list[dict[str, Any]]:
    """The replication connections a MariaDB host runs (its own slave threads)."""
    with handle.connect() as conn:
        cur = conn.cursor()
        cur.execute("SHOW ALL SLAVES STATUS")
        names = [c[0] for c in cur.description or ()]
        rows = cur.fetchall() or ()
        cur.close()
    out = []
    for r in rows:
        d = dict(zip(names, r, strict=False))
        lag = d.get("Seconds_Behind_Master")
        out.append(
            {
                "name": d.get("Connection_name") or "",
                "master": f"{d.get('Master_Host')}:{d.get('Master_Port')}",
                "io": d.get("Slave_IO_Running"),
                "sql": d.get("Slave_SQL_Running"),
                "lag_s": None if lag is None else int(lag),
            }
        )
    return out
