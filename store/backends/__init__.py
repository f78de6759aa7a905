"""Everything that differs between database servers, one module or package per backend.

A `Backend` knows, for one kind of server: how shards are named (a MariaDB
database ``db00042``, a PostgreSQL schema ``shard0042``, a SQLite file), the
column types and DDL of the store's tables (defined once as SQLAlchemy Core
`Table` objects in `store.backends.tables`), how statements are compiled for
its driver, how to connect (timeouts included), how its errors read
(disconnect, missing table, duplicate key, retryable, tombstone), and what
it can do (make Instagram IDs, move shards, lock a shard for admin work,
promote a slave: `ReplicaState`).

Nothing outside this package branches on a backend's name: the rest of the
store asks the host's `Backend` (``backend_for(url)``).

    mysql/        MariaDB / MySQL (PyMySQL or mysqlclient)
      dialect.py      MySQLBackend: names, types, DDL, errors, grants, inventory
      driver.py       opening a driver's connection, TLS, timeouts
      pymysql_fast.py the store's shortcuts through PyMySQL's internals
      admin.py        Instagram IDs' counter and trigger, tombstones, dump and load, a slave's state
    postgres/     PostgreSQL (psycopg 3): Instagram IDs, a schema per shard
      dialect.py      PostgresBackend: names, types, DDL, errors, grants, inventory
      driver.py       opening a psycopg connection, its ``$n`` cursor
      admin.py        advisory lock keys, the tombstone's error, a standby's state and promotion
    sqlite.py     SQLite: a folder of shard files, the embedded default
    tables.py     the store's tables, once, as SQLAlchemy Core `Table` objects
    statements.py the statements, built with Core, compiled once per backend and table
    inventory.py  a server's shards as its backend reads them (live, tombstone, archive)

Each package's ``__init__`` hands on every public name its module had
before it was a package; ``mysql_driver.py`` and ``pymysql_fast.py`` are the
first places of ``mysql/driver.py`` and ``mysql/pymysql_fast.py``, and hand
on their names. Nothing in this package imports a module above it.
"""

from __future__ import annotations

import copy
import enum
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy.engine import URL, Dialect
from sqlalchemy.schema import CreateIndex, CreateTable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

from store.backends.tables import SHARD, VERSION_COLUMN, ColumnTypes, shard_tables
from store.exceptions import ConfigError
from store.naming import ADDED_VERSION, COUNTS_TABLE, DEFAULT_NAMES, Names
from store.specs import RelationSpec, TypeSpec

__all__ = [
    "COUNTED_TAIL",
    "DEFAULT_BACKEND",
    "SHARD",
    "Backend",
    "ErrorKind",
    "ReplicaState",
    "access_denied",
    "backend_for",
    "backend_named",
    "backend_names",
]


#: How a counted write (`Backend.counted_writes`: ``WITH w AS (write RETURNING 1), c AS (count
#: RETURNING version) ...``) ends: a row per row the write changed (its rowcount is the write's),
#: holding the list's version the count left (NULL if no count row changed), which a pipelining
#: cursor reports as the statement's ``lastrowid`` (`store.transactions`): the writer's cached
#: lists are changed in place, as where `Backend.list_versions`.
COUNTED_TAIL = " SELECT (SELECT version FROM c) FROM w"


class ErrorKind(enum.Enum):
    """What a driver error means to the store."""

    DISCONNECT = "the connection is gone"
    MISSING = "the shard's database, schema or table does not exist"
    TOMBSTONE = "the shard moved away: a tombstone answered"
    RETRYABLE = "the transaction was rolled back whole (deadlock, lock wait): run it again"
    DUPLICATE = "a primary or unique key refused the row"


@dataclass(frozen=True)
class ReplicaState:
    """A slave as `store promote` finds it before promoting it (`Backend.replica_state`)."""

    #: Why the server is not replicating from a master at all (not a standby), or None.
    not_replicating: str | None = None
    #: What it received from its master and has not applied yet, one entry per stream, in words
    #: (``default read 1234 executed 1200``); empty: caught up with all it received.
    unapplied: tuple[str, ...] = ()


