"""`store promote` of a PostgreSQL streaming hot standby (``pg_basebackup -R``), on a primary and a standby
the tests start.

Refused while the primary answers (probed with psycopg, not MariaDB's driver); after an immediate
shutdown of the primary, the standby is promoted (``pg_promote``) and the map names it, with every
object and pair written before readable and new writes taken. A standby whose replay is paused
behind what it received is refused unless --force. A probe that fails for another reason than a
server that is down (a role the server refuses) counts as a master that may be up; a "slave" that
is in no recovery is refused unless --force. The command runs as an operator runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from store import Store, StoreConfig
from store.admin import init_shards
from store.admin.promote import PromoteError, promote
from store.backends import backend_named
from tests.conftest import base_config, require_port
from tests.servers import PostgresServer, TLSFiles, free_port

SHARDS = 8


def url(port: int) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/store?sslmode=require"


def sql(port: int, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(
        host="127.0.0.1", port=port, user="postgres", dbname="store", sslmode="require", autocommit=True
    ) as conn:
        cur = conn.execute(query)
        return list(cur.fetchall()) if cur.description else []


def lsn_reached(port: int, function: str, lsn: str) -> bool:
    """Whether ``function()`` (a standby's receive or replay position) on ``port`` has reached ``lsn``."""
    return bool(sql(port, f"SELECT COALESCE({function}() >= '{lsn}'::pg_lsn, false)")[0][0])


def wait_for(port: int, function: str, lsn: str, within_s: float = 30.0) -> None:
    deadline = time.monotonic() + within_s
    while not lsn_reached(port, function, lsn):
        assert time.monotonic() < deadline, f"{function}() on {port} did not reach {lsn}"
        time.sleep(0.05)


def current_lsn(primary: PostgresServer) -> str:
    return str(sql(primary.port, "SELECT pg_current_wal_lsn()::text")[0][0])


class Pair:
    """A primary ``P`` with a database ``store`` and its streaming standby ``S``, the shards of a config
    with Instagram IDs on P (S their slave), made by `init_shards` and replayed on S."""

    def __init__(self, tmp_path: Path) -> None:
        self.files = TLSFiles()
        self.servers: list[PostgresServer] = []
        try:
            self.primary = self._add(PostgresServer(None, self.files))
            self.primary.create_database("store")
            self.standby = self._add(PostgresServer(None, self.files, standby_of=self.primary))
            self.raw = base_config(
                ids="instagram",
                shards=SHARDS,
                hosts={"P": url(self.primary.port), "S": url(self.standby.port)},
                map=[{"range": [0, SHARDS - 1], "master": "P", "slave": "S"}],
                map_source={"file": str(tmp_path / "map.yaml"), "poll_s": 0.2},
            )
            self.config_path = tmp_path / "store.yaml"
            self.config_path.write_text(yaml.safe_dump(self.raw))
            self.config = StoreConfig.from_dict(self.raw)
            init_shards(self.config)  # on the primary; the standby replays it
            self.replayed()
        except BaseException:
            self.remove()
            raise

    def _add(self, server: PostgresServer) -> PostgresServer:
        self.servers.append(server)
        return server

    def replayed(self) -> None:
        """Wait until the standby has replayed all the primary has written."""
        wait_for(self.standby.port, "pg_last_wal_replay_lsn", current_lsn(self.primary))

    def in_recovery(self) -> bool:
        return bool(sql(self.standby.port, "SELECT pg_is_in_recovery()")[0][0])

    def remove(self) -> None:
        for server in reversed(self.servers):
            server.remove()
        self.files.remove()


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[Pair]:
    made = Pair(tmp_path)
    try:
        yield made
    finally:
        made.remove()


class Written:
    """``n`` pins and a board that has them all (Instagram IDs: each read names its type)."""

    def __init__(self, store: Store, n: int, tag: str) -> None:
        self.board = store.create("board", {"name": tag})
        self.pins = {store.create("pin", {"tag": tag, "i": i}): {"tag": tag, "i": i} for i in range(n)}
        for pin in self.pins:
            store.link("board_has_pins", self.board, pin)
        self.tag = tag

    def check(self, store: Store) -> None:
        """Every object and pair is there, as written."""
        assert store.get_many(self.pins, type_name="pin") == self.pins
        assert store.get(self.board, type_name="board") == {"name": self.tag}
        assert store.count("board_has_pins", self.board) == len(self.pins)


def test_a_standby_is_promoted_once_the_primary_is_down(pair: Pair) -> None:
    with Store(pair.config) as store:
        before = Written(store, 20, "before")
        # The primary answers psycopg: refused, the map and the standby untouched.
        with pytest.raises(PromoteError, match="the master P still answers"):
            promote(store, 0, SHARDS - 1, say=lambda _m: None)
        assert store.shard_map.version == 1
        assert pair.in_recovery()
        pair.replayed()
        pair.primary.kill()
        said: list[str] = []
        new = promote(store, 0, SHARDS - 1, say=said.append)
        assert said == [f"promoted S to master of shards 0-{SHARDS - 1} (map version 2)"]
        assert new.version == 2
        assert [(r.start, r.end, r.master, r.slave) for r in store.shard_map.ranges] == [
            (0, SHARDS - 1, "S", None)
        ]
        assert not pair.in_recovery()
        before.check(store)
        after = Written(store, 5, "after")  # new IDs from the standby's own counters
        assert not set(after.pins) & set(before.pins)
        assert store.link("board_has_pins", before.board, next(iter(after.pins)))
        assert store.count("board_has_pins", before.board) == len(before.pins) + 1
    # A store that starts now reads the map the promote wrote, and finds everything on S.
    with Store(pair.config) as fresh:
        assert fresh.shard_map.master(0) == "S"
        after.check(fresh)
        assert fresh.get_many(before.pins, type_name="pin") == before.pins


def test_a_standby_that_has_not_replayed_what_it_received_is_refused_unless_forced(pair: Pair) -> None:
    with Store(pair.config) as store:
        replayed = Written(store, 5, "replayed")
        pair.replayed()
        sql(pair.standby.port, "SELECT pg_wal_replay_pause()")
        received = Written(store, 5, "received")
        # The standby has the new WAL on its disk, and has not replayed it.
        wait_for(pair.standby.port, "pg_last_wal_receive_lsn", current_lsn(pair.primary))
        assert not lsn_reached(pair.standby.port, "pg_last_wal_replay_lsn", current_lsn(pair.primary))
        pair.primary.kill()
        with pytest.raises(PromoteError, match="the slave S has not applied everything it received") as exc:
            promote(store, 0, SHARDS - 1, say=lambda _m: None)
        assert "WAL received" in str(exc.value)
        assert "--force" in str(exc.value)
        assert store.shard_map.version == 1
        assert pair.in_recovery()
        said: list[str] = []
        promote(store, 0, SHARDS - 1, force=True, say=said.append)
        assert said[0].startswith(
            "WARNING: promoting S with --force: unapplied changes will be lost (WAL received"
        )
        assert said[-1] == f"promoted S to master of shards 0-{SHARDS - 1} (map version 2)"
        assert store.shard_map.master(0) == "S"
        replayed.check(store)
        # pg_promote ends a paused replay by replaying the WAL the standby holds first: here the
        # writes it had received are kept (the warning cannot count on it: WAL it never got is lost).
        received.check(store)
        Written(store, 3, "after").check(store)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "store.cli", *args], capture_output=True, text=True, check=False, timeout=120
    )


