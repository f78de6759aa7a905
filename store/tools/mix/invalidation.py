"""What invalidation costs in the mix: a `store invalidate` daemon per system that asks for one,
the caches' deletes per write in each phase, and the database queries a second a system's
background machinery sends while no call is made.

- **The daemon.** A system whose cache settings name ``invalidation: log`` or
  ``binlog`` (``store:invalidation=log``) gets one daemon of its own in a
  spawned process, from the first phase to the end of the run, as a
  deployment would run it beside the app processes.
- **Deletes per write.** Every memcached ``delete`` and Redis ``DEL`` or
  ``UNLINK`` the servers counted during a phase, over the phase's writes.
  Every deleter is counted: the writers, per-process followers and daemons
  (a binlog daemon deletes for every write on its servers, whoever made it).
- **Queries a second at rest.** After the phases, each system is opened
  alone (in ``--processes`` processes where the run had them), with its
  daemon where it has one, and the database servers' own query counters
  are read over a few seconds in which no call is made: what followers,
  daemons and map checks cost. The floor and the peer have no background
  work; they are measured the same way.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import socket
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from store.config import StoreConfig
from store.exceptions import ConfigError, StoreError
from store.tools.mix.options import MixOptions, system_config
from store.tools.mix.systems import make_system

if TYPE_CHECKING:
    from store.tools.mix.system import MixSchema

__all__ = [
    "WRITES",
    "DaemonProcess",
    "cache_deletes",
    "daemon_config",
    "QueryCounter",
    "idle_queries_per_s",
]

#: The mix's operations that write.
WRITES = ("add_link", "update_link", "delete_link", "update_node", "add_node", "delete_node")
#: Seconds a daemon may take to come up (its first lock and source).
DAEMON_START_S = 60.0


def daemon_config(config: StoreConfig) -> StoreConfig | None:
    """``config`` if a `store invalidate` daemon follows any of its hosts, else None."""
    return config if config.cache.daemon_hosts(sorted(config.hosts)) else None


def _daemon_main(conn: Any, config: StoreConfig) -> None:
    """A daemon's process: run until the parent says stop (or goes)."""
    from store.invalidate import Daemon

    try:
        # From the binlog's end: not the backlog of the run's bulk loads, nor of earlier runs.
        daemon = Daemon(config, from_now=True)
        daemon.start()
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("up",))
    try:
        with contextlib.suppress(EOFError):
            conn.recv()
    finally:
        daemon.stop()
        conn.close()


class DaemonProcess:
    """One `store invalidate` daemon for a system's config, in a spawned process of its own."""

    def __init__(self, config: StoreConfig) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=_daemon_main, args=(theirs, config), daemon=True)
        self._proc.start()
        theirs.close()
        if not self._conn.poll(DAEMON_START_S):
            self.close()
            raise StoreError(f"the invalidation daemon did not start within {DAEMON_START_S:.0f} s")
        msg = self._conn.recv()
        if msg[0] != "up":
            self.close()
            raise ConfigError(f"the invalidation daemon could not start: {msg[1]}")

    def close(self) -> None:
        """Stop the daemon (its locks go with its connections) and wait for its process."""
        with contextlib.suppress(OSError):
            self._conn.send(("stop",))
        self._conn.close()
        self._proc.join(10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)


