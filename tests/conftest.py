"""Shared fixtures: the store on each backend, and real servers.

Integration tests talk to the real MariaDB on 127.0.0.1:3306. When it is not
reachable they skip on a developer's laptop; with STORE_REQUIRE_SERVICES=1
(set by .ci/run) they fail instead, so CI can never pass on skipped tests.

Each test process (a session, or each pytest-xdist worker) has a namespace of
its own, `NAMESPACE` (config ``namespace:``, a random name), for every
database, schema and account it makes on the shared MariaDB and PostgreSQL,
and memcached and Redis servers of its own on ports the OS picks: two runs at
once, or two workers, never see each other's data, never touch the databases
of ``config/local.yaml``, and never flush a cache they do not own. The session
drops what its namespace made when it ends.
"""

from __future__ import annotations

import copy
import os
import secrets
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from store import Store, StoreConfig
from store.admin import init_shards
from store.defaults import EMBEDDED
from store.naming import Names, like_escape
from tests.servers import session_ports, start_memcached, start_redis


def _namespace() -> str:
    """This process's namespace: ``t``, 8 random hex digits, and the xdist worker's number if any."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")  # gw0, gw1, ... under pytest-xdist
    return "t" + secrets.token_hex(4) + "".join(c for c in worker if c.isdigit())[:6]


#: The namespace of everything this test process makes on the shared servers (see the docstring).
NAMESPACE = _namespace()
#: Its names: ``NAMES.database_name(3)``, ``NAMES.log_database``, ``NAMES.meta_database``, ...
NAMES = Names(NAMESPACE)

#: The admin account of the test MariaDB (init, moves, repairs, DDL the tests make).
MARIADB_URL = os.environ.get("STORE_TEST_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306")
TEST_SHARDS = 8
#: The request-path tests run as this application account (no CREATE, DROP, ALTER, GRANT):
#: `app_account` creates it and gives it `store grants`' GRANTs. Its password comes from the
#: environment (password_env), as an application's would. One account per namespace: another
#: run's REVOKE never reaches this one's.
APP_USER = f"app_{NAMESPACE}"
APP_PASSWORD_ENV = "STORE_TEST_APP_PASSWORD"
os.environ.setdefault(APP_PASSWORD_ENV, "app-pw-7f3c1e")


def app_host(admin_url: str = MARIADB_URL) -> dict[str, Any]:
    """A host entry: the application account on ``admin_url``'s server, ``admin_url`` as its admin."""
    from sqlalchemy.engine import make_url

    app = make_url(admin_url).set(username=APP_USER, password=None)
    return {
        "url": app.render_as_string(hide_password=False),
        "password_env": APP_PASSWORD_ENV,
        "admin": {"url": admin_url},
    }


