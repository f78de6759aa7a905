"""Load and validate the store's YAML config into frozen values.

`StoreConfig.from_file` / `StoreConfig.from_dict` check everything up front
and raise `ConfigError` naming the key at fault and how to fix it. Host URLs
may be overridden by environment variables, ``STORE_HOST_<NAME>`` where NAME is
the host name upper-cased with every other character turned into ``_`` (so
``MySQL001A`` reads ``STORE_HOST_MYSQL001A``): secrets stay out of the file.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from store.backends import backend_for, backend_named, backend_names
from store.exceptions import ConfigError, brief
from store.ids import INSTAGRAM_EPOCH_MS
from store.naming import DEFAULT_NAMES, Names
from store.shardmap import ShardMap, ShardRange
from store.specs import RelationSpec, TypeSpec, UniqueSpec

__all__ = [
    "DEFAULT_MAX_OBJECT_BYTES",
    "DEFAULT_MAX_PAGE",
    "LIMIT_KEYS",
    "CacheConfig",
    "RelationSpec",
    "StoreConfig",
    "TicketsConfig",
    "TypeSpec",
    "admin_host_env_var",
    "host_env_var",
    "redis_server_name",
]

DEFAULT_MAX_OBJECT_BYTES = 1 << 20
DEFAULT_MAX_PAGE = 1000
#: IDs (or pairs) one call may take; larger calls are refused before any query.
DEFAULT_MAX_IDS = 1_000_000
#: IDs one query carries: a call over more runs as several bounded queries.
DEFAULT_ID_CHUNK = 5_000
#: Bytes of a page cursor (a longer one is refused before it is decoded).
DEFAULT_MAX_CURSOR_BYTES = 1024
#: Nesting depth of an object's JSON (objects and arrays).
DEFAULT_MAX_DEPTH = 64
#: MEDIUMTEXT holds 16 MiB - 1 bytes; the limit may not exceed what the column holds.
MAX_OBJECT_BYTES_CEILING = (1 << 24) - 1
DEFAULT_POOL_SIZE = 8
DEFAULT_MAX_STALE_S = 5.0
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_QUERY_TIMEOUT_S = 30.0
DEFAULT_POOL_TIMEOUT_S = 30.0
#: How long a write keeps retrying what cannot land yet (an update racing writers of its unique values).
DEFAULT_WRITE_TIMEOUT_S = 10.0
#: Connections older than this are replaced at checkout (below MariaDB's default wait_timeout of 8 h).
DEFAULT_POOL_RECYCLE_S = 3600.0
_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
_COUNTER = re.compile(r"^[a-z_][a-z0-9_]{0,50}$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HOST_PORT = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$")
#: Keys of the ``limits:`` section.
LIMIT_KEYS = frozenset(
    {"max_object_bytes", "max_page", "max_ids", "id_chunk", "max_cursor_bytes", "max_depth"}
)
_TOP_KEYS = frozenset(
    {"ids", "shards", "open_shards", "hosts", "map", "types", "relations", "cache", "limits",
     "instagram", "pool_size", "tickets", "map_source", "connect_timeout_s", "query_timeout_s",
     "pool_timeout_s", "pool_recycle_s", "unique", "write_timeout_s", "namespace", "cursor_secret",
     "cursor_secret_env", "cursor_secret_file"}
)  # fmt: skip
#: Table names the store keeps for itself in every shard (store.schema names them; schema imports
#: config, not back): relation counts, and the marker of a shard that moved away.
RESERVED_TABLES = {
    "relation_counts": "relation counts",
    "store_tombstone": "the tombstone of a moved shard",
    "unique_keys": "unique keys (config unique:)",
}


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
    #: log their keys; one `store invalidate` daemon per host reads the log) or ``binlog`` (no
    #: log rows; the daemon reads the server's ROW binlog). (host name, mode) pairs; hosts not
    #: named take ``invalidation``.
    invalidation: str = "window"
    invalidation_hosts: tuple[tuple[str, str], ...] = ()

    def invalidation_of(self, host: str) -> str:
        """How ``host``'s lost invalidations are caught: ``window``, ``log`` or ``binlog``."""
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


