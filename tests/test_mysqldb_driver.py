"""The mysqlclient driver (``mysql+mysqldb://``) beside PyMySQL: the same store, the same errors."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pymysql
import pytest
import yaml
from sqlalchemy.engine import URL, make_url

from store import ConfigError, Store, StoreConfig
from store.backends import ErrorKind, backend_for
from store.backends.mysql import TOMBSTONE_ERRNO, MySQLBackend, mysql_connector, mysql_driver_error
from tests.conftest import MARIADB_URL, NAMESPACE, mariadb_config

DRIVERS = ["pymysql", "mysqldb"]
SCRATCH_DB = f"{NAMESPACE}_mysqldb_test"


def driver_url(driver: str) -> URL:
    """The test MariaDB's URL with ``driver``."""
    return make_url(MARIADB_URL).set(drivername=f"mysql+{driver}")


def mysqldb_config() -> dict[str, Any]:
    """The MariaDB test config (two host names, one server) with every host on mysqlclient."""
    raw = mariadb_config()
    url = driver_url("mysqldb").render_as_string(hide_password=False)
    raw["hosts"] = dict.fromkeys(raw["hosts"], url)
    return raw


@pytest.fixture(scope="session")
def mysqldb() -> ModuleType:
    """The MySQLdb module (`make test` installs mysqlclient; CI must not skip for want of it)."""
    try:
        return importlib.import_module("MySQLdb")
    except ImportError:
        if os.environ.get("STORE_REQUIRE_SERVICES") == "1":
            raise
        pytest.skip("mysqlclient is not installed: pip install mysqlclient")


@pytest.fixture
def mysqldb_store(mariadb_ready: StoreConfig, mysqldb: ModuleType) -> Iterator[Store]:
    """A store on the initialised test shards whose hosts all use mysqlclient."""
    with Store.from_config(mysqldb_config()) as store:
        yield store


@pytest.fixture
def scratch(mariadb_ready: StoreConfig, mysqldb: ModuleType) -> Iterator[str]:
    """A database of its own holding one table ``t (k INT PRIMARY KEY, v INT)``, dropped afterwards."""
    admin = mysql_connector(driver_url("pymysql"))()
    cur = admin.cursor()
    cur.execute(f"DROP DATABASE IF EXISTS {SCRATCH_DB}")
    cur.execute(f"CREATE DATABASE {SCRATCH_DB}")
    cur.execute(f"CREATE TABLE {SCRATCH_DB}.t (k INT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB")
    try:
        yield f"{SCRATCH_DB}.t"
    finally:
        cur.execute(f"DROP DATABASE IF EXISTS {SCRATCH_DB}")
        admin.close()


def raised(run: Callable[[], object]) -> BaseException:
    """The exception ``run()`` raises."""
    with pytest.raises(Exception) as info:  # noqa: PT011 - any driver error; the caller inspects it
        run()
    return info.value


# -- the store on mysqlclient ------------------------------------------------------------------


@pytest.mark.mariadb
def test_a_mysqldb_url_selects_the_mariadb_backend_and_driver(mysqldb_store: Store) -> None:
    for url in ("mysql+mysqldb://root@127.0.0.1:3306", "mariadb+mysqldb://root@127.0.0.1:3306"):
        assert isinstance(backend_for(make_url(url)), MySQLBackend)
    pin = mysqldb_store.create("pin", {"a": 1}, shard=0)
    pool = mysqldb_store.admin_context().engines.shard(0, mysqldb_store.locate(pin).host).pool
    assert mysqldb_store.get(pin) == {"a": 1}
    raws = [c.raw for c in pool.idle_connections()]
    assert raws
    assert all(type(raw).__module__.startswith("MySQLdb") for raw in raws)


