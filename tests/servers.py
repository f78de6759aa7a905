"""Real servers of the tests' own: MariaDB instances in temporary data directories.

Every server listens on a port the OS picks (`free_port`) unless the caller
names one, and every MariaDB data directory is a copy of one template that
``mariadb-install-db`` makes once per test process (`template_datadir`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it: no two tests share one)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(n: int) -> tuple[int, ...]:
    """``n`` distinct ports as `free_port` picks them (all held open until each is known)."""
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return tuple(int(s.getsockname()[1]) for s in socks)
    finally:
        for sock in socks:
            sock.close()


def _ephemeral_floor() -> int:
    """The lowest port the OS hands out itself (to ``bind(0)`` and to outgoing connections)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def session_ports(n: int) -> tuple[int, ...]:
    """``n`` distinct free ports for servers a test process starts only later (its own caches).

    Drawn at random from below the OS's own range: a port `free_port` picked
    minutes before its server starts could meanwhile be handed to another
    process's ``bind(0)`` (another worker's server) or to an outgoing
    connection. Down here only another process drawing the same way can
    take it, which the servers' start checks (`start_redis`, `start_memcached`).
    """
    import random

    rng = random.SystemRandom()
    out: list[int] = []
    while len(out) < n:
        port = rng.randrange(10000, _ephemeral_floor())
        if port in out:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        out.append(port)
    return tuple(out)


def _listener_pid(port: int, ask: bytes, field: bytes) -> int | None:
    """The pid a memcached (``stats``) or Redis (``INFO server``) on ``port`` reports, if any."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(ask)
            got = b""
            while field not in got or b"\r\n" not in got.split(field, 1)[1]:  # (its line whole)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                got += chunk
    except OSError:
        return None
    if field not in got:
        return None
    digits = got.split(field, 1)[1].split(b"\r\n", 1)[0].strip()
    return int(digits) if digits.isdigit() else None


def _check_ours(proc: subprocess.Popen[bytes], port: int, what: str, ask: bytes, field: bytes) -> None:
    """Fail unless the server answering on ``port`` is ``proc``: where another process held the
    port, ours exited and the tests would talk to a stranger (until it went away)."""
    pid = _listener_pid(port, ask, field)
    if pid != proc.pid:
        proc.kill()
        proc.wait()
        pytest.fail(f"{what} did not start on port {port}: it is another process's (pid {pid})")


def wait_stopped(pid: int, seconds: float = 10.0) -> None:
    """Wait until every thread of process ``pid`` is stopped (state ``T`` in ``/proc``), after a
    SIGSTOP; at once where there is no ``/proc``."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.exists():
        return
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        states = []
        for task in tasks.iterdir():
            try:
                states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
            except OSError:  # the thread ended meanwhile
                continue
        if all(state in ("T", "t") for state in states):
            return
        time.sleep(0.005)
    pytest.fail(f"process {pid} did not stop within {seconds} s of its SIGSTOP")


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
    _check_ours(proc, port, "memcached", b"stats\r\n", b"STAT pid ")
    return proc


