"""Two roles: the application account serves rows and nothing else; the admin account does DDL.

The request-path tests (every test on the shared ``config``/``store`` fixtures
for MariaDB and PostgreSQL) run as the application account that
`make_app_account` makes from `store grants`' plan; these tests show what that
account may not do, and that the config keeps the two URLs apart.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymysql
import pytest
import yaml

from store import BackendError, ConfigError, Store, StoreConfig
from store.admin import init_shards
from store.backends.mysql import mysql_connector
from store.backends.postgres import postgres_connector
from store.grants import access_denied, grant_plan
from store.ids import encode_pinterest
from store.naming import like_escape
from tests.conftest import (
    APP_PASSWORD_ENV,
    APP_USER,
    MARIADB_URL,
    NAMES,
    base_config,
    db,
    mariadb_config,
    run_cli,
)

#: Shard 0's database (MariaDB) and schema (PostgreSQL) in this namespace.
DB0, SCHEMA0 = NAMES.database_name(0), NAMES.schema_name(0)

#: Statements the application account must be refused on MariaDB, each with its kind.
MYSQL_REFUSED = [
    ("CREATE TABLE", f"CREATE TABLE `{DB0}`.`evil` (id INT)"),
    ("DROP TABLE", f"DROP TABLE `{DB0}`.`pins`"),
    ("ALTER TABLE", f"ALTER TABLE `{DB0}`.`pins` ADD COLUMN evil INT"),
    ("RENAME TABLE", f"RENAME TABLE `{DB0}`.`pins` TO `{DB0}`.`pins_x`"),
    ("TRUNCATE", f"TRUNCATE TABLE `{DB0}`.`pins`"),
    ("CREATE INDEX", f"CREATE INDEX evil ON `{DB0}`.`pins` (id)"),
    ("CREATE VIEW", f"CREATE VIEW `{DB0}`.`evil` AS SELECT 1"),
    (
        "CREATE TRIGGER",
        f"CREATE TRIGGER `{DB0}`.`evil` BEFORE INSERT ON `{DB0}`.`pins` FOR EACH ROW SET @x = 1",
    ),
    ("CREATE FUNCTION", f"CREATE FUNCTION `{DB0}`.`evil`() RETURNS INT RETURN 1"),
    ("CREATE DATABASE", "CREATE DATABASE `evil_db`"),
    ("DROP DATABASE", f"DROP DATABASE `{DB0}`"),
    ("GRANT", f"GRANT SELECT ON `{DB0}`.* TO 'root'@'localhost'"),
    ("CREATE USER", "CREATE USER 'evil'@'%'"),
    ("read mysql.user", "SELECT * FROM mysql.user"),
    ("another database", "SELECT 1 FROM `store_meta`.`nothing`"),
    ("LOCK TABLES", f"LOCK TABLES `{DB0}`.`pins` WRITE"),
]

PG_REFUSED = [
    ("CREATE TABLE", f'CREATE TABLE "{SCHEMA0}"."evil" (id int)'),
    ("DROP TABLE", f'DROP TABLE "{SCHEMA0}"."pins"'),
    ("ALTER TABLE", f'ALTER TABLE "{SCHEMA0}"."pins" ADD COLUMN evil int'),
    ("TRUNCATE", f'TRUNCATE "{SCHEMA0}"."pins"'),
    ("CREATE INDEX", f'CREATE INDEX evil ON "{SCHEMA0}"."pins" (id)'),
    ("CREATE FUNCTION", f"CREATE FUNCTION \"{SCHEMA0}\".evil() RETURNS int AS 'SELECT 1' LANGUAGE sql"),
    ("CREATE SCHEMA", 'CREATE SCHEMA "evil"'),
    ("DROP SCHEMA", f'DROP SCHEMA "{SCHEMA0}" CASCADE'),
    ("CREATE in public", "CREATE TABLE public.evil (id int)"),
    ("GRANT", f"GRANT pg_read_all_data TO {APP_USER}"),
    ("CREATE ROLE", "CREATE ROLE evil"),
    ("ALTER SEQUENCE", f'ALTER SEQUENCE "{SCHEMA0}"."id_seq" RESTART WITH 1'),
]


def _refused(connect: Callable[[], Any], sql: str) -> BaseException:
    conn = connect()
    try:
        cur = conn.cursor()
        with pytest.raises(Exception) as info:  # noqa: PT011 - which one is what access_denied() decides
            cur.execute(sql)
        return info.value
    finally:
        conn.close()


@pytest.mark.parametrize(("what", "sql"), MYSQL_REFUSED, ids=[w for w, _ in MYSQL_REFUSED])
def test_the_application_account_is_refused_ddl_on_mariadb(
    mariadb_ready: StoreConfig, what: str, sql: str
) -> None:
    exc = _refused(mysql_connector(mariadb_ready.hosts["MySQL001A"]), sql)
    assert access_denied(exc), f"{what}: {exc!r} is not a privilege refusal"
    with Store(mariadb_ready) as store:  # the tables are all still there and serving
        pin = store.create("pin", {"after": what}, shard=0)
        assert store.get(pin) == {"after": what}


@pytest.mark.parametrize(("what", "sql"), PG_REFUSED, ids=[w for w, _ in PG_REFUSED])
def test_the_application_account_is_refused_ddl_on_postgresql(
    postgres_ready: StoreConfig, what: str, sql: str
) -> None:
    exc = _refused(postgres_connector(postgres_ready.hosts["PG1"]), sql)
    assert access_denied(exc), f"{what}: {exc!r} is not a privilege refusal"
    with Store(postgres_ready) as store:
        pin = store.create("pin", {"after": what}, shard=0)
        assert store.get(pin, type_name="pin") == {"after": what}


def test_the_request_path_suite_runs_as_the_application_account(
    mariadb_ready: StoreConfig, postgres_ready: StoreConfig
) -> None:
    for config, who in ((mariadb_ready, "SELECT CURRENT_USER()"), (postgres_ready, "SELECT current_user")):
        with Store(config) as store:
            for host in config.hosts:
                h = store.admin_context().engines.shard(config.shard_map.ranges[0].start, host)
                with h.connect() as conn:
                    cur = conn.cursor()
                    cur.execute(who)
                    assert str(cur.fetchone()[0]).split("@")[0] == APP_USER
        assert all(url.username != APP_USER for url in config.for_admin().hosts.values())


def test_the_application_account_sees_only_the_store_databases(mariadb_ready: StoreConfig) -> None:
    conn = mysql_connector(mariadb_ready.hosts["MySQL001A"])()
    try:
        cur = conn.cursor()
        cur.execute("SHOW DATABASES")
        seen = {str(r[0]) for r in cur.fetchall()} - {"information_schema"}
    finally:
        conn.close()
    shard_dbs = {db(s) for s in range(mariadb_ready.shards)}
    shard_name = re.escape(NAMES.database_prefix) + r"[0-9]{5}"
    others = {name for name in seen if not re.fullmatch(shard_name, name)} - {NAMES.log_database}
    assert not others, f"the application account sees {sorted(others)}"
    assert shard_dbs <= seen


def test_init_with_only_the_application_account_says_to_use_the_admin_url(mariadb_ready: StoreConfig) -> None:
    raw = mariadb_config()
    for entry in raw["hosts"].values():
        del entry["admin"]
    raw["shards"], raw["map"][-1]["range"] = 12, [4, 11]
    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS {db(11)}")  # shard 11 does not exist
    finally:
        conn.close()
    with pytest.raises(BackendError, match=r"admin URL") as info:
        init_shards(StoreConfig.from_dict(raw), shards=[11])
    assert access_denied(info.value)


def test_grants_prints_row_privileges_for_every_shard_and_nothing_more(tmp_path: Path) -> None:
    raw = mariadb_config()
    raw["map_source"] = {"table": MARIADB_URL}
    path = tmp_path / "store.yaml"
    path.write_text(yaml.safe_dump(raw))
    out = run_cli(path, "grants", "--app-user", "reader")
    lines = [line for line in out.splitlines() if line and not line.startswith("--")]
    assert len(lines) == 8 + 2  # every shard's database, the log, the map table
    for s in range(8):
        shard_db = like_escape(db(s))  # a GRANT's database name is a pattern: its _ escaped
        assert f"GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON `{shard_db}`.* TO 'reader'@'%';" in lines
    assert f"GRANT SELECT ON `{like_escape(NAMES.meta_database)}`.* TO 'reader'@'%';" in lines
    for line in lines:
        assert line.startswith("GRANT ")
        assert line.endswith(" TO 'reader'@'%';")
        for word in ("ALL", "CREATE", "DROP", "ALTER", "GRANT OPTION", "*.*", "SUPER", "FILE"):
            assert word not in line.removeprefix("GRANT "), line


def test_grants_for_postgresql_cover_each_schema_and_what_admins_make_later() -> None:
    from tests.conftest import instagram_pg_config

    plan = grant_plan(StoreConfig.from_dict(instagram_pg_config()), "reader")
    assert [g.kind for g in plan] == ["postgresql"]
    text = "\n".join(plan[0].statements)
    for s in range(16):
        assert f'GRANT USAGE ON SCHEMA "{NAMES.schema_name(s)}" TO "reader"' in text
        assert f'ALTER DEFAULT PRIVILEGES IN SCHEMA "{NAMES.schema_name(s)}" GRANT' in text
    for word in ("CREATE", "ALL PRIVILEGES", "WITH GRANT OPTION", "SUPERUSER"):
        assert word not in text


@pytest.mark.parametrize(
    ("user", "host"), [("bad user", "%"), ("x'; DROP DATABASE db00000; --", "%"), ("", "%"), ("app", "a'b")]
)
def test_grants_refuse_account_names_that_are_not_identifiers(user: str, host: str) -> None:
    with pytest.raises(ConfigError, match=r"--app-(user|host)"):
        grant_plan(StoreConfig.from_dict(mariadb_config()), user, host)


def test_grants_apply_needs_the_account_to_exist(mariadb_ready: StoreConfig, tmp_path: Path) -> None:
    path = tmp_path / "store.yaml"
    path.write_text(yaml.safe_dump(mariadb_config()))
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "store.cli",
            "grants",
            "--app-user",
            "nobody_here",
            "--apply",
            "--config",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "has no account 'nobody_here': create it first" in done.stderr
    assert "Traceback" not in done.stderr


def test_grants_on_sqlite_says_there_are_no_accounts(tmp_path: Path) -> None:
    from tests.conftest import sqlite_config

    path = tmp_path / "store.yaml"
    path.write_text(yaml.safe_dump(sqlite_config(tmp_path)))
    assert "file permissions" in run_cli(path, "grants", "--app-user", "app")


# -- the config keeps the two URLs and the passwords apart ------------------------------------


def _hosts(entry: object, environ: dict[str, str] | None = None, base: Path | None = None) -> StoreConfig:
    raw = base_config(shards=2, hosts={"A": entry}, map=[{"range": [0, 1], "master": "A"}])
    return StoreConfig.from_dict(raw, environ=environ or {}, base_dir=base)


def test_a_password_from_the_environment() -> None:
    c = _hosts({"url": "mysql+pymysql://app@db1:3306", "password_env": "APP_PW"}, {"APP_PW": "s3cret"})
    assert c.hosts["A"].password == "s3cret"
    assert c.for_admin().hosts["A"].password == "s3cret"  # no admin given: the same account


def test_a_password_from_a_file_drops_one_trailing_newline(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("s3cret\n")
    c = _hosts({"url": "mysql+pymysql://app@db1:3306", "password_file": "pw"}, base=tmp_path)
    assert c.hosts["A"].password == "s3cret"


def test_the_admin_url_is_used_by_for_admin_only(tmp_path: Path) -> None:
    (tmp_path / "admin-pw").write_text("adm1n")
    c = _hosts(
        {
            "url": "mysql+pymysql://app@db1:3306",
            "password_env": "APP_PW",
            "admin": {"url": "mysql+pymysql://admin@db1:3306", "password_file": "admin-pw"},
        },
        {"APP_PW": "s3cret"},
        tmp_path,
    )
    assert (c.hosts["A"].username, c.hosts["A"].password) == ("app", "s3cret")
    admin = c.for_admin()
    assert (admin.hosts["A"].username, admin.hosts["A"].password) == ("admin", "adm1n")
    assert admin.role == "admin"
    assert admin.for_admin() is admin


def test_environment_overrides_name_the_admin_url_apart() -> None:
    c = _hosts(
        "mysql+pymysql://app@db1:3306",
        {
            "STORE_HOST_A": "mysql+pymysql://app2@db2:3306",
            "STORE_ADMIN_HOST_A": "mysql+pymysql://adm@db2:3306",
        },
    )
    assert c.hosts["A"].username == "app2"
    assert c.for_admin().hosts["A"].username == "adm"


@pytest.mark.parametrize(
    ("entry", "environ", "message"),
    [
        (
            {"url": "mysql+pymysql://app@db1:3306", "password_env": "NOPE"},
            {},
            r"hosts.A.password_env names \$NOPE",
        ),
        (
            {"url": "mysql+pymysql://app@db1:3306", "password_file": "missing"},
            {},
            r"hosts.A.password_file: cannot",
        ),
        (
            {"url": "mysql+pymysql://app:inline@db1:3306", "password_env": "PW"},
            {"PW": "x"},
            r"more than once",
        ),
        (
            {"url": "mysql+pymysql://app@db1:3306", "password_env": "PW", "password_file": "f"},
            {"PW": "x"},
            "once",
        ),
        (
            {"url": "mysql+pymysql://app@db1:3306", "pasword_env": "PW"},
            {},
            r"unknown key\(s\).*pasword_env",
        ),
        (
            {"url": "mysql+pymysql://app@db1:3306", "password_env": "bad name"},
            {},
            r"must name an environment",
        ),
        ({"url": "mysql+pymysql://app@db1:3306", "password_env": "PW"}, {"PW": ""}, r"empty password"),
        ({"password_env": "PW"}, {"PW": "x"}, r"hosts.A needs url"),
        ({"url": 5}, {}, r"hosts.A.url must be a URL string"),
        ({"url": "mysql+pymysql://app@db1:3306", "admin": "sqlite:///x"}, {}, r"same kind of server"),
        ({"url": "mysql+pymysql://app@db1:3306", "admin": {"admin": {}}}, {}, r"cannot itself have an admin"),
        (["mysql+pymysql://app@db1:3306"], {}, r"hosts.A must be a URL string or a mapping"),
    ],
)
def test_credential_mistakes_name_the_key(
    entry: object, environ: dict[str, str], message: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=message):
        _hosts(entry, environ, tmp_path)


def test_a_bad_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as info:
        _hosts({"url": "not a url :// s3cret-in-here", "password_env": "PW"}, {"PW": "x"})
    assert "s3cret-in-here" not in str(info.value)
    assert "hosts.A.url" in str(info.value)


def test_the_test_password_really_is_checked(mariadb_ready: StoreConfig) -> None:
    raw = mariadb_config()
    wrong = dict(os.environ, **{APP_PASSWORD_ENV: "not-the-password"})
    config = StoreConfig.from_dict(raw, environ=wrong)
    with (
        Store(config) as store,
        pytest.raises(BackendError, match=r"refused the login.*check the user and password"),
    ):
        store.get(encode_pinterest(0, 1, 1))