@dataclass(frozen=True, slots=True)
class TicketsConfig:
    """The ``tickets:`` section of the config."""

    #: The servers' URLs; they may hold passwords, so they are left out of the repr.
    servers: tuple[str, ...] = field(repr=False)
    counters: tuple[str, ...] = ("default",)
    block: int = 1
    retry_after_s: float = 5.0
    timeout_s: float = 1.0
    #: The database of the counters on each server (``NAME_tickets`` in a namespace).
    database: str = DEFAULT_NAMES.tickets_database

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], base: Path | None = None, *, names: Names = DEFAULT_NAMES
    ) -> TicketsConfig:
        """Validate a ``tickets:`` mapping (relative TLS files are taken from ``base``); the counters
        live in the tickets database of ``names`` (the config's namespace)."""
        if not isinstance(raw, Mapping):
            raise ConfigError("tickets must be a mapping: {servers: [URL, URL], counters: [photos, ...]}")
        extra = sorted(map(brief, set(raw) - {"servers", "counters", "block", "retry_after_s", "timeout_s"}))
        if extra:
            raise ConfigError(
                f"unknown tickets key(s) {extra}; known: servers, counters, block, retry_after_s, timeout_s"
            )
        servers = raw.get("servers")
        if not isinstance(servers, list) or not servers or not all(isinstance(s, str) for s in servers):
            raise ConfigError(
                "tickets.servers must be a list of MariaDB URLs, e.g. [mysql+pymysql://root@db1:3306]"
            )
        checked = []
        for i, s in enumerate(servers):
            url = _parse_url(s, f"tickets.servers[{i}]")
            if not _mariadb(url):
                raise ConfigError(f"tickets.servers[{i}] is not a MariaDB/MySQL URL (mysql+pymysql://...)")
            url = _mysql_tls_checked(url, f"tickets.servers[{i}]", Path.cwd() if base is None else base)
            checked.append(url.render_as_string(hide_password=False))
        servers = checked
        counters = raw.get("counters", ["default"])
        if (
            not isinstance(counters, list)
            or not counters
            or not all(isinstance(c, str) and _COUNTER.fullmatch(c) for c in counters)
        ):
            raise ConfigError(
                "tickets.counters must be a list of lower_snake_case names, e.g. [photos, accounts]"
            )
        block = raw.get("block", 1)
        if not isinstance(block, int) or isinstance(block, bool) or not 1 <= block <= 1_000_000:
            raise ConfigError(f"tickets.block must be an int in 1..1000000, got {brief(block)}")
        retry = raw.get("retry_after_s", 5.0)
        if not isinstance(retry, int | float) or retry < 0:
            raise ConfigError(f"tickets.retry_after_s must be a number >= 0, got {brief(retry)}")
        timeout = raw.get("timeout_s", 1.0)
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError(f"tickets.timeout_s must be a number > 0, got {brief(timeout)}")
        return cls(
            tuple(servers), tuple(counters), block, float(retry), float(timeout), names.tickets_database
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreConfig:
    """The whole validated configuration of a store."""

    ids: str
    shard_map: ShardMap
    #: The application's URL of each host: the request path (reads and writes of rows) uses these.
    hosts: Mapping[str, URL]
    types: Mapping[str, TypeSpec]
    relations: Mapping[str, RelationSpec]
    open_shards: tuple[tuple[int, int], ...]
    cache: CacheConfig = field(default_factory=CacheConfig)
    max_object_bytes: int = DEFAULT_MAX_OBJECT_BYTES
    max_page: int = DEFAULT_MAX_PAGE
    #: IDs or pairs one call may take (``limits.max_ids``); more is `LimitError` before any query.
    max_ids: int = DEFAULT_MAX_IDS
    #: IDs one query carries (``limits.id_chunk``); a bigger call runs as several queries.
    id_chunk: int = DEFAULT_ID_CHUNK
    #: Longest page cursor accepted, in characters (``limits.max_cursor_bytes``).
    max_cursor_bytes: int = DEFAULT_MAX_CURSOR_BYTES
    #: Deepest nesting of objects and arrays in an object's data (``limits.max_depth``).
    max_depth: int = DEFAULT_MAX_DEPTH
    instagram_epoch_ms: int = INSTAGRAM_EPOCH_MS
    pool_size: int = DEFAULT_POOL_SIZE
    #: Bounds on every database call of the request path: opening a connection, waiting for
    #: one reply (a host that stops answering fails its shards' calls after this), and waiting
    #: for a free pooled connection.
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S
    pool_timeout_s: float = DEFAULT_POOL_TIMEOUT_S
    #: How long a write keeps retrying a step that cannot land yet (an update whose object's
    #: unique values other writers keep changing) before `WriteTimeoutError`.
    write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S
    #: A pooled connection older than this is closed and replaced at checkout (set it below the
    #: servers' ``wait_timeout`` and any proxy's idle cut-off).
    pool_recycle_s: float = DEFAULT_POOL_RECYCLE_S
    tickets: TicketsConfig | None = None
    #: Where running stores read the live map: None (the map above), ("file", path),
    #: ("table", url) or ("zookeeper", hosts).
    map_source: tuple[str, str] | None = None
    map_poll_s: float = 1.0
    #: The map table's (application URL, admin URL), when ``map_source`` is a table.
    map_table: tuple[URL, URL] | None = None
    base_dir: Path = field(default_factory=Path.cwd)
    #: Unique keys by name (config ``unique:``).
    unique: Mapping[str, UniqueSpec] = field(default_factory=dict)
    #: The admin URL of each host (``hosts.NAME.admin``; the application's URL where none is given):
    #: init, move, promote, repair and check connect with these (see `for_admin`).
    admin_hosts: Mapping[str, URL] = field(default_factory=dict)
    #: "app" (the request path's accounts) or "admin" (a config made by `for_admin`).
    role: str = "app"
    #: ``hosts.NAME.replication_host``: (host, port or None) a replica uses to reach NAME, where that
    #: differs from the URL's (containers, NAT, a proxy in front of the application).
    replication_hosts: Mapping[str, tuple[str, int | None]] = field(default_factory=dict)
    #: The names of every database, schema and cache key the store makes (config ``namespace:``;
    #: none: ``db00042``, ``store_meta``, ...).
    names: Names = DEFAULT_NAMES
    #: The secret page cursors are signed with (``cursor_secret``, ``cursor_secret_env`` or
    #: ``cursor_secret_file``); None: cursors are not signed. Never shown in a repr.
    cursor_secret: bytes | None = field(default=None, repr=False)

    @property
    def namespace(self) -> str | None:
        """The config's ``namespace:`` (None: none)."""
        return self.names.namespace

    def for_admin(self) -> StoreConfig:
        """This config with every host's admin URL in place of its application URL.

        Admin work (`store init`, move, promote, repair, check) runs on the
        result; the request path runs on the config itself, whose accounts
        need no CREATE, DROP, ALTER or GRANT (`store grants`).
        """
        if self.role == "admin":
            return self
        table = None if self.map_table is None else (self.map_table[1], self.map_table[1])
        return replace(self, hosts=dict(self.admin_hosts or self.hosts), map_table=table, role="admin")

    def replication_address(self, host: str, default_port: int) -> tuple[str, int]:
        """(host, port) a replica of ``host`` connects to: its ``replication_host``, else its URL's.

        A ``replication_host`` without a port keeps the URL's port; a URL
        without one gives ``default_port`` (the backend's).
        """
        url = self.hosts[host]
        name, port = self.replication_hosts.get(host, (None, None))
        return name or url.host or "127.0.0.1", port or url.port or default_port

    @property
    def shards(self) -> int:
        """How many logical shards exist (0..shards-1)."""
        return self.shard_map.shards

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> StoreConfig:
        """Read a YAML config; relative SQLite paths resolve against its folder."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror}") from exc
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {p} is not valid YAML: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {p} must hold a mapping of keys (ids, shards, ...)")
        return cls.from_dict(raw, base_dir=p.resolve().parent)

    @classmethod
    def from_dict(
        cls,
        raw: Mapping[str, Any],
        *,
        base_dir: str | os.PathLike[str] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> StoreConfig:
        """Validate a config mapping (as loaded from YAML) into a `StoreConfig`."""
        env = os.environ if environ is None else environ
        base = Path(base_dir) if base_dir is not None else Path.cwd()
        if not isinstance(raw, Mapping):
            raise ConfigError("config must be a mapping of keys (ids, shards, hosts, map, types)")
        unknown = sorted(map(_key, set(raw) - _TOP_KEYS))
        if unknown:
            raise ConfigError(
                f"unknown config key(s) {', '.join(unknown)}; known keys are {', '.join(sorted(_TOP_KEYS))}"
            )
        ids = raw.get("ids", "pinterest")
        if ids not in ("pinterest", "instagram"):
            raise ConfigError(f"ids must be 'pinterest' or 'instagram', got {brief(ids)}")
        shards = _int(raw, "shards", None, 1, 65536 if ids == "pinterest" else 8192)
        hosts, admin_hosts, replication_hosts = _hosts(raw.get("hosts"), env, base)
        shard_map = _map(raw.get("map"), shards, hosts)
        _check_backends(ids, hosts)
        types = _types(raw.get("types"), ids)
        relations = _relations(raw.get("relations"), types)
        unique = _unique(raw.get("unique"), types)
        open_shards = _open_shards(raw.get("open_shards"), shards)
        map_source, map_poll_s, map_table = _map_source(raw.get("map_source"), env, base)
        limits = raw.get("limits") or {}
        if not isinstance(limits, Mapping):
            raise ConfigError("limits must be a mapping, e.g. {max_object_bytes: 1048576}")
        bad = sorted(map(brief, set(limits) - LIMIT_KEYS))
        if bad:
            raise ConfigError(f"unknown limits key(s) {bad}; known: {', '.join(sorted(LIMIT_KEYS))}")
        names = Names(raw.get("namespace"))
        insta = raw.get("instagram") or {}
        if not isinstance(insta, Mapping) or set(insta) - {"epoch_ms"}:
            raise ConfigError("instagram must be a mapping with one key, epoch_ms")
        cache = _cache(raw.get("cache"))
        _check_invalidation(cache, hosts)
        return cls(
            ids=ids,
            shard_map=shard_map,
            hosts=hosts,
            admin_hosts=admin_hosts,
            replication_hosts=replication_hosts,
            types=types,
            relations=relations,
            open_shards=open_shards,
            cache=cache,
            max_object_bytes=_int(
                limits, "max_object_bytes", DEFAULT_MAX_OBJECT_BYTES, 2, MAX_OBJECT_BYTES_CEILING
            ),
            max_page=_int(limits, "max_page", DEFAULT_MAX_PAGE, 1, 1_000_000),
            max_ids=_int(limits, "max_ids", DEFAULT_MAX_IDS, 1, 100_000_000),
            id_chunk=_int(limits, "id_chunk", DEFAULT_ID_CHUNK, 1, 30_000),
            max_cursor_bytes=_int(limits, "max_cursor_bytes", DEFAULT_MAX_CURSOR_BYTES, 64, 65_536),
            max_depth=_int(limits, "max_depth", DEFAULT_MAX_DEPTH, 1, 1000),
            instagram_epoch_ms=_int(insta, "epoch_ms", INSTAGRAM_EPOCH_MS, 0, 1 << 62),
            pool_size=_int(raw, "pool_size", DEFAULT_POOL_SIZE, 1, 1000),
            connect_timeout_s=_seconds(raw, "connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S),
            query_timeout_s=_seconds(raw, "query_timeout_s", DEFAULT_QUERY_TIMEOUT_S),
            pool_timeout_s=_seconds(raw, "pool_timeout_s", DEFAULT_POOL_TIMEOUT_S),
            write_timeout_s=_seconds(raw, "write_timeout_s", DEFAULT_WRITE_TIMEOUT_S),
            pool_recycle_s=_seconds(raw, "pool_recycle_s", DEFAULT_POOL_RECYCLE_S, 365 * 86400.0),
            tickets=(
                None
                if raw.get("tickets") is None
                else TicketsConfig.from_dict(raw["tickets"], base, names=names)
            ),
            map_source=map_source,
            map_poll_s=map_poll_s,
            map_table=map_table,
            base_dir=base,
            unique=unique,
            names=names,
            cursor_secret=_cursor_secret(raw, env, base),
        )

    def type_by_name(self, name: str) -> TypeSpec:
        """The type called ``name``."""
        return self.types[name]


def host_env_var(host: str) -> str:
    """The environment variable that overrides ``host``'s URL."""
    return "STORE_HOST_" + re.sub(r"[^A-Za-z0-9]", "_", host).upper()


def admin_host_env_var(host: str) -> str:
    """The environment variable that overrides ``host``'s admin URL."""
    return "STORE_ADMIN_HOST_" + re.sub(r"[^A-Za-z0-9]", "_", host).upper()


def _key(key: object) -> str:
    """A key for a message: as it is if it is a short printable str, else quoted and cut short."""
    if isinstance(key, str) and len(key) <= 64 and key.isprintable():
        return key
    return brief(key)


def _int(raw: Mapping[str, Any], key: str, default: int | None, low: int, high: int) -> int:
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"{key} is required: an int in {low}..{high}")
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"{key} must be an int in {low}..{high}, got {brief(value)}")
    return value


