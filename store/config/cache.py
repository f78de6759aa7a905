"""The ``cache:`` section: memcached, Redis, leases, the staleness bound and invalidation."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from sqlalchemy.engine import URL

from store.backends import backend_for
from store.config.checks import _host_port, _int, _keys
from store.exceptions import ConfigError, brief

DEFAULT_MAX_STALE_S = 5.0


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Which caches to use, and how they behave. No memcached, redis or memory: no cache."""

    memcached: tuple[str, ...] = ()
    #: The Redis URLs (one or more: each list lives on one, by rendezvous hashing); they may hold
    #: passwords, so they are left out of the repr.
    redis: tuple[str, ...] = field(default=(), repr=False)
    memory: bool = False
    timeout_ms: int = 50
    connect_timeout_ms: int = 50
    failures_to_trip: int = 3
    cooldown_s: int = 5
    ttl_s: int = 3600
    lease_ttl_s: int = 10
    list_entries: int = 1000
    prefix: str = "s:"
    #: An entry is trusted for this long after the database read that filled it, then read again.
    #: It bounds how long any process can serve a value older than an acknowledged write when the
    #: writer's invalidation was lost (cache unreachable from the writer, writer killed after its
    #: commit, cache restarted).
    max_stale_s: float = 5.0  # DEFAULT_MAX_STALE_S
    #: Follow the servers' invalidation logs (`store.cache.follower`): while the follower is
    #: current, entries are trusted at any age, staleness still bounded by ``max_stale_s``.
    #: Every process writing to the same databases must have the same setting. Off by default: a
    #: write made behind the store's back (plain SQL) is not in the log, so with it on such a write
    #: is never seen by cached readers.
    follow: bool = False
    #: How often the follower reads the logs (must be well under ``max_stale_s``).
    follow_poll_s: float = 0.5
    #: How lost invalidations are caught, per host (`store.invalidate`): ``window`` (entries are
    #: trusted for ``max_stale_s``, or the per-process follower if ``follow``), ``log`` (writes
    #: log their keys; one `store invalidate` daemon per host reads the log), ``binlog`` (no
    #: log rows; the daemon reads a MariaDB/MySQL server's ROW binlog) or ``wal`` (no log rows;
    #: the daemon reads a PostgreSQL server's WAL through a logical slot). (host name, mode)
    #: pairs; hosts not named take ``invalidation``.
    invalidation: str = "window"
    invalidation_hosts: tuple[tuple[str, str], ...] = ()

    def invalidation_of(self, host: str) -> str:
        """How ``host``'s lost invalidations are caught: ``window``, ``log``, ``binlog`` or ``wal``."""
        for name, mode in self.invalidation_hosts:
            if name == host:
                return mode
        return self.invalidation

    def daemon_hosts(self, hosts: Iterable[str]) -> list[str]:
        """Those of ``hosts`` whose invalidations a `store invalidate` daemon catches."""
        return [h for h in hosts if self.invalidation_of(h) != "window"]

    def __post_init__(self) -> None:
        # ``redis`` was one URL (or None) before it took several: keep both spellings working.
        redis: object = self.redis
        if redis is None:
            object.__setattr__(self, "redis", ())
        elif isinstance(redis, str):
            object.__setattr__(self, "redis", (redis,))

    @property
    def enabled(self) -> bool:
        """True if any cache is configured."""
        return bool(self.memcached or self.redis or self.memory)


def _check_invalidation(cache: CacheConfig, hosts: Mapping[str, URL]) -> None:
    """Each host named in ``cache.invalidation`` exists, and a host the daemon follows can be followed."""
    for name, _mode in cache.invalidation_hosts:
        if name not in hosts:
            raise ConfigError(
                f"cache.invalidation names host {brief(name)}, which is not under hosts "
                f"({', '.join(sorted(hosts))}; `default` sets the others)"
            )
    for name, url in hosts.items():
        mode = cache.invalidation_of(name)
        backend = backend_for(url)
        if mode != "window" and mode not in backend.invalidation_modes:
            can = " or ".join(backend.invalidation_modes)
            raise ConfigError(
                f"cache.invalidation is {mode} for hosts.{name}, a {backend.name} host, which "
                + (f"a daemon can follow by {can} only" if can else "no daemon can follow")
                + f": set it to {can or 'window'} for {name} (e.g. {{default: {mode}, {name}: "
                f"{backend.invalidation_modes[0] if can else 'window'}}})"
            )


_CACHE_INTS = {
    "timeout_ms": (1, 60_000),
    "connect_timeout_ms": (1, 60_000),
    "failures_to_trip": (1, 1000),
    "cooldown_s": (0, 3600),
    "ttl_s": (1, 30 * 86_400),
    "lease_ttl_s": (1, 3600),
    "list_entries": (1, 100_000),
}


def _redis_urls(raw: object) -> tuple[str, ...]:
    """``cache.redis``: one URL or a list of them, each a Redis URL, no server named twice."""
    if raw is None:
        return ()
    urls = [raw] if isinstance(raw, str) else raw
    if not isinstance(urls, list) or not urls:
        raise ConfigError(
            "cache.redis must be a redis:// URL or a non-empty list of them (each list is kept on one "
            f"server, chosen by rendezvous hashing), got {brief(raw)}"
        )
    seen: dict[str, int] = {}
    for i, url in enumerate(urls):
        where = "cache.redis" if isinstance(raw, str) else f"cache.redis[{i}]"
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            shown = url.split("://")[0] + "://..." if isinstance(url, str) else brief(url)
            raise ConfigError(
                f"{where} must be a redis:// URL (rediss:// for TLS, unix:// for a socket), got {shown}"
            )
        server = redis_server_name(url)
        if server in seen:
            raise ConfigError(
                f"cache.redis[{i}] names the server {server} again (as cache.redis[{seen[server]}]): "
                "each list is placed by the servers' addresses, so each server is listed once"
            )
        seen[server] = i
    return tuple(urls)


