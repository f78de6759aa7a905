"""`store promote` with a real MariaDB master and slave (GTID replication) started by the test; hosts that
cannot be promoted, a config without a map_source, and a master whose probe a live server refuses.

PostgreSQL standbys: tests/test_promote_postgres.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest
from sqlalchemy.engine import make_url

from store import ConfigError, Store, StoreConfig
from store.admin import init_shards
from store.admin.promote import PromoteError, promote
from store.backends import backend_named
from tests.conftest import base_config, require_port
from tests.servers import MariaDBServer, free_port


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[tuple[MariaDBServer, MariaDBServer, StoreConfig]]:
    master = MariaDBServer(log_bin=True, server_id=11)
    slave = MariaDBServer(log_bin=True, server_id=12)
    try:
        master.start()
        slave.start()
        conn = pymysql.connect(host="127.0.0.1", port=slave.port, user="root", autocommit=True)
        with conn.cursor() as cur:
            cur.execute(
                "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=%s, MASTER_USER='root', "
                "MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos",
                (master.port,),
            )
            cur.execute("START SLAVE")
        conn.close()
        raw = base_config(
            shards=4,
            hosts={"M": master.url, "S": slave.url},
            map=[{"range": [0, 3], "master": "M", "slave": "S"}],
            map_source={"file": str(tmp_path / "map.yaml")},
        )
        config = StoreConfig.from_dict(raw)
        init_shards(config)  # on the master; replicated to the slave
        yield master, slave, config
    finally:
        master.remove()
        slave.remove()


def wait_replicated(master: MariaDBServer, slave: MariaDBServer) -> None:
    m = pymysql.connect(host="127.0.0.1", port=master.port, user="root")
    with m.cursor() as cur:
        cur.execute("SELECT @@gtid_binlog_pos")
        pos = cur.fetchone()[0]
    m.close()
    s = pymysql.connect(host="127.0.0.1", port=slave.port, user="root")
    with s.cursor() as cur:
        cur.execute("SELECT MASTER_GTID_WAIT(%s, 30)", (pos,))
        assert cur.fetchone() == (0,)
    s.close()


def test_promote_after_the_master_dies(replicated: tuple[MariaDBServer, MariaDBServer, StoreConfig]) -> None:
    master, slave, config = replicated
    with Store(config) as store:
        pins = [store.create("pin", {"i": i}) for i in range(20)]
        with pytest.raises(PromoteError, match="still answers"):
            promote(store, 0, 3, say=lambda _m: None)
        wait_replicated(master, slave)
        master.kill()
        new = promote(store, 0, 3, say=lambda _m: None)
        assert new.version == 2
        assert store.shard_map.master(2) == "S"
        assert store.shard_map.range_for(2).slave is None
        assert store.get_many(pins) == {p: {"i": i} for i, p in enumerate(pins)}
        assert store.get(store.create("pin", {"after": True})) == {"after": True}


def test_promote_refuses_a_slave_that_has_not_applied_what_it_received(
    replicated: tuple[MariaDBServer, MariaDBServer, StoreConfig],
) -> None:
    master, slave, config = replicated
    s = pymysql.connect(host="127.0.0.1", port=slave.port, user="root", autocommit=True)
    with s.cursor() as cur:
        cur.execute("STOP SLAVE SQL_THREAD")  # it keeps receiving, applies nothing
    with Store(config) as store:
        for i in range(5):
            store.create("pin", {"i": i})
        import time

        time.sleep(0.5)  # let the IO thread receive them
        master.kill()
        with pytest.raises(PromoteError, match="has not applied everything it received"):
            promote(store, 0, 3, say=lambda _m: None)
        said: list[str] = []
        promote(store, 0, 3, force=True, say=said.append)
        assert any(m.startswith("WARNING") for m in said)
        assert store.shard_map.master(0) == "S"
    s.close()


def test_promote_refuses_a_slave_whose_io_thread_was_stopped(
    replicated: tuple[MariaDBServer, MariaDBServer, StoreConfig],
) -> None:
    """A slave that stopped receiving (its IO thread stopped, by hand here) has applied all it
    received, yet may lack every write since: refused unless forced. (A dead master leaves the
    IO thread connecting again, not stopped: the test above promotes that slave.)"""
    master, slave, config = replicated
    wait_replicated(master, slave)
    s = pymysql.connect(host="127.0.0.1", port=slave.port, user="root", autocommit=True)
    with s.cursor() as cur:
        cur.execute("STOP SLAVE IO_THREAD")
    s.close()
    with Store(config) as store:
        store.create("pin", {"after": "the IO thread stopped"})
        master.kill()
        with pytest.raises(
            PromoteError, match=r"the slave S is not replicating \(default: its IO thread is not running"
        ):
            promote(store, 0, 3, say=lambda _m: None)
        assert store.shard_map.version == 1
        said: list[str] = []
        promote(store, 0, 3, force=True, say=said.append)
        assert said[0].startswith("WARNING: promoting S with --force: it is not replicating (default: its IO")
        assert store.shard_map.master(0) == "S"


def test_a_mariadb_slave_that_has_no_master_is_refused_unless_forced(tmp_path: Path) -> None:
    require_port("MariaDB", 3306)
    # The master is down; the "slave" is the shared server, which replicates from nothing.
    dead = f"mysql+pymysql://root@127.0.0.1:{free_port()}"
    config = promote_config(tmp_path, dead, "mysql+pymysql://root@127.0.0.1:3306")
    with Store(config) as store:
        with pytest.raises(PromoteError, match=r"the slave S is not replicating \(SHOW ALL SLAVES STATUS"):
            promote(store, 0, 3, say=lambda _m: None)
        assert store.shard_map.version == 1


# -- what cannot be promoted, and a probe a live server refuses ------------------------------------


def promote_config(tmp_path: Path, master: str, slave: str) -> StoreConfig:
    return StoreConfig.from_dict(
        base_config(
            shards=4,
            hosts={"M": master, "S": slave},
            map=[{"range": [0, 3], "master": "M", "slave": "S"}],
            map_source={"file": str(tmp_path / "map.yaml")},
            connect_timeout_s=2,
        )
    )


def test_a_sqlite_slave_cannot_be_promoted(tmp_path: Path) -> None:
    config = promote_config(tmp_path, f"sqlite:///{tmp_path}/m", f"sqlite:///{tmp_path}/s")
    with Store(config) as store:
        with pytest.raises(
            PromoteError, match="the slave S is a sqlite host, which has no slaves to promote"
        ) as exc:
            promote(store, 0, 3, force=True, say=lambda _m: None)
        assert "store promote works on mysql, postgresql hosts" in str(exc.value)
        assert store.shard_map.version == 1


def test_promote_needs_a_map_source_before_it_touches_a_server(tmp_path: Path) -> None:
    # Both hosts on ports nothing listens on: refused before the probe or the slave are tried.
    raw = base_config(
        shards=4,
        hosts={
            "M": f"mysql+pymysql://root@127.0.0.1:{free_port()}",
            "S": f"mysql+pymysql://root@127.0.0.1:{free_port()}",
        },
        map=[{"range": [0, 3], "master": "M", "slave": "S"}],
    )
    with (
        Store(StoreConfig.from_dict(raw)) as store,
        pytest.raises(ConfigError, match="a promote must publish a new map to every running store"),
    ):
        promote(store, 0, 3, force=True, say=lambda _m: None)


def test_a_master_that_refuses_the_probes_login_may_be_up(tmp_path: Path) -> None:
    require_port("MariaDB", 3306)
    master = "mysql+pymysql://no_such_user@127.0.0.1:3306"
    config = promote_config(tmp_path, master, f"mysql+pymysql://root@127.0.0.1:{free_port()}")
    with Store(config) as store:
        with pytest.raises(PromoteError, match="the master M may still answer: its probe failed") as exc:
            promote(store, 0, 3, say=lambda _m: None)
        assert "Access denied" in str(exc.value)
        assert store.shard_map.version == 1


@pytest.mark.parametrize("driver", ["pymysql", "mysqldb"])
def test_which_connect_errors_say_nothing_answered(driver: str) -> None:
    require_port("MariaDB", 3306)
    backend = backend_named("mysql")

    def error(host: str, port: int, user: str = "root") -> Exception:
        url = make_url(f"mysql+{driver}://{user}@{host}:{port}")
        try:
            backend.admin_connector(url)().close()
        except Exception as exc:
            return exc
        raise AssertionError(f"{url} connected")

    assert backend.unreachable(error("127.0.0.1", free_port()))
    assert not backend.unreachable(error("127.0.0.1", 3306, "no_such_user"))
    assert not backend.unreachable(error("no-such-host.invalid", 3306))
