"""PostgreSQL (psycopg 3): Instagram IDs, every logical shard a schema (``shard0042``) of one database.

Each schema has its own ``next_id()`` and counter; every object table's
``id`` defaults to it, and a create reads the ID back with ``INSERT ...
RETURNING id``. Thousands of logical shards map to a few databases.
`PostgresBackend` is the dialect; opening a connection is
`store.backends.postgres.driver`'s; the advisory lock keys, the
tombstone's error and a standby's promotion are `store.backends.postgres.admin`'s.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import func, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import psycopg as pg_psycopg
from sqlalchemy.engine import URL, Dialect
from sqlalchemy.sql.elements import ClauseElement

from store.backends import COUNTED_TAIL, Backend, ErrorKind, ReplicaState
from store.backends.inventory import ServerInventory, ShardCopy, shard_number
from store.backends.postgres.admin import (
    PG_LOCK_BASE,
    PROMOTE_WAIT_S,
    TOMBSTONE_SQLSTATE,
    _admin_key,
    parse_tombstone,
    promote_standby,
    standby_state,
)
from store.backends.postgres.admin import unreachable as connect_unreachable
from store.backends.postgres.driver import postgres_connector
from store.backends.tables import VERSION_COLUMN, ColumnTypes
from store.exceptions import BackendError, ConfigError
from store.naming import ADDED_VERSION, NEXT_ID, TOMBSTONE_TABLE
from store.specs import TypeSpec
from store.tls import absolute_files, postgres_tls

__all__ = ["ROW_PRIVILEGES", "PostgresBackend"]

# Transactions rolled back whole, safe to run again: deadlock, serialization failure.
_RETRY = frozenset({"40P01", "40001"})
# Undefined table, invalid schema name, undefined function.
_MISSING = frozenset({"42P01", "3F000", "42883"})
_DUPLICATE = frozenset({"23505"})
# An upsert into a tombstone's view (no key to match ON CONFLICT): the store's
# tables always have one, so this only ever answers for a moved shard.
_NO_CONFLICT_KEY = "42P10"


#: What the application account may do to the rows of a shard's tables.
ROW_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"


#: A counted write's gate (after `COUNTED_TAIL`): a branch that returns no row, and divides by the
#: rows the write changed (plus, with two writes, those the first changed: ``_PLUS_KEPT``) in a
#: one-time filter.
_DIVIDE_BY = " UNION ALL SELECT 1 WHERE (SELECT 1 / (count(*){}) FROM w) < 0"
_PLUS_KEPT = " + current_setting('store.pair')::int"
#: The first of two writes keeps its count for the second's gate (in the transaction only).
_KEEP_COUNT = " UNION ALL SELECT 1 WHERE set_config('store.pair', (SELECT count(*) FROM w)::text, true) = ''"


#: The tail of a counted-rows statement (`PostgresBackend.counted_link_rows`), and its gate.
_ROWS_TAIL = " SELECT from_id, to_id FROM w"
_EVERY_PAIR = (
    " UNION ALL SELECT 0, 0 WHERE (SELECT 1 / ((SELECT count(*) FROM w) = (SELECT count(*) FROM v))::int) < 0"
)


def _gated_counted(text: str, gate: str) -> str:
    """A counted write's ``text`` with ``gate`` as another branch of its SELECT."""
    if not text.endswith(COUNTED_TAIL):
        raise AssertionError(f"not a counted statement: {text[:200]}")
    return text + gate


