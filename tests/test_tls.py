"""TLS on every connection: MariaDB (both drivers, and the command-line clients moves run),
PostgreSQL and Redis, against servers of the tests' own with certificates made here.

Each server's certificate is signed by ``files.ca`` and names 127.0.0.1 and
localhost, not 127.0.0.2 (where the servers listen too). The refusals are
tried with accounts that do not require TLS, so a driver that fell back to an
unencrypted connection would be caught connecting.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pymysql
import pytest
from sqlalchemy.engine import make_url

from store import BackendError, ConfigError, Store, StoreConfig
from store.admin import init_shards
from store.backends.mysql import dump_databases, mysql_connector
from store.backends.postgres import postgres_connector
from store.tls import mysql_tls, postgres_tls
from tests.conftest import base_config
from tests.servers import (
    MariaDBServer,
    PostgresServer,
    TLSFiles,
    TLSMariaDBServer,
    free_ports,
    start_redis_tls,
)

#: MariaDB with TLS (and a binlog, for mariadb-dump), MariaDB without TLS, PostgreSQL, Redis.
TLS_PORT, PLAIN_PORT, PG_PORT, REDIS_PORT = free_ports(4)
DRIVERS = ["pymysql", "mysqldb"]
TLS_USER, TLS_PASSWORD = "store_tls", "tls-secret"  # REQUIRE SSL
X509_USER, X509_PASSWORD = "store_x509", "x509-secret"  # REQUIRE X509: a client certificate


@pytest.fixture(scope="module")
def files() -> Iterator[TLSFiles]:
    """A CA, a server and a client certificate signed by it, and an unrelated CA."""
    made = TLSFiles()
    yield made
    made.remove()


@pytest.fixture(scope="module")
def tls_server(files: TLSFiles) -> Iterator[MariaDBServer]:
    """A MariaDB with TLS on, and the accounts that require it."""
    server = TLSMariaDBServer(TLS_PORT, files, log_bin=True)
    try:
        server.start()
        conn = pymysql.connect(host="127.0.0.1", port=TLS_PORT, user="root", autocommit=True)
        with conn.cursor() as cur:
            for user, password, require in (
                (TLS_USER, TLS_PASSWORD, "SSL"),
                (X509_USER, X509_PASSWORD, "X509"),
            ):
                cur.execute(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}' REQUIRE {require}")
                cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO '{user}'@'%'")
        conn.close()
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="module")
def plain_server() -> Iterator[MariaDBServer]:
    """A MariaDB without TLS: what a client sees when someone strips TLS off the path."""
    server = MariaDBServer(PLAIN_PORT)
    try:
        server.start()
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="module")
def mysqldb_module() -> ModuleType:
    """mysqlclient (`make test` installs it; CI must not skip for want of it)."""
    try:
        return importlib.import_module("MySQLdb")
    except ImportError:
        if os.environ.get("STORE_REQUIRE_SERVICES") == "1":
            raise
        pytest.skip("mysqlclient is not installed: pip install mysqlclient")


@pytest.fixture(params=DRIVERS)
def driver(request: pytest.FixtureRequest) -> str:
    """Each MariaDB test on PyMySQL and on mysqlclient."""
    if request.param == "mysqldb":
        request.getfixturevalue("mysqldb_module")
    return str(request.param)


def mysql_url(driver: str, user: str = TLS_USER, password: str = TLS_PASSWORD, *, host: str = "127.0.0.1",
              port: int = TLS_PORT, **query: object) -> str:  # fmt: skip
    """A MariaDB URL with TLS parameters (paths and booleans as given)."""
    text = f"mysql+{driver}://{user}:{password}@{host}:{port}"
    if query:
        text += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return text


def session_cipher(conn: Any) -> str:
    """The TLS cipher of ``conn``'s session, as the server reports it ("" when unencrypted)."""
    cur = conn.cursor()
    cur.execute("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
    (_name, cipher), *_ = cur.fetchall()
    cur.close()
    return str(cipher)


def open_mysql(url: str) -> Any:
    """A connection by `mysql_connector`, as the store opens its connections."""
    return mysql_connector(make_url(url), connect_timeout_s=5)()


# -- MariaDB: verified, refused ------------------------------------------------------------------


def test_a_verified_connection_is_encrypted(tls_server: MariaDBServer, files: TLSFiles, driver: str) -> None:
    conn = open_mysql(mysql_url(driver, ssl_ca=files.ca))
    try:
        assert session_cipher(conn)
        cur = conn.cursor()
        cur.execute("SELECT CURRENT_USER()")
        assert cur.fetchone()[0] == f"{TLS_USER}@%"
    finally:
        conn.close()


def test_a_client_certificate_logs_in_an_account_that_requires_one(
    tls_server: MariaDBServer, files: TLSFiles, driver: str
) -> None:
    with_cert = mysql_url(
        driver,
        X509_USER,
        X509_PASSWORD,
        ssl_ca=files.ca,
        ssl_cert=files.client_cert,
        ssl_key=files.client_key,
    )
    conn = open_mysql(with_cert)
    try:
        assert session_cipher(conn)
    finally:
        conn.close()
    with pytest.raises(Exception, match="Access denied") as refused:  # TLS, but no certificate
        open_mysql(mysql_url(driver, X509_USER, X509_PASSWORD, ssl_ca=files.ca))
    assert refused.value.args[0] == 1045


def test_the_wrong_ca_is_refused(tls_server: MariaDBServer, files: TLSFiles, driver: str) -> None:
    # root needs no TLS: a driver that fell back to plain text would get in.
    with pytest.raises(Exception, match=r"(?i)certificate") as refused:
        open_mysql(mysql_url(driver, "root", "", ssl_ca=files.other_ca))
    assert refused.value.args[0] in (2003, 2026)
    assert "verify failed" in str(refused.value) or "self-signed certificate" in str(refused.value)


def test_the_host_name_is_checked(tls_server: MariaDBServer, files: TLSFiles, driver: str) -> None:
    """127.0.0.2 is the same server, but its certificate names only 127.0.0.1 and localhost."""
    other_name = mysql_url(driver, "root", "", host="127.0.0.2", ssl_ca=files.ca, ssl_verify_identity="true")
    with pytest.raises(Exception, match=r"(?i)certificate") as refused:
        open_mysql(other_name)
    assert refused.value.args[0] in (2003, 2026)
    # ssl_verify_identity defaults to true with ssl_ca:
    with pytest.raises(Exception, match=r"(?i)certificate"):
        open_mysql(mysql_url(driver, "root", "", host="127.0.0.2", ssl_ca=files.ca))
    # the name it carries passes:
    conn = open_mysql(mysql_url(driver, "root", "", ssl_ca=files.ca, ssl_verify_identity="1"))
    try:
        assert session_cipher(conn)
    finally:
        conn.close()
    # the chain alone, without the name:
    conn = open_mysql(other_name.replace("ssl_verify_identity=true", "ssl_verify_identity=false"))
    try:
        assert session_cipher(conn)
    finally:
        conn.close()


def test_without_ssl_ca_the_systems_cas_are_trusted(
    tls_server: MariaDBServer, files: TLSFiles, driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ssl_verify_identity=true`` alone: the chain and the name, checked against OpenSSL's default CAs."""
    url = mysql_url(driver, "root", "", ssl_verify_identity="true")
    with pytest.raises(Exception, match=r"(?i)certificate"):  # the test CA is no system CA
        open_mysql(url)
    monkeypatch.setenv("SSL_CERT_FILE", str(files.ca))  # now it is, for OpenSSL
    conn = open_mysql(url)
    try:
        assert session_cipher(conn)
    finally:
        conn.close()


def test_ssl_true_encrypts_without_verifying(tls_server: MariaDBServer, driver: str) -> None:
    conn = open_mysql(mysql_url(driver, ssl="true"))
    try:
        assert session_cipher(conn)
    finally:
        conn.close()


@pytest.mark.parametrize("tls", ["ca", "ca-no-identity", "ssl-true"])
def test_a_server_without_tls_is_refused(
    plain_server: MariaDBServer, files: TLSFiles, driver: str, tls: str
) -> None:
    """What a client sees when someone in the path strips TLS off: root, no password, would get in."""
    query: dict[str, object] = {
        "ca": {"ssl_ca": files.ca},
        "ca-no-identity": {"ssl_ca": files.ca, "ssl_verify_identity": "false"},
        "ssl-true": {"ssl": "true"},
    }[tls]
    with pytest.raises(Exception, match=r"(?i)ssl is required") as refused:
        open_mysql(mysql_url(driver, "root", "", port=PLAIN_PORT, **query))
    assert refused.value.args[0] == 2026
    plain = open_mysql(mysql_url(driver, "root", "", port=PLAIN_PORT))  # without TLS parameters it connects
    assert session_cipher(plain) == ""
    plain.close()


def test_without_tls_parameters_pymysql_connections_share_one_context(
    tls_server: MariaDBServer, plain_server: MariaDBServer, files: TLSFiles
) -> None:
    """PyMySQL's default (TLS if the server offers it, unverified) is kept, but its context is built
    once: a connection to a server with TLS is encrypted, one to a server without is plain."""
    first = open_mysql(mysql_url("pymysql"))
    second = open_mysql(mysql_url("pymysql"))
    plain = open_mysql(mysql_url("pymysql", "root", "", port=PLAIN_PORT))
    try:
        assert session_cipher(first)
        assert session_cipher(second)
        assert session_cipher(plain) == ""
        assert first.ctx is second.ctx is plain.ctx
        verified = open_mysql(mysql_url("pymysql", ssl_ca=files.ca))
        assert verified.ctx is not first.ctx  # a context of its own, with the CA
        assert session_cipher(verified)
        verified.close()
    finally:
        for conn in (first, second, plain):
            conn.close()


def test_an_account_that_requires_tls_cannot_log_in_without_it(
    tls_server: MariaDBServer, driver: str
) -> None:
    with pytest.raises(Exception, match="Access denied") as refused:
        open_mysql(mysql_url(driver, ssl="false"))
    assert refused.value.args[0] == 1045


def test_a_whole_store_over_tls(tls_server: MariaDBServer, files: TLSFiles) -> None:
    """Two host names, one per driver (when mysqlclient is installed), every connection verified TLS."""
    drivers = DRIVERS if importlib.util.find_spec("MySQLdb") else ["pymysql"]
    hosts = {
        f"H{i}": mysql_url(d, ssl_ca=files.ca, ssl_verify_identity="true") for i, d in enumerate(drivers)
    }
    names = list(hosts)
    raw = base_config(
        shards=4,
        hosts=hosts,
        map=[{"range": [0, 1], "master": names[0]}, {"range": [2, 3], "master": names[-1]}],
    )
    config = StoreConfig.from_dict(raw)
    init_shards(config)
    with Store(config) as store:
        board = store.create("board", {"name": "over TLS"}, shard=0)
        pins = [store.create("pin", {"n": i}, shard=3) for i in range(3)]
        for pin in pins:
            assert store.link("board_has_pins", board, pin)
        assert store.get(board) == {"name": "over TLS"}
        assert store.get(pins[0]) == {"n": 0}
        page = store.page("board_has_pins", board, limit=10)
        assert sorted(page.ids) == sorted(pins)
        engines = store.admin_context().engines
        for shard, host in ((0, names[0]), (3, names[-1])):
            with engines.shard(shard, host).connect() as conn:
                assert session_cipher(conn)


def test_a_store_with_the_wrong_ca_raises_a_backend_error(tls_server: MariaDBServer, files: TLSFiles) -> None:
    raw = base_config(
        shards=4,
        hosts={"H": mysql_url("pymysql", "root", "", ssl_ca=files.other_ca)},
        map=[{"range": [0, 3], "master": "H"}],
    )
    with Store(StoreConfig.from_dict(raw)) as store, pytest.raises(BackendError) as refused:
        store.get(store.create("user", {"never": "stored"}, shard=0))
    assert "CERTIFICATE_VERIFY_FAILED" in str(refused.value.orig)


def test_mariadb_dump_goes_over_tls(tls_server: MariaDBServer, files: TLSFiles) -> None:
    """Moves copy shards with mariadb-dump: the URL's TLS parameters reach it."""
    conn = open_mysql(mysql_url("pymysql", ssl_ca=files.ca))
    cur = conn.cursor()
    cur.execute("CREATE DATABASE IF NOT EXISTS tls_dump")
    cur.execute("CREATE TABLE IF NOT EXISTS tls_dump.t (k INT PRIMARY KEY)")
    conn.close()
    dump, gtid = dump_databases(make_url(mysql_url("pymysql", ssl_ca=files.ca)), ["tls_dump"])
    assert b"CREATE TABLE `t`" in dump
    assert gtid is not None
    # the REQUIRE X509 account logs in with its client certificate
    with_cert = mysql_url(
        "pymysql",
        X509_USER,
        X509_PASSWORD,
        ssl_ca=files.ca,
        ssl_cert=files.client_cert,
        ssl_key=files.client_key,
    )
    assert b"CREATE TABLE `t`" in dump_databases(make_url(with_cert), ["tls_dump"])[0]
    with pytest.raises(BackendError, match="certificate"):
        dump_databases(make_url(mysql_url("pymysql", "root", "", ssl_ca=files.other_ca)), ["tls_dump"])
    with pytest.raises(BackendError, match="Validation of SSL server certificate failed"):
        dump_databases(
            make_url(mysql_url("pymysql", "root", "", host="127.0.0.2", ssl_ca=files.ca)), ["tls_dump"]
        )


# -- MariaDB: the config -----------------------------------------------------------------------


def config_with_host(url: str, base_dir: Path | None = None) -> StoreConfig:
    """A config whose one host is ``url``."""
    raw = base_config(shards=4, hosts={"db1": url}, map=[{"range": [0, 3], "master": "db1"}])
    return StoreConfig.from_dict(raw, base_dir=base_dir)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            "ssl_verfy_identity=true",
            r"hosts\.db1: unknown MariaDB URL parameter\(s\) ssl_verfy_identity; known: ",
        ),
        ("sslca=x.pem", r"hosts\.db1: unknown MariaDB URL parameter\(s\) sslca"),
        ("ssl_ca=missing-ca.pem", r"hosts\.db1: URL parameter ssl_ca: no such file '.*missing-ca\.pem'"),
        ("ssl_verify_cert=yes", r"hosts\.db1: URL parameter ssl_verify_cert must be true, false, 1 or 0"),
        (
            "ssl=false&ssl_ca={ca}",
            r"hosts\.db1: URL parameter ssl=false turns TLS off, but ssl_ca asks for it",
        ),
        ("ssl_ca={ca}&ssl_ca={ca}", r"hosts\.db1: URL parameter ssl_ca is given 2 times"),
        ("ssl_ca={ca}&ssl_key={key}", r"hosts\.db1: URL parameter ssl_key needs ssl_cert"),
        (
            "ssl_verify_cert=false&ssl_verify_identity=true",
            r"hosts\.db1: URL parameter ssl_verify_identity=true",
        ),
        ("ssl_verify_cert=true&ssl_verify_identity=false", r"hosts\.db1: .* needs ssl_ca"),
        ("ssl_ca={key}", r"hosts\.db1: URL parameter\(s\) ssl_ca: the files cannot be loaded"),
        (
            "ssl_ca={ca}&ssl_cert={cert}&ssl_key={ca_key}",
            r"hosts\.db1: .*ssl_cert, ssl_key: the files cannot",
        ),
    ],
)
def test_wrong_tls_parameters_are_config_errors(files: TLSFiles, query: str, message: str) -> None:
    query = query.format(ca=files.ca, key=files.client_key, cert=files.client_cert, ca_key=files.ca_key)
    with pytest.raises(ConfigError, match=message) as refused:
        config_with_host(f"mysql+pymysql://app:s3cret@db1:3306?{query}")
    assert "s3cret" not in str(refused.value)