def run_cli(config_file: Path, *args: str) -> str:
    """Run `store ARGS --config FILE` in a process of its own; its stdout (raises if it fails)."""
    done = subprocess.run(
        [sys.executable, "-m", "store.cli", *args, "--config", str(config_file)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.stdout


def require_port(name: str, port: int, host: str = "127.0.0.1") -> None:
    """Skip (or, in CI, fail) unless a server listens on host:port."""
    try:
        with socket.create_connection((host, port), timeout=1):
            return
    except OSError:
        msg = f"{name} is not reachable on {host}:{port}"
        if os.environ.get("STORE_REQUIRE_SERVICES") == "1":
            pytest.fail(msg + " (STORE_REQUIRE_SERVICES=1: run scripts/services.sh)")
        pytest.skip(msg)


def base_config(**overrides: Any) -> dict[str, Any]:
    """The embedded default's types and relations with other hosts and map."""
    raw = {k: copy.deepcopy(v) for k, v in EMBEDDED.items() if k not in ("hosts", "map", "shards", "cache")}
    raw.update(overrides)
    return raw


def root_sql(query: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of ``query``, run as root straight on the test MariaDB (3306), in autocommit.

    Without ``args`` the query is sent as written (a ``'%'`` account host needs no doubling)."""
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            cur.execute(query, args or None)
            return list(cur.fetchall())
    finally:
        conn.close()


def repair_past_every_grace(store: Any) -> None:
    """`repair_unique` as if every claim's grace period had run out: what earlier tests of this
    session's namespace left (a killed rename's claim, young at their last repair) is gone, and
    not counted as a later test's orphan."""
    import store.unique as unique_module
    from store.admin import repair_unique

    later = unique_module._now_ms() + int(unique_module.CLAIM_GRACE_S * 1000) + 1000
    with pytest.MonkeyPatch.context() as m:
        m.setattr(unique_module, "_now_ms", lambda: later)
        repair_unique(store)


def sqlite_config(folder: Path) -> dict[str, Any]:
    """Eight shards in SQLite files, split over two host folders."""
    return base_config(
        shards=TEST_SHARDS,
        hosts={"A": f"sqlite:///{folder}/a", "B": f"sqlite:///{folder}/b"},
        map=[{"range": [0, 3], "master": "A"}, {"range": [4, 7], "master": "B"}],
    )


@contextmanager
def one_run_at_a_time(name: str) -> Iterator[None]:
    """Hold the machine-wide lock ``name`` (a file in the system's temporary folder): for the few
    tests whose tools have no namespace, so two test runs at once take turns there."""
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / f"store-tests-{name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def db(shard: int) -> str:
    """The database of ``shard`` in this process's namespace (``NAMESPACE_db00003``)."""
    return NAMES.database_name(shard)


def mariadb_config() -> dict[str, Any]:
    """Eight shards on the one MariaDB, under two host names (to exercise per-host batching), in
    this process's namespace."""
    return base_config(
        namespace=NAMESPACE,
        shards=TEST_SHARDS,
        hosts={"MySQL001A": app_host(), "MySQL002A": app_host()},
        map=[
            {"range": [0, 3], "master": "MySQL001A", "slave": "MySQL002A"},
            {"range": [4, 7], "master": "MySQL002A"},
        ],
    )


def reset_mariadb_shards(shards: range) -> None:
    """Drop the test shards of this namespace so every session starts empty."""
    import pymysql

    conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            for s in shards:
                cur.execute(f"DROP DATABASE IF EXISTS {db(s)}")
    finally:
        conn.close()


def _drop_namespace() -> None:
    """Drop this namespace's databases and accounts on the shared MariaDB and PostgreSQL (what is
    reachable: a server that was never up has nothing of ours)."""
    try:
        import pymysql

        conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True, connect_timeout=2)
    except Exception:  # nothing to clean where the server is down
        conn = None
    if conn is not None:
        try:
            with conn.cursor() as cur:
                # NAMESPACE_db00000, ..., and the namespaces tests derive from it (NAMESPACE + "x")
                cur.execute("SHOW DATABASES LIKE %s", (like_escape(NAMESPACE) + "%",))
                for (name,) in cur.fetchall():
                    cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
                cur.execute(f"DROP USER IF EXISTS '{APP_USER}'@'%'")
        finally:
            conn.close()
    try:
        import psycopg

        with psycopg.connect(
            "host=127.0.0.1 user=postgres dbname=postgres", autocommit=True, connect_timeout=2
        ) as pg:
            pattern = "%\\_" + like_escape(NAMESPACE)  # storetest_NAMESPACE and other tests' NAME_NAMESPACE
            for (name,) in pg.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", (pattern,)
            ).fetchall():
                pg.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            pg.execute(f"DROP ROLE IF EXISTS {APP_USER}")
    except Exception:  # as above: a PostgreSQL that is down holds nothing of ours
        pass


@pytest.fixture(scope="session", autouse=True)
def _namespace_dropped_at_the_end() -> Iterator[None]:
    """After the session, nothing this namespace made stays on the shared servers."""
    yield
    _drop_namespace()


def make_app_account(config: StoreConfig) -> None:
    """Create the application account afresh and give it exactly `store grants`' GRANTs for ``config``."""
    from store.grants import apply_grants, grant_plan

    password = os.environ[APP_PASSWORD_ENV]
    for g in grant_plan(config, APP_USER):
        assert g.admin_url is not None
        if g.kind == "postgresql":
            import psycopg

            with psycopg.connect(
                host=g.admin_url.host, user=g.admin_url.username, dbname=g.admin_url.database, autocommit=True
            ) as conn:
                found = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_USER,)).fetchone()
                verb = "ALTER" if found else "CREATE"
                conn.execute(
                    f"{verb} ROLE {APP_USER} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD '{password}'"
                )
            continue
        import pymysql

        conn = pymysql.connect(
            host=g.admin_url.host, port=g.admin_url.port or 3306, user="root", autocommit=True
        )
        try:
            with conn.cursor() as cur:
                account = f"'{APP_USER}'@'%%'"  # %% : a literal % beside the %s parameter
                cur.execute(f"CREATE USER IF NOT EXISTS {account} IDENTIFIED BY %s", (password,))
                cur.execute(f"ALTER USER {account} IDENTIFIED BY %s", (password,))
                cur.execute(f"REVOKE ALL PRIVILEGES, GRANT OPTION FROM '{APP_USER}'@'%'")
        finally:
            conn.close()
    apply_grants(grant_plan(config, APP_USER), APP_USER)