def memcached_stats(address: str) -> dict[str, int]:
    """The numeric counters of memcached's ``stats`` at ``address`` (``host:port``)."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=2) as sock:
        sock.sendall(b"stats\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            data += sock.recv(65536)
    out: dict[str, int] = {}
    for line in data.decode().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            out[parts[1]] = int(parts[2])
    return out


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
    _check_ours(proc, port, "redis-server", b"INFO server\r\n", b"process_id:")
    return proc


_template_lock = threading.Lock()
_template: Path | None = None


#: The test servers' InnoDB redo log: 16 MB, not the default 96 MB, so that each server's copy of
#: the template is a third of the size (the tests' writes are small; a server started with another
#: size would rebuild its log at startup).
REDO_LOG = "--innodb-log-file-size=16M"


def template_datadir() -> Path:
    """A MariaDB data directory fresh from ``mariadb-install-db``, made once per process.

    `MariaDBServer` copies it instead of running ``mariadb-install-db`` for each
    server (the system tables are the same every time; a copy takes a fraction
    of the bootstrap's time). Nothing ever starts a server on the template itself.
    """
    global _template
    with _template_lock:
        if _template is not None and _template.exists():
            return _template
        install = _require("mariadb-install-db")
        base = Path(tempfile.mkdtemp(prefix="store-mariadb-template-"))
        os.chmod(base, 0o755)
        datadir = base / "data"
        user = ["--user=mysql"] if os.geteuid() == 0 else []
        # A tmpdir of its own: a mariadbd starting up deletes every ``#sql*``
        # file in its tmpdir, which in the shared /tmp are other servers' live
        # temporary tables.
        tmpdir = base / "tmp"
        tmpdir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(tmpdir, "mysql", "mysql")
        subprocess.run(
            [install, *user, f"--datadir={datadir}", "--auth-root-authentication-method=normal",
             "--skip-test-db", f"--tmpdir={tmpdir}", REDO_LOG],
            check=True,
            capture_output=True,
        )  # fmt: skip
        if os.geteuid() == 0:
            shutil.chown(datadir, "mysql", "mysql")
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        _template = datadir
        return datadir


class MariaDBServer:
    """A mariadbd with its own data directory and port (the OS picks it if none is given); start,
    kill -9, restart. The data directory is a copy of `template_datadir`."""

    def __init__(self, port: int | None = None, *, log_bin: bool = False, server_id: int = 1) -> None:
        port = free_port() if port is None else port
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
        self._mariadbd = _require("mariadbd")
        # cp -a keeps the mysql user's ownership (the tests run as root in CI).
        subprocess.run(["cp", "-a", "--reflink=auto", str(template_datadir()), str(datadir)], check=True)
        # Its own tmpdir (see `template_datadir`): startup deletes ``#sql*`` files there.
        self.tmpdir = self.base / "tmp"
        self.tmpdir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.tmpdir, "mysql", "mysql")

    def start(self) -> None:
        user = ["--user=mysql"] if os.geteuid() == 0 else []
        log = open(self.datadir.parent / f"mariadb-{self.port}.log", "ab")  # noqa: SIM115 - kept by the child
        self.proc = subprocess.Popen(
            [self._mariadbd, "--no-defaults", *user, f"--datadir={self.datadir}", f"--port={self.port}",
             f"--socket={self.datadir}/sock", f"--tmpdir={self.tmpdir}", "--bind-address=127.0.0.1",
             "--innodb-buffer-pool-size=32M", REDO_LOG, f"--log-error={self.base}/err.log",
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
        self._check_ours()

    def _check_ours(self) -> None:
        """Fail unless the server answering on the port serves this data directory, which only this
        server's process does (the module's `_check_ours` asks memcached and Redis for their pid):
        where another server held the port, ours exited and the tests would talk to a stranger."""
        import pymysql

        theirs = None
        try:
            conn = pymysql.connect(
                host="127.0.0.1", port=self.port, user="root", connect_timeout=10, read_timeout=10
            )
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT @@datadir")
                    theirs = str(cur.fetchone()[0])
            finally:
                conn.close()
        except pymysql.Error:
            pass
        if theirs is None or Path(theirs).resolve() != self.datadir.resolve():
            self.kill()
            pytest.fail(
                f"mariadbd did not start on port {self.port}: the server there is not ours "
                f"(its datadir: {theirs or 'not told'}; see {self.base}/err.log)"
            )

    def kill(self) -> None:
        """SIGKILL: no shutdown, like a crash."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def freeze(self) -> None:
        """SIGSTOP: the port stays open and nothing answers, like a hung host. Returns once every
        thread of the server has stopped: the signal is delivered after ``kill`` returns, and on a
        busy machine a thread answered a query in between."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)
            wait_stopped(self.proc.pid)

    def thaw(self) -> None:
        """SIGCONT after `freeze`."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def remove(self) -> None:
        """Kill the server and delete its files."""
        self.kill()
        shutil.rmtree(self.base, ignore_errors=True)


