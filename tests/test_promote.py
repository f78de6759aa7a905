"""`store promote` with a real master and slave (GTID replication) started by the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

from store import Store, StoreConfig
from store.admin import init_shards
from store.admin.promote import PromoteError, promote
from tests.conftest import base_config
from tests.servers import MariaDBServer


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