def _seconds(raw: Mapping[str, Any], key: str, default: float, high: float = 3600.0) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= high:
        raise ConfigError(f"{key} must be a number of seconds in (0, {high:g}], got {brief(value)}")
    return float(value)


_HOST_KEYS = frozenset({"url", "password_env", "password_file", "admin"})
_CREDENTIAL_KEYS = frozenset({"url", "password_env", "password_file"})
#: Keys of a ``hosts:`` entry: the credentials, ``admin`` and where replicas reach the server.
_HOST_ENTRY_KEYS = _HOST_KEYS | {"replication_host"}
_REPLICATION_HOST = re.compile(
    r"^(?:\[(?P<ip6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9_.\-]{1,253}))(?::(?P<port>[0-9]{1,5}))?$"
)


def _replication_host(raw: object, where: str, url: URL) -> tuple[str, int | None]:
    """``HOST``, ``HOST:PORT`` or ``[IPv6]:PORT``: where a replica reaches this server."""
    shape = (
        f"{where} must be HOST or HOST:PORT, the address a replica uses to reach this server "
        "(e.g. mariadb-a or mariadb-a:3306; [::1]:3306 for IPv6)"
    )
    if backend_for(url).made_on_first_use:
        raise ConfigError(
            f"{where} is for MariaDB and PostgreSQL hosts: a {url.get_backend_name()} host has no replicas"
        )
    match = _REPLICATION_HOST.fullmatch(raw) if isinstance(raw, str) else None
    if match is None:
        raise ConfigError(f"{shape}, got {brief(raw)}")
    port = None if match["port"] is None else int(match["port"])
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError(f"{where} has port {port}, outside 1..65535")
    return match["ip6"] or match["name"], port