def test_right_tls_parameters_pass_and_relative_files_are_the_configs(files: TLSFiles) -> None:
    query = f"ssl_ca={files.ca.name}&ssl_cert={files.client_cert.name}&ssl_key={files.client_key.name}"
    config = config_with_host(f"mysql+pymysql://app@db1:3306?{query}&ssl_verify_identity=TRUE", files.base)
    url = config.hosts["db1"]
    assert url.query["ssl_ca"] == str(files.ca)  # taken from the config file's folder
    tls = mysql_tls(url)
    assert (tls.required, tls.verify_cert, tls.verify_identity) == (True, True, True)
    assert (tls.ca, tls.cert, tls.key) == (str(files.ca), str(files.client_cert), str(files.client_key))
    weak = mysql_tls(config_with_host("mysql+pymysql://app@db1:3306?ssl=1").hosts["db1"])
    assert (weak.required, weak.verify_cert, weak.verify_identity, weak.ca) == (True, False, False, None)
    chain_only = mysql_tls(make_url(f"mysql+pymysql://app@db1?ssl_ca={files.ca}&ssl_verify_identity=0"))
    assert (chain_only.verify_cert, chain_only.verify_identity) == (True, False)
    assert mysql_tls(make_url("mysql+pymysql://app@db1?ssl=false")).disabled
    assert not mysql_tls(make_url("mysql+pymysql://app@db1?unix_socket=/run/mysqld/mysqld.sock")).required


