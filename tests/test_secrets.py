"""No password is ever printed or written: every CLI command runs with passwords set, and all it
prints and every file it leaves behind is searched for them.

Two private MariaDB servers (with binlogs, so a real move runs) carry an admin
account whose password comes from a file and from the environment, and an
application account whose password sits inside its URLs, the map table's and
the Redis URL's. Each command runs as a user would (a process of its own
working folder), on the right passwords and then on a wrong one, and on a host
that does not answer.

The commands run in a few child processes, several one after another in each
through the `store` command's main function (`DRIVER`), each with its own
standard output and error (the file descriptors, so that what a library or a
child process writes is caught too), exit code and traceback, as separate
processes would have them: a Python start for each of some 80 commands cost
more than most of the commands. `store serve` runs in a process of its own.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pymysql
import pytest
import yaml

from store import Store, StoreConfig, StoreError
from store.cli import main
from tests.conftest import MEMCACHED_PORTS, REDIS_PORT, base_config
from tests.servers import MariaDBServer, binlog_pair, free_ports

APP_PW = "app-Zq9secretA1"
ADMIN_PW = "adm-Xk7secretB2"
WRONG_PW = "bad-Yy3secretC3"
CURSOR_SECRET = "cur-Wv5secretD4-signs-page-cursors"
SECRETS = (APP_PW, ADMIN_PW, WRONG_PW, CURSOR_SECRET)
ADMIN_PW_ENV = "STORE_SECRETS_TEST_ADMIN_PW"
PORTS = free_ports(2)
SHARDS = 16

pytestmark = pytest.mark.moves  # two servers of its own and a real move


def _accounts(server: MariaDBServer) -> None:
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute("CREATE USER 'store_admin'@'%%' IDENTIFIED BY %s", (ADMIN_PW,))
            cur.execute("GRANT ALL PRIVILEGES ON *.* TO 'store_admin'@'%' WITH GRANT OPTION")
            cur.execute("CREATE USER 'store_app'@'%%' IDENTIFIED BY %s", (APP_PW,))
    finally:
        conn.close()


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    with binlog_pair(*PORTS) as pair:
        for server in pair:
            _accounts(server)
        yield pair


def _raw(folder: Path, app_pw: str = APP_PW, port_a: int = PORTS[0]) -> dict[str, Any]:
    """The config: the app's password in its URLs, the admin's in a file (A) and the environment (B)."""
    (folder / "admin-pw").write_text(ADMIN_PW + "\n")
    (folder / "cursor-secret").write_text(CURSOR_SECRET + "\n")
    app = f"mysql+pymysql://store_app:{app_pw}@127.0.0.1"
    return base_config(
        shards=SHARDS,
        hosts={
            "A": {
                "url": f"{app}:{port_a}",
                "admin": {
                    "url": f"mysql+pymysql://store_admin@127.0.0.1:{port_a}",
                    "password_file": "admin-pw",
                },
            },
            "B": {
                "url": f"{app}:{PORTS[1]}",
                "admin": {
                    "url": f"mysql+pymysql://store_admin@127.0.0.1:{PORTS[1]}",
                    "password_env": ADMIN_PW_ENV,
                },
            },
        },
        map=[{"range": [0, SHARDS - 1], "master": "A"}],
        map_source={
            "table": {
                "url": f"{app}:{port_a}",
                "admin": {"url": f"mysql+pymysql://store_admin:{ADMIN_PW}@127.0.0.1:{port_a}"},
            },
            "poll_s": 0.2,
        },
        unique={"username": {"type": "user", "field": "name"}},
        cursor_secret_file="cursor-secret",
        cache={
            "memcached": [f"127.0.0.1:{MEMCACHED_PORTS[0]}"],
            "redis": f"redis://:{app_pw}@127.0.0.1:{REDIS_PORT}/14",
            "prefix": "sec:",
        },
        tickets={
            "servers": [f"mysql+pymysql://store_admin:{ADMIN_PW}@127.0.0.1:{p}" for p in PORTS],
            "counters": ["photos"],
        },
    )


#: Runs the commands of a job file (JSON: a list of [args, stdout file, stderr file]) one after
#: another through `store.cli.main`, each with fds 1 and 2 on its own files, as `python -m
#: store.cli ARGS` would run it: its exit code (a string code printed, as Python does), and an
#: exception that escapes the command printed as the interpreter prints it. Prints each code.
DRIVER = """
import json, os, sys, traceback
from store.cli import main
jobs = json.load(open(sys.argv[1]))
codes = []
for args, out_path, err_path in jobs:
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            try:
                main.main(args=args, prog_name="store", standalone_mode=True)
                code = 0
            except SystemExit as exc:
                code = exc.code
                if code is None:
                    code = 0
                elif not isinstance(code, int):
                    print(code, file=sys.stderr)
                    code = 1
            except BaseException:
                traceback.print_exc()
                code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    codes.append(code)