def _hosts(
    raw: object, env: Mapping[str, str], base: Path
) -> tuple[dict[str, URL], dict[str, URL], dict[str, tuple[str, int | None]]]:
    """Each host's application URL, admin URL (the same where no ``admin`` is given), replication_host."""
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(
            "hosts must map host names to SQLAlchemy URLs, "
            "e.g. {MySQL001A: 'mysql+pymysql://root@127.0.0.1:3306'}"
        )
    app: dict[str, URL] = {}
    admin: dict[str, URL] = {}
    replication: dict[str, tuple[str, int | None]] = {}
    for name, entry in raw.items():
        if not isinstance(name, str) or not _HOST_NAME.fullmatch(name):
            raise ConfigError(
                "host names under hosts must be 1-64 letters, digits, '_', '.' or '-' "
                f"(a tombstone records them), got {brief(name)}"
            )
        where = f"hosts.{name}"
        admin_entry: object = None
        replication_entry: object = None
        if isinstance(entry, Mapping):
            extra = sorted(map(brief, set(entry) - _HOST_ENTRY_KEYS))
            if extra:
                raise ConfigError(
                    f"{where} has unknown key(s) {extra}; known: {', '.join(sorted(_HOST_ENTRY_KEYS))}"
                )
            admin_entry = entry.get("admin")
            replication_entry = entry.get("replication_host")
            entry = {k: v for k, v in entry.items() if k != "replication_host"}
        url = _credentialed_url(entry, where, env.get(host_env_var(name)), env, base)
        app[name] = _checked(name, url, base)
        if replication_entry is not None:
            replication[name] = _replication_host(replication_entry, f"{where}.replication_host", app[name])
        if admin_entry is None:
            admin_url = env.get(admin_host_env_var(name))
            admin[name] = (
                app[name] if admin_url is None else _checked(name, _parse_url(admin_url, where), base)
            )
        else:
            if isinstance(admin_entry, Mapping) and "admin" in admin_entry:
                raise ConfigError(f"{where}.admin cannot itself have an admin")
            url = _credentialed_url(
                admin_entry, f"{where}.admin", env.get(admin_host_env_var(name)), env, base
            )
            admin[name] = _checked(name, url, base)
            if backend_for(admin[name]) is not backend_for(app[name]):
                raise ConfigError(f"{where}.admin must name the same kind of server as {where}.url")
    return app, admin, replication


