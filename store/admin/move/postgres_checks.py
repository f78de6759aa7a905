"""What a PostgreSQL move checks: the hosts and schemas before it, and the two sides under its fence.

A part of `store.admin.move.postgres.PostgresEngine` (its base class),
apart for its size: `_refuse_pg` refuses, when the move is planned, what it
could not finish (a source without logical WAL, leftovers of an earlier
move, objects it would not carry); `_verify_pg` compares row counts and a
hash of every row on both sides.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from store.backends.postgres.dialect import PostgresBackend
from store.exceptions import MoveError
from store.naming import TOMBSTONE_TABLE, Names

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from store.admin.move.engine import MoveContext
    from store.admin.move.journal import Journal, MovePlan

__all__ = ["VERIFY_SESSIONS", "PostgresChecks"]

#: Sessions per side that compute the verify hashes side by side.
VERIFY_SESSIONS = 4
_QUERY_TIMEOUT_S = 600.0
_ISO = (
    "SET TimeZone = 'UTC'; SET DateStyle = 'ISO, YMD'; SET extra_float_digits = 3; SET bytea_output = 'hex'"
)


def _name(low: int, high: int, names: Names) -> str:
    """The move's publication, subscription and slot name (``store_move_0_7``, ``NAME_store_move_0_7``)."""
    return f"{names.replication_name}_{low}_{high}"