def redis_server_name(url: str) -> str:
    """``host:port/db`` of a Redis URL (a socket's path for unix://), never its password.

    What places lists on servers (`store.cache.redis_lists.RedisListServers`): a
    password or an option changed in the URL moves no list.
    """
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if parts.scheme == "unix":
        db = query.get("db", ["0"])[0]
        return f"{parts.path}/{db}"
    path = parts.path.lstrip("/") or query.get("db", ["0"])[0]
    try:
        port = parts.port or 6379
    except ValueError:
        port = 0  # (redis-py refuses the URL when it connects, with its own message)
    return f"{parts.hostname or 'localhost'}:{port}/{path or 0}"


INVALIDATION_MODES = ("window", "log", "binlog", "wal")


def _invalidation(raw: object) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``cache.invalidation``: one mode for every host, or a mapping of host name (or ``default``) to mode."""
    usage = (
        "cache.invalidation must be window, log, binlog or wal, or a mapping of host names (and default) "
        "to one of them, e.g. {default: binlog, pg1: wal}"
    )
    if isinstance(raw, str):
        if raw not in INVALIDATION_MODES:
            raise ConfigError(f"{usage}; got {brief(raw)}")
        return raw, ()
    if not isinstance(raw, Mapping) or not all(
        isinstance(k, str) and v in INVALIDATION_MODES for k, v in raw.items()
    ):
        raise ConfigError(f"{usage}; got {brief(raw)}")
    default = str(raw.get("default", "window"))
    return default, tuple(sorted((str(k), str(v)) for k, v in raw.items() if k != "default"))


def _cache(raw: object) -> CacheConfig:
    if raw is None:
        return CacheConfig()
    known = {
        "memcached", "redis", "memory", "prefix", "max_stale_s", "follow", "follow_poll_s", "invalidation",
        *_CACHE_INTS,
    }  # fmt: skip
    usage = (
        "cache must be a mapping with memcached: [host:port, ...], redis: URL or [URL, ...] "
        f"and/or memory: true (and optionally {_keys(known - {'memcached', 'redis', 'memory'})})"
    )
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{usage}; got {brief(raw)}")
    if set(raw) - known:
        raise ConfigError(f"unknown cache key(s) {_keys(set(raw) - known)}: {usage}")
    mc = raw.get("memcached") or []
    if isinstance(mc, str):
        mc = [mc]
    if not isinstance(mc, list) or not all(_host_port(s) for s in mc):
        raise ConfigError(
            f"cache.memcached must be a list of host:port strings (port 1-65535), got {brief(mc)}"
        )
    redis = _redis_urls(raw.get("redis"))
    memory = raw.get("memory", False)
    if not isinstance(memory, bool):
        raise ConfigError(f"cache.memory must be true or false, got {brief(memory)}")
    prefix = raw.get("prefix", "s:")
    if not isinstance(prefix, str) or not re.match(r"^[A-Za-z0-9_:.-]{0,32}$", prefix):
        raise ConfigError(f"cache.prefix must be up to 32 letters, digits or _:.- , got {brief(prefix)}")
    ints = {k: _int(raw, k, CacheConfig.__dataclass_fields__[k].default, lo, hi, "cache.")  # type: ignore[arg-type]
            for k, (lo, hi) in _CACHE_INTS.items()}  # fmt: skip
    max_stale = raw.get("max_stale_s", DEFAULT_MAX_STALE_S)
    if (
        isinstance(max_stale, bool)
        or not isinstance(max_stale, int | float)
        or not 0 < max_stale <= ints["ttl_s"]
    ):
        raise ConfigError(
            f"cache.max_stale_s must be a number of seconds in (0, ttl_s = {ints['ttl_s']}], "
            f"got {brief(max_stale)}: how long a cached entry is trusted after the read that filled it"
        )
    follow = raw.get("follow", False)
    if not isinstance(follow, bool):
        raise ConfigError(f"cache.follow must be true or false, got {brief(follow)}")
    poll = raw.get("follow_poll_s", 0.5)
    if isinstance(poll, bool) or not isinstance(poll, int | float) or not 0.05 <= poll <= max_stale / 2:
        raise ConfigError(
            f"cache.follow_poll_s must be seconds in [0.05, max_stale_s / 2 = {max_stale / 2:g}], "
            f"got {brief(poll)}: how often the invalidation logs are read"
        )
    mode, per_host = _invalidation(raw.get("invalidation", "window"))
    if (mode != "window" or per_host) and follow:
        raise ConfigError(
            "cache.follow (every process follows the logs) and cache.invalidation (one `store invalidate` "
            "daemon per host) are two ways of catching lost invalidations: set only one"
        )
    if (mode != "window" or any(m != "window" for _h, m in per_host)) and not (mc or redis):
        raise ConfigError(
            "cache.invalidation other than window needs shared caches (cache.memcached and/or cache.redis): "
            "the daemon deletes keys there"
        )
    return CacheConfig(
        invalidation=mode,
        invalidation_hosts=per_host,
        memcached=tuple(mc),
        redis=redis,
        memory=memory,
        prefix=prefix,
        max_stale_s=float(max_stale),
        follow=follow,
        follow_poll_s=float(poll),
        **ints,
    )