def _checked(name: str, url: URL, base: Path) -> URL:
    try:
        backend = backend_for(url)
    except ConfigError as exc:
        raise ConfigError(f"hosts.{name} uses {exc}") from None
    return backend.check_url(name, url, base)


def _parse_url(text: object, where: str) -> URL:
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{where} must be a URL string, got {type(text).__name__}")
    try:
        return make_url(text)
    except ArgumentError:
        # The text may hold a password: name the key, never echo the value.
        raise ConfigError(
            f"{where} is not a valid SQLAlchemy URL (dialect+driver://user@host:port)"
        ) from None


def _credentialed_url(
    entry: object, where: str, override: str | None, env: Mapping[str, str], base: Path
) -> URL:
    """A URL from ``URL`` or ``{url, password_env | password_file}``, the password filled in.

    ``override`` (an environment variable's value) replaces the URL text. A
    password is given once: in the URL, or by ``password_env`` (the name of
    an environment variable), or by ``password_file`` (a file holding it; one
    trailing newline is dropped; relative to the config's folder).
    """
    if isinstance(entry, str):
        return _parse_url(override or entry, where)
    if not isinstance(entry, Mapping):
        raise ConfigError(
            f"{where} must be a URL string or a mapping {{url: URL, password_env: VAR}} / "
            f"{{url: URL, password_file: PATH}}, got {type(entry).__name__}"
        )
    extra = sorted(map(brief, set(entry) - _CREDENTIAL_KEYS - {"admin"}))
    if extra:
        raise ConfigError(f"{where} has unknown key(s) {extra}; known: {', '.join(sorted(_CREDENTIAL_KEYS))}")
    if "url" not in entry and override is None:
        raise ConfigError(f"{where} needs url: the SQLAlchemy URL, without its password")
    url = _parse_url(override or entry["url"], f"{where}.url")
    sources = [k for k in ("password_env", "password_file") if entry.get(k) is not None]
    if not sources:
        return url
    if len(sources) > 1 or url.password is not None:
        raise ConfigError(
            f"{where} gives its password more than once; keep one of the URL's password, "
            "password_env and password_file"
        )
    key = sources[0]
    password = read_secret(f"{where}.{key}", entry[key], from_file=key == "password_file", env=env, base=base)
    if not password:
        raise ConfigError(f"{where}.{key} gives an empty password; leave the key out for none")
    return url.set(password=password)


def read_secret(where: str, ref: object, *, from_file: bool, env: Mapping[str, str], base: Path) -> str:
    """The secret a ``*_env`` key (``ref`` names an environment variable) or a ``*_file`` key (``ref``
    is a path, relative to ``base``: one trailing newline is dropped) points at; ``where`` is the key."""
    if not isinstance(ref, str) or not ref:
        raise ConfigError(f"{where} must be a non-empty string, got {type(ref).__name__}")
    if not from_file:
        if not _ENV_NAME.fullmatch(ref):
            raise ConfigError(f"{where} must name an environment variable (A-Z, 0-9, _), got {brief(ref)}")
        secret = env.get(ref)
        if secret is None:
            other = where[: -len("_env")] + "_file" if where.endswith("_env") else "a file"
            raise ConfigError(f"{where} names ${ref}, which is not set: export it or use {other}")
        return secret
    path = Path(ref)
    path = path if path.is_absolute() else base / path
    try:
        secret = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"{where}: cannot read {path}: {why}") from None
    secret = secret[:-1] if secret.endswith("\n") else secret
    return secret[:-1] if secret.endswith("\r") else secret


