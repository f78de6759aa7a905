"""`store invalidate`: one invalidator per database server, leader or standby, and the daemon running them.

The daemon opens everything it uses itself (a `Store` of its own for key
naming and the caches, a lock connection and a binlog stream per server),
so it shares no socket with any other process.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from store.cache.follower import CLEAN_BATCH, parse_entries
from store.cache.heartbeat import (
    HEARTBEAT_EVERY_S,
    HEARTBEAT_TTL_S,
    Heartbeat,
    encode_heartbeat,
    heartbeat_key,
)
from store.cache.invalidators import STATUS_TTL_S, encode_status, servers_of, status_key
from store.cache.leases import wall_ms
from store.config import StoreConfig
from store.exceptions import ConfigError, StoreError
from store.ids import encode_pinterest
from store.invalidate.leader import Leadership, close_quietly, lock_name
from store.invalidate.sources import POSITION_TABLE, BinlogKeys, BinlogSource, LogTableSource, Position
from store.invalidate.wal import WalSource
from store.naming import COUNTS_TABLE, Names

__all__ = ["CacheDeleteError", "Daemon", "HostInvalidator", "position_key"]

log = logging.getLogger(__name__)

#: How long the binlog stream may go without a byte (the server sends a heartbeat every 0.25 s).
STREAM_TIMEOUT_S = 2.0

#: How often the binlog source's position is written to its server (it is in the caches every tick).
SAVE_ON_HOST_EVERY_S = 30.0

#: MariaDB's errors for a missing table and a missing database.
_NO_SUCH_TABLE, _NO_SUCH_DATABASE = 1146, 1049


class CacheDeleteError(StoreError):
    """A cache did not take every delete: the keys are kept and deleted again at the next tick."""


def position_key(prefix: str, server: str) -> str:
    """The cache key where a server's binlog position is saved."""
    return f"{prefix}inv:{server}"


class HostInvalidator:
    """One database server's invalidator: a standby until it holds the server's lock, then the leader."""

    def __init__(
        self,
        *,
        server: str,
        hosts: Sequence[str],
        mode: str,
        leadership: Leadership,
        source: LogTableSource | BinlogSource | WalSource,
        publish: Callable[[Sequence[str], Heartbeat], bool],
        tick_s: float = HEARTBEAT_EVERY_S,
        announce: Callable[[HostInvalidator], None] | None = None,
    ) -> None:
        self.server = server
        self.hosts = list(hosts)
        self.mode = mode
        self._leadership = leadership
        self.source = source
        self._publish = publish
        self._tick_s = tick_s
        self._announce = announce
        #: "standby", "leader" or "stopped".
        self.role = "standby"
        self.heartbeat: Heartbeat | None = None
        self.terms = 0
        self.errors = 0
        #: Ticks whose deletes a cache did not take (kept and sent again; the lead stays).
        self.cache_errors = 0
        self.last_error = ""

    def run(self, stop: threading.Event) -> None:
        """Wait for the lock, lead until the connection or the source fails, and again, until ``stop``."""
        while not stop.is_set():
            self.role = "standby"
            conn = self._leadership.acquire(stop, self._announced)
            if conn is None:
                break
            self.role = "leader"
            self.terms += 1
            log.info("invalidator of %s (%s): leader", self.server, self.mode)
            try:
                self.source.start(conn)
                while not stop.is_set():
                    began = wall_ms()
                    try:
                        beat = self.source.tick()
                    except CacheDeleteError as exc:
                        # The caches missed deletes: the source kept them and sends them again next
                        # tick; the lead and the stream stay (no heartbeat is published meanwhile, so
                        # readers fall back to the window).
                        self.cache_errors += 1
                        self.last_error = f"{type(exc).__name__}: {exc}"
                        beat = None
                    if beat is not None:
                        self.heartbeat = beat
                        self._publish(self.hosts, beat)
                    self._announced()
                    stop.wait(max(0.0, self._tick_s - (wall_ms() - began) / 1000))
            except Exception as exc:  # the server or the stream lost: step down, take the lock again
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("invalidator of %s stepped down: %s", self.server, self.last_error)
                stop.wait(0.2)
            finally:
                self.source.stop()
                close_quietly(conn)
        self.role = "stopped"

    def _announced(self) -> None:
        """Publish this invalidator's status for operators (`store.cache.invalidators`); never raises."""
        if self._announce is not None:
            try:
                self._announce(self)
            except Exception as exc:  # the caches down: the status shows as absent, nothing else
                log.debug("status of %s not published: %s", self.server, exc)

    def status(self) -> dict[str, Any]:
        """What an operator sees: role, position, lag, heartbeat age, keys deleted."""
        beat = self.heartbeat
        out: dict[str, Any] = {
            "server": self.server,
            "hosts": self.hosts,
            "mode": self.mode,
            "role": self.role,
            "terms": self.terms,
            "errors": self.errors,
            "cache_errors": self.cache_errors,
            "last_error": self.last_error,
            "heartbeat_age_s": None if beat is None else round((wall_ms() - beat.covered_ms) / 1000, 3),
        }
        if isinstance(self.source, BinlogSource):
            out["position"] = self.source.position.gtid
            out["lag_s"] = self.source.lag_s()
        else:
            out["position"] = self.source.position()
        return out


