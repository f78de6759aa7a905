"""Real servers of the tests' own: MariaDB instances in temporary data directories."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _require(binary: str) -> str:
    path = shutil.which(binary) or (f"/usr/sbin/{binary}" if Path(f"/usr/sbin/{binary}").exists() else None)
    if path is None:
        if os.environ.get("STORE_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{binary} is not installed")
        pytest.skip(f"{binary} is not installed")
    return path


def wait_port(port: int, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def start_memcached(port: int) -> subprocess.Popen[bytes]:
    """A memcached of the tests' own on ``port`` (the caller stops it)."""
    binary = _require("memcached")
    user = ["-u", "memcache"] if os.geteuid() == 0 else []
    proc = subprocess.Popen([binary, *user, "-l", "127.0.0.1", "-p", str(port), "-m", "64", "-U", "0"])
    if not wait_port(port, 10):
        proc.kill()
        pytest.fail(f"memcached did not start on port {port}")
    return proc


def start_redis(port: int) -> subprocess.Popen[bytes]:
    """A redis-server of the tests' own on ``port``, keeping nothing on disk."""
    binary = _require("redis-server")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    if not wait_port(port, 10):
        proc.kill()
        pytest.fail(f"redis-server did not start on port {port}")
    return proc


class MariaDBServer:
    """A mariadbd with its own data directory and port; start, kill -9, restart."""

    def __init__(self, port: int, *, log_bin: bool = False, server_id: int = 1) -> None:
        self.extra = (
            ["--log-bin=mysql-bin", f"--server-id={server_id}", "--binlog-format=ROW"] if log_bin else []
        )
        # Its own folder, traversable by the mysql user (pytest's tmp_path is not).
        self.base = Path(tempfile.mkdtemp(prefix=f"store-mariadb-{port}-"))
        os.chmod(self.base, 0o755)
        datadir = self.datadir = self.base / "data"
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = f"mysql+pymysql://root@127.0.0.1:{port}"
        install = _require("mariadb-install-db")
        self._mariadbd = _require("mariadbd")
        user = ["--user=mysql"] if os.geteuid() == 0 else []
        subprocess.run(
            [install, *user, f"--datadir={datadir}", "--auth-root-authentication-method=normal",
             "--skip-test-db"],
            check=True,
            capture_output=True,
        )  # fmt: skip
        if os.geteuid() == 0:
            shutil.chown(datadir, "mysql", "mysql")

    def start(self) -> None:
        user = ["--user=mysql"] if os.geteuid() == 0 else []
        log = open(self.datadir.parent / f"mariadb-{self.port}.log", "ab")  # noqa: SIM115 - kept by the child
        self.proc = subprocess.Popen(
            [self._mariadbd, "--no-defaults", *user, f"--datadir={self.datadir}", f"--port={self.port}",
             f"--socket={self.datadir}/sock", "--bind-address=127.0.0.1",
             "--innodb-buffer-pool-size=32M", f"--log-error={self.base}/err.log",
             # Each commit reaches the OS at once, so it survives a SIGKILL of
             # mariadbd (not a power cut); fsync per commit would triple the run.
             "--innodb-flush-log-at-trx-commit=2", *self.extra],
            stdout=log,
            stderr=log,
        )  # fmt: skip
        log.close()
        if not wait_port(self.port):
            self.kill()
            pytest.fail(f"mariadbd did not start on port {self.port}")

    def kill(self) -> None:
        """SIGKILL: no shutdown, like a crash."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def remove(self) -> None:
        """Kill the server and delete its files."""
        self.kill()
        shutil.rmtree(self.base, ignore_errors=True)


@contextmanager
def binlog_pair(source_port: int, target_port: int) -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    """Two running MariaDB servers with ROW binlogs (a move's source and target), removed afterwards."""
    source = MariaDBServer(source_port, log_bin=True, server_id=1)
    target = MariaDBServer(target_port, log_bin=True, server_id=2)
    try:
        source.start()
        target.start()
        yield source, target
    finally:
        source.remove()
        target.remove()


ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")


class ZooKeeperServer:
    """A standalone ZooKeeper (Debian's package) with its own data directory and port."""

    def __init__(self, port: int) -> None:
        java = _require("java")
        if not ZOOKEEPER_JAR.exists():
            if os.environ.get("STORE_REQUIRE_SERVICES") == "1":
                pytest.fail("ZooKeeper is not installed (run scripts/services.sh)")
            pytest.skip("ZooKeeper is not installed")
        self.base = Path(tempfile.mkdtemp(prefix=f"store-zookeeper-{port}-"))
        (self.base / "data").mkdir()
        cfg = self.base / "zoo.cfg"
        cfg.write_text(
            f"tickTime=2000\ndataDir={self.base / 'data'}\nclientPort={port}\n"
            "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
        )
        self.port = port
        self.hosts = f"127.0.0.1:{port}"
        self.proc = subprocess.Popen(
            [
                java,
                "-Xmx128m",
                "-cp",
                str(ZOOKEEPER_JAR),
                "org.apache.zookeeper.server.ZooKeeperServerMain",
                str(cfg),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not wait_port(port, 30) or not self._answers(30):
            self.remove()
            pytest.fail(f"ZooKeeper did not start on port {port}")

    def _answers(self, seconds: float) -> bool:
        """The port opens before the server takes sessions: wait until one starts."""
        from kazoo.client import KazooClient

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            client = KazooClient(hosts=self.hosts, timeout=5)
            try:
                client.start(timeout=5)
                return True
            except Exception:  # not yet: try again until the deadline
                time.sleep(0.2)
            finally:
                client.stop()
                client.close()
        return False

    def remove(self) -> None:
        """Stop it and delete its files."""
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)