#: The config's keys that give the secret page cursors are signed with (one at most).
CURSOR_SECRET_KEYS = ("cursor_secret", "cursor_secret_env", "cursor_secret_file")
#: The shortest cursor secret accepted, in bytes (UTF-8).
MIN_CURSOR_SECRET_BYTES = 16


def _cursor_secret(raw: Mapping[str, Any], env: Mapping[str, str], base: Path) -> bytes | None:
    """The secret of ``cursor_secret``, ``cursor_secret_env`` or ``cursor_secret_file`` (None: unsigned)."""
    given = [k for k in CURSOR_SECRET_KEYS if raw.get(k) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise ConfigError(
            f"{', '.join(given)} given together: keep exactly one of cursor_secret, "
            "cursor_secret_env (an environment variable's name) and cursor_secret_file (a file's path)"
        )
    key = given[0]
    if key == "cursor_secret":
        secret = raw[key]
        if not isinstance(secret, str):
            raise ConfigError(f"cursor_secret must be a string, got {type(secret).__name__}")
    else:
        secret = read_secret(key, raw[key], from_file=key == "cursor_secret_file", env=env, base=base)
    data = secret.encode("utf-8")
    if len(data) < MIN_CURSOR_SECRET_BYTES:
        # Never echo the secret: say how long it is and how long it must be.
        raise ConfigError(
            f"{key} gives a secret of {len(data)} bytes; page cursors need at least "
            f"{MIN_CURSOR_SECRET_BYTES} (e.g. the output of `openssl rand -base64 32`)"
        )
    return data


_MapSource = tuple[tuple[str, str] | None, float, tuple[URL, URL] | None]


def _map_source(raw: object, env: Mapping[str, str], base: Path) -> _MapSource:
    if raw is None:
        return None, 1.0, None
    kinds = {"file", "table", "zookeeper"}
    if not isinstance(raw, Mapping) or len(set(raw) & kinds) != 1 or set(raw) - kinds - {"poll_s"}:
        raise ConfigError(
            "map_source must be {file: PATH}, {table: mysql+pymysql://HOST:3306, poll_s: 1} or "
            "{zookeeper: HOST:2181[,HOST:2181]}: where running stores read the live shard map"
        )
    poll = raw.get("poll_s", 1.0)
    if not isinstance(poll, int | float) or not 0 < poll <= 3600:
        raise ConfigError(f"map_source.poll_s must be a number of seconds in (0, 3600], got {brief(poll)}")
    if "zookeeper" in raw:
        hosts = raw["zookeeper"]
        if not isinstance(hosts, str) or not all(_HOST_PORT.fullmatch(h) for h in hosts.split(",")):
            raise ConfigError(f"map_source.zookeeper must be host:port[,host:port...], got {brief(hosts)}")
        return ("zookeeper", hosts), float(poll), None
    if "file" in raw:
        if not isinstance(raw["file"], str) or not raw["file"]:
            raise ConfigError(f"map_source.file must be a path, got {brief(raw['file'])}")
        path = Path(raw["file"])
        return ("file", str(path if path.is_absolute() else base / path)), float(poll), None
    entry = raw["table"]
    if isinstance(entry, Mapping) and set(entry) - _HOST_KEYS:
        extra = sorted(map(brief, set(entry) - _HOST_KEYS))
        raise ConfigError(
            f"map_source.table has unknown key(s) {extra}; known: {', '.join(sorted(_HOST_KEYS))}"
        )
    app = _credentialed_url(entry, "map_source.table", None, env, base)
    admin_entry = entry.get("admin") if isinstance(entry, Mapping) else None
    admin = (
        app
        if admin_entry is None
        else _credentialed_url(admin_entry, "map_source.table.admin", None, env, base)
    )
    checked = []
    for url, where in ((app, "map_source.table"), (admin, "map_source.table.admin")):
        if not _mariadb(url):
            raise ConfigError(f"{where} must be a MariaDB URL, got {url.drivername}://...")
        checked.append(_mysql_tls_checked(url, where, base))
    app, admin = checked
    return ("table", app.render_as_string(hide_password=True)), float(poll), (app, admin)


def _mysql_tls_checked(url: URL, where: str, base: Path) -> URL:
    """``url`` with its TLS files made absolute (from the config's folder) and its TLS parameters checked."""
    from store.tls import absolute_files, mysql_tls

    try:
        url = absolute_files(url, base)
        mysql_tls(url)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    return url


def _check_backends(ids: str, hosts: Mapping[str, URL]) -> None:
    for name, url in hosts.items():
        backend = backend_for(url)
        if ids not in backend.serves_ids:
            able = sorted({b for b in backend_names() if ids in backend_named(b).serves_ids})
            serves = ", ".join(sorted(backend.serves_ids))
            raise ConfigError(
                f"hosts.{name} is a {backend.name} host, which serves ids: {serves}; "
                f"use {' or '.join(able)} hosts for ids: {ids}"
            )


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


def _mariadb(url: URL) -> bool:
    """True if ``url`` names a server that can hold the map table and ticket counters (MariaDB)."""
    try:
        backend = backend_for(url)
    except ConfigError:
        return False
    return backend.can_hold_tickets


def _pair(value: object, what: str, shards: int) -> tuple[int, int]:
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise ConfigError(f"{what} must be [first, last] shard numbers, got {brief(value)}")
    low, high = value
    if low > high:
        raise ConfigError(f"{what} [{brief(low)}, {brief(high)}] is reversed: write [low, high]")
    if low < 0 or high >= shards:
        raise ConfigError(
            f"{what} [{brief(low)}, {brief(high)}] goes beyond shards 0..{shards - 1}; "
            "shrink it or raise shards"
        )
    return low, high


def _map(raw: object, shards: int, hosts: Mapping[str, URL]) -> ShardMap:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(
            f"map must be a list of ranges, e.g. [{{range: [0, {shards - 1}], master: HOST, slave: HOST}}]"
        )
    ranges = []
    for i, item in enumerate(raw):
        what = f"map[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{what} must be a mapping with range, master and optional slave")
        extra = sorted(map(brief, set(item) - {"range", "master", "slave"}))
        if extra:
            raise ConfigError(f"{what} has unknown key(s) {extra}; known: range, master, slave")
        low, high = _pair(item.get("range"), f"{what}.range", shards)
        for role in ("master", "slave"):
            host = item.get(role)
            if host is None and role == "slave":
                continue
            if not isinstance(host, str) or host not in hosts:
                raise ConfigError(
                    f"{what}.{role} is {brief(host)}, which is not under hosts; "
                    f"known hosts: {', '.join(hosts)}"
                )
        ranges.append(ShardRange(low, high, item["master"], item.get("slave")))
    return ShardMap(ranges, shards=shards)


