"""No password is ever printed or written: every CLI command runs with passwords set, and all it
prints and every file it leaves behind is searched for them.

Two private MariaDB servers (with binlogs, so a real move runs) carry an admin
account whose password comes from a file and from the environment, and an
application account whose password sits inside its URLs, the map table's and
the Redis URL's. Each command runs as a user would (a subprocess, its own
working folder), on the right passwords and then on a wrong one, and on a host
that does not answer.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Iterator
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


class Runner:
    """Runs `store ...` in a working folder of its own; keeps every command line and its output."""

    def __init__(self, folder: Path, config: Path) -> None:
        self.folder = folder
        self.config = config
        self.outputs: list[tuple[str, str]] = []
        self.commands: set[str] = set()

    def __call__(self, *args: str, ok: bool | None = True, config: Path | None = None) -> str:
        """Run `store ARGS`; ``ok``: it must succeed (True), fail (False), or either (None)."""
        where = [] if args[0] == "ids" else ["--config", str(config or self.config)]  # ids take no config
        done = subprocess.run(
            [sys.executable, "-m", "store.cli", *args, *where],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=self.folder,
            env={**os.environ, ADMIN_PW_ENV: ADMIN_PW},
        )
        line = " ".join(args)
        self.outputs.append((line, done.stdout + done.stderr))
        two = " ".join(args[:2])
        self.commands.add(two if two in _COMMANDS else args[0])
        assert "Traceback" not in done.stderr, f"store {line}: {done.stderr}"
        if ok is True:
            assert done.returncode == 0, f"store {line} failed: {done.stderr}"
        elif ok is False:
            assert done.returncode != 0, f"store {line} should have failed"
        return done.stdout

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


@pytest.mark.timeout(900)  # (some 80 commands, each a process of its own: 4 minutes on two idle cores)
def test_no_command_prints_or_writes_a_password(
    servers: tuple[MariaDBServer, MariaDBServer], tmp_path: Path, own_caches: None
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    config = tmp_path / "store.yaml"
    config.write_text(yaml.safe_dump(_raw(tmp_path)))
    run = Runner(work, config)

    # Admin: make the shards, give the application its rows.
    run("init")
    run("grants", "--app-user", "store_app")
    run("grants", "--app-user", "store_app", "--apply")
    run("schema")
    run("map", "show")
    run("map", "show", "--json")
    run("tickets", "init")
    run("tickets", "next", "photos", "-n", "3")
    run("tickets", "next", "photos", "--json")

    # The request path, as the application account.
    pin = run("create", "pin", '{"title": "a"}', "--shard", "9").strip()
    board = run("create", "board", "{}", "--shard", "2").strip()
    user = run("create", "user", '{"name": "ann"}').strip()
    run("get", pin)
    run("get", pin, "--json")
    run("get", pin, board, "--type", "pin", ok=False)  # several IDs; the board is no pin
    run("get", pin, board, "--json")
    run("update", pin, '{"title": "b"}')
    run("link", "board_has_pins", board, pin)
    run("links", "board_has_pins", board)
    run("links", "board_has_pins", board, "--json")
    run("page", "board_has_pins", board, "--objects")
    run("page", "board_has_pins", board, "--objects", "--json")
    # The Redis URL carries a password this Redis may refuse: pass or fail, no password is shown.
    run("ping", ok=None)
    run("ping", "--json", ok=None)
    run("has-link", "board_has_pins", board, pin)
    run("count", "board_has_pins", board)
    run("lookup", "username", "ann")
    run("lookup", "username", "ann", "--json")
    run("create", "user", '{"name": "ann"}', ok=False)  # a duplicate key: its error names no password
    run("check", "--result-file", "check.json")
    run("check", "--json")
    run("relations", "repair")
    run("relations", "repair", "--json")
    run("export", "--out", "export.ndjson")
    run("import", "export.ndjson")  # (what is there is skipped: nothing changes)

    # The benchmarks (before the move: the mix loads its floor by the config's map).
    run("demo")
    run("bench", "-n", "5")
    run("bench", "-n", "5", "--json")
    run("bench", "mix", "--quick", "--users", "40", "--shards", "16", "--requests", "20", "--out", "mix")

    # A real move (its journal and output), the map's history, a promotion refused.
    run("move", "--shards", "8-15", "--to", "B", "--dry-run")
    run("move", "--shards", "8-15", "--to", "B", "--yes", "--journal", "move.json")
    run("map", "diff")
    run("map", "diff", "--json")
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
    run("--log-json", "map", "show")  # log lines too
    run("get", pin)  # now served by B
    run("move", "--status", "--journal", "move.json")
    run("move", "--status", "--json", "--journal", "move.json")
    run("rebalance", "--hosts", "A,B", "--dry-run")
    run("move", "--cleanup", "--journal", "move.json")
    run("promote", "--shards", "0-7", "--yes", ok=False)  # no slave to promote
    run("unlink", "board_has_pins", board, pin)
    run("delete", user, "--yes")
    run("ids", "decode", pin)
    run("invalidate", ok=False)  # no host set to log or binlog: the error names no password
    run("ids", "encode", "--shard", "1", "--type", "1", "--local", "1")

    # The same commands with a wrong password, and with a host that does not answer.
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(yaml.safe_dump(_raw(tmp_path, app_pw=WRONG_PW)))
    for args in (["get", pin], ["create", "pin", "{}"], ["links", "board_has_pins", board], ["map", "show"]):
        run(*args, ok=False, config=wrong)
    down = tmp_path / "down.yaml"
    down.write_text(yaml.safe_dump(_raw(tmp_path, port_a=1)))
    for args in (
        ["init"],
        ["check"],
        ["get", pin],
        ["grants", "--app-user", "store_app", "--apply"],
        ["ping"],
    ):
        run(*args, ok=False, config=down)

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