def test_store_promote_on_the_command_line(pair: Pair) -> None:
    common = ("--config", str(pair.config_path))
    with Store(pair.config) as store:
        before = Written(store, 10, "cli")
    refused = run_cli("promote", *common, "--shards", f"0-{SHARDS - 1}", "--yes")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.splitlines()[-1].startswith("error: the master P still answers")
    assert pair.in_recovery()
    pair.replayed()
    pair.primary.kill()
    done = run_cli("promote", *common, "--shards", f"0-{SHARDS - 1}", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [f"promoted S to master of shards 0-{SHARDS - 1} (map version 2)"]
    shown = run_cli("map", "show", "--json", *common)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {
        "version": 2,
        "shards": SHARDS,
        "ranges": [{"range": [0, SHARDS - 1], "shards": SHARDS, "master": "S", "slave": None}],
    }
    with Store(pair.config) as store:
        assert store.shard_map.master(0) == "S"
        before.check(store)
        Written(store, 3, "after").check(store)


# -- the probe and the slave's state, on the shared PostgreSQL -------------------------------------


def shared_config(tmp_path: Path, master: str, slave: str) -> StoreConfig:
    return StoreConfig.from_dict(
        base_config(
            ids="instagram",
            shards=SHARDS,
            hosts={"P": master, "S": slave},
            map=[{"range": [0, SHARDS - 1], "master": "P", "slave": "S"}],
            map_source={"file": str(tmp_path / "map.yaml")},
            connect_timeout_s=2,
        )
    )


def test_a_probe_refused_by_a_live_server_is_not_a_dead_master(tmp_path: Path) -> None:
    require_port("PostgreSQL", 5432)
    # The master's server is up and refuses the probe's role: it may be taking writes.
    master = "postgresql+psycopg://no_such_role@127.0.0.1:5432/postgres"
    config = shared_config(tmp_path, master, f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/store")
    with Store(config) as store:
        with pytest.raises(PromoteError, match="the master P may still answer: its probe failed") as exc:
            promote(store, 0, SHARDS - 1, say=lambda _m: None)
        assert "no_such_role" in str(exc.value)
        assert store.shard_map.version == 1


def test_a_slave_in_no_recovery_is_refused_unless_forced(tmp_path: Path) -> None:
    require_port("PostgreSQL", 5432)
    # The master is down; the "slave" is the shared server, a primary of its own.
    dead = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/store"
    config = shared_config(tmp_path, dead, "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    with Store(config) as store:
        with pytest.raises(PromoteError, match=r"the slave S is not replicating \(not in recovery"):
            promote(store, 0, SHARDS - 1, say=lambda _m: None)
        assert store.shard_map.version == 1
        said: list[str] = []
        promote(store, 0, SHARDS - 1, force=True, say=said.append)  # (pg_promote is not run: no recovery)
        assert said[0] == (
            "WARNING: promoting S with --force: it is not replicating (not in recovery (pg_is_in_recovery() "
            "is false))"
        )
        assert store.shard_map.master(0) == "S"


def test_which_connect_errors_say_nothing_answered(tmp_path: Path) -> None:
    require_port("PostgreSQL", 5432)
    backend = backend_named("postgresql")

    def error(dsn: str) -> Exception:
        try:
            psycopg.connect(dsn, connect_timeout=2).close()
        except Exception as exc:
            return exc
        raise AssertionError(f"{dsn} connected")

    assert backend.unreachable(error(f"host=127.0.0.1 port={free_port()} user=postgres dbname=postgres"))
    assert not backend.unreachable(error("host=127.0.0.1 port=5432 user=no_such_role dbname=postgres"))
    assert not backend.unreachable(error("host=127.0.0.1 port=5432 user=postgres dbname=no_such_db"))
    assert not backend.unreachable(error("host=no-such-host.invalid port=5432 user=postgres dbname=postgres"))