@pytest.fixture(scope="session")
def mariadb_ready() -> StoreConfig:
    """The MariaDB test config (the application account), with fresh shards 0-7 made by `init_shards`."""
    require_port("MariaDB", 3306)
    reset_mariadb_shards(range(TEST_SHARDS))
    config = StoreConfig.from_dict(mariadb_config())
    init_shards(config)
    make_app_account(config)
    return config


#: This process's own memcached servers and Redis (`own_caches` starts them, maybe minutes after
#: the ports are drawn: `session_ports` draws them where the OS hands out none of its own).
_CACHE_PORTS = session_ports(3)
MEMCACHED_PORTS = _CACHE_PORTS[:2]
REDIS_PORT = _CACHE_PORTS[2]
REDIS_TEST_URL = f"redis://127.0.0.1:{REDIS_PORT}/15"


def memcached_flush(port: int) -> None:
    """Empty the memcached on ``port`` (only ever one of this process's own)."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(b"flush_all\r\n")
        assert sock.recv(100) == b"OK\r\n"


@pytest.fixture(scope="session")
def own_caches() -> Iterator[None]:
    """Start this process's two memcached servers and its Redis (`MEMCACHED_PORTS`, `REDIS_PORT`)."""
    procs = [start_memcached(port) for port in MEMCACHED_PORTS]
    try:
        procs.append(start_redis(REDIS_PORT))
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def memcached_pair(own_caches: None) -> list[str]:
    """Two memcached servers of this process's own, both empty at the start."""
    for port in MEMCACHED_PORTS:
        memcached_flush(port)
    return [f"127.0.0.1:{port}" for port in MEMCACHED_PORTS]


@pytest.fixture(scope="session")
def redis_ready(own_caches: None) -> str:
    """A Redis of this process's own; database 15 emptied for the tests."""
    import redis

    redis.Redis.from_url(REDIS_TEST_URL).flushdb()
    return REDIS_TEST_URL


def cached_on(
    request: pytest.FixtureRequest, server: str, **cache: Any
) -> tuple[dict[str, Any], list[str], str]:
    """(the test config of ``server``, "mariadb" or "postgresql", with its database ready and
    this process's memcached and Redis under a prefix of its own, and ``cache`` settings; the
    memcached addresses; the Redis URL): for tests that count what the caches were sent."""
    memcached: list[str] = request.getfixturevalue("memcached_pair")
    redis_url: str = request.getfixturevalue("redis_ready")
    raw: dict[str, Any]
    if server == "mariadb":
        request.getfixturevalue("mariadb_ready")
        raw = cached_mariadb_config(memcached, redis_url)
    else:
        request.getfixturevalue("postgres_ready")
        raw = instagram_pg_config()
    prefix = f"c{uuid.uuid4().hex[:6]}:"
    raw["cache"] = {"memcached": memcached, "redis": redis_url, "prefix": prefix, **cache}
    return raw, memcached, redis_url


def cached_mariadb_config(memcached: list[str], redis_url: str) -> dict[str, Any]:
    """The MariaDB test config with memcached (two servers) and Redis."""
    raw = mariadb_config()
    raw["cache"] = {"memcached": memcached, "redis": redis_url, "prefix": "t:"}
    return raw