def _types(raw: object, ids: str) -> dict[str, TypeSpec]:
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError("types must map type names to {id: N, table: NAME}, e.g. pin: {id: 1, table: pins}")
    out: dict[str, TypeSpec] = {}
    by_id: dict[int, str] = {}
    tables: dict[str, str] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not _IDENT.fullmatch(name):
            raise ConfigError(
                f"types: type name {brief(name)} must be lower_snake_case (a-z, 0-9, _), 64 chars at most"
            )
        if not isinstance(spec, Mapping) or set(spec) - {"id", "table"}:
            raise ConfigError(f"types.{name} must be {{id: N, table: NAME}}, got {brief(spec)}")
        type_id = spec.get("id")
        if not isinstance(type_id, int) or isinstance(type_id, bool) or not 0 <= type_id <= 1023:
            raise ConfigError(f"types.{name}.id must be an int in 0..1023 (10 bits), got {brief(type_id)}")
        if type_id in by_id:
            raise ConfigError(
                f"types.{name}.id {type_id} is already used by type {brief(by_id[type_id])}; "
                "each type needs its own id"
            )
        table = spec.get("table", name)
        if not isinstance(table, str) or not _IDENT.fullmatch(table):
            raise ConfigError(f"types.{name}.table {brief(table)} must be lower_snake_case, at most 64 chars")
        if table in RESERVED_TABLES:
            raise ConfigError(f"types.{name}.table {brief(table)} is reserved for {RESERVED_TABLES[table]}")
        if table in tables:
            raise ConfigError(
                f"types.{name}.table {brief(table)} is also the table of type {brief(tables[table])}"
            )
        by_id[type_id] = name
        tables[table] = name
        out[name] = TypeSpec(name, type_id, table)
    return out


