"""Load and validate the store's YAML config into frozen values.

`StoreConfig.from_file` / `StoreConfig.from_dict` check everything up front
and raise `ConfigError` naming the key at fault and how to fix it. Host URLs
may be overridden by environment variables, ``STORE_HOST_<NAME>`` where NAME is
the host name upper-cased with every other character turned into ``_`` (so
``MySQL001A`` reads ``STORE_HOST_MYSQL001A``): secrets stay out of the file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy.engine import URL

from store.config.cache import (
    DEFAULT_MAX_STALE_S,
    INVALIDATION_MODES,
    CacheConfig,
    _cache,
    _check_invalidation,
    redis_server_name,
)
from store.config.checks import _COUNTER, _int, _key, _keys, _seconds
from store.config.hosts import (
    CURSOR_SECRET_KEYS,
    MIN_CURSOR_SECRET_BYTES,
    _check_backends,
    _cursor_secret,
    _hosts,
    _map_source,
    _mariadb,
    _mysql_tls_checked,
    _parse_url,
    admin_host_env_var,
    host_env_var,
    read_secret,
)
from store.config.layout import RESERVED_TABLES, _map, _open_shards, _relations, _types, _unique
from store.exceptions import ConfigError, brief
from store.ids import INSTAGRAM_EPOCH_MS
from store.naming import DEFAULT_NAMES, Names
from store.shardmap import ShardMap
from store.specs import RelationSpec, TypeSpec, UniqueSpec

__all__ = [
    "CURSOR_SECRET_KEYS",
    "DEFAULT_MAX_OBJECT_BYTES",
    "DEFAULT_MAX_STALE_S",
    "INVALIDATION_MODES",
    "MIN_CURSOR_SECRET_BYTES",
    "RESERVED_TABLES",
    "ConfigError",
    "read_secret",
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
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_QUERY_TIMEOUT_S = 30.0
DEFAULT_POOL_TIMEOUT_S = 30.0
#: How long a write keeps retrying what cannot land yet (an update racing writers of its unique values).
DEFAULT_WRITE_TIMEOUT_S = 10.0
#: Connections older than this are replaced at checkout (below MariaDB's default wait_timeout of 8 h).
DEFAULT_POOL_RECYCLE_S = 3600.0
DEFAULT_POOL_IDLE_S = 10.0
#: Keys of the ``limits:`` section.
LIMIT_KEYS = frozenset(
    {"max_object_bytes", "max_page", "max_ids", "id_chunk", "max_cursor_bytes", "max_depth"}
)
_TOP_KEYS = frozenset(
    {"ids", "shards", "open_shards", "hosts", "map", "types", "relations", "cache", "limits",
     "instagram", "pool_size", "tickets", "map_source", "connect_timeout_s", "query_timeout_s",
     "pool_timeout_s", "pool_recycle_s", "pool_idle_s", "pool_overflow", "unique", "write_timeout_s",
     "namespace", "cursor_secret", "cursor_secret_env", "cursor_secret_file"}
)  # fmt: skip


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
        known = {"servers", "counters", "block", "retry_after_s", "timeout_s"}
        if set(raw) - known:
            raise ConfigError(f"unknown tickets key(s) {_keys(set(raw) - known)}; known: {_keys(known)}")
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
    #: Connections a host may open beyond ``pool_size`` at a busy moment (SQLAlchemy's
    #: ``max_overflow``); None: as many again as ``pool_size``.
    pool_overflow: int | None = None
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
    #: Connections beyond ``pool_size`` (a burst opens up to `max_open`) are closed once one of
    #: them has sat idle this long; ``pool_size`` of them are kept however long they wait.
    pool_idle_s: float = DEFAULT_POOL_IDLE_S
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

    @property
    def max_open(self) -> int:
        """The most connections one host's pool opens at once: ``pool_size`` + ``pool_overflow``."""
        return self.pool_size + (self.pool_size if self.pool_overflow is None else self.pool_overflow)

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
            mark = getattr(exc, "problem_mark", None)
            where = "" if mark is None else f"line {mark.line + 1}, column {mark.column + 1}: "
            why = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"config file {p} is not valid YAML: {where}{why}") from exc
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
        bad = set(limits) - LIMIT_KEYS
        if bad:
            raise ConfigError(f"unknown limits key(s) {_keys(bad)}; known: {_keys(LIMIT_KEYS)}")
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
                limits, "max_object_bytes", DEFAULT_MAX_OBJECT_BYTES, 2, MAX_OBJECT_BYTES_CEILING, "limits."
            ),
            max_page=_int(limits, "max_page", DEFAULT_MAX_PAGE, 1, 1_000_000, "limits."),
            max_ids=_int(limits, "max_ids", DEFAULT_MAX_IDS, 1, 100_000_000, "limits."),
            id_chunk=_int(limits, "id_chunk", DEFAULT_ID_CHUNK, 1, 30_000, "limits."),
            max_cursor_bytes=_int(
                limits, "max_cursor_bytes", DEFAULT_MAX_CURSOR_BYTES, 64, 65_536, "limits."
            ),
            max_depth=_int(limits, "max_depth", DEFAULT_MAX_DEPTH, 1, 1000, "limits."),
            instagram_epoch_ms=_int(insta, "epoch_ms", INSTAGRAM_EPOCH_MS, 0, 1 << 62, "instagram."),
            pool_size=_int(raw, "pool_size", DEFAULT_POOL_SIZE, 1, 1000),
            pool_overflow=None
            if raw.get("pool_overflow") is None
            else _int(raw, "pool_overflow", 0, 0, 1000),
            connect_timeout_s=_seconds(raw, "connect_timeout_s", DEFAULT_CONNECT_TIMEOUT_S),
            query_timeout_s=_seconds(raw, "query_timeout_s", DEFAULT_QUERY_TIMEOUT_S),
            pool_timeout_s=_seconds(raw, "pool_timeout_s", DEFAULT_POOL_TIMEOUT_S),
            write_timeout_s=_seconds(raw, "write_timeout_s", DEFAULT_WRITE_TIMEOUT_S),
            pool_recycle_s=_seconds(raw, "pool_recycle_s", DEFAULT_POOL_RECYCLE_S, 365 * 86400.0),
            pool_idle_s=_seconds(raw, "pool_idle_s", DEFAULT_POOL_IDLE_S, 365 * 86400.0),
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
