"""The invalidators as an operator sees them, from the caches alone: no database query, no daemon RPC.

Each running invalidator of a server publishes its status in memcached: the
leader under ``<prefix>invst:leader:<server>`` every tick, a standby under
``<prefix>invst:standby:<server>`` each time it waits for the lock. Items live
`STATUS_TTL_S`, so a daemon gone shows as gone within that. With the hosts'
heartbeats (`store.cache.heartbeat`) that is what `store serve`,
its ``/metrics`` and `store check` show.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from store.cache.heartbeat import decode_heartbeat, heartbeat_key
from store.cache.leases import wall_ms

__all__ = [
    "ROLES",
    "STATUS_TTL_S",
    "decode_status",
    "encode_status",
    "invalidators",
    "servers_of",
    "status_key",
]

#: The roles an invalidator publishes a status under.
ROLES = ("leader", "standby")
#: How long a published status lives: a daemon that stopped publishing is gone after this.
STATUS_TTL_S = 10


def status_key(prefix: str, server: str, role: str) -> str:
    """The cache key of ``server``'s invalidator in ``role`` (leader or standby)."""
    return f"{prefix}invst:{role}:{server}"


def encode_status(status: Mapping[str, Any]) -> bytes:
    """A status as the item's value (JSON)."""
    return orjson.dumps(dict(status), default=str)


def decode_status(value: bytes | None) -> dict[str, Any] | None:
    """The status in an item's value; None if there is none or it does not parse."""
    if not value:
        return None
    try:
        got = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    return got if isinstance(got, dict) else None


def servers_of(hosts: Sequence[str], identity: Callable[[str], str]) -> dict[str, list[str]]:
    """``hosts`` grouped by the database server each is on (one invalidator per server)."""
    out: dict[str, list[str]] = {}
    for name in hosts:
        out.setdefault(identity(name), []).append(name)
    return dict(sorted(out.items()))


def invalidators(store: Any) -> list[dict[str, Any]]:
    """Per server the daemon follows: its hosts and mode, the leader's and a standby's last status
    (None: none published in the last `STATUS_TTL_S`), each host's heartbeat age, and ``stale``
    (a host without a heartbeat younger than ``max_stale_s``). Empty without a daemon configured."""
    config = store.config
    ctx = store.admin_context()
    hosts = config.cache.daemon_hosts(sorted(config.hosts))
    objects = ctx.caches.objects
    peek = getattr(getattr(objects, "store", None), "peek_many", None)
    if not hosts or peek is None:
        return []
    prefix = ctx.caches.prefix
    servers = servers_of(hosts, lambda h: ctx.engines.backend(h).server_identity(config.hosts[h]))
    keys = [status_key(prefix, s, r) for s in servers for r in ROLES]
    keys += [heartbeat_key(prefix, h) for h in hosts]
    try:
        got: Mapping[str, bytes] = peek(keys)
    except Exception:  # the caches down: everything shows as absent
        got = {}
    now = wall_ms()
    window_s = config.cache.max_stale_s
    out = []
    for server, names in servers.items():
        ages: dict[str, float | None] = {}
        for h in names:
            beat = decode_heartbeat(got.get(heartbeat_key(prefix, h)))
            ages[h] = None if beat is None else round((now - beat.covered_ms) / 1000, 3)
        row: dict[str, Any] = {
            "server": server,
            "hosts": names,
            "mode": config.cache.invalidation_of(names[0]),
            "heartbeat_age_s": ages,
            "stale": any(a is None or a > window_s for a in ages.values()),
        }
        for role in ROLES:
            status = decode_status(got.get(status_key(prefix, server, role)))
            if status is not None and isinstance(status.get("at_ms"), int):
                status["seen_s"] = round((now - status["at_ms"]) / 1000, 3)
            row[role] = status
        out.append(row)
    return out