def test_the_connector_checks_urls_the_config_does_not(files: TLSFiles) -> None:
    """Ticket servers and the map table are not hosts: their URLs are checked when connectors are made."""
    with pytest.raises(ConfigError, match="ssl_verfy_identity"):
        mysql_connector(make_url("mysql+pymysql://app@db1?ssl_verfy_identity=true"))


# -- PostgreSQL ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pg_server(files: TLSFiles) -> Iterator[PostgresServer]:
    """A PostgreSQL that accepts TLS connections only, with a database ``store``."""
    server = PostgresServer(PG_PORT, files)
    try:
        server.create_database("store")
        yield server
    finally:
        server.remove()


def pg_url(host: str = "127.0.0.1", **query: object) -> str:
    """A URL of the TLS PostgreSQL's database ``store`` with query parameters (as given)."""
    text = f"postgresql+psycopg://postgres@{host}:{PG_PORT}/store"
    return text + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def test_postgres_verified_connection(pg_server: PostgresServer, files: TLSFiles) -> None:
    url = make_url(pg_url(sslrootcert=files.ca))
    assert postgres_tls(url)["sslmode"] == "verify-full"  # the default with a CA
    with postgres_connector(url)() as conn:
        assert conn.info.pgconn.ssl_in_use
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)
    with postgres_connector(make_url(pg_url(sslmode="require")))() as conn:  # encrypted, unverified
        assert conn.info.pgconn.ssl_in_use


