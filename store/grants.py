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

from sqlalchemy.engine import URL

from store.backends import access_denied, backend_for, backend_named
from store.config import StoreConfig
from store.exceptions import BackendError, ConfigError, StoreError

__all__ = ["ServerGrants", "access_denied", "apply_grants", "grant_plan"]

#: Account names: MariaDB's and PostgreSQL's safe subset, no quoting games.
_ACCOUNT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,31}$")
#: The host part of a MariaDB account: a name, an address, a netmask or a % pattern.
_ACCOUNT_HOST = re.compile(r"^[A-Za-z0-9_.%:\-/]{1,255}$")
#: The `ServerGrants.kind` of a server that holds the shard map table and no shard of the config.
META = "-meta"


@dataclass(frozen=True, slots=True)
class ServerGrants:
    """The statements for one server, and the host names (of the config) that live on it."""

    server: str
    kind: str
    hosts: tuple[str, ...]
    statements: list[str] = field(default_factory=list)
    #: The admin URL the statements run with (`apply_grants`).
    admin_url: URL | None = None


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
    c = config.cache
    shared = bool(c.memcached or c.redis)
    servers: dict[str, ServerGrants] = {}
    for name in sorted(config.hosts):
        url = config.hosts[name]
        backend = backend_for(url, config.names)
        if not backend.has_accounts:
            continue
        key = backend.grant_server(url)
        found = servers.get(key)
        if found is None:
            servers[key] = ServerGrants(key, backend.name, (name,), admin_url=admin.hosts[name])
        else:
            servers[key] = ServerGrants(key, found.kind, (*found.hosts, name), admin_url=found.admin_url)
    table = config.map_table
    meta_key = None
    if table is not None:
        meta_backend = backend_for(table[0], config.names)
        meta_key = meta_backend.grant_server(table[0])
        if meta_key not in servers:
            servers[meta_key] = ServerGrants(meta_key, meta_backend.name + META, (), admin_url=table[1])
    out = []
    for key, g in servers.items():
        assert g.admin_url is not None
        backend = backend_named(g.kind.removesuffix(META)).named(config.names)
        stmts = backend.grant_statements(
            shards=0 if g.kind.endswith(META) else config.shards,
            user=app_user,
            host=app_host,
            database=g.admin_url.database,
            log=shared and any(c.follow or c.invalidation_of(h) == "log" for h in g.hosts),
            meta=key == meta_key,
        )
        out.append(ServerGrants(g.server, g.kind, g.hosts, stmts, g.admin_url))
    return out


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
    _check_account(app_user, app_host)
    ran = 0
    for g in plan:
        assert g.admin_url is not None
        backend = backend_named(g.kind.removesuffix(META))
        one_transaction = backend.grants_in_transaction
        try:
            conn = backend.admin_connector(g.admin_url)()
        except Exception as exc:
            raise BackendError(
                f"cannot reach {g.server} with its admin URL to grant: {exc}", orig=exc
            ) from exc
        try:
            cur = conn.cursor()
            if not backend.account_exists(cur, app_user, app_host):
                create = backend.create_account_hint(app_user, app_host)
                raise ConfigError(
                    f"{g.server} has no account {app_user!r}: create it first ({create}), then re-run"
                )
            if one_transaction:
                cur.execute("BEGIN")
            for stmt in g.statements:
                cur.execute(stmt)
                ran += 1
            if one_transaction:
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