def _q(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


def _lit(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class PostgresChecks:
    """The checks of a PostgreSQL move (`store.admin.move.postgres.PostgresEngine` fills in the rest)."""

    move: MoveContext

    @property
    def _pg_backend(self) -> PostgresBackend:
        raise NotImplementedError

    def _url(self, host: str) -> URL:
        raise NotImplementedError

    def _pg(self, host: str, *, timeout_s: float = 60.0) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _server_version(self, host: str) -> int:
        with self._pg(host) as conn:
            return int(conn.execute("SHOW server_version_num").fetchone()[0])

    def _check_source_wal(self, source: str) -> None:
        with self._pg(source) as conn:
            level = str(conn.execute("SHOW wal_level").fetchone()[0])
        if level != "logical":
            raise MoveError(
                f"the source {source} has wal_level = {level}: a PostgreSQL move replicates logically; "
                "set wal_level = logical there (it takes a restart) first"
            )

    def _server_of(self, host: str) -> str:
        """The server's system identifier (its cluster), else its address."""
        url = self._url(host)
        try:
            with self._pg(host) as conn:
                return "cluster " + str(
                    conn.execute("SELECT system_identifier FROM pg_control_system()").fetchone()[0]
                )
        except Exception:  # no right to read it: the address stands in
            return f"{url.host or '127.0.0.1'}:{url.port or 5432}"

    def _refuse_pg(self, plan: MovePlan, version: int) -> None:
        """`MoveError` for anything on the hosts or in the shard schemas that the move could not finish."""
        source, to, schemas = plan.source, plan.target, plan.databases()
        name = _name(plan.low, plan.high, self.move.names)
        self._check_source_wal(source)
        for host in (source, to):
            if self._server_version(host) < 100000:
                raise MoveError(f"{host} runs PostgreSQL before 10: it has no logical replication")
        archives = [self.move.names.archive(s) for s in schemas]
        with self._pg(source) as conn:
            found = {str(r[0]) for r in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE nspname = ANY(%s)", (schemas + archives,)
            ).fetchall()}  # fmt: skip
            missing = [s for s in schemas if s not in found]
            if missing:
                raise MoveError(
                    f"{source} has no schema {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}: "
                    "nothing to move there; run store init first"
                )
            gone = self._pg_backend.tombstones(conn.cursor(), range(plan.low, plan.high + 1))
            if gone:
                shard, (moved_to, was) = min(gone.items())
                raise MoveError(
                    f"{source} holds only a tombstone of shard {shard} (moved to {moved_to} in map version "
                    f"{was}), yet the live map (version {version}) names {source}: the map source is behind "
                    "the hosts; run store check"
                )
            left = sorted(a for a in archives if a in found)
            if left:
                raise MoveError(
                    f"{source} still holds the archive {', '.join(left[:3])}{' ...' if len(left) > 3 else ''}"
                    " of an earlier move of these shards: run store move --cleanup (or --abort) with that "
                    "move's journal first"
                )
            for what, query in (
                ("publication", "SELECT pubname FROM pg_publication WHERE pubname = %s"),
                ("replication slot", "SELECT slot_name FROM pg_replication_slots WHERE slot_name = %s"),
            ):
                if conn.execute(query, (name,)).fetchone() is not None:
                    raise MoveError(
                        f"{source} holds the {what} {name} of a move of these shards that did not finish: "
                        "run store move --resume or --abort with its journal"
                    )
            self._refuse_odd_objects(conn, source, schemas)
            free = conn.execute(
                "SELECT current_setting('max_replication_slots')::int "
                "- (SELECT count(*) FROM pg_replication_slots)"
            ).fetchone()[0]
            if int(free) < 1:
                raise MoveError(
                    f"{source} has no free replication slot: a move needs one (raise max_replication_slots)"
                )
        with self._pg(to) as conn:
            there = sorted({str(r[0]) for r in conn.execute(
                "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') AND c.relname <> %s",
                (schemas, TOMBSTONE_TABLE),
            ).fetchall()})  # fmt: skip
            if there:
                raise MoveError(
                    f"{to} already holds tables of {', '.join(there[:3])}{' ...' if len(there) > 3 else ''}, "
                    f"which the live map (version {version}) does not give it: a leftover copy? Run store "
                    "check, and drop them before moving these shards there"
                )
            if conn.execute("SELECT 1 FROM pg_subscription WHERE subname = %s", (name,)).fetchone():
                raise MoveError(
                    f"{to} holds the subscription {name} of a move of these shards that did not finish: "
                    "run store move --resume or --abort with its journal"
                )
            workers = int(conn.execute("SHOW max_logical_replication_workers").fetchone()[0])
            if workers < 1:
                raise MoveError(f"{to} has max_logical_replication_workers = 0: it cannot subscribe")

    def _refuse_odd_objects(self, conn: Any, source: str, schemas: list[str]) -> None:
        """`MoveError` for what a move would not carry: views, functions, triggers, keyless tables."""
        odd = conn.execute(
            "SELECT n.nspname, c.relname, c.relkind FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = ANY(%s) AND c.relkind NOT IN ('r', 'p', 'i', 'I') "
            "AND NOT (c.relkind = 'S' AND c.relname = 'id_seq') ORDER BY 1, 2 LIMIT 1",
            (schemas,),
        ).fetchone()
        if odd is not None:
            kinds = {
                "v": "view",
                "m": "materialized view",
                "S": "sequence",
                "f": "foreign table",
                "c": "type",
            }
            raise MoveError(
                f"{odd[0]}.{odd[1]} on {source} is a {kinds.get(str(odd[2]), 'relation')}, not a table: "
                "store move copies and fences only tables (and next_id()'s counter); drop it first"
            )
        keyless = conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = ANY(%s) AND c.relkind IN ('r', 'p') AND NOT EXISTS "
            "(SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) ORDER BY 1, 2 LIMIT 1",
            (schemas,),
        ).fetchone()
        if keyless is not None:
            raise MoveError(
                f"{keyless[0]}.{keyless[1]} on {source} has no primary key: logical replication cannot carry "
                "its updates and deletes; give it one first"
            )
        routine = conn.execute(
            "SELECT n.nspname, p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
            "WHERE n.nspname = ANY(%s) AND p.proname <> 'next_id' ORDER BY 1, 2 LIMIT 1",
            (schemas,),
        ).fetchone()
        if routine is not None:
            raise MoveError(
                f"{routine[0]} on {source} has the function {routine[1]}, which store move does not carry: "
                "drop it, or move the shard by hand"
            )
        trigger = conn.execute(
            "SELECT n.nspname, c.relname, t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = ANY(%s) AND NOT t.tgisinternal "
            "ORDER BY 1, 2, 3 LIMIT 1",
            (schemas,),
        ).fetchone()
        if trigger is not None:
            raise MoveError(
                f"{trigger[0]}.{trigger[1]} on {source} has the trigger {trigger[2]}, which store move does "
                "not carry: drop it first"
            )

    def _verify_pg(
        self, j: Journal, info: dict[tuple[str, str], tuple[list[tuple[str, str]], list[str]]]
    ) -> None:
        """Row counts and a sum of every row's md5 (60 bits of it), per table, on both sides, fenced.

        The sum needs no order and no memory; the rows' text is made in UTC
        and ISO style on both sides.
        """
        queries = {
            f"{s}.{t}": "SELECT count(*), "
            "coalesce(sum(('x' || substr(md5(x::text), 1, 15))::bit(60)::bigint), 0)::text "
            f"FROM {_q(s)}.{_q(t)} AS x"
            for (s, t) in info
        }
        self.move.say(f"verify: {len(queries)} tables, row counts and content hashes on both sides")

        def side(host: str) -> dict[str, tuple[int, str]]:
            items = sorted(queries.items())
            chunks = [items[i::VERIFY_SESSIONS] for i in range(VERIFY_SESSIONS)]

            def run(chunk: list[tuple[str, str]]) -> dict[str, tuple[int, str]]:
                out: dict[str, tuple[int, str]] = {}
                if not chunk:
                    return out
                with self._pg(host, timeout_s=_QUERY_TIMEOUT_S) as conn:
                    conn.execute(_ISO)
                    for key, sql in chunk:
                        n, digest = conn.execute(sql).fetchone()
                        out[key] = (int(n), str(digest))
                return out

            with ThreadPoolExecutor(VERIFY_SESSIONS) as pool:
                merged: dict[str, tuple[int, str]] = {}
                for part in pool.map(run, chunks):
                    merged.update(part)
            return merged

        with ThreadPoolExecutor(2) as pool:
            here_f, there_f = pool.submit(side, j.source), pool.submit(side, j.target)
            here, there = here_f.result(), there_f.result()
        wrong = sorted(k for k in here if here[k] != there.get(k))
        if wrong:
            raise MoveError(
                f"verify: rows differ for {', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''}; "
                "the source was unlocked and keeps serving: resume to try again, or abort"
            )
        rows = sum(n for n, _d in here.values())
        self.move.say(f"verify: {len(here)} tables ({rows} rows) equal on both sides")