print(json.dumps(codes), flush=True)
"""


@dataclass(frozen=True)
class Cmd:
    """One `store ARGS` of a batch; ``ok``: it must succeed (True), fail (False), or either (None)."""

    args: tuple[str, ...]
    ok: bool | None = True
    config: Path | None = None


def cmd(*args: str, ok: bool | None = True, config: Path | None = None) -> Cmd:
    return Cmd(args, ok, config)


class Runner:
    """Runs `store ...` in a working folder of its own; keeps every command line and its output."""

    def __init__(self, folder: Path, config: Path) -> None:
        self.folder = folder
        self.config = config
        self.outputs: list[tuple[str, str]] = []
        self.commands: set[str] = set()

    def __call__(self, *cmds: Cmd) -> list[str]:
        """Run ``cmds`` in order in one child process (`DRIVER`); their standard outputs."""
        with tempfile.TemporaryDirectory(prefix="store-secrets-") as tmp:  # outside the searched folder
            jobs = []
            for k, c in enumerate(cmds):
                # (ids take no config)
                where = [] if c.args[0] == "ids" else ["--config", str(c.config or self.config)]
                jobs.append([[*c.args, *where], f"{tmp}/{k}.out", f"{tmp}/{k}.err"])
            job_file = Path(tmp) / "jobs.json"
            job_file.write_text(json.dumps(jobs))
            done = subprocess.run(
                [sys.executable, "-c", DRIVER, str(job_file)],
                capture_output=True,
                text=True,
                timeout=300 + 60 * len(cmds),
                cwd=self.folder,
                env={**os.environ, ADMIN_PW_ENV: ADMIN_PW},
            )
            self.outputs.append(("(the batch's own output)", done.stdout + done.stderr))
            assert done.returncode == 0, f"the batch failed: {done.stderr}"
            codes = json.loads(done.stdout.splitlines()[-1])
            assert len(codes) == len(cmds), done.stdout
            outs = []
            for (_args, out_path, err_path), c, code in zip(jobs, cmds, codes, strict=True):
                stdout = Path(out_path).read_text(errors="replace")
                stderr = Path(err_path).read_text(errors="replace")
                outs.append(stdout)
                line = " ".join(c.args)
                self.outputs.append((line, stdout + stderr))
                two = " ".join(c.args[:2])
                self.commands.add(two if two in _COMMANDS else c.args[0])
                assert "Traceback" not in stderr, f"store {line}: {stderr}"
                if c.ok is True:
                    assert code == 0, f"store {line} failed: {stderr}"
                elif c.ok is False:
                    assert code != 0, f"store {line} should have failed"
        return outs

    def serve(self, *pages: str) -> None:
        """`store serve --metrics` for a moment: every page and endpoint read, then stopped."""
        import socket
        import time
        import urllib.request

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "store.cli", "serve", "--port", str(port), "--metrics",
             "--journal", "move.json", "--check-file", "check.json", "--config", str(self.config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=self.folder,
            env={**os.environ, ADMIN_PW_ENV: ADMIN_PW},
        )  # fmt: skip
        try:
            body = []
            deadline = time.monotonic() + 30
            for page in pages:
                while True:
                    try:
                        with urllib.request.urlopen(f"http://127.0.0.1:{port}{page}", timeout=10) as r:
                            body.append(r.read().decode())
                        break
                    except OSError:
                        if time.monotonic() > deadline or proc.poll() is not None:
                            raise
                        time.sleep(0.2)
        finally:
            proc.terminate()
            out, _ = proc.communicate(timeout=30)
        self.outputs.append(("serve", "\n".join([*body, out])))
        self.commands.add("serve")
        assert "Traceback" not in out, out
        assert len(body) == len(pages)


def _command_names(group: click.Group, prefix: str = "") -> set[str]:
    out: set[str] = set()
    for name, cmd in group.commands.items():
        full = f"{prefix}{name}"
        if isinstance(cmd, click.Group):
            out |= _command_names(cmd, full + " ")
            if cmd.invoke_without_command:
                out.add(full)
        else:
            out.add(full)
    return out


_COMMANDS = _command_names(main) | {n.split()[0] for n in _command_names(main)}


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


@pytest.mark.timeout(900)  # (some 80 commands in three processes, and a move: minutes on a busy machine)
def test_no_command_prints_or_writes_a_password(
    servers: tuple[MariaDBServer, MariaDBServer], tmp_path: Path, own_caches: None
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    config = tmp_path / "store.yaml"
    config.write_text(yaml.safe_dump(_raw(tmp_path)))
    run = Runner(work, config)

    # Admin: make the shards, give the application its rows; the request path makes three objects.
    *_, pin, board, user = (
        out.strip()
        for out in run(
            cmd("init"),
            cmd("grants", "--app-user", "store_app"),
            cmd("grants", "--app-user", "store_app", "--apply"),
            cmd("schema"),
            cmd("map", "show"),
            cmd("map", "show", "--json"),
            cmd("tickets", "init"),
            cmd("tickets", "next", "photos", "-n", "3"),
            cmd("tickets", "next", "photos", "--json"),
            cmd("create", "pin", '{"title": "a"}', "--shard", "9"),
            cmd("create", "board", "{}", "--shard", "2"),
            cmd("create", "user", '{"name": "ann"}'),
        )
    )

    run(
        # The request path, as the application account.
        cmd("get", pin),
        cmd("get", pin, "--json"),
        cmd("get", pin, board, "--type", "pin", ok=False),  # several IDs; the board is no pin
        cmd("get", pin, board, "--json"),
        cmd("update", pin, '{"title": "b"}'),
        cmd("link", "board_has_pins", board, pin),
        cmd("links", "board_has_pins", board),
        cmd("links", "board_has_pins", board, "--json"),
        cmd("page", "board_has_pins", board, "--objects"),
        cmd("page", "board_has_pins", board, "--objects", "--json"),
        # The Redis URL carries a password this Redis may refuse: pass or fail, no password is shown.
        cmd("ping", ok=None),
        cmd("ping", "--json", ok=None),
        cmd("has-link", "board_has_pins", board, pin),
        cmd("count", "board_has_pins", board),
        cmd("lookup", "username", "ann"),
        cmd("lookup", "username", "ann", "--json"),
        cmd("create", "user", '{"name": "ann"}', ok=False),  # a duplicate key: its error names no password
        cmd("check", "--result-file", "check.json"),
        cmd("check", "--json"),
        cmd("relations", "repair"),
        cmd("relations", "repair", "--json"),
        cmd("export", "--out", "export.ndjson"),
        cmd("import", "export.ndjson"),  # (what is there is skipped: nothing changes)
        # The benchmarks (before the move: the mix loads its floor by the config's map).
        cmd("demo"),
        cmd("bench", "-n", "5"),
        cmd("bench", "-n", "5", "--json"),
        cmd("bench", "mix", "--quick", "--users", "40", "--shards", "16", "--requests", "20", "--out", "mix"),
        # A real move (its journal and output), the map's history.
        cmd("move", "--shards", "8-15", "--to", "B", "--dry-run"),
        cmd("move", "--shards", "8-15", "--to", "B", "--yes", "--journal", "move.json"),
        cmd("map", "diff"),
        cmd("map", "diff", "--json"),
    )
    run.serve(
        "/",
        "/panels",
        "/api/all",
        "/api/map",
        "/api/hosts",
        "/api/caches",
        "/api/invalidators",
        "/api/move",
        "/api/check",
        "/metrics",
    )
    # The same commands with a wrong password, and with a host that does not answer.
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump(_raw(tmp_path, app_pw=WRONG_PW)))
    down = tmp_path / "down.yaml"
    down.write_text(yaml.safe_dump(_raw(tmp_path, port_a=1)))
    run(
        cmd("--log-json", "map", "show"),  # log lines too
        cmd("get", pin),  # now served by B
        cmd("move", "--status", "--journal", "move.json"),
        cmd("move", "--status", "--json", "--journal", "move.json"),
        cmd("rebalance", "--hosts", "A,B", "--dry-run"),
        cmd("move", "--cleanup", "--journal", "move.json"),
        cmd("promote", "--shards", "0-7", "--yes", ok=False),  # no slave to promote
        cmd("unlink", "board_has_pins", board, pin),
        cmd("delete", user, "--yes"),
        cmd("ids", "decode", pin),
        cmd("invalidate", ok=False),  # no host set to log or binlog: the error names no password
        cmd("ids", "encode", "--shard", "1", "--type", "1", "--local", "1"),
        *(
            cmd(*args, ok=False, config=wrong)
            for args in (
                ["get", pin],
                ["create", "pin", "{}"],
                ["links", "board_has_pins", board],
                ["map", "show"],
            )
        ),
        *(
            cmd(*args, ok=False, config=down)
            for args in (
                ["init"],
                ["check"],
                ["get", pin],
                ["grants", "--app-user", "store_app", "--apply"],
                ["ping"],
            )
        ),
    )

    missed = _COMMANDS - run.commands - {n.split()[0] for n in _COMMANDS if " " in n}
    assert not missed, f"commands the test never ran: {sorted(missed)}"
    leaks = [(line, _leaks(out)) for line, out in run.outputs if _leaks(out)]
    assert not leaks, f"passwords printed by: {leaks}"
    written = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file()
        and p.name not in ("store.yaml", "wrong.yaml", "down.yaml", "admin-pw", "cursor-secret")
    ]
    assert any(p.name == "move.json" for p in written), "the move left no journal to search"
    assert any(p.parent.name == "mix" for p in written), "the mix left no report to search"
    found = [(str(p.relative_to(tmp_path)), _leaks(p.read_text(errors="replace"))) for p in written]
    assert not [f for f in found if f[1]], f"passwords written to: {[f for f in found if f[1]]}"


def _open_and_write(config: StoreConfig, seen: list[str]) -> None:
    with Store(config) as store:
        seen.append(repr(store))
        store.create("pin", {}, shard=1)


def test_errors_configs_and_logs_never_show_a_password(
    servers: tuple[MariaDBServer, MariaDBServer], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    os.environ[ADMIN_PW_ENV] = ADMIN_PW
    try:
        for raw in (_raw(tmp_path, app_pw=WRONG_PW), _raw(tmp_path, port_a=1)):
            config = StoreConfig.from_dict(raw, base_dir=tmp_path)
            seen += [repr(config), str(config), repr(config.for_admin()), repr(config.tickets)]
            with pytest.raises(StoreError) as info:  # opening (the map table) or the write refuses
                _open_and_write(config, seen)
            exc: BaseException | None = info.value
            while exc is not None:  # the whole chain, as a traceback shows it
                seen += [repr(exc), str(exc), *map(repr, exc.args)]
                exc = exc.__cause__ or exc.__context__
            seen.append("".join(traceback.format_exception(info.value)))
    finally:
        del os.environ[ADMIN_PW_ENV]
    seen += [r.getMessage() for r in caplog.records]
    assert sum("Access denied" in t or "refused" in t.lower() for t in seen) >= 2, "no error was looked at"
    leaks = [text for text in seen if _leaks(text)]
    assert not leaks, f"a password shows in: {leaks[:3]}"