class Daemon:
    """The invalidators of a config's servers (those with ``cache.invalidation`` log, binlog or wal)."""

    def __init__(
        self,
        config: StoreConfig,
        *,
        hosts: Sequence[str] = (),
        tick_s: float = HEARTBEAT_EVERY_S,
        from_now: bool = False,
    ) -> None:
        from store.store import Store  # the store imports the cache modules; keep this module light

        admin = config.for_admin()
        unknown = sorted(set(hosts) - set(admin.hosts))
        if unknown:
            raise ConfigError(
                f"--host {', '.join(unknown)}: not under hosts ({', '.join(sorted(admin.hosts))})"
            )
        chosen = admin.cache.daemon_hosts(hosts or sorted(admin.hosts))
        if not chosen:
            raise ConfigError(
                "no host to follow: set cache.invalidation to log, binlog or wal (for all hosts, or per host)"
            )
        self.config = admin
        #: The first term of each binlog invalidator starts at the binlog's end, not at a saved
        #: position (safe: its heartbeat vouches only from its start); later terms resume.
        self._from_now = from_now
        self._store = Store(admin)
        ctx = self._store.admin_context()
        self._caches = ctx.caches
        self.deleted = 0
        self.deletes = 0
        self._count_lock = threading.Lock()
        types = {spec.table: spec for spec in admin.types.values()}
        instagram = admin.ids == "instagram"

        def object_key(table: str, shard: int, first: int) -> str | None:
            spec = types.get(table)
            if spec is None:
                return None
            return ctx.objects.key(first if instagram else encode_pinterest(shard, spec.id, first), spec)

        def list_key(relation: str, from_id: int) -> str | None:
            return ctx.relations.list_key(relation, from_id) if relation in admin.relations else None

        keys = BinlogKeys(
            object_key=object_key,
            list_key=list_key,
            names=admin.names,
            tables=[*types, *admin.relations, COUNTS_TABLE],
        )
        #: The same keys, named from PostgreSQL's shard schemas (`WalSource`).
        self._schema_keys = keys.named_by_schemas()
        by_server = servers_of(chosen, lambda h: ctx.engines.backend(h).server_identity(admin.hosts[h]))
        #: Who runs this daemon, as operators see it (`store serve`): machine and process.
        self.instance = f"{socket.gethostname()}:{os.getpid()}"
        self.invalidators: list[HostInvalidator] = []
        for server, names in by_server.items():
            modes = {admin.cache.invalidation_of(n) for n in names}
            if len(modes) > 1:
                raise ConfigError(
                    f"hosts {', '.join(names)} are one server ({server}) with different cache.invalidation "
                    f"({', '.join(sorted(modes))}): give them one"
                )
            mode = modes.pop()
            url = admin.hosts[names[0]]
            backend = ctx.engines.backend(names[0])
            self.invalidators.append(
                HostInvalidator(
                    server=server,
                    hosts=names,
                    mode=mode,
                    leadership=Leadership(
                        _connector(backend, url),
                        name=lock_name(admin.names),
                        wait_for_lock=backend.wait_for_lock,
                    ),
                    source=self._source(server, names[0], mode, url, keys),
                    publish=self._publish,
                    tick_s=tick_s,
                    announce=self._announce,
                )
            )
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _source(
        self, server: str, host: str, mode: str, url: Any, keys: BinlogKeys
    ) -> LogTableSource | BinlogSource | WalSource:
        ctx = self._store.admin_context()
        if mode == "wal":
            return WalSource(
                server,
                self._store.config.names.prefix,
                self._schema_keys,
                self._apply,
                from_now=self._from_now,
            )
        if mode == "log":
            table = ctx.engines.backend(host).change_log
            if table is None:
                raise ConfigError(f"host {host} keeps no invalidation log")
            ctx.engines.shard(0, host).log_sql()  # makes the log where it is missing
            backend = ctx.engines.backend(host)
            return LogTableSource(
                server,
                table,
                self._apply,
                step_sql=backend.change_log_step_sql,
                clean_sql=backend.change_log_clean(CLEAN_BATCH),
            )
        settings = {
            "host": url.host or "127.0.0.1",
            "port": int(url.port or 3306),
            "user": url.username or "root",
            "password": url.password or "",
            # The server's heartbeats come every 0.25 s: a stream silent for longer is cut off
            # (a hung server or network) and fails, rather than wait for ever with its target unmet.
            "connect_timeout": STREAM_TIMEOUT_S,
            "read_timeout": STREAM_TIMEOUT_S,
        }
        saved_at = [0.0]
        connect = _connector(ctx.engines.backend(host), url)

        fresh = [self._from_now]

        def load() -> Position | None:
            if fresh[0]:
                fresh[0] = False
                return None
            objects = self._caches.objects
            peek = getattr(objects.store, "peek_many", None) if objects is not None else None
            if peek is not None:
                key = position_key(self._caches.prefix, server)
                got = Position.decode(peek([key]).get(key))
                if got is not None:
                    return got
            return _load_on_host(connect, server, self._store.config.names)

        on_host: list[bytes] = [b""]

        def save(position: Position, conn: Any) -> None:
            objects = self._caches.objects
            setter = getattr(objects.store, "set_many", None) if objects is not None else None
            if setter is not None:
                setter({position_key(self._caches.prefix, server): position.encode()}, HEARTBEAT_TTL_S * 60)
            # On the server only when it moved, at most every SAVE_ON_HOST_EVERY_S, on the lock's
            # connection: an idle server costs the ticks' one query each and nothing more.
            now = wall_ms() / 1000
            encoded = position.encode()
            if now - saved_at[0] >= SAVE_ON_HOST_EVERY_S and encoded != on_host[0]:
                saved_at[0] = now
                if _save_on_host(conn, server, position, self._store.config.names):
                    on_host[0] = encoded

        return BinlogSource(
            server,
            settings,
            keys,
            self._apply,
            server_id=1_000_000 + os.getpid() % 1_000_000,
            load=load,
            save=save,
        )

    def _apply(self, texts: list[str]) -> None:
        """Delete the keys ``texts`` name from the caches; `CacheDeleteError` if any delete was lost."""
        from store.store import _settle

        objects, lists = parse_entries(texts)
        caches = self._caches
        before = _failures(caches)
        if objects and caches.objects is not None:
            caches.objects.invalidate(sorted(set(objects)))
        if lists and caches.lists is not None:
            _settle(caches.lists)(sorted(set(lists)))
        if _failures(caches) != before:
            raise CacheDeleteError("a cache did not take every delete: they are sent again next tick")
        with self._count_lock:
            self.deleted += len(set(objects)) + len(set(lists))
            self.deletes += 1

    def _publish(self, hosts: Sequence[str], beat: Heartbeat) -> bool:
        objects = self._caches.objects
        setter = getattr(objects.store, "set_many", None) if objects is not None else None
        if setter is None:
            return False
        value = encode_heartbeat(beat)
        ok: bool = setter({heartbeat_key(self._caches.prefix, h): value for h in hosts}, HEARTBEAT_TTL_S)
        return ok

    def _announce(self, inv: HostInvalidator) -> None:
        objects = self._caches.objects
        setter = getattr(objects.store, "set_many", None) if objects is not None else None
        if setter is None or inv.role not in ("leader", "standby"):
            return
        status = {**inv.status(), "keys_deleted": self.deleted, "instance": self.instance, "at_ms": wall_ms()}
        setter({status_key(self._caches.prefix, inv.server, inv.role): encode_status(status)}, STATUS_TTL_S)

    def start(self) -> None:
        """Run every invalidator in a thread of its own."""
        for inv in self.invalidators:
            thread = threading.Thread(
                target=inv.run, args=(self._stop,), name=f"store-inv-{inv.server}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until `stop` (True) or ``timeout_s`` passes (False)."""
        return self._stop.wait(timeout_s)

    def request_stop(self) -> None:
        """Have `wait` return (from a signal handler); `stop` then stops the invalidators."""
        self._stop.set()

    def stop(self) -> None:
        """Stop every invalidator (their locks go with their connections) and close the store."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        self._store.close()

    def status(self) -> list[dict[str, Any]]:
        """Each server's invalidator, and the keys this daemon deleted."""
        return [{**inv.status(), "keys_deleted": self.deleted} for inv in self.invalidators]


def _failures(caches: Any) -> tuple[int, ...]:
    out: list[int] = []
    for cache in (caches.objects, caches.lists):
        if cache is not None:
            out += [cache.stats.errors, cache.stats.skipped]
    return tuple(out)


def _connector(backend: Any, url: Any) -> Callable[[], Any]:
    """The daemon's own connections to a server: short connect timeout, autocommit."""
    connect: Callable[[], Any] = backend.connector(url, shard=0, connect_timeout_s=2.0, query_timeout_s=10.0)
    return connect


def _position_table(names: Names) -> str:
    return f"`{names.log_database}`.`{POSITION_TABLE}`"


def _load_on_host(connect: Callable[[], Any], server: str, names: Names) -> Position | None:
    conn = None
    try:
        conn = connect()
        cur = conn.cursor()
        cur.execute(f"SELECT position FROM {_position_table(names)} WHERE server = %s", (server,))
        row = cur.fetchone()
        return None if row is None else Position.decode(row[0])
    except Exception as exc:  # no table yet, or the server down: start from the current position
        log.debug("no saved position for %s: %s", server, exc)
        return None
    finally:
        close_quietly(conn)


def _save_on_host(conn: Any, server: str, position: Position, names: Names) -> bool:
    """Write ``position`` on its server over ``conn`` (the lock's connection), making the table the
    first time; False if it could not (the caches keep it too)."""
    upsert = (
        f"INSERT INTO {_position_table(names)} (server, position, at_ms) VALUES (%s, %s, %s) "
        "ON DUPLICATE KEY UPDATE position = VALUES(position), at_ms = VALUES(at_ms)"
    )
    args = (server, position.encode().decode(), wall_ms())
    cur = conn.cursor()
    try:
        try:
            cur.execute(upsert, args)
        except Exception as exc:
            if getattr(exc, "args", (None,))[0] not in (_NO_SUCH_TABLE, _NO_SUCH_DATABASE):
                raise
            cur.execute(f"CREATE DATABASE IF NOT EXISTS `{names.log_database}`")
            cur.execute(
                f"CREATE TABLE IF NOT EXISTS {_position_table(names)} (server VARCHAR(255) NOT NULL "
                "PRIMARY KEY, position VARCHAR(1024) NOT NULL, at_ms BIGINT NOT NULL) ENGINE=InnoDB"
            )
            cur.execute(upsert, args)
        return True
    except Exception as exc:  # the caches keep it too; a lost connection shows at the next tick
        log.debug("position of %s not saved on the server: %s", server, exc)
        return False
    finally:
        cur.close()