@contextmanager
def binlog_pair(
    source_port: int | None = None, target_port: int | None = None
) -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    """Two running MariaDB servers with ROW binlogs (a move's source and target), removed afterwards;
    on ports the OS picks unless given."""
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

    def __init__(self, port: int | None = None) -> None:
        port = free_port() if port is None else port
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


# -- TLS: certificates, and servers of the tests' own that speak TLS ---------------------------


class TLSFiles:
    """PEM files made with the ``openssl`` command line, in a folder every server user can read.

    ``ca`` signs ``server_cert`` (for ``localhost`` and 127.0.0.1 only) and
    ``client_cert``; ``other_ca`` is an unrelated CA that signed nothing here.
    The server's key is a test key, readable by all, so a server running as
    another user can load it; the client's is private to this user.
    """

    def __init__(self) -> None:
        self._openssl = _require("openssl")
        self.base = Path(tempfile.mkdtemp(prefix="store-tls-"))
        os.chmod(self.base, 0o755)
        self.ca, self.ca_key = self._ca("store-test-ca")
        self.other_ca, _ = self._ca("store-test-other-ca")
        self.server_cert, self.server_key = self._leaf(
            "server", "serverAuth", "subjectAltName=DNS:localhost,IP:127.0.0.1"
        )
        self.client_cert, self.client_key = self._leaf("client", "clientAuth", None)
        for path in self.base.iterdir():
            os.chmod(path, 0o644)
        os.chmod(self.client_key, 0o600)  # libpq takes no key that others may read

    def _run(self, *args: str) -> None:
        subprocess.run([self._openssl, *args], check=True, capture_output=True)

    def _ca(self, name: str) -> tuple[Path, Path]:
        cert, key = self.base / f"{name}.pem", self.base / f"{name}-key.pem"
        self._run(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-days", "2", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        )  # fmt: skip
        return cert, key

    def _leaf(self, name: str, usage: str, san: str | None) -> tuple[Path, Path]:
        cert, key = self.base / f"{name}.pem", self.base / f"{name}-key.pem"
        csr, ext = self.base / f"{name}.csr", self.base / f"{name}.ext"
        self._run(
            "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr),
        )  # fmt: skip
        lines = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature",
                 f"extendedKeyUsage={usage}", *([san] if san else [])]  # fmt: skip
        ext.write_text("\n".join(lines) + "\n")
        self._run(
            "x509", "-req", "-in", str(csr), "-CA", str(self.ca), "-CAkey", str(self.ca_key),
            "-set_serial", str(int.from_bytes(os.urandom(8), "big")), "-days", "2",
            "-extfile", str(ext), "-out", str(cert),
        )  # fmt: skip
        return cert, key

    def remove(self) -> None:
        """Delete the files."""
        shutil.rmtree(self.base, ignore_errors=True)


class TLSMariaDBServer(MariaDBServer):
    """A `MariaDBServer` with ``files``' server certificate, listening on 127.0.0.1 and 127.0.0.2.

    The certificate names 127.0.0.1 and not 127.0.0.2: the same server
    reached by a name its certificate does not carry.
    """

    def __init__(self, port: int | None, files: TLSFiles, *, log_bin: bool = False) -> None:
        super().__init__(port, log_bin=log_bin)
        self.extra += [
            "--bind-address=127.0.0.1,127.0.0.2",
            f"--ssl-ca={files.ca}",
            f"--ssl-cert={files.server_cert}",
            f"--ssl-key={files.server_key}",
        ]


def _postgres_bin(name: str) -> str:
    """``name`` from the newest /usr/lib/postgresql/*/bin, else from PATH; skip (fail in CI) if absent."""
    found = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), key=lambda p: int(p.parts[-3]))
    if found:
        return str(found[-1])
    return _require(name)