def test_postgres_refusals(pg_server: PostgresServer, files: TLSFiles) -> None:
    import psycopg

    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        postgres_connector(make_url(pg_url(sslrootcert=files.other_ca)))()
    with pytest.raises(psycopg.OperationalError, match="does not match host name"):
        postgres_connector(make_url(pg_url("127.0.0.2", sslrootcert=files.ca)))()
    with postgres_connector(
        make_url(pg_url("127.0.0.2", sslrootcert=files.ca, sslmode="verify-ca"))
    )() as conn:
        assert conn.info.pgconn.ssl_in_use  # the chain alone
    with pytest.raises(psycopg.OperationalError, match="no encryption"):  # the server's pg_hba refuses
        postgres_connector(make_url(pg_url(sslmode="disable")))()


def test_a_whole_instagram_store_on_postgres_over_tls(pg_server: PostgresServer, files: TLSFiles) -> None:
    raw = base_config(
        ids="instagram",
        shards=4,
        hosts={"PG": pg_url(sslrootcert=files.ca, sslcert=files.client_cert, sslkey=files.client_key)},
        map=[{"range": [0, 3], "master": "PG"}],
    )
    config = StoreConfig.from_dict(raw)
    init_shards(config)
    with Store(config) as store:
        board = store.create("board", {"name": "pg"}, shard=1)
        pin = store.create("pin", {"n": 1}, shard=1)
        assert store.link("board_has_pins", board, pin)
        assert store.get(board, type_name="board") == {"name": "pg"}
        assert store.page("board_has_pins", board).ids == [pin]
        with store.admin_context().engines.shard(1, "PG").connect() as conn:
            assert conn.info.pgconn.ssl_in_use


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("sslmode=verify", r"hosts\.PG: URL parameter sslmode must be one of disable, allow, prefer"),
        (
            "sslmode=prefer&sslrootcert={ca}",
            r"hosts\.PG: URL parameter sslmode=prefer may connect without TLS",
        ),
        ("sslrootcert=missing.pem", r"hosts\.PG: URL parameter sslrootcert: no such file"),
        ("sslcert={cert}", r"hosts\.PG: URL parameters sslcert and sslkey go together"),
        ("sslrootcert=system&sslmode=verify-ca", r"hosts\.PG: URL parameter sslrootcert=system needs"),
        ("ssl_ca={ca}", r"hosts\.PG: unknown PostgreSQL URL parameter\(s\) ssl_ca"),
        (
            "sslcert={cert}&sslkey={readable_key}",
            r"hosts\.PG: URL parameter sslkey: libpq refuses .* chmod 600",
        ),
    ],
)
def test_wrong_postgres_tls_parameters_are_config_errors(files: TLSFiles, query: str, message: str) -> None:
    query = query.format(ca=files.ca, cert=files.client_cert, readable_key=files.server_key)
    raw = base_config(
        ids="instagram",
        shards=4,
        hosts={"PG": f"postgresql+psycopg://postgres@db:5432/store?{query}"},
        map=[{"range": [0, 3], "master": "PG"}],
    )
    with pytest.raises(ConfigError, match=message):
        StoreConfig.from_dict(raw)