@pytest.mark.mariadb
def test_objects_on_mysqldb(mysqldb_store: Store) -> None:
    s = mysqldb_store
    board = s.create("board", {"name": "kitchen", "é": "ü"}, shard=1)
    pins = [s.create("pin", {"n": n}, near=board) for n in range(3)]
    far = s.create("pin", {"n": 9}, shard=6)
    assert s.get(board) == {"name": "kitchen", "é": "ü"}
    assert s.get_many([*pins, far]) == {**{p: {"n": n} for n, p in enumerate(pins)}, far: {"n": 9}}
    assert s.update(pins[0], {"title": "granite"}) == {"n": 0, "title": "granite"}
    assert s.update(far, lambda old: {**old, "n": old["n"] + 1}) == {"n": 10}
    assert s.get(far) == {"n": 10}
    assert s.delete(pins[1]) is True
    assert s.delete(pins[1]) is False  # affected rows, not found rows: a second delete changes nothing
    assert s.get(pins[1]) is None
    assert set(s.get_many(pins)) == {pins[0], pins[2]}


@pytest.mark.mariadb
def test_links_with_inverses_across_two_hosts_on_mysqldb(mysqldb_store: Store) -> None:
    s = mysqldb_store
    board = s.create("board", {}, shard=2)  # MySQL001A
    pins = [s.create("pin", {"n": n}, shard=5) for n in range(5)]  # MySQL002A
    assert s.shard_map.master(2) != s.shard_map.master(5)
    for seq, pin in enumerate(pins, start=1):
        assert s.link("board_has_pins", board, pin, sequence=seq) is True
    # A pair that is there already: ON DUPLICATE KEY UPDATE changes nothing, and says so (rowcount 0).
    assert s.link("board_has_pins", board, pins[0], sequence=1) is False
    assert s.count("board_has_pins", board) == 5
    assert s.links("pin_owned_by_board", pins[3]) == [board]

    first = s.page("board_has_pins", board, limit=2)
    assert first.ids == pins[:2]
    assert first.next_cursor is not None
    second = s.page("board_has_pins", board, limit=2, cursor=first.next_cursor)
    assert second.ids == pins[2:4]
    assert s.page("board_has_pins", board, limit=2, newest_first=True).ids == [pins[4], pins[3]]

    assert s.unlink("board_has_pins", board, pins[0]) is True
    assert s.unlink("board_has_pins", board, pins[0]) is False
    assert s.links("pin_owned_by_board", pins[0]) == []
    assert s.count("board_has_pins", board) == 4
    assert s.delete(pins[4]) is True  # a deleted pin leaves its board's list too
    assert s.count("board_has_pins", board) == 3
    assert s.links("board_has_pins", board) == pins[1:4]


@pytest.mark.mariadb
def test_a_read_survives_a_killed_mysqldb_connection(mysqldb_store: Store) -> None:
    s = mysqldb_store
    pin = s.create("pin", {"a": 1}, shard=0)
    assert s.get(pin) == {"a": 1}
    pool = s.admin_context().engines.shard(0, s.locate(pin).host).pool
    victims = [c.thread_id() for c in pool.idle_connections()]
    assert victims
    killer = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with killer.cursor() as cur:
            for tid in victims:
                cur.execute(f"KILL CONNECTION {tid}")
    finally:
        killer.close()
    opened = pool.opened
    assert s.get(pin) == {"a": 1}  # retried once on a fresh connection
    assert pool.opened == opened + 1
    assert s.get_many([pin]) == {pin: {"a": 1}}


# -- the same answers from both drivers ----------------------------------------------------------


