"""Where running stores read the shard map from, so that all of them see a change.

A `MapSource` holds versioned maps. Every `Store` reloads from it when it
changes (a file: its modification time; a table: polled) and at once when a
call fails for a routing reason. A write is atomic and must name the version
it was based on: a write based on a stale version is refused with
`StaleMapError`, so two operators can never both flip a map.

* `StaticMapSource`: the config's ``map:``, never changes (the default).
* `FileMapSource`: a YAML file, replaced atomically (write then rename)
  under an exclusive lock.
* `TableMapSource`: a table ``shard_maps`` in a MariaDB "meta" database, one
  row per version (the history ``store map diff`` reads); the primary key
  on the version makes the compare-and-set atomic.
* `ZooKeeperMapSource`: a znode, as Pinterest kept it: a watch tells every
  store at once, and the znode's own version makes the write a
  compare-and-set (needs ``pip install 'shardstore[zookeeper]'``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import Any, Protocol

import orjson
import yaml
from sqlalchemy.engine import URL, make_url

from store.backends import access_denied
from store.config import DEFAULT_CONNECT_TIMEOUT_S, DEFAULT_QUERY_TIMEOUT_S, StoreConfig
from store.exceptions import BackendError, ConfigError, StaleMapError
from store.forks import at_fork
from store.shardmap import ShardMap

__all__ = [
    "FileMapSource",
    "MapSource",
    "StaticMapSource",
    "TableMapSource",
    "ZooKeeperMapSource",
    "live_map",
    "load_or_seed",
    "open_map_source",
    "require_changeable",
]


class MapSource(Protocol):
    """Versioned shard maps shared by every running store."""

    def load(self) -> ShardMap | None:
        """The current map, or None if the source holds none yet."""
        ...

    def changed(self) -> bool:
        """Cheaply: might the map have changed since the last `load`?"""
        ...

    def write(self, new: ShardMap, *, expected_version: int) -> None:
        """Store ``new`` if the current version is ``expected_version`` (0: empty); else `StaleMapError`."""
        ...


class StaticMapSource:
    """The map from the config file; it never changes while the store runs."""

    def __init__(self, shard_map: ShardMap) -> None:
        self._map = shard_map

    def load(self) -> ShardMap:
        """The config's map."""
        return self._map

    def changed(self) -> bool:
        """Never."""
        return False

    def write(self, new: ShardMap, *, expected_version: int) -> None:
        """Refused: a static map cannot change."""
        raise ConfigError("the shard map comes from the config file; configure map_source to change it live")


def require_changeable(source: MapSource, what: str) -> None:
    """`ConfigError` if ``source`` is the config's own map (`StaticMapSource`), which ``what`` (a
    command that writes a new map: "a move", "a rebalance", "a promote") cannot change; checked
    before that command plans or touches a server."""
    if isinstance(source, StaticMapSource):
        raise ConfigError(
            f"{what} must publish a new map to every running store, and the config has no map_source: "
            "configure one (map_source: {file: PATH}, {table: URL} or {zookeeper: HOST:2181})"
        )


def _check_next(new: ShardMap, current: int, expected: int) -> None:
    if current != expected:
        raise StaleMapError(
            f"the shard map is at version {current}, not {expected}: reload it and redo the change"
        )
    if new.version != expected + 1:
        raise StaleMapError(
            f"a change of version {expected} must be version {expected + 1}, not {new.version}"
        )