BACKENDS = ("sqlite", "sqlite-memory", "mariadb", "mariadb-cached")
#: Where a module that sets ``BOTH_FACES = True`` runs the ``store`` fixture's tests through
#: `store.aio.AsyncStore` too (two backends, so the suite's time does not double).
ASYNC_FACE_BACKENDS = ("sqlite", "mariadb-cached")
#: Where they run through `AsyncStore(io="native")` too: its calls as greenlets on the event loop,
#: each socket wait the loop's (MariaDB, memcached and Redis all on sockets).
NATIVE_FACE_BACKENDS = ("mariadb-cached",)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Each store test runs on SQLite and MariaDB, each without and with caches."""
    return str(request.param)


@pytest.fixture
def face() -> str:
    """Which API the ``store`` fixture is: ``sync`` (`Store`), or ``async`` (see `pytest_generate_tests`)."""
    return "sync"


#: Fixtures that reach a server (the shared ones, or this process's own caches).
SERVER_FIXTURES = frozenset(
    {"mariadb_ready", "postgres_ready", "memcached_pair", "redis_ready", "own_caches"}
)
#: Fixtures whose code names servers but that reach one only for a parameter that says so (above),
#: or only to clean up after the session.
DISPATCH_FIXTURES = frozenset({"config", "store", "backend", "face", "_namespace_dropped_at_the_end"})
#: Words in a test's code (its function, its fixtures, and the functions and classes of the tests
#: they call) that say it reaches a server.
SERVER_WORDS = (
    "MariaDBServer", "binlog_pair", "PostgresServer", "ZooKeeperServer", "start_memcached", "start_redis",
    "require_port", "root_sql", "MARIADB_URL", "PG_URL", "pymysql.connect", "psycopg.connect", "free_port",
    "mariadb_ready", "postgres_ready", "own_caches", "redis_ready", "memcached_pair", "mariadb_config",
    "instagram_pg_config", "REDIS_TEST_URL", "MEMCACHED_PORTS",
)  # fmt: skip


_sources: dict[Any, str] = {}


def _source(obj: Any) -> str:
    """``inspect.getsource(obj)``, once per object ("" where there is none)."""
    import inspect

    if obj not in _sources:
        try:
            _sources[obj] = inspect.getsource(obj)
        except (OSError, TypeError):
            _sources[obj] = ""
    return _sources[obj]


def _code_words(obj: Any, seen: set[int], depth: int = 0) -> str:
    """The source of ``obj`` (a function or class), and of the test helpers it names, 4 calls deep."""
    import inspect

    if id(obj) in seen or depth > 4:
        return ""
    seen.add(id(obj))
    text = _source(obj)
    if not text:
        return ""
    names: set[str] = set()
    codes = [obj.__code__] if inspect.isfunction(obj) else []
    if inspect.isclass(obj):
        codes = [f.__code__ for f in vars(obj).values() if inspect.isfunction(f)]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if inspect.iscode(c))
    glob = obj.__globals__ if inspect.isfunction(obj) else vars(sys.modules[obj.__module__])
    for name in names:
        helper = glob.get(name)
        if (inspect.isfunction(helper) or inspect.isclass(helper)) and helper.__module__.startswith("tests"):
            text += _code_words(helper, seen, depth + 1)
    return text


def _reaches_servers(item: pytest.Item) -> bool:
    """Whether ``item`` may need a server: `SERVER_FIXTURES`, a parameter naming MariaDB or
    PostgreSQL, or `SERVER_WORDS` in its code or its fixtures' (see `_code_words`)."""
    names = set(getattr(item, "fixturenames", ()))
    if names & SERVER_FIXTURES:
        return True
    callspec = getattr(item, "callspec", None)
    for value in callspec.params.values() if callspec is not None else ():
        if isinstance(value, str) and value.startswith(("mariadb", "postgres")):
            return True
    function = getattr(item, "function", None)
    if function is None:
        return True
    seen: set[int] = set()
    text = _code_words(function, seen)
    info = getattr(item, "_fixtureinfo", None)
    for name, defs in info.name2fixturedefs.items() if info is not None else ():
        if name not in DISPATCH_FIXTURES:
            for fixturedef in defs:
                text += _code_words(fixturedef.func, seen)
    return any(word in text for word in SERVER_WORDS)


#: The modules that take longest, longest first (measured in a full run). They are collected first,
#: so that pytest-xdist, which hands each worker whole modules in the order collected (`make test`
#: turns off its reordering by test count), starts them first: a long module handed out last
#: would leave one worker running alone at the end.
LONGEST_FIRST = (
    "tests/test_unique_interleavings.py",
    "tests/test_hostile.py",
    "tests/test_bench_mix.py",
    "tests/test_promises.py",
    "tests/test_pair_interleavings.py",
    "tests/faults/test_scenarios.py",
    "tests/test_move_postgres.py",
    "tests/test_invalidate.py",
    "tests/test_relations.py",
    "tests/test_relation_reads.py",
    "tests/test_move.py",
    "tests/test_move_instagram.py",
    "tests/faults/test_write_crashes.py",
    "tests/test_exactly_once_postgres.py",
    "tests/test_unique.py",
    "tests/test_secrets.py",
    "tests/test_bench.py",
    "tests/test_rebalance.py",
    "tests/faults/test_invalidate_faults.py",
    "tests/test_packaging.py",
    "tests/test_deploy.py",
    "tests/test_move_journals.py",
    "tests/test_exactly_once.py",
    "tests/test_tickets.py",
    "tests/test_instagram.py",
    "tests/test_aio.py",
    "tests/test_livemap.py",
    "tests/test_forks.py",
)


