"""The application account's privileges: the exact GRANTs, and telling a refusal apart.

A store has two kinds of account on each server (see SECURITY.md):

* the **application** account (``hosts.NAME.url``) reads and writes rows of
  the shard tables, the invalidation log and the shard map table, and runs
  the shards' ID functions. It cannot CREATE, DROP, ALTER or GRANT, and it
  sees no database or schema but those;
* the **admin** account (``hosts.NAME.admin.url``) runs `store init`,
  moves, promotions, repairs and checks.

`grant_plan` lists, per server, the statements that give the application
account exactly that, for every shard of the config (a move may bring any
shard to any host, so grants made once stay right after moves).
`store grants --app-user NAME [--apply]` prints or applies them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import URL

from store.backends import backend_for
from store.config import StoreConfig
from store.exceptions import BackendError, ConfigError, StoreError
from store.naming import Names

__all__ = ["ServerGrants", "access_denied", "apply_grants", "grant_plan"]

#: What the application account may do to the rows of a shard's tables.
ROW_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
#: The database of the invalidation log (`store.cache.follower`) on each MariaDB server, without a
#: namespace (`store.naming.Names.log_database`).
LOG_DATABASE = "store_log"
#: Account names: MariaDB's and PostgreSQL's safe subset, no quoting games.
_ACCOUNT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
#: The host part of a MariaDB account: a name, an address, a netmask or a % pattern.
_ACCOUNT_HOST = re.compile(r"^[A-Za-z0-9_.%:\-/]{1,255}$")

#: MariaDB's "access denied" errors: to a database, at login, to a table or command,
#: to a column, a missing global privilege, to a routine.
_MYSQL_DENIED = frozenset({1044, 1045, 1142, 1143, 1227, 1370})
#: PostgreSQL's insufficient_privilege.
_PG_DENIED = "42501"


@dataclass(frozen=True, slots=True)
class ServerGrants:
    """The statements for one server, and the host names (of the config) that live on it."""

    server: str
    kind: str
    hosts: tuple[str, ...]
    statements: list[str] = field(default_factory=list)
    #: The admin URL the statements run with (`apply_grants`).
    admin_url: URL | None = None


def access_denied(exc: BaseException) -> bool:
    """True if ``exc`` (a store error or a driver's) is the server refusing a privilege."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if getattr(cur, "sqlstate", None) == _PG_DENIED:
            return True
        args = getattr(cur, "args", ())
        if args and isinstance(args[0], int) and args[0] in _MYSQL_DENIED:
            return True
        cur = getattr(cur, "orig", None) or cur.__cause__
    return False


def _check_account(user: str, host: str) -> None:
    if not _ACCOUNT.fullmatch(user):
        raise ConfigError(
            "--app-user must be 1-32 letters, digits or underscores, starting with a letter or _, "
            f"got {user!r}"
        )
    if not _ACCOUNT_HOST.fullmatch(host):
        raise ConfigError(f"--app-host must be a host name, address or % pattern, got {host!r}")


def grant_plan(config: StoreConfig, app_user: str, app_host: str = "%") -> list[ServerGrants]:
    """The GRANTs that let ``app_user`` serve ``config``'s request path, one entry per server.

    MariaDB: row privileges and EXECUTE on each shard database (``db00000``
    ...), SELECT, INSERT and DELETE on the invalidation log, SELECT on the
    shard map table's database where it lives on that server. PostgreSQL:
    CONNECT on the database, USAGE and row privileges on each shard schema
    (``shard0000`` ...), its sequences and ``next_id()``, and the same for
    tables an admin makes there later; where its writes are logged, SELECT,
    INSERT and DELETE on the invalidation log (schema ``store_log``). SQLite has no accounts: none.

    Every database and schema is named, those of the config's namespace
    only (``NAME_db00000``, ``NAME_store_log``, ...): no pattern, so an
    account of one namespace never reaches another's.
    """
    _check_account(app_user, app_host)
    admin = config.for_admin()
    servers: dict[str, ServerGrants] = {}
    for name in sorted(config.hosts):
        url = config.hosts[name]
        backend = backend_for(url)
        if backend.name == "sqlite":
            continue
        key = backend.server_identity(url)
        if backend.name == "postgresql":
            key += f"/{url.database}"
        found = servers.get(key)
        if found is None:
            servers[key] = ServerGrants(key, backend.name, (name,), admin_url=admin.hosts[name])
        else:
            servers[key] = ServerGrants(key, found.kind, (*found.hosts, name), admin_url=found.admin_url)
    table = config.map_table
    if table is not None:
        key = backend_for(table[0]).server_identity(table[0])
        if key not in servers:
            servers[key] = ServerGrants(key, "mysql-meta", (), admin_url=table[1])
    names = config.names
    meta_key = None if table is None else backend_for(table[0]).server_identity(table[0])
    out = []
    for key, g in servers.items():
        if g.kind == "postgresql":
            assert g.admin_url is not None
            stmts = _postgres(config.shards, app_user, str(g.admin_url.database), names)
            c = config.cache
            shared = bool(c.memcached or c.redis)
            if shared and any(c.follow or c.invalidation_of(h) == "log" for h in g.hosts):
                # The log schema exists by then: `store init` makes it where writes are logged.
                log = f'"{names.log_database}"'
                stmts += [
                    f'GRANT USAGE ON SCHEMA {log} TO "{app_user}"',
                    f'GRANT SELECT, INSERT, DELETE ON ALL TABLES IN SCHEMA {log} TO "{app_user}"',
                ]
        else:
            stmts = _mysql(config.shards if g.kind != "mysql-meta" else 0, app_user, app_host, names)
            if key == meta_key:
                meta = _grant_database(names.meta_database)
                stmts.append(f"GRANT SELECT ON `{meta}`.* TO '{app_user}'@'{app_host}'")
        out.append(ServerGrants(g.server, g.kind, g.hosts, stmts, g.admin_url))
    return out


def _mysql(shards: int, user: str, host: str, names: Names) -> list[str]:
    account = f"'{user}'@'{host}'"
    out = [
        f"GRANT {ROW_PRIVILEGES}, EXECUTE ON `{_grant_database(names.database_name(s))}`.* TO {account}"
        for s in range(shards)
    ]
    if shards:
        out.append(f"GRANT SELECT, INSERT, DELETE ON `{_grant_database(names.log_database)}`.* TO {account}")
    return out


def _grant_database(name: str) -> str:
    """``name`` as a MariaDB GRANT names one database: ``_`` is a wildcard there (``store_log`` would
    also grant ``storeXlog``, ``app_db00001`` ``appXdb00001``), so it is escaped."""
    return name.replace("_", "\\_")


def _postgres(shards: int, user: str, database: str, names: Names) -> list[str]:
    role = f'"{user}"'
    out = [f'GRANT CONNECT ON DATABASE "{database}" TO {role}']
    for s in range(shards):
        schema = f'"{names.schema_name(s)}"'
        out += [
            f"GRANT USAGE ON SCHEMA {schema} TO {role}",
            f"GRANT {ROW_PRIVILEGES} ON ALL TABLES IN SCHEMA {schema} TO {role}",
            f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
            f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role}",
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT {ROW_PRIVILEGES} ON TABLES TO {role}",
            f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {role}",
        ]
    return out