class Backend:
    """One kind of database server. Subclasses fill in the class attributes and the hooks."""

    #: The name `store schema --backend` takes and messages show.
    name: ClassVar[str] = ""
    #: SQLAlchemy URL backend names this backend serves (``mysql+pymysql://`` -> "mysql").
    url_backends: ClassVar[frozenset[str]] = frozenset()
    #: Placeholder of the driver's paramstyle (compiled statements use it too).
    param: ClassVar[str] = "%s"
    #: Statement that opens a write transaction.
    begin: ClassVar[str] = "BEGIN"
    #: True where ``begin`` can go out with the transaction's first statement, in one round trip
    #: (the shards' connections accept several statements in one request).
    begin_with_first_statement: ClassVar[bool] = False
    #: True where the driver pipelines statements (its cursor's ``run_pipeline``: the store's libpq
    #: pipeline on psycopg): ``begin`` and deferred statements go out with the next statement, in
    #: one round trip.
    pipelines: ClassVar[bool] = False
    #: True where a write transaction locks the whole shard (SQLite's BEGIN IMMEDIATE):
    #: two such shards are locked in shard order, so two writers never wait in a circle.
    locks_whole_shard: ClassVar[bool] = False
    #: True where each shard has a pool of its own (a SQLite file): a batch reaches one shard.
    pool_per_shard: ClassVar[bool] = False
    #: True where a shard comes into being on first use (a SQLite file), not by `store init`.
    made_on_first_use: ClassVar[bool] = False
    #: A statement locking one key for the rest of the transaction, taken before writing a pair
    #: whose row may be absent; None where the write itself locks the key, present or not.
    key_lock: ClassVar[str | None] = None
    #: The same for many keys, taken in the order given (one parameter: the keys as an array);
    #: None: `key_lock` a key at a time.
    key_locks: ClassVar[str | None] = None
    #: Which ID schemes a host of this backend can serve.
    serves_ids: ClassVar[frozenset[str]] = frozenset({"pinterest"})
    #: True if `store move` can move its shards; True if it can be a ticket server or a map table.
    can_move: ClassVar[bool] = False
    can_hold_tickets: ClassVar[bool] = False
    #: The `store.admin.move` engine that moves its shards (``mariadb``, ``postgres``); None: none does.
    move_kind: ClassVar[str | None] = None
    #: The names of the databases, schemas and files it makes (`store.naming.Names`): a backend
    #: bound to a namespace is made by `named` (or ``backend_for(url, names)``).
    names: Names = DEFAULT_NAMES
    #: A statement that bumps a list's version also returns the new version (the driver's
    #: ``lastrowid``), and a log row can name it: cached lists are updated in place
    #: (`store.cache.lists`). Where `counted_writes`, those statements return it too
    #: (`COUNTED_TAIL`); elsewhere a write drops the cached lists it changed.
    list_versions: ClassVar[bool] = False
    #: A statement can be made to run only if the one before it changed a row (``ROW_COUNT()``),
    #: and several go in one request: a pair write and its counts travel together
    #: (`store.backends.statements.RelationStatements`: count_up_if, count_down_if, bump_if).
    conditional_writes: ClassVar[bool] = False
    #: A pair write's statements can carry gates (`gate_plan`): its COMMIT goes in the same
    #: request, and runs only if each write changed its row.
    gates: ClassVar[bool] = False
    #: A pair write and its count are one statement (a data-modifying CTE: the count runs only if
    #: the write changed a row), and several statements go in one request (a pipeline): a pair
    #: write travels as where `conditional_writes` (`store.backends.statements.RelationStatements`:
    #: move_if_other_counted, delete_counted; `GuardedInsertStatements`: insert_live_counted).
    counted_writes: ClassVar[bool] = False
    #: A side of a batch of pairs is written with a few multi-row statements: one locking read of
    #: every pair's key (present rows, and the gaps where absent ones would go), then one INSERT,
    #: one upsert of the moves, one of the counts (`store.backends.statements.PairRowsStatements`).
    pair_rows: ClassVar[bool] = False
    #: A side of a batch of new pairs is one statement: every guarded insert and the counts of the
    #: lists it grew (`counted_link_rows`), where `counted_writes` and the pair rows are not.
    counted_rows: ClassVar[bool] = False
    #: Each shard is a schema of one database (PostgreSQL), not a database or file of its own.
    schema_shards: ClassVar[bool] = False
    #: How an INSERT that meets an existing key updates it instead, in hand-written SQL (benchmark
    #: floors): ``on_conflict`` (``ON CONFLICT (...) DO UPDATE``) or ``on_duplicate_key``.
    upsert_style: ClassVar[str] = "on_conflict"
    #: ``ALTER TABLE ... ADD COLUMN IF NOT EXISTS`` is understood (MariaDB, PostgreSQL; not SQLite).
    add_column_if_not_exists: ClassVar[bool] = True

    def __init__(self) -> None:
        self.sa_dialect = self._sa_dialect()

    def named(self, names: Names) -> Backend:
        """This backend making and finding the names of ``names`` (one shared object per namespace)."""
        if names == self.names:
            return self
        key = (self.name, names)
        with _NAMED_LOCK:
            found = _NAMED.get(key)
            if found is None:
                found = _NAMED[key] = copy.copy(self)
                found.names = names
        return found

    @property
    def change_log(self) -> str | None:
        """The quoted name of the server's invalidation log (`store.cache.follower`), or None."""
        return None

    # -- accounts and grants (`store.grants`) ------------------------------------

    #: The server has accounts the application logs in with (SQLite files have none).
    has_accounts: ClassVar[bool] = True
    #: A server's GRANT statements run in one transaction (PostgreSQL); else each on its own.
    grants_in_transaction: ClassVar[bool] = False

    def grant_server(self, url: URL) -> str:
        """The name of the server (and database, where grants are per database) ``url`` reaches."""
        return self.server_identity(url)

    def grant_statements(
        self, *, shards: int, user: str, host: str, database: str | None, log: bool, meta: bool
    ) -> list[str]:
        """The statements that let ``user`` serve ``shards`` shards here: rows, ID functions, the
        invalidation log where ``log``, and the shard map table where ``meta``."""
        raise NotImplementedError

    def account_exists(self, cur: Any, user: str, host: str) -> bool:
        """Whether the server has the account ``user`` (from ``host``, where accounts have one)."""
        raise NotImplementedError

    def create_account_hint(self, user: str, host: str) -> str:
        """The statement an operator runs to make the account (its password theirs to choose)."""
        raise NotImplementedError

    def admin_connector(self, url: URL) -> Callable[[], Any]:
        """Opens an autocommit connection with an admin URL (grants, checks)."""
        raise NotImplementedError

    def denies(self, exc: BaseException) -> bool:
        """True if ``exc`` (one exception, not its causes) is this server refusing a privilege."""
        return False

    # -- promoting a slave (`store.admin.promote`) --------------------------------

    #: `store promote` can make a slave of this kind the master of its master's ranges
    #: (`unreachable`, `replica_state`, `promote_replica`).
    can_promote: ClassVar[bool] = False

    def unreachable(self, exc: BaseException) -> bool:
        """True if ``exc``, raised opening an admin connection (`admin_connector`), says that nothing
        answered at the server's address: refused, timed out, no route. `store promote` takes a
        master for dead only then; any other failure (a login or database refused, a name that
        does not resolve, a driver missing) may come from a server that is up."""
        return False

    def replica_state(self, url: URL) -> ReplicaState:
        """Whether the slave at admin URL ``url`` replicates, and what it received and has not applied."""
        raise NotImplementedError(f"a {self.name} host has no slaves to promote")

    def promote_replica(self, url: URL) -> None:
        """Make the slave at admin URL ``url`` stop replicating and take writes (a no-op where it
        replicates nothing); `store.exceptions.PromoteError` if it did not finish."""
        raise NotImplementedError(f"a {self.name} host has no slaves to promote")

    # -- hooks each backend provides ---------------------------------------------

    def _sa_dialect(self) -> Dialect:
        raise NotImplementedError

    def column_types(self) -> ColumnTypes:
        """The column types and table options of this backend's tables."""
        raise NotImplementedError

    def namespace(self, shard: int) -> str:
        """The database, schema or file stem that holds shard ``shard``."""
        raise NotImplementedError

    def statement_schema(self, shard: int) -> str | None:
        """The schema a statement names for shard ``shard`` (None: the connection's own, as SQLite's)."""
        return self.namespace(shard)

    def check_url(self, host: str, url: URL, base: Path) -> URL:
        """``url`` checked (and completed) for a host of this backend; `ConfigError` if it cannot serve."""
        return url

    def server_identity(self, url: URL) -> str:
        """One name per physical server: host names whose URLs reach the same server share it."""
        raise NotImplementedError

    def connector(
        self, url: URL, *, shard: int, connect_timeout_s: float, query_timeout_s: float
    ) -> Callable[[], Any]:
        """A function that opens one autocommit DBAPI connection (for ``shard``, where that matters)."""
        raise NotImplementedError

    def classify(self, exc: BaseException) -> ErrorKind | None:
        """What a driver error means, or None for anything else."""
        raise NotImplementedError

    def is_driver_error(self, exc: BaseException) -> bool:
        """True if ``exc`` came from this backend's driver (rather than a bug)."""
        raise NotImplementedError

    def gate_plan(
        self, statements: Sequence[tuple[str, Any]], writes: int, kind: int
    ) -> tuple[list[tuple[str, Any]], list[int]]:
        """A side's pair write (``statements``: `store.relations.repository.Plan`'s, of ``writes``
        writes, each a move or a guarded insert with its count) with gates that end the request
        with an error unless one of its writes changed its row, where `gates`; and where its
        own statements are among those returned. ``kind`` (0 or 1): which error, where the
        backend can tell them apart (`gate`)."""
        raise NotImplementedError

    def gate_rows(self, text: str) -> str:
        """A `counted_link_rows` (or `counted_unlink_rows`) text with a gate (`gate_plan`) that
        ends the request unless it wrote every pair it was given, where `gates` and
        `counted_rows`."""
        raise NotImplementedError

    def gate(self, exc: BaseException) -> int | None:
        """What ``exc`` means if a gate of `gate_plan` raised it, or None: not a gate's. 0: the
        transaction goes on (the statements before the gate stand, none after it ran); 1: it
        must be begun again (rolled back, or in error)."""
        return None

    def extra_statements(
        self, shard: int, types: Sequence[TypeSpec], *, ids: str, epoch_ms: int
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """(before the tables, after them): what else a shard needs, as (what, statement) pairs.

        The ID machinery of Instagram IDs (a counter and ``next_id()``, or a
        trigger per table), and the database or schema itself.
        """
        return [], []

    def change_log_ddl(self) -> list[str]:
        """Idempotent statements that make the server's invalidation log (none where there is none)."""
        return []

    #: How a `store invalidate` daemon can follow this backend's hosts (`cache.invalidation`).
    invalidation_modes: ClassVar[tuple[str, ...]] = ()
    #: The query of the log's id step (`None`: ids step by 1).
    change_log_step_sql: ClassVar[str | None] = None

    def change_log_clean(self, batch: int) -> str:
        """``DELETE`` of at most ``batch`` log rows with ids up to the parameter (oldest first)."""
        raise NotImplementedError

    def wait_for_lock(self, cur: Any, name: str, wait_s: int) -> bool:
        """Take the server-wide lock ``name`` on ``cur``'s session, waiting up to ``wait_s``: True if
        this session holds it now (it goes with the session: `store.invalidate.leader`)."""
        raise NotImplementedError

    def change_log_insert(self) -> str:
        """``INSERT`` of one log row: (at_ms, entries)."""
        raise NotImplementedError

    def change_log_insert_versions(self, versions: Sequence[str]) -> str:
        """``INSERT`` of one log row whose entries name lists with their versions as the transaction
        leaves them, where `list_versions`: (at_ms, the plain entries, then for each of
        ``versions`` (a query of one list's version) the entry up to the version and the
        query's parameters)."""
        raise NotImplementedError

    def change_log_insert_if_changed(self) -> str:
        """``INSERT`` of one log row (at_ms, one list's entry up to its version), where
        `conditional_writes`: written only if the statement before it in the request changed a row,
        the entry ending in the version that statement returned (``LAST_INSERT_ID()``)."""
        raise NotImplementedError

    def existing(self, cur: Any) -> set[tuple[str, str]]:
        """(namespace, what) of every shard object this server already holds (for `store init`)."""
        raise NotImplementedError

    def inventory(self, url: URL, open_cursor: Callable[[], Any]) -> Any:
        """The shard databases on the server (`store.backends.inventory.ServerInventory`)."""
        raise NotImplementedError

    def tombstones(self, cur: Any, shards: Iterable[int]) -> dict[int, tuple[str, int]]:
        """(moved_to, map version) of each of ``shards`` that left a tombstone here."""
        return {}

    def tombstone_from_error(self, exc: BaseException) -> tuple[str, int] | None:
        """(moved_to, map version) as a tombstone's refusal names them, if it does."""
        return None

    @contextmanager
    def admin_lock(self, cur: Any, shards: Iterable[int], *, timeout_s: float) -> Iterator[None]:
        """Hold the admin lock of each of ``shards`` on this server (no-op where shards never move)."""
        yield

    def upsert_skip(self, table: Any) -> Any:
        """An INSERT construct on ``table`` that skips a row whose key exists (rowcount 0)."""
        raise NotImplementedError

    def upsert_add(self, table: Any, key: Sequence[str], column: str, *, also: Mapping[str, Any]) -> Any:
        """An INSERT construct on ``table`` that adds to ``column`` of the existing ``key`` row
        (and sets the columns of ``also`` to their expressions there)."""
        raise NotImplementedError

    def id_step(self, cur: Any) -> int | None:
        """The step between the auto-increment keys one multi-row INSERT gives its rows on ``cur``'s
        session, where they are sure to be consecutive from the statement's ``lastrowid`` in the
        order given (a session's answer holds for as long as it lasts); None where they are not,
        or not known to be: the keys are read back (``RETURNING``)."""
        return None

    def returned(self, value: Any) -> Any:
        """``value`` as an expression the statement also returns, where `list_versions`."""
        return value

    def upsert_set(self, table: Any, key: Sequence[str], column: str, *, also: Mapping[str, Any]) -> Any:
        """An INSERT construct on ``table`` that overwrites ``column`` of the existing ``key`` row
        (and sets the columns of ``also`` to their expressions there)."""
        raise NotImplementedError

    def ts_now(self) -> ClauseElement | None:
        """The value an UPDATE sets ``ts`` to, or None where the column updates itself."""
        return None

    # -- shared ----------------------------------------------------------------------

    def compile(self, stmt: ClauseElement) -> tuple[str, tuple[str, ...]]:
        """``stmt`` as this driver's SQL text, and its parameter names in the order they are passed."""
        compiled = stmt.compile(dialect=self.sa_dialect)
        assert isinstance(compiled, SQLCompiler)
        return compiled.string, tuple(compiled.positiontup or ())

    def table(self, shard: int, table: str) -> str:
        """The quoted name of ``table`` in shard ``shard``, for hand-written SQL."""
        prep = self.sa_dialect.identifier_preparer
        schema = self.statement_schema(shard)
        name = prep.quote_identifier(table)
        return name if schema is None else f"{prep.quote_identifier(schema)}.{name}"

    def counted_link_rows(self, shard: int, relation: str, table: str, key: str) -> str:
        """Where `counted_rows`: one statement inserting many pairs of ``relation`` on ``shard``,
        each only if its ``from`` object (row ``key`` of ``table``) is live (read in share mode) and
        the pair is absent, and counting the lists it grew; parameters: the from, to, sequence and
        object-key arrays, then the relation's name; a row (from_id, to_id) per pair inserted."""
        raise NotImplementedError(f"{self.name} writes a batch's pairs one statement each")

    def counted_unlink_rows(self, shard: int, relation: str) -> str:
        """Where `counted_rows`: one statement deleting many pairs of ``relation`` on ``shard`` and
        counting the lists it shrank; parameters: the from and to arrays, then the relation's
        name; a row (from_id, to_id) per pair deleted."""
        raise NotImplementedError(f"{self.name} deletes a batch's pairs one statement each")

    def params(self, n: int) -> str:
        """``n`` comma-separated placeholders."""
        return ", ".join([self.param] * n)

    def shard_statements(
        self,
        shard: int,
        types: Iterable[TypeSpec],
        relations: Iterable[RelationSpec],
        *,
        ids: str = "pinterest",
        epoch_ms: int = 0,
        unique: bool = False,
    ) -> list[tuple[str, str]]:
        """Idempotent DDL for shard ``shard`` as (what it creates, statement) pairs.

        ``unique``: with the unique-key table (the config has ``unique:``).

        What it creates is ``""`` for the database or schema, a table name,
        or a name ending in ``#next_id`` for ID machinery, so that `store
        init` can skip what already exists.
        """
        types, relations = list(types), list(relations)
        if ids not in self.serves_ids:
            raise ConfigError(f"a {self.name} host cannot serve ids: {ids}")
        before, after = self.extra_statements(shard, types, ids=ids, epoch_ms=epoch_ms)
        out = list(before)
        schema = self.statement_schema(shard)
        object_tables = {t.table for t in types}
        made = shard_tables(
            self.column_types(), types, relations, ids=ids, schema=schema, shard=shard, unique=unique
        )
        for t in made:
            out.append((t.name, self._ddl(CreateTable(t, if_not_exists=True))))
            for index in sorted(t.indexes, key=lambda i: str(i.name)):
                out.append((t.name, self._ddl(CreateIndex(index, if_not_exists=True))))
            if t.name in object_tables or t.name == COUNTS_TABLE:
                # Tables made before objects and lists carried versions get the column.
                out.append((t.name + ADDED_VERSION, self._add_column(t, t.c[VERSION_COLUMN])))
        return out + after

    @staticmethod
    def missing(
        statements: Iterable[tuple[str, str]], existing: set[tuple[str, str]], namespace: str
    ) -> list[tuple[str, str]]:
        """The statements of `shard_statements` whose object does not exist yet in ``namespace``.

        A column added to an older table is skipped when its table is made
        now: the new table has it already.
        """
        todo = [(what, stmt) for what, stmt in statements if (namespace, what) not in existing]
        made = {what for what, _stmt in todo}
        return [
            (what, stmt)
            for what, stmt in todo
            if not (what.endswith(ADDED_VERSION) and what[: -len(ADDED_VERSION)] in made)
        ]

    def _add_column(self, table: Any, column: Any) -> str:
        prep = self.sa_dialect.identifier_preparer
        kind = column.type.compile(dialect=self.sa_dialect)
        guard = "IF NOT EXISTS " if self.add_column_if_not_exists else ""
        return (
            f"ALTER TABLE {prep.format_table(table)} ADD COLUMN {guard}{prep.quote(column.name)} {kind} "
            f"NOT NULL DEFAULT {column.server_default.arg.text}"
        )

    def _ddl(self, element: ClauseElement) -> str:
        text = str(element.compile(dialect=self.sa_dialect)).strip()
        # SQLAlchemy's DDL pads lines with trailing blanks and tabs: tidy it for readers.
        return "\n".join(line.rstrip().replace("\t", "  ") for line in text.splitlines())

    def describe(self, shard: int) -> str:
        """Where shard ``shard`` lives on a host of this backend, in words (for the DDL's header)."""
        return f"database {self.namespace(shard)}"


_REGISTRY: dict[str, Backend] = {}
#: Backends bound to a namespace, by (backend name, names).
_NAMED: dict[tuple[str, Names], Backend] = {}
_NAMED_LOCK = threading.Lock()
#: The backend the store is built around (MariaDB/MySQL), for defaults such as `store schema`'s.
DEFAULT_BACKEND = "mysql"


def _registry() -> dict[str, Backend]:
    if not _REGISTRY:
        from store.backends.mysql.dialect import MySQLBackend
        from store.backends.postgres.dialect import PostgresBackend
        from store.backends.sqlite import SQLiteBackend

        for backend in (MySQLBackend(), PostgresBackend(), SQLiteBackend()):
            _REGISTRY[backend.name] = backend
    return _REGISTRY


def access_denied(exc: BaseException) -> bool:
    """True if ``exc`` (a store error or a driver's), or an error it was raised from, is a server
    refusing a privilege (`Backend.denies`)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    backends = list(_registry().values())
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if any(b.denies(cur) for b in backends):
            return True
        cur = getattr(cur, "orig", None) or cur.__cause__
    return False


def backend_names() -> list[str]:
    """The backends this store supports, by name."""
    return sorted(_registry())


def backend_named(name: str) -> Backend:
    """The backend called ``name``; `ConfigError` naming the supported ones."""
    found = _registry().get(name)
    if found is None:
        raise ConfigError(f"no backend {name!r}; supported: {', '.join(backend_names())}")
    return found


def backend_for(url: URL, names: Names = DEFAULT_NAMES) -> Backend:
    """The backend that serves host URL ``url`` with the names of ``names``; `ConfigError` naming
    the supported ones."""
    wanted = url.get_backend_name()
    for backend in _registry().values():
        if wanted in backend.url_backends:
            return backend.named(names)
    supported = sorted(b for backend in _registry().values() for b in backend.url_backends)
    raise ConfigError(f"backend {wanted!r} is not supported; supported: {', '.join(supported)}")