def _memcached_deletes(servers: tuple[str, ...]) -> int:
    total = 0
    for server in servers:
        host, port = server.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=2) as sock:
            sock.sendall(b"stats\r\n")
            data = b""
            while not data.endswith(b"END\r\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        for line in data.decode(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[1] in ("delete_hits", "delete_misses"):
                total += int(parts[2])
    return total


def _redis_deletes(urls: tuple[str, ...]) -> int:
    import redis

    total = 0
    for url in urls:
        client = redis.Redis.from_url(url)
        try:
            stats = client.info("commandstats")
        finally:
            client.close()
        for name in ("cmdstat_del", "cmdstat_unlink"):
            found = stats.get(name)
            if isinstance(found, dict):
                total += int(found.get("calls", 0))
    return total


def cache_deletes(config: StoreConfig) -> dict[str, int]:
    """The caches' delete counters so far: memcached's and Redis's ({} where they cannot be read)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError, ValueError):
        out["memcached"] = _memcached_deletes(config.cache.memcached)
    with contextlib.suppress(Exception):  # Redis down or refusing INFO: not measured
        out["redis"] = _redis_deletes(config.cache.redis)
    return out


class QueryCounter:
    """The database servers' own statement counters, on one connection per server held open (so the
    counter's reads cost one statement per server each, and no connection setup)."""

    def __init__(self, schema: MixSchema, connect: Callable[[str], Any]) -> None:
        self._pg = schema.ids == "instagram"
        seen: set[str] = set()
        self._conns: list[Any] = []
        for url in schema.hosts.values():
            key = url if self._pg else url.rsplit("/", 1)[0]
            if key not in seen:
                seen.add(key)
                self._conns.append(connect(url))

    @property
    def servers(self) -> int:
        """How many servers are counted (each read adds one statement on each)."""
        return len(self._conns)

    def read(self) -> int:
        """Statements the servers have run so far (PostgreSQL: transactions, as autocommit runs them)."""
        total = 0
        for conn in self._conns:
            cur = conn.cursor()
            if self._pg:
                cur.execute("SELECT COALESCE(SUM(xact_commit + xact_rollback), 0) FROM pg_stat_database")
            else:
                cur.execute("SHOW GLOBAL STATUS LIKE 'Questions'")
            total += int(cur.fetchone()[-1])
            cur.close()
        return total

    def close(self) -> None:
        """Close the connections."""
        for conn in self._conns:
            with contextlib.suppress(Exception):
                conn.close()


def _idle_main(conn: Any, name: str, config: StoreConfig, schema: MixSchema, options: MixOptions) -> None:
    """A process holding one system open, idle, until the parent says stop."""
    try:
        system = make_system(name, config, schema, options)
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("up",))
    try:
        with contextlib.suppress(EOFError):
            conn.recv()
    finally:
        system.close()
        conn.close()


@contextlib.contextmanager
def _open_idle(
    name: str, config: StoreConfig, schema: MixSchema, options: MixOptions, processes: int
) -> Iterator[None]:
    """``processes`` processes, each holding system ``name`` open and idle."""
    ctx = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    try:
        for _ in range(processes):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_idle_main, args=(theirs, name, config, schema, options), daemon=True)
            proc.start()
            theirs.close()
            pipes.append(mine)
            procs.append(proc)
        for mine in pipes:
            if not mine.poll(DAEMON_START_S):
                raise StoreError(f"an idle {name} process did not start within {DAEMON_START_S:.0f} s")
            msg = mine.recv()
            if msg[0] != "up":
                raise StoreError(f"an idle {name} process could not start: {msg[1]}")
        yield
    finally:
        for mine in pipes:
            with contextlib.suppress(OSError):
                mine.send(("stop",))
            mine.close()
        for proc in procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def idle_queries_per_s(
    name: str,
    config: StoreConfig,
    schema: MixSchema,
    options: MixOptions,
    connect: Callable[[str], Any],
    *,
    processes: int,
    seconds: float = 4.0,
    settle_s: float = 1.5,
) -> float:
    """Database statements a second while system ``name`` is open in ``processes`` processes (with its
    daemon, if it has one) and no call is made; the counter reads' own statements left out."""
    own = system_config(name, config, options)
    daemon = DaemonProcess(own) if own is not None and daemon_config(own) is not None else None
    counter = QueryCounter(schema, connect)
    try:
        with _open_idle(name, config, schema, options, max(1, processes)):
            time.sleep(settle_s)  # followers and daemons past their first passes
            before = counter.read()
            began = time.monotonic()
            time.sleep(seconds)
            after = counter.read()
            took = time.monotonic() - began
    finally:
        counter.close()
        if daemon is not None:
            daemon.close()
    return max(0.0, (after - before - counter.servers) / took)