def _account_exists(cur: Any, kind: str, user: str, host: str) -> bool:
    if kind == "postgresql":
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,))
    else:
        cur.execute("SELECT 1 FROM mysql.user WHERE User = %s AND Host = %s", (user, host))
    return cur.fetchone() is not None


def apply_grants(
    plan: list[ServerGrants],
    app_user: str,
    app_host: str = "%",
    *,
    on_server: Callable[[str], None] | None = None,
) -> int:
    """Run ``plan`` with each server's admin URL; how many statements ran.

    The account must exist (its password is the operator's to choose):
    `ConfigError` names the statement to create it. PostgreSQL's statements
    run in one transaction; MariaDB's GRANTs are each atomic and idempotent.
    """
    from store.backends.mysql import mysql_connector
    from store.backends.postgres import postgres_connector

    _check_account(app_user, app_host)
    ran = 0
    for g in plan:
        assert g.admin_url is not None
        pg = g.kind == "postgresql"
        try:
            conn = (postgres_connector(g.admin_url) if pg else mysql_connector(g.admin_url))()
        except Exception as exc:
            raise BackendError(
                f"cannot reach {g.server} with its admin URL to grant: {exc}", orig=exc
            ) from exc
        try:
            cur = conn.cursor()
            if not _account_exists(cur, g.kind, app_user, app_host):
                create = (
                    f"CREATE ROLE \"{app_user}\" LOGIN PASSWORD '...'"
                    if pg
                    else f"CREATE USER '{app_user}'@'{app_host}' IDENTIFIED BY '...'"
                )
                raise ConfigError(
                    f"{g.server} has no account {app_user!r}: create it first ({create}), then re-run"
                )
            if pg:
                cur.execute("BEGIN")
            for stmt in g.statements:
                cur.execute(stmt)
                ran += 1
            if pg:
                cur.execute("COMMIT")
            cur.close()
        except StoreError:
            raise
        except Exception as exc:
            raise BackendError(f"granting on {g.server} failed: {exc}", orig=exc) from exc
        finally:
            conn.close()
        if on_server is not None:
            on_server(g.server)
    return ran