class FileMapSource:
    """A YAML file holding one map; replaced atomically under a lock."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._seen: tuple[int, int] | None = None

    def _stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def load(self) -> ShardMap | None:
        """The map in the file, or None if there is no file."""
        stamp = self._stamp()
        if stamp is None:
            self._seen = None
            return None
        try:
            raw = yaml.safe_load(self.path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read the shard map file {self.path}: {exc}") from exc
        self._seen = stamp
        return ShardMap.from_dict(raw)

    def changed(self) -> bool:
        """True if the file's modification time or size moved."""
        return self._stamp() != self._seen

    def write(self, new: ShardMap, *, expected_version: int) -> None:
        """Replace the file with ``new`` if it holds ``expected_version``."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock_path = self.path.with_name(self.path.name + ".lock")
        with open(lock_path, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            current = self.load()
            _check_next(new, 0 if current is None else current.version, expected_version)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(yaml.safe_dump(new.to_dict(), sort_keys=False), encoding="utf-8")
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, self.path)


#: The map table's database without a namespace (`store.naming.Names.meta_database`).
META_DATABASE = "store_meta"


class TableMapSource:
    """Map versions as rows of ``store_meta.shard_maps`` on a MariaDB server, polled.

    ``poll_s``: `changed` asks the server at most this often (0: every time).
    ``connect_timeout_s``, ``query_timeout_s``: the bounds on opening each
    query's connection and on each reply; `BackendError` past them.
    """

    def __init__(
        self,
        url: str | URL,
        *,
        poll_s: float = 1.0,
        database: str = META_DATABASE,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        query_timeout_s: float = DEFAULT_QUERY_TIMEOUT_S,
    ) -> None:
        from store.backends.mysql.driver import mysql_connector

        # Every query opens its own connection: a server that refuses, or
        # hangs, fails the read within these bounds (the config's, from
        # `open_map_source`), not within the connector's default minute.
        self._connect = mysql_connector(
            make_url(url), connect_timeout_s=connect_timeout_s, query_timeout_s=query_timeout_s
        )
        self._table = f"`{database}`.`shard_maps`"
        self._database = database
        self._poll_s = poll_s
        self._loaded_at = 0.0
        self._version = 0

    def _run(self, sql: str, params: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        try:
            conn = self._connect()
        except Exception as exc:
            raise BackendError(f"cannot reach the shard map table {self._table}: {exc}", orig=exc) from exc
        try:
            cur = conn.cursor()
            cur.execute(sql, params)
            rows = list(cur.fetchall())
            cur.close()
            return rows
        except Exception as exc:
            code = exc.args[0] if exc.args else None
            if code == 1062:  # the version exists: another writer got there first
                raise StaleMapError(
                    f"shard map version {params[0]} was written by someone else: reload"
                ) from exc
            raise BackendError(f"shard map table {self._table}: {exc}", orig=exc) from exc
        finally:
            conn.close()

    def create(self) -> None:
        """Create the meta database and table unless the table exists (idempotent).

        An application account (no CREATE) opens an existing table; where
        the table is missing it gets an error that says to run `store init`.
        """
        found = self._run(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s AND table_name = %s",
            (self._database, "shard_maps"),
        )
        if found and int(str(found[0][0])):
            return
        try:
            self._run(f"CREATE DATABASE IF NOT EXISTS `{self._database}`")
        except BackendError as exc:
            if access_denied(exc):
                raise ConfigError(
                    f"the shard map table {self._table} does not exist and this account cannot create it: "
                    "run `store init` (it connects with the hosts' admin URLs)"
                ) from exc
            raise
        self._run(
            f"CREATE TABLE IF NOT EXISTS {self._table} (`version` BIGINT NOT NULL PRIMARY KEY, "
            "`body` MEDIUMTEXT NOT NULL, `written` TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)) "
            "ENGINE=InnoDB"
        )

    def load(self, version: int | None = None) -> ShardMap | None:
        """The newest map (or ``version``), or None if the table holds none."""
        if version is None:
            rows = self._run(f"SELECT body FROM {self._table} ORDER BY version DESC LIMIT 1")
        else:
            rows = self._run(f"SELECT body FROM {self._table} WHERE version = %s", (version,))
        self._loaded_at = time.monotonic()
        if not rows:
            return None
        found = ShardMap.from_dict(orjson.loads(str(rows[0][0])))
        if version is None:
            self._version = found.version
        return found

    def versions(self) -> list[int]:
        """Every stored version, oldest first."""
        return [int(str(r[0])) for r in self._run(f"SELECT version FROM {self._table} ORDER BY version")]

    def changed(self) -> bool:
        """Polled: at most every ``poll_s`` seconds, one primary-key read of the newest version."""
        if self._poll_s and time.monotonic() - self._loaded_at < self._poll_s:
            return False
        rows = self._run(f"SELECT MAX(version) FROM {self._table}")
        self._loaded_at = time.monotonic()
        newest = rows[0][0] if rows else None
        return newest is not None and int(str(newest)) != self._version

    def write(self, new: ShardMap, *, expected_version: int) -> None:
        """Insert ``new`` as the next version; the primary key refuses a second writer."""
        rows = self._run(f"SELECT COALESCE(MAX(version), 0) FROM {self._table}")
        _check_next(new, int(str(rows[0][0])), expected_version)
        self._run(
            f"INSERT INTO {self._table} (version, body) VALUES (%s, %s)",
            (new.version, orjson.dumps(new.to_dict()).decode()),
        )


class ZooKeeperMapSource:
    """The map as JSON in one znode; a data watch flags every change.

    ``timeout_s``: the session timeout (ZooKeeper may raise it to its
    minimum); ``connect_timeout_s``: the wait for the first connection
    (default ``timeout_s``). While the client is not connected, no watch can
    fire: `changed` and `load` raise `BackendError` rather than answer.

    A child of ``os.fork()`` never uses (or closes: that would end the
    parent's session) the client it inherited, whose threads stayed in the
    parent: it connects a client of its own on first use (`store.forks`).
    """

    def __init__(
        self,
        hosts: str,
        *,
        path: str = "/store/shardmap",
        timeout_s: float = 5.0,
        connect_timeout_s: float | None = None,
    ) -> None:
        self.path = path
        self.hosts = hosts
        self._timeout_s = timeout_s
        self._connect_timeout_s = timeout_s if connect_timeout_s is None else connect_timeout_s
        self._client: Any = self._start()
        self._dirty = True
        self._watching = False
        self._version = 0
        self._pid = os.getpid()
        #: Clients inherited over a fork: kept, never used or closed (see the class's text).
        self._inherited: list[Any] = []
        at_fork(self, ZooKeeperMapSource._after_fork)

    def _start(self) -> Any:
        """A connected client (`BackendError` if ZooKeeper cannot be reached in time)."""
        from kazoo.client import KazooClient

        # ``timeout_s`` is the session's: a request on a connection that stops
        # answering fails once the client declares the connection lost, within it.
        client = KazooClient(hosts=self.hosts, timeout=self._timeout_s)
        try:
            client.start(timeout=self._connect_timeout_s)
        except Exception as exc:
            raise BackendError(f"cannot reach ZooKeeper at {self.hosts}: {exc}", orig=exc) from exc
        return client

    def _after_fork(self) -> None:
        """In a forked child: put the parent's client aside; `_here` connects a new one."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        if self._client is not None:
            self._inherited.append(self._client)
        self._client = None
        self._watching = False
        self._dirty = True

    def _here(self) -> Any:
        """This process's client, connected now if it has none yet (after a fork)."""
        if self._pid != os.getpid():  # a fork the hook missed
            self._after_fork()
        if self._client is None:
            self._client = self._start()
        return self._client

    def _watch(self) -> None:
        if self._watching:
            return
        self._watching = True

        def on_change(_data: object, _stat: object) -> None:
            self._dirty = True  # ZooKeeper calls back on its own thread

        self._here().DataWatch(self.path, on_change)

    def load(self) -> ShardMap | None:
        """The map in the znode, or None if there is none yet."""
        from kazoo.exceptions import NoNodeError

        self._connected()
        self._watch()
        self._dirty = False
        try:
            data, _stat = self._here().get(self.path)
        except NoNodeError:
            return None
        except Exception as exc:  # the connection lost mid-request, the session expired
            self._dirty = True
            raise BackendError(
                f"ZooKeeper at {self.hosts}: cannot read {self.path}: {exc}", orig=exc
            ) from exc
        found = ShardMap.from_dict(orjson.loads(data))
        self._version = found.version
        return found

    def changed(self) -> bool:
        """True once the watch has seen a change since the last `load` (`BackendError`: not connected)."""
        self._connected()
        return self._dirty

    def _connected(self) -> None:
        if not self._here().connected:
            raise BackendError(
                f"ZooKeeper at {self.hosts} is not connected: the shard map cannot be confirmed current"
            )

    def write(self, new: ShardMap, *, expected_version: int) -> None:
        """Replace the znode's map if it holds ``expected_version`` (the znode version is the lock)."""
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

        body = orjson.dumps(new.to_dict())
        try:
            data, stat = self._here().get(self.path)
            current = ShardMap.from_dict(orjson.loads(data)).version
        except NoNodeError:
            stat, current = None, 0
        _check_next(new, current, expected_version)
        try:
            if stat is None:
                self._here().create(self.path, body, makepath=True)
            else:
                self._here().set(self.path, body, version=stat.version)
        except (BadVersionError, NodeExistsError) as exc:
            raise StaleMapError("another writer changed the shard map in ZooKeeper first: reload") from exc

    def close(self) -> None:
        """Disconnect (this process's client only)."""
        if self._pid != os.getpid():
            self._after_fork()
        if self._client is not None:
            self._client.stop()
            self._client.close()
            self._client = None


def open_map_source(config: StoreConfig) -> MapSource:
    """The map source ``config`` names (its ``map_source``), or its static map."""
    if config.map_source is None:
        return StaticMapSource(config.shard_map)
    kind, where = config.map_source
    if kind == "file":
        return FileMapSource(where)
    if kind == "zookeeper":
        return ZooKeeperMapSource(
            where,
            path=config.names.zookeeper_path,
            timeout_s=config.query_timeout_s,
            connect_timeout_s=config.connect_timeout_s,
        )
    assert config.map_table is not None
    # poll_s=0: the live map asks every map_poll_s itself (`LiveMap.tick`); a second
    # throttle here skipped every other of its checks.
    source = TableMapSource(
        config.map_table[0],
        poll_s=0.0,
        database=config.names.meta_database,
        connect_timeout_s=config.connect_timeout_s,
        query_timeout_s=config.query_timeout_s,
    )
    source.create()
    return source


def load_or_seed(source: MapSource, seed: ShardMap) -> ShardMap:
    """The source's current map; an empty source is seeded with ``seed`` (the config's map) first."""
    found = source.load()
    if found is None:
        with contextlib.suppress(StaleMapError):  # another process seeded it first
            source.write(seed, expected_version=0)
        found = source.load()
    assert found is not None
    return found


def live_map(config: StoreConfig) -> ShardMap:
    """The map running stores route by now: the map source's (seeded if empty), else the config's.

    Admin commands place shards by this map, never by the config's ``map:``
    once a map source exists: after a move the two differ.
    """
    source = open_map_source(config)
    try:
        return load_or_seed(source, config.shard_map)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()