# -- Redis -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_tls(files: TLSFiles) -> Iterator[int]:
    """A redis-server speaking only TLS (client certificates required); its port."""
    proc = start_redis_tls(REDIS_PORT, files)
    try:
        yield REDIS_PORT
    finally:
        proc.kill()
        proc.wait()


def test_redis_list_cache_over_tls(redis_tls: int, files: TLSFiles) -> None:
    """``rediss://`` with the CA and a client certificate in the URL, beside the backend's own settings."""
    from store.cache.redis_lists import RedisListBackend

    url = (
        f"rediss://127.0.0.1:{redis_tls}/0?ssl_ca_certs={files.ca}&ssl_cert_reqs=required"
        f"&ssl_certfile={files.client_cert}&ssl_keyfile={files.client_key}"
    )
    backend = RedisListBackend(url, timeout_s=2, connect_timeout_s=2)
    try:
        a, b = b"a" * 16, b"b" * 16
        assert backend.fill("tls:list", None, 2, a + b, 60, 0)
        read = backend.read("tls:list", ("rank", 0, 9, False))
        assert read is not None
        assert list(read.members) == [a, b]
        assert backend.client.connection_pool.connection_kwargs["ssl_ca_certs"] == str(files.ca)
    finally:
        backend.close()
    wrong = RedisListBackend(
        url.replace(str(files.ca), str(files.other_ca)), timeout_s=2, connect_timeout_s=2
    )
    try:
        assert wrong.read("tls:list", ("rank", 0, 9, False)) is None  # a cache failure, counted
        assert wrong.stats.errors == 1
        assert "certificate verify failed" in wrong.stats.last_error
    finally:
        wrong.close()