class PostgresBackend(Backend):
    """PostgreSQL, for Instagram IDs."""

    name = "postgresql"
    url_backends = frozenset({"postgresql"})
    param = "%s"
    serves_ids = frozenset({"instagram"})
    # PostgreSQL locks nothing for an absent key: an advisory lock on the pair stands in.
    key_lock = "SELECT pg_advisory_xact_lock(%s)"
    # (unnest keeps the array's order: a batch takes its keys' locks in the order it writes them)
    key_locks = (
        "SELECT pg_advisory_xact_lock(k) FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(k, o) ORDER BY o"
    )
    # BEGIN and the deferred count updates go out in one pipeline with the next statement.
    pipelines = True
    # A pair write and its count in one statement (a data-modifying CTE).
    counted_writes = True
    gates = True
    # A batch's new pairs on one shard: one statement (`counted_link_rows`).
    counted_rows = True

    def counted_link_rows(self, shard: int, relation: str, table: str, key: str) -> str:
        """`Backend.counted_link_rows`: the pairs as arrays (unnest), inserted where their object
        is live and they are absent, each list's count and version grown by its new pairs in the
        same statement (a data-modifying CTE, as the counted write of one pair)."""
        rel, obj = self.table(shard, relation), self.table(shard, table)
        counts = self.table(shard, "relation_counts")
        column = self.sa_dialect.identifier_preparer.quote_identifier(key)
        return (
            "WITH v AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::bigint[]) "
            "AS v(f, t, s, k)), "
            f"w AS (INSERT INTO {rel} (from_id, to_id, sequence) "
            f"SELECT v.f, v.t, v.s FROM v JOIN {obj} AS o ON o.{column} = v.k WHERE o.active = 1 "
            "FOR SHARE OF o ON CONFLICT DO NOTHING RETURNING from_id, to_id), "
            f"c AS (INSERT INTO {counts} AS rc (relation, from_id, n, version) "
            "SELECT %s, from_id, count(*), count(*) FROM w GROUP BY from_id "
            "ON CONFLICT (relation, from_id) DO UPDATE SET n = rc.n + excluded.n, "
            "version = rc.version + excluded.version) "
            "SELECT from_id, to_id FROM w"
        )

    def counted_unlink_rows(self, shard: int, relation: str) -> str:
        """`Backend.counted_unlink_rows`: the pairs as arrays, deleted where present, each list's
        count shrunk and its version grown by its deleted pairs, in the same statement."""
        rel, counts = self.table(shard, relation), self.table(shard, "relation_counts")
        return (
            "WITH v AS (SELECT * FROM unnest(%s::bigint[], %s::bigint[]) AS v(f, t)), "
            f"w AS (DELETE FROM {rel} AS r USING v WHERE r.from_id = v.f AND r.to_id = v.t "
            "RETURNING r.from_id, r.to_id), "
            f"c AS (UPDATE {counts} AS rc SET n = rc.n - x.k, version = rc.version + x.k "
            "FROM (SELECT from_id, count(*) AS k FROM w GROUP BY from_id) AS x "
            "WHERE rc.relation = %s AND rc.from_id = x.from_id) "
            "SELECT from_id, to_id FROM w"
        )

    def _sa_dialect(self) -> Dialect:
        return pg_psycopg.dialect(paramstyle="format")  # type: ignore[no-untyped-call]

    def column_types(self) -> ColumnTypes:
        """bigint keys made by the schema's next_id(), text JSON, timestamptz(3)."""
        return ColumnTypes(
            local_id=postgresql.BIGINT(),
            instagram_id=postgresql.BIGINT(),
            instagram_default=lambda schema, _shard: text(f'"{schema}".next_id()'),
            data=postgresql.TEXT(),
            flag=postgresql.SMALLINT(),
            timestamp=postgresql.TIMESTAMP(timezone=True, precision=3),
            timestamp_default="now()",
            pair_id=postgresql.BIGINT(),
            sequence=postgresql.BIGINT(),
            relation_name=postgresql.TEXT(),
            count=postgresql.BIGINT(),
        )

    def namespace(self, shard: int) -> str:
        """``shard0042`` (``NAME_shard0042`` in a namespace)."""
        return self.names.schema_name(shard)

    def describe(self, shard: int) -> str:
        """``schema shard0042``."""
        return f"schema {self.names.schema_name(shard)}"

    def check_url(self, host: str, url: URL, base: Path) -> URL:
        """A PostgreSQL host names its database (each shard is a schema in it), and its query
        parameters are the TLS ones, right (`store.tls.postgres_tls`).

        Relative TLS file names are taken from ``base`` (the config file's folder); the URL
        returned names them in full.
        """
        if not url.database:
            raise ConfigError(
                f"hosts.{host}: a PostgreSQL host names its database, e.g. "
                "postgresql+psycopg://postgres@127.0.0.1:5432/store; each shard is a schema in it"
            )
        url = absolute_files(url, base)
        try:
            postgres_tls(url)
        except ConfigError as exc:
            raise ConfigError(f"hosts.{host}: {exc}") from None
        return url

    def server_identity(self, url: URL) -> str:
        """``postgresql://host:port/database``."""
        return f"postgresql://{url.host or '127.0.0.1'}:{url.port or 5432}/{url.database}"

    def connector(
        self, url: URL, *, shard: int, connect_timeout_s: float, query_timeout_s: float
    ) -> Callable[[], Any]:
        """psycopg, autocommit, with the timeouts."""
        return postgres_connector(url, connect_timeout_s=connect_timeout_s, query_timeout_s=query_timeout_s)

    # -- accounts and grants ------------------------------------------------------

    grants_in_transaction = True

    def grant_server(self, url: URL) -> str:
        """The server and its database (privileges are per database)."""
        return f"{self.server_identity(url)}/{url.database}"

    def grant_statements(
        self, *, shards: int, user: str, host: str, database: str | None, log: bool, meta: bool
    ) -> list[str]:
        """CONNECT on the database; USAGE and row privileges on each shard schema, its sequences and
        ``next_id()``, and the same for tables made there later; the invalidation log where ``log``
        (its schema exists by then: `store init` makes it where writes are logged)."""
        role = f'"{user}"'
        out = [f'GRANT CONNECT ON DATABASE "{database}" TO {role}']
        for s in range(shards):
            schema = f'"{self.names.schema_name(s)}"'
            out += [
                f"GRANT USAGE ON SCHEMA {schema} TO {role}",
                f"GRANT {ROW_PRIVILEGES} ON ALL TABLES IN SCHEMA {schema} TO {role}",
                f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {schema} TO {role}",
                f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role}",
                f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT {ROW_PRIVILEGES} ON TABLES TO {role}",
                f"ALTER DEFAULT PRIVILEGES IN SCHEMA {schema} GRANT USAGE, SELECT, UPDATE ON SEQUENCES "
                f"TO {role}",
            ]
        if log:
            schema = f'"{self.names.log_database}"'
            out += [
                f"GRANT USAGE ON SCHEMA {schema} TO {role}",
                f"GRANT SELECT, INSERT, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}",
            ]
        return out

    def account_exists(self, cur: Any, user: str, host: str) -> bool:
        """A row of ``pg_roles``."""
        cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,))
        return cur.fetchone() is not None

    def create_account_hint(self, user: str, host: str) -> str:
        """``CREATE ROLE ... LOGIN``."""
        return f"CREATE ROLE \"{user}\" LOGIN PASSWORD '...'"

    def admin_connector(self, url: URL) -> Callable[[], Any]:
        """`postgres_connector` with its default timeouts."""
        return postgres_connector(url)

    def denies(self, exc: BaseException) -> bool:
        """SQLSTATE 42501, insufficient_privilege."""
        return getattr(exc, "sqlstate", None) == "42501"

    # -- promoting a streaming standby ----------------------------------------------

    can_promote = True

    def unreachable(self, exc: BaseException) -> bool:
        """libpq's words for a connect no server answered (`store.backends.postgres.admin.unreachable`)."""
        return connect_unreachable(exc)

    def replica_state(self, url: URL) -> ReplicaState:
        """In recovery, and the WAL received against the WAL replayed (`standby_state`)."""
        conn = postgres_connector(url)()
        try:
            return standby_state(conn.cursor())
        finally:
            conn.close()

    def promote_replica(self, url: URL) -> None:
        """``pg_promote`` (`promote_standby`), on a connection that outlasts its wait."""
        conn = postgres_connector(url, query_timeout_s=2 * PROMOTE_WAIT_S)()
        try:
            promote_standby(conn.cursor())
        finally:
            conn.close()

    schema_shards = True
    move_kind = "postgres"
    invalidation_modes = ("log", "wal")

    @property
    def change_log(self) -> str:
        """The invalidation log, ``store_log.cache_log`` (``NAME_store_log`` in a namespace), quoted."""
        return f'"{self.names.log_database}"."cache_log"'

    def change_log_ddl(self) -> list[str]:
        """The ``store_log`` schema and its ``cache_log`` table (one per database, not per shard)."""
        return [
            f'CREATE SCHEMA IF NOT EXISTS "{self.names.log_database}"',
            f"CREATE TABLE IF NOT EXISTS {self.change_log} ("
            "id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, at_ms BIGINT NOT NULL, "
            "entries TEXT NOT NULL)",
        ]

    def change_log_insert(self) -> str:
        """One log row, sent with the write's COMMIT."""
        return f"INSERT INTO {self.change_log} (at_ms, entries) VALUES (%s, %s)"

    def change_log_clean(self, batch: int) -> str:
        """The oldest ``batch`` rows up to the parameter, by a keyed subquery (no ``DELETE ... LIMIT``)."""
        return (
            f"DELETE FROM {self.change_log} WHERE id IN (SELECT id FROM {self.change_log} "
            f"WHERE id <= %s ORDER BY id LIMIT {int(batch)})"
        )

    def wait_for_lock(self, cur: Any, name: str, wait_s: int) -> bool:
        """A session advisory lock keyed by ``name`` (its hash), waited for up to ``lock_timeout``;
        it goes with the session."""
        key = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big", signed=True)
        cur.execute(f"SET lock_timeout = '{int(wait_s * 1000)}ms'")
        try:
            cur.execute("SELECT pg_advisory_lock(%s)", (key,))
            cur.fetchone()
        except Exception as exc:
            if getattr(exc, "sqlstate", None) == "55P03":  # lock_not_available: another holds it
                return False
            raise
        return True

    def classify(self, exc: BaseException) -> ErrorKind | None:
        """By SQLSTATE; a lost or refused connection is an OperationalError with none."""
        if isinstance(exc, ConnectionError | TimeoutError):
            return ErrorKind.DISCONNECT
        sqlstate = getattr(exc, "sqlstate", None)
        if sqlstate == TOMBSTONE_SQLSTATE or (sqlstate == _NO_CONFLICT_KEY and "ON CONFLICT" in str(exc)):
            return ErrorKind.TOMBSTONE
        if sqlstate in _MISSING:
            return ErrorKind.MISSING
        if sqlstate in _RETRY:
            return ErrorKind.RETRYABLE
        if sqlstate in _DUPLICATE:
            return ErrorKind.DUPLICATE
        if type(exc).__module__.startswith("psycopg") and type(exc).__name__ == "OperationalError":
            return ErrorKind.DISCONNECT if sqlstate is None else None
        return None

    def gate_plan(
        self, statements: Sequence[tuple[str, Any]], writes: int, kind: int
    ) -> tuple[list[tuple[str, Any]], list[int]]:
        """Each counted write (``WITH w AS (... RETURNING 1), c AS (...)`` `COUNTED_TAIL`) carries
        its gate: one more branch of its SELECT, which returns no row and divides by the rows
        the write changed (by zero: the error `gate` names). With two writes, the first keeps
        its count in a setting of the transaction that the second's gate adds to its own.
        Either way the statement returns a row per row its write changed, as before."""
        texts = [text for text, _params in statements]
        if writes == 1:
            gated = [_gated_counted(texts[0], _DIVIDE_BY.format(""))]
        else:
            gated = [
                _gated_counted(texts[0], _KEEP_COUNT),
                _gated_counted(texts[1], _DIVIDE_BY.format(_PLUS_KEPT)),
            ]
        return [(t, params) for t, (_old, params) in zip(gated, statements, strict=True)], list(
            range(len(statements))
        )

    def gate_rows(self, text: str) -> str:
        """One more branch of the statement's SELECT, which returns no row and divides by whether
        it wrote as many pairs as its arrays hold (by zero if not)."""
        if not text.endswith(_ROWS_TAIL):
            raise AssertionError(f"not a counted-rows statement: {text[:200]}")
        return text + _EVERY_PAIR

    def gate(self, exc: BaseException) -> int | None:
        """Division by zero (22012): only a gate divides. The transaction is in error: begun again."""
        return 1 if getattr(exc, "sqlstate", None) == "22012" else None

    def is_driver_error(self, exc: BaseException) -> bool:
        """psycopg's errors, and socket errors."""
        return isinstance(exc, ConnectionError | TimeoutError) or type(exc).__module__.startswith("psycopg")

    def extra_statements(
        self, shard: int, types: Sequence[TypeSpec], *, ids: str, epoch_ms: int
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
        """The schema, its counter and its next_id()."""
        sc = self.names.schema_name(shard)
        return [
            ("", _SCHEMA.format(schema=sc)),
            (NEXT_ID, _ID_SEQ.format(schema=sc)),
            (NEXT_ID, _NEXT_ID.format(schema=sc, shard=shard, epoch=epoch_ms, lock_key=PG_LOCK_BASE + shard)),
        ], []

    def existing(self, cur: Any) -> set[tuple[str, str]]:
        """Schemas, tables and next_id() functions of this namespace, from information_schema."""
        like = self.names.schemas_like
        cur.execute("SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE %s", (like,))
        out = {(str(row[0]), "") for row in cur.fetchall()}
        cur.execute(
            "SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema LIKE %s",
            (like,),
        )
        out |= {(str(row[0]), str(row[1])) for row in cur.fetchall()}
        cur.execute(
            "SELECT routine_schema FROM information_schema.routines "
            "WHERE routine_schema LIKE %s AND routine_name = 'next_id'",
            (like,),
        )
        out |= {(str(row[0]), NEXT_ID) for row in cur.fetchall()}
        cur.execute(
            "SELECT table_schema, table_name FROM information_schema.columns "
            "WHERE table_schema LIKE %s AND column_name = %s",
            (like, VERSION_COLUMN),
        )
        return out | {(str(row[0]), str(row[1]) + ADDED_VERSION) for row in cur.fetchall()}

    def inventory(self, url: URL, open_cursor: Callable[[], Any]) -> Any:
        """Shard schemas (live, tombstone or empty) and move archives (``moved_shard0042``), of this
        namespace only."""
        names = self.names
        inv = ServerInventory()
        with open_cursor() as cur:
            cur.execute(
                "SELECT n.nspname, c.relname FROM pg_namespace n LEFT JOIN pg_class c "
                "ON c.relnamespace = n.oid AND c.relkind IN ('r', 'p') WHERE n.nspname LIKE %s "
                "OR n.nspname LIKE %s",
                (names.schemas_like, names.archive_schemas_like),
            )
            found: dict[int, list[str]] = {}
            for schema, table in cur.fetchall():
                archived = shard_number(str(schema), names.archive_schema_prefix, 4)
                if archived is not None:
                    extra = () if table is None else (str(table),)
                    inv.archives[archived] = (*inv.archives.get(archived, ()), *extra)
                    continue
                shard = shard_number(str(schema), names.schema_prefix, 4)
                if shard is not None:
                    found.setdefault(shard, []).extend([] if table is None else [str(table)])
            told = self.tombstones(cur, [s for s, tables in found.items() if TOMBSTONE_TABLE in tables])
        for shard, tables in found.items():
            if shard in told:
                moved_to, version = told[shard]
                inv.copies[shard] = ShardCopy(shard, "tombstone", (), moved_to, version)
            else:
                inv.copies[shard] = ShardCopy(shard, "live" if tables else "empty", tuple(sorted(tables)))
        return inv

    def tombstones(self, cur: Any, shards: Iterable[int]) -> dict[int, tuple[str, int]]:
        """(moved_to, map_version) of each of ``shards`` whose schema here is a tombstone."""
        wanted = [self.names.schema_name(s) for s in sorted(set(shards))]
        if not wanted:
            return {}
        cur.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relname = %s AND c.relkind = 'r' AND n.nspname = ANY(%s)",
            (TOMBSTONE_TABLE, wanted),
        )
        marked = [str(r[0]) for r in cur.fetchall()]
        if not marked:
            return {}
        rows = (f'SELECT shard, moved_to, map_version FROM "{sc}"."{TOMBSTONE_TABLE}"' for sc in marked)
        cur.execute(" UNION ALL ".join(rows))
        return {int(shard): (str(moved_to), int(version)) for shard, moved_to, version in cur.fetchall()}

    def tombstone_from_error(self, exc: BaseException) -> tuple[str, int] | None:
        """A tombstone's refusal names the new host and map version (an upsert's does not)."""
        return parse_tombstone(str(exc))

    @contextmanager
    def admin_lock(self, cur: Any, shards: Iterable[int], *, timeout_s: float) -> Iterator[None]:
        """Session advisory locks, one per shard, in shard order."""
        held: list[int] = []
        cur.execute(f"SET lock_timeout = '{int(timeout_s * 1000)}ms'")
        try:
            for shard in sorted(set(shards)):
                key = _admin_key(shard, self.names)
                try:
                    cur.execute("SELECT pg_advisory_lock(%s)", (key,))
                    cur.fetchall()
                except Exception as exc:
                    raise BackendError(
                        f"another admin command holds shard {shard}'s admin lock: "
                        "wait for it, then run this again",
                        orig=exc,
                    ) from exc
                held.append(key)
            yield
        finally:
            for key in reversed(held):
                cur.execute("SELECT pg_advisory_unlock(%s)", (key,))
                cur.fetchall()
            cur.execute("SET lock_timeout = 0")

    def upsert_skip(self, table: Any) -> Any:
        """``ON CONFLICT DO NOTHING``."""
        return postgresql.insert(table).on_conflict_do_nothing()

    def upsert_add(self, table: Any, key: Sequence[str], column: str, *, also: Mapping[str, Any]) -> Any:
        """``ON CONFLICT (key) DO UPDATE SET n = t.n + excluded.n``."""
        ins = postgresql.insert(table)
        return ins.on_conflict_do_update(
            index_elements=list(key), set_={column: table.c[column] + ins.excluded[column], **also}
        )

    def upsert_set(self, table: Any, key: Sequence[str], column: str, *, also: Mapping[str, Any]) -> Any:
        """``ON CONFLICT (key) DO UPDATE SET n = excluded.n``."""
        ins = postgresql.insert(table)
        return ins.on_conflict_do_update(
            index_elements=list(key), set_={column: ins.excluded[column], **also}
        )

    def ts_now(self) -> ClauseElement | None:
        """``now()``: PostgreSQL has no ON UPDATE."""
        return func.now()