def _longest_first(items: list[pytest.Item]) -> None:
    """Put the tests of `LONGEST_FIRST`'s modules first, in its order; the rest keep theirs."""
    rank = {module: k for k, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


@pytest.hookimpl(tryfirst=True)  # before -m deselects by markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the modules longest first (`LONGEST_FIRST`), and mark every test that may need a
    server ``servers``: `make test-fast` runs the others. (The marks only where ``-m`` names the
    marker: reading the tests' code takes a few seconds.)"""
    _longest_first(items)
    if "servers" not in (config.option.markexpr or ""):
        return
    for item in items:
        if _reaches_servers(item):
            item.add_marker(pytest.mark.servers)


@pytest.hookimpl(tryfirst=True)  # before the fixtures' own params: these replace backend's
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """In a module with ``BOTH_FACES = True``, each test of the ``store`` fixture also runs on the
    async face (`tests.asyncface`: `AsyncStore` behind the sync API) on `ASYNC_FACE_BACKENDS`, and
    on its native face on `NATIVE_FACE_BACKENDS`; the sync runs keep their ids (``[sqlite]``), the
    async ones end in ``-async`` and ``-native``. A test that
    parametrizes ``backend`` itself keeps its backends, on the sync face."""
    if not getattr(metafunc.module, "BOTH_FACES", False):
        return
    if "face" not in metafunc.fixturenames or "backend" not in metafunc.fixturenames:
        return
    for mark in metafunc.definition.iter_markers("parametrize"):
        if "backend" in str(mark.args[0]):  # a test that names its own backends: the sync face there
            return
    cases = [pytest.param(b, "sync", id=b) for b in BACKENDS]
    cases += [pytest.param(b, "async", id=f"{b}-async") for b in ASYNC_FACE_BACKENDS]
    cases += [pytest.param(b, "native", id=f"{b}-native") for b in NATIVE_FACE_BACKENDS]
    metafunc.parametrize(("backend", "face"), cases)


@pytest.fixture
def config(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> StoreConfig:
    """A validated config for ``backend``."""
    if backend == "mariadb":
        ready: StoreConfig = request.getfixturevalue("mariadb_ready")
        return ready
    if backend == "mariadb-cached":
        request.getfixturevalue("mariadb_ready")
        raw = cached_mariadb_config(
            request.getfixturevalue("memcached_pair"), request.getfixturevalue("redis_ready")
        )
        return StoreConfig.from_dict(raw)
    if backend.startswith("postgres"):  # Instagram IDs (modules that list it among their backends)
        request.getfixturevalue("postgres_ready")
        raw = instagram_pg_config()
    else:
        raw = sqlite_config(tmp_path)
    if backend.endswith("-memory"):
        raw["cache"] = {"memory": True}
    return StoreConfig.from_dict(raw)


@pytest.fixture
def store(config: StoreConfig, face: str) -> Iterator[Store]:
    """A store on ``backend`` (through ``face``), closed after the test."""
    from tests.asyncface import blocking_store

    with blocking_store(config, face) as s:
        yield s


def row_count(store: Store, table: str) -> int:
    """Rows of ``table`` over every shard, read straight from the databases."""
    total = 0
    for r in store.shard_map:
        for shard in r.shards():
            h = store.admin_context().engines.shard(shard, r.master)
            with h.connect() as conn:
                cur = conn.cursor()
                cur.execute(f"SELECT COUNT(*) FROM {h.table(table)}")
                total += cur.fetchone()[0]
                cur.close()
    return int(total)


#: This process's PostgreSQL database (the namespace in its name, as in its schemas').
PG_TEST_DB = f"storetest_{NAMESPACE}"
PG_URL = f"postgresql+psycopg://postgres@127.0.0.1:5432/{PG_TEST_DB}"
IG_SHARDS = 16


def pg_app_host() -> dict[str, Any]:
    """A PostgreSQL host entry: the application role, ``postgres`` as its admin."""
    return {
        "url": PG_URL.replace("postgres@", f"{APP_USER}@"),
        "password_env": APP_PASSWORD_ENV,
        "admin": {"url": PG_URL},
    }


def instagram_pg_config() -> dict[str, Any]:
    """Instagram IDs: 16 logical shards (schemas NAMESPACE_shard0000-...0015) under two host names."""
    return base_config(
        namespace=NAMESPACE,
        ids="instagram",
        shards=IG_SHARDS,
        hosts={"PG1": pg_app_host(), "PG2": pg_app_host()},
        map=[{"range": [0, 7], "master": "PG1"}, {"range": [8, 15], "master": "PG2"}],
    )


@pytest.fixture(scope="session")
def postgres_ready() -> StoreConfig:
    """A fresh PostgreSQL database with the 16 shard schemas made by `init_shards`."""
    require_port("PostgreSQL", 5432)
    import psycopg

    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {PG_TEST_DB} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {PG_TEST_DB}")
    config = StoreConfig.from_dict(instagram_pg_config())
    init_shards(config)
    make_app_account(config)
    return config