@pytest.mark.mariadb
@pytest.mark.parametrize("driver", DRIVERS)
def test_rowcount_and_lastrowid_mean_the_same_on_both_drivers(scratch: str, driver: str) -> None:
    conn = mysql_connector(driver_url(driver))()
    cur = conn.cursor()
    try:
        seen = []
        for sql, params in [
            (f"INSERT INTO {scratch} (k, v) VALUES (%s, %s)", (1, 1)),
            (f"INSERT IGNORE INTO {scratch} (k, v) VALUES (%s, %s)", (1, 1)),
            (f"INSERT INTO {scratch} (k, v) VALUES (%s, %s) ON DUPLICATE KEY UPDATE k = k", (1, 1)),
            (f"INSERT INTO {scratch} (k, v) VALUES (%s, %s) ON DUPLICATE KEY UPDATE v = VALUES(v)", (1, 2)),
            (f"UPDATE {scratch} SET v = 2 WHERE k = %s", (1,)),
            (f"DELETE FROM {scratch} WHERE k = %s", (7,)),
        ]:
            cur.execute(sql, params)
            seen.append(cur.rowcount)
        # Affected rows (no CLIENT.FOUND_ROWS): a no-op upsert or update reports 0, a changed upsert 2.
        assert seen == [1, 0, 0, 2, 0, 0]
        cur.executemany(f"INSERT INTO {scratch} (k, v) VALUES (%s, %s)", [(2, 0), (3, 0), (4, 0)])
        assert cur.rowcount == 3
        cur.execute(f"SELECT k, v FROM {scratch} WHERE k = %s", (1,))
        assert (cur.rowcount, cur.fetchone(), cur.fetchone(), cur.fetchall()) == (1, (1, 2), None, ())
        cur.execute(f"SELECT COUNT(*) FROM {scratch}")
        assert cur.fetchall() == ((4,),)
        cur.execute(f"ALTER TABLE {scratch} MODIFY k INT NOT NULL AUTO_INCREMENT")
        cur.execute(f"INSERT INTO {scratch} (v) VALUES (%s)", (5,))
        assert cur.lastrowid == 5
        # Autocommit, utf8mb4, REPEATABLE READ and the timeouts, whichever the driver.
        cur.execute("SELECT @@autocommit, @@character_set_client, @@tx_isolation, @@net_read_timeout")
        assert cur.fetchone() == (1, "utf8mb4", "REPEATABLE-READ", 30)
    finally:
        cur.close()
        conn.close()


@pytest.mark.mariadb
@pytest.mark.parametrize("driver", DRIVERS)
def test_server_errors_are_classified_alike(scratch: str, driver: str) -> None:
    backend = MySQLBackend()
    url = driver_url(driver)
    open_conn = mysql_connector(url, setup="SET SESSION innodb_lock_wait_timeout = 1")
    holder, waiter = open_conn(), open_conn()
    try:
        cur = waiter.cursor()
        cur.execute(f"INSERT INTO {scratch} (k, v) VALUES (1, 1)")
        dup = raised(lambda: cur.execute(f"INSERT INTO {scratch} (k, v) VALUES (1, 1)"))
        assert (type(dup).__name__, dup.args[0], backend.classify(dup)) == (
            "IntegrityError",
            1062,
            ErrorKind.DUPLICATE,
        )
        lock = holder.cursor()
        lock.execute("BEGIN")
        lock.execute(f"SELECT v FROM {scratch} WHERE k = 1 FOR UPDATE")
        lock.fetchall()
        waited = raised(lambda: cur.execute(f"UPDATE {scratch} SET v = 2 WHERE k = 1"))
        assert (type(waited).__name__, waited.args[0], backend.classify(waited)) == (
            "OperationalError",
            1205,
            ErrorKind.RETRYABLE,
        )
        lock.execute("ROLLBACK")
        missing = raised(lambda: cur.execute(f"SELECT * FROM {SCRATCH_DB}.nope"))
        assert (missing.args[0], backend.classify(missing)) == (1146, ErrorKind.MISSING)
        # Neither driver runs two statements sent in one execute (mysqlclient would by default).
        two = raised(lambda: cur.execute("SELECT 1; SELECT 2"))
        assert (two.args[0], backend.classify(two)) == (1064, None)
        for exc in (dup, waited, missing, two):
            assert backend.is_driver_error(exc)
            assert isinstance(exc, mysql_driver_error(url))
        cur.execute("SELECT 1")
        assert cur.fetchall() == ((1,),)  # the connection is still in step after every refusal
    finally:
        holder.close()
        waiter.close()