#: Data directories fresh from ``initdb``, each with a system identifier of its own, and those a
#: running `PostgresServer` of this process was copied from.
_pg_templates: list[Path] = []
_pg_templates_in_use: set[Path] = set()


def _postgres_user() -> dict[str, object]:
    """`subprocess` arguments that run a PostgreSQL program as ``postgres`` when the tests run as root."""
    if os.geteuid() == 0:
        return {"user": "postgres", "group": "postgres", "extra_groups": []}
    return {}


def take_postgres_template() -> Path:
    """A PostgreSQL data directory fresh from ``initdb`` that no running server of this process was
    copied from; made once and kept for the process (as `template_datadir` is for MariaDB), so
    that `PostgresServer` copies it instead of running ``initdb`` for each server, which made the
    same files each time in a second of CPU. Not one another running server's copy shares: a
    cluster's system identifier is initdb's, and a move between two servers of one identifier
    is refused as a move within one server. `give_back_postgres_template` when the copy is gone.
    Nothing ever starts a server on a template itself."""
    with _template_lock:
        for template in _pg_templates:
            if template not in _pg_templates_in_use and template.exists():
                _pg_templates_in_use.add(template)
                return template
        base = Path(tempfile.mkdtemp(prefix="store-postgres-template-"))
        os.chmod(base, 0o755)
        if os.geteuid() == 0:
            shutil.chown(base, "postgres", "postgres")
        data = base / "data"
        subprocess.run(
            [_postgres_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"],
            check=True, capture_output=True, **_postgres_user(),
        )  # fmt: skip
        atexit.register(shutil.rmtree, base, ignore_errors=True)
        _pg_templates.append(data)
        _pg_templates_in_use.add(data)
        return data


def give_back_postgres_template(template: Path) -> None:
    """`take_postgres_template`'s ``template`` may be copied again: its copy's server is gone."""
    with _template_lock:
        _pg_templates_in_use.discard(template)


class PostgresServer:
    """A PostgreSQL of the tests' own (a copy of `take_postgres_template` in a temporary folder) with TLS
    on ``files``' server certificate, on 127.0.0.1 and 127.0.0.2. ``pg_hba.conf``: TLS connections
    are trusted (replication connections too), others refused. Runs as ``postgres`` when the tests
    run as root. ``wal_level="logical"``: a server that can publish and subscribe (moves), with room
    for a move's table copies. ``standby_of``: a streaming hot standby of that running server
    (``pg_basebackup -R`` of it, its ``pg_hba.conf`` the primary's), not a copy of the template."""

    def __init__(
        self,
        port: int | None,
        files: TLSFiles,
        *,
        wal_level: str = "replica",
        standby_of: PostgresServer | None = None,
    ) -> None:
        port = free_port() if port is None else port
        postgres = _postgres_bin("postgres")
        self.port = port
        self.base = Path(tempfile.mkdtemp(prefix=f"store-postgres-{port}-"))
        os.chmod(self.base, 0o755)
        user = _postgres_user()
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres", "postgres")
        data = self.base / "data"
        self._template: Path | None = None
        if standby_of is not None:
            subprocess.run(
                [_postgres_bin("pg_basebackup"), "-h", "127.0.0.1", "-p", str(standby_of.port),
                 "-U", "postgres", "-D", str(data), "-R", "-X", "stream", "-c", "fast", "--no-sync"],
                check=True, capture_output=True, env={**os.environ, "HOME": str(self.base),
                "PGSSLMODE": "require"}, **user,
            )  # fmt: skip
        else:
            # cp -a keeps the postgres user's ownership and the folder's mode (0700, which it requires).
            self._template = take_postgres_template()
            try:
                subprocess.run(["cp", "-a", "--reflink=auto", str(self._template), str(data)], check=True)
            except BaseException:
                give_back_postgres_template(self._template)
                raise
            (data / "pg_hba.conf").write_text(
                "local all all trust\nhostssl all all 127.0.0.0/8 trust\n"
                "hostssl replication all 127.0.0.0/8 trust\nhostnossl all all 127.0.0.0/8 reject\n"
            )
        key = self.base / "server-key.pem"  # libpq's server wants its key private to its user
        shutil.copy(files.server_key, key)
        os.chmod(key, 0o600)
        if os.geteuid() == 0:
            shutil.chown(key, "postgres", "postgres")
        logical = [f"-c{k}={v}" for k, v in (("max_replication_slots", 40), ("max_wal_senders", 40),
                   ("max_logical_replication_workers", 16), ("max_sync_workers_per_subscription", 8),
                   ("max_worker_processes", 32))]  # fmt: skip
        self._args = [
            postgres, "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1,127.0.0.2",
            "-c", f"unix_socket_directories={self.base}", "-c", "ssl=on",
            "-c", f"ssl_cert_file={files.server_cert}", "-c", f"ssl_key_file={key}",
            "-c", "fsync=off", "-c", f"wal_level={wal_level}", *(logical if wal_level == "logical" else []),
        ]  # fmt: skip
        self._user = user
        self.proc = self._run()

    def _run(self) -> subprocess.Popen[bytes]:
        """The server started on its folder (its port open), or the test failed."""
        log = open(self.base / "postgres.log", "ab")  # noqa: SIM115 - kept by the child
        env = {**os.environ, "HOME": str(self.base)}  # libpq: not ~root
        proc: subprocess.Popen[bytes]
        proc = subprocess.Popen(self._args, stdout=log, stderr=log, env=env, **self._user)
        log.close()
        if not wait_port(self.port, 30):
            proc.kill()
            proc.wait()
            shutil.rmtree(self.base, ignore_errors=True)
            pytest.fail(f"postgres did not start on port {self.port}")
        return proc

    def restart(self, *, crash: bool = False) -> None:
        """Stop the server (a fast shutdown; ``crash``: an immediate one, which writes nothing and
        recovers from the WAL at the start, as after a power cut) and start it on the same files."""
        import signal

        self.proc.send_signal(signal.SIGQUIT if crash else signal.SIGINT)
        self.proc.wait(timeout=30)
        self.proc = self._run()

    def kill(self) -> None:
        """An immediate shutdown (``pg_ctl stop -m immediate``, SIGQUIT): nothing is written and the
        port closes, as in a crash; the files stay."""
        import signal

        self.proc.send_signal(signal.SIGQUIT)
        self.proc.wait(timeout=30)

    def create_database(self, name: str = "store", *, within_s: float = 30.0) -> None:
        """``CREATE DATABASE name`` once the server takes connections (its port opens first)."""
        import psycopg

        deadline = time.monotonic() + within_s
        while True:
            try:
                with psycopg.connect(
                    host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                    sslmode="require", autocommit=True,
                ) as conn:  # fmt: skip
                    conn.execute(f"CREATE DATABASE {name}")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def remove(self) -> None:
        """Stop it (fast shutdown) and delete its files."""
        import signal

        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)
        if self._template is not None:
            give_back_postgres_template(self._template)


def start_redis_tls(port: int, files: TLSFiles) -> subprocess.Popen[bytes]:
    """A redis-server of the tests' own speaking only TLS on ``port``, clients need a certificate."""
    binary = _require("redis-server")
    proc = subprocess.Popen(
        [binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(files.server_cert), "--tls-key-file", str(files.server_key),
         "--tls-ca-cert-file", str(files.ca), "--tls-auth-clients", "yes",
         "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    if not wait_port(port, 10):
        proc.kill()
        proc.wait()
        pytest.fail(f"redis-server did not start with TLS on port {port} (built without TLS?)")
    return proc