# -- DDL that is not a table -------------------------------------------------------------

_SCHEMA = 'CREATE SCHEMA IF NOT EXISTS "{schema}"'
_ID_SEQ = 'CREATE SEQUENCE IF NOT EXISTS "{schema}"."id_seq" AS bigint START WITH 1 MINVALUE 1'

# The published next_id() uses now() (frozen for a whole transaction) and a
# sequence `% 1024`: the 1,025th ID in one millisecond repeats the first.
# Here the counter v of a shard counts in units of (ms since the epoch) * 1024
# + sequence: ID = ((v >> 10) << 23) | (shard << 10) | (v & 1023). Each call
# takes v = nextval; if v lags the clock, the counter jumps forward to the
# clock first. So IDs never repeat and keep increasing per shard, even when
# more than 1,024 are made in one millisecond (the ms field borrows the next
# millisecond) or the clock steps back (the ms field runs ahead of the clock
# until it catches up); the counter is the schema's, shared by all its tables.
# setval can move a sequence backwards, so the counter is read and moved under
# a session advisory lock held for microseconds (not the transaction). Tests
# may pin the clock: SET store.clock_ms.
_NEXT_ID = """\
CREATE OR REPLACE FUNCTION "{schema}".next_id() RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
  units bigint;
  v bigint;
BEGIN
  units := (coalesce(nullif(current_setting('store.clock_ms', true), '')::bigint,
                     floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) - {epoch}) * 1024;
  PERFORM pg_advisory_lock({lock_key});
  BEGIN
    v := nextval('"{schema}"."id_seq"');
    IF v < units THEN
      PERFORM setval('"{schema}"."id_seq"', units);
      v := units;
    END IF;
  EXCEPTION WHEN OTHERS OR query_canceled THEN  -- OTHERS alone misses a cancel
    PERFORM pg_advisory_unlock({lock_key});
    RAISE;
  END;
  PERFORM pg_advisory_unlock({lock_key});
  IF (v >> 10) >= 1099511627776 THEN
    RAISE EXCEPTION 'Instagram ID space of shard {shard} exhausted (2**40 ms)';
  END IF;
  RETURN ((v >> 10) << 23) | ({shard}::bigint << 10) | (v & 1023);
END
$$"""