@pytest.mark.parametrize(
    ("cls", "code", "kind"),
    [
        ("IntegrityError", 1062, ErrorKind.DUPLICATE),
        ("OperationalError", 1213, ErrorKind.RETRYABLE),
        ("OperationalError", 1205, ErrorKind.RETRYABLE),
        ("OperationalError", 2002, ErrorKind.DISCONNECT),
        ("OperationalError", 2003, ErrorKind.DISCONNECT),
        ("OperationalError", 2006, ErrorKind.DISCONNECT),
        ("OperationalError", 2013, ErrorKind.DISCONNECT),
        ("OperationalError", 2055, ErrorKind.DISCONNECT),
        ("InterfaceError", 0, ErrorKind.DISCONNECT),
        ("OperationalError", 1049, ErrorKind.MISSING),
        ("ProgrammingError", 1146, ErrorKind.MISSING),
        ("OperationalError", TOMBSTONE_ERRNO, ErrorKind.TOMBSTONE),
        ("OperationalError", 1471, ErrorKind.TOMBSTONE),
        ("OperationalError", 1288, ErrorKind.TOMBSTONE),
        ("ProgrammingError", 1064, None),
        ("OperationalError", 1045, None),
    ],
)
def test_mysqldb_exceptions_are_classified_as_pymysqls(
    mysqldb: ModuleType, cls: str, code: int, kind: ErrorKind | None
) -> None:
    backend = MySQLBackend()
    ours = getattr(mysqldb, cls)(code, "message")
    theirs = getattr(pymysql.err, cls)(code, "message")
    assert backend.classify(ours) is backend.classify(theirs) is kind
    assert backend.is_driver_error(ours)
    assert backend.is_driver_error(theirs)
    assert isinstance(ours, mysql_driver_error(driver_url("mysqldb")))
    assert not backend.is_driver_error(ValueError(code, "message"))


# -- mysqlclient missing ----------------------------------------------------------------------------


def test_a_missing_mysqlclient_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "MySQLdb", None)  # `import MySQLdb` now fails
    with pytest.raises(ConfigError, match=r"hosts\.MySQL001A: .*pip install mysqlclient") as info:
        StoreConfig.from_dict(mysqldb_config())
    assert info.value.__cause__ is None  # no chained traceback
    assert info.value.__suppress_context__
    raw = mysqldb_config()
    raw["hosts"] = dict.fromkeys(raw["hosts"], "mariadb+mysqldb://root@127.0.0.1:3306")
    with pytest.raises(ConfigError, match="pip install mysqlclient"):
        StoreConfig.from_dict(raw)
    with pytest.raises(ConfigError, match="pip install mysqlclient"):
        mysql_connector(driver_url("mysqldb"))
    # PyMySQL hosts do not need it.
    assert StoreConfig.from_dict(mariadb_config()).hosts


def test_an_unknown_mariadb_driver_is_a_config_error() -> None:
    raw = mariadb_config()
    raw["hosts"] = dict.fromkeys(raw["hosts"], "mysql+mysqlconnector://root@127.0.0.1:3306")
    with pytest.raises(ConfigError, match=r"unsupported MariaDB driver 'mysqlconnector'"):
        StoreConfig.from_dict(raw)


def test_the_cli_says_pip_install_mysqlclient_without_a_traceback(tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "MySQLdb"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("libmariadb.so.3: no such file")\n')
    config_file = tmp_path / "store.yaml"
    config_file.write_text(yaml.safe_dump(mysqldb_config()))
    path = [str(shim.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    done = subprocess.run(
        [sys.executable, "-m", "store.cli", "count", "board_has_pins", "1", "--config", str(config_file)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: hosts.MySQL001A: mysql+mysqldb:// URLs need the MySQLdb module")
    assert "pip install mysqlclient" in done.stderr
    assert "Traceback" not in done.stderr