def _relations(raw: object, types: Mapping[str, TypeSpec]) -> dict[str, RelationSpec]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError("relations must map names to {from: TYPE, to: TYPE, inverse: NAME}")
    tables = {t.table for t in types.values()}
    out: dict[str, RelationSpec] = {}

    def add(spec: RelationSpec) -> None:
        if spec.name in tables:
            raise ConfigError(f"relations: {brief(spec.name)} has the same name as an object table")
        if spec.name in RESERVED_TABLES:
            raise ConfigError(
                f"relations: {brief(spec.name)} is the table of {RESERVED_TABLES[spec.name]}; "
                "pick another relation name"
            )
        old = out.get(spec.name)
        if old is None:
            out[spec.name] = spec
        elif (old.from_type, old.to_type, old.inverse) != (spec.from_type, spec.to_type, spec.inverse):
            raise ConfigError(
                f"relations: {brief(spec.name)} is defined twice, differently "
                f"(once as the inverse of {brief(old.inverse or spec.inverse)}); make them agree"
            )

    for name, spec in raw.items():
        if not isinstance(name, str) or not _IDENT.fullmatch(name):
            raise ConfigError(
                f"relations: relation name {brief(name)} must be lower_snake_case (a-z, 0-9, _), "
                "64 chars at most"
            )
        if not isinstance(spec, Mapping) or set(spec) - {"from", "to", "inverse"}:
            raise ConfigError(f"relations.{name} must be {{from: TYPE, to: TYPE, inverse: NAME}}")
        for end in ("from", "to"):
            if not isinstance(spec.get(end), str) or spec.get(end) not in types:
                raise ConfigError(
                    f"relations.{name}.{end} is {brief(spec.get(end))}, which is not a type; "
                    f"known types: {', '.join(types)}"
                )
        inverse = spec.get("inverse")
        if inverse is not None and (not isinstance(inverse, str) or not _IDENT.fullmatch(inverse)):
            raise ConfigError(f"relations.{name}.inverse {brief(inverse)} must be lower_snake_case")
        if inverse == name:
            raise ConfigError(f"relations.{name}.inverse names the relation itself")
        add(RelationSpec(name, spec["from"], spec["to"], inverse))
        if inverse is not None:
            add(RelationSpec(inverse, spec["to"], spec["from"], name, primary=False))
    return out


def _unique(raw: object, types: Mapping[str, TypeSpec]) -> dict[str, UniqueSpec]:
    shape = (
        "unique must map key names to {type: TYPE, field: FIELD}, "
        "e.g. user_by_username: {type: user, field: username}"
    )
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(shape)
    out: dict[str, UniqueSpec] = {}
    seen: dict[tuple[str, str], str] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not _IDENT.fullmatch(name):
            raise ConfigError(
                f"unique: key name {brief(name)} must be lower_snake_case (a-z, 0-9, _), 64 chars at most"
            )
        if not isinstance(spec, Mapping) or set(spec) != {"type", "field"}:
            raise ConfigError(f"unique.{name} must be {{type: TYPE, field: FIELD}}")
        if not isinstance(spec["type"], str) or spec["type"] not in types:
            raise ConfigError(
                f"unique.{name}.type is {brief(spec['type'])}, which is not a type; "
                f"known types: {', '.join(types)}"
            )
        fld = spec["field"]
        if not isinstance(fld, str) or not fld:
            raise ConfigError(f"unique.{name}.field must be the name of a top-level field of the object")
        other = seen.get((spec["type"], fld))
        if other is not None:
            raise ConfigError(f"unique.{name} and unique.{other} both index {spec['type']}.{fld}; keep one")
        seen[(spec["type"], fld)] = name
        out[name] = UniqueSpec(name, spec["type"], fld)
    return out


def _open_shards(raw: object, shards: int) -> tuple[tuple[int, int], ...]:
    if raw is None:
        return ((0, shards - 1),)
    if isinstance(raw, list) and raw and all(isinstance(v, list | tuple) for v in raw):
        return tuple(_pair(v, f"open_shards[{i}]", shards) for i, v in enumerate(raw))
    return (_pair(raw, "open_shards", shards),)


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


INVALIDATION_MODES = ("window", "log", "binlog")


def _invalidation(raw: object) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``cache.invalidation``: one mode for every host, or a mapping of host name (or ``default``) to mode."""
    usage = (
        "cache.invalidation must be window, log or binlog, or a mapping of host names (and default) to "
        "one of them, e.g. {default: binlog, pg1: log}"
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
    if not isinstance(raw, Mapping) or set(raw) - known:
        bad = sorted(map(brief, set(raw) - known)) if isinstance(raw, Mapping) else raw
        raise ConfigError(
            f"cache must be a mapping with memcached: [host:port, ...], redis: URL or [URL, ...] "
            "and/or memory: true "
            f"(and optionally {', '.join(sorted(known - {'memcached', 'redis', 'memory'}))}); "
            f"got {brief(bad)}"
        )
    mc = raw.get("memcached") or []
    if isinstance(mc, str):
        mc = [mc]
    if not isinstance(mc, list) or not all(isinstance(s, str) and _HOST_PORT.fullmatch(s) for s in mc):
        raise ConfigError(f"cache.memcached must be a list of host:port strings, got {brief(mc)}")
    redis = _redis_urls(raw.get("redis"))
    memory = raw.get("memory", False)
    if not isinstance(memory, bool):
        raise ConfigError(f"cache.memory must be true or false, got {brief(memory)}")
    prefix = raw.get("prefix", "s:")
    if not isinstance(prefix, str) or not re.match(r"^[A-Za-z0-9_:.-]{0,32}$", prefix):
        raise ConfigError(f"cache.prefix must be up to 32 letters, digits or _:.- , got {brief(prefix)}")
    ints = {k: _int(raw, f"{k}", CacheConfig.__dataclass_fields__[k].default, lo, hi)  # type: ignore[arg-type]
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
