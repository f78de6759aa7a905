"""How a PostgreSQL move compares the two sides on snapshots before its fence, and what is left for it.

A part of `store.admin.move.postgres.PostgresEngine` (its base class).
Before the fence, while the source serves, `_compare_snapshots` takes the
source's snapshot at one WAL position (a temporary logical slot's exported
snapshot: it holds every transaction that committed before the slot's
consistent point, and none after), lets the target apply the stream up to
that position and takes the target's snapshot. Both sides hash every row
in their snapshots, in groups by a hash of the row's key; the rows of a
group that differs are compared one by one. What differs is what changed
between the two snapshots (the target's is a little later), or what is
wrong on the target: these rows are the suspects. Under the fence
(`_verify_fenced_pg`) the target has applied everything: each table's row
count and newest key, and each suspect row, are compared on both sides
(index lookups, and a count).

What this does not see, and the full hashes under the fence did: a row
changed on the target behind replication's back, after its snapshot,
that leaves the count and the newest key as they were (nothing of the
store's writes there: the map does not name the target until the switch).
With more suspects than `SUSPECTS_MAX`, the fence hashes everything, as
before.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import psycopg

from store.admin.move.postgres_checks import (
    _ISO,
    _QUERY_TIMEOUT_S,
    VERIFY_SESSIONS,
    PostgresChecks,
    _lit,
    _name,
    _q,
)
from store.exceptions import MoveError

if TYPE_CHECKING:
    from store.admin.move.journal import Journal

__all__ = ["BUCKETS", "SUSPECTS_MAX", "PostgresVerify", "Suspects", "TableInfo"]

#: Before the fence, each table's rows are hashed in this many groups (by a hash of their key).
BUCKETS = 64
#: With more rows than this differing between the snapshots, the fence hashes every row itself.
SUSPECTS_MAX = 5000
_ROW_HASH = "('x' || substr(md5(x::text), 1, 15))::bit(60)::bigint"

#: (schema, table) -> (columns with their types, primary key columns).
TableInfo = dict[tuple[str, str], tuple[list[tuple[str, str]], list[str]]]
#: (schema, table) -> the primary keys of the rows the fence compares one by one.
Suspects = dict[tuple[str, str], list[tuple[Any, ...]]]


def _ask(sessions: list[Any], queries: dict[str, tuple[str, Any]]) -> dict[str, list[tuple[Any, ...]]]:
    """Each of ``queries`` (key -> SQL and parameters), spread over ``sessions`` side by side; the rows."""
    items = sorted(queries.items())
    chunks = [items[i :: len(sessions)] for i in range(len(sessions))]

    def run(conn: Any, chunk: list[tuple[str, tuple[str, Any]]]) -> dict[str, list[tuple[Any, ...]]]:
        return {key: list(conn.execute(sql, params).fetchall()) for key, (sql, params) in chunk}

    out: dict[str, list[tuple[Any, ...]]] = {}
    with ThreadPoolExecutor(len(sessions)) as pool:
        for part in pool.map(run, sessions, chunks):
            out.update(part)
    return out


def _both(
    here: list[Any], there: list[Any], queries: dict[str, tuple[str, Any]]
) -> tuple[dict[str, list[tuple[Any, ...]]], dict[str, list[tuple[Any, ...]]]]:
    """`_ask` on both sides at once: (the source's rows, the target's)."""
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.submit(_ask, here, queries), pool.submit(_ask, there, queries)
        return a.result(), b.result()


def _key(keys: list[str]) -> str:
    """The primary key of a row of alias ``x`` as one row value."""
    return "ROW(" + ", ".join(f"x.{_q(k)}" for k in keys) + ")"


class PostgresVerify(PostgresChecks):
    """The comparisons of a PostgreSQL move around its fence (`PostgresEngine` fills in the rest)."""

    def _connect(self, host: str, *, timeout_s: float = 60.0) -> Any:
        raise NotImplementedError

    def _conninfo(self, host: str, *, for_replica: bool = False) -> str:
        raise NotImplementedError

    def _table_info(self, conn: Any, schemas: list[str]) -> TableInfo:
        raise NotImplementedError

    def _wait_level(self, j: Journal, lsn: str, timeout_s: float) -> None:
        raise NotImplementedError

    def _compare_snapshots(
        self, j: Journal, schemas: list[str], timeout_s: float
    ) -> tuple[str, Suspects] | None:
        """Both sides' rows compared at one WAL position, unfenced (see the module); (that position, the
        suspects), or None where no snapshot could be had (the fence then hashes everything)."""
        t0 = time.monotonic()
        with self._pg(j.source) as conn:
            info = self._table_info(conn, schemas)
        here: list[Any] = []
        there: list[Any] = []
        try:
            slot: Any = psycopg.connect(self._conninfo(j.source) + " replication=database", autocommit=True)
            try:
                made = slot.execute(
                    f"CREATE_REPLICATION_SLOT {_name(j.low, j.high, self.move.names)}_verify "
                    "TEMPORARY LOGICAL pgoutput EXPORT_SNAPSHOT"
                ).fetchone()
                at, snapshot = str(made[1]), str(made[2])
                for _ in range(VERIFY_SESSIONS):
                    here.append(self._connect(j.source, timeout_s=_QUERY_TIMEOUT_S))
                    here[-1].execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    here[-1].execute(f"SET TRANSACTION SNAPSHOT {_lit(snapshot)}")
            finally:
                slot.close()  # the temporary slot goes; the snapshot stays with the sessions that took it
        except psycopg.Error as exc:  # e.g. no free replication slot
            for c in here:
                c.close()
            self.move.say(
                f"catch up: no snapshot to compare before the fence ({exc}); the fence compares all"
            )
            return None
        try:
            self._wait_level(j, at, timeout_s)
            for _ in range(VERIFY_SESSIONS):
                there.append(self._connect(j.target, timeout_s=_QUERY_TIMEOUT_S))
                there[-1].execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            exported = str(there[0].execute("SELECT pg_export_snapshot()").fetchone()[0])
            for c in there[1:]:
                c.execute(f"SET TRANSACTION SNAPSHOT {_lit(exported)}")
            for c in here + there:
                c.execute(_ISO)
            suspects = self._suspects(here, there, info)
        finally:
            for c in here + there:
                c.close()
        if suspects is None:
            self.move.say(f"catch up: more than {SUSPECTS_MAX} rows differ at {at}; the fence compares all")
            return None
        j.timings["checksum_s"] = round(time.monotonic() - t0, 3)
        self.move.say(
            f"catch up: {len(info)} tables compared on both sides at {at}, before the fence; "
            f"{sum(len(k) for k in suspects.values())} row(s) changed meanwhile are compared under it"
        )
        return at, suspects

    def _suspects(self, here: list[Any], there: list[Any], info: TableInfo) -> Suspects | None:
        """The keys of the rows that differ between the two sides' snapshots (None: too many)."""
        groups = {
            f"{s}.{t}": (
                f"SELECT hashtext({_key(keys)}::text) & {BUCKETS - 1}, count(*), sum({_ROW_HASH})::text "
                f"FROM {_q(s)}.{_q(t)} AS x GROUP BY 1",
                None,
            )
            for (s, t), (_cols, keys) in info.items()
        }
        a, b = _both(here, there, groups)
        odd: dict[str, list[int]] = {}
        for name, rows in a.items():
            mine, theirs = {r[0]: r[1:] for r in rows}, {r[0]: r[1:] for r in b.get(name, [])}
            wrong = sorted(g for g in set(mine) | set(theirs) if mine.get(g) != theirs.get(g))
            if wrong:
                odd[name] = wrong
        by_name = {f"{s}.{t}": (s, t) for s, t in info}
        rows_of = {
            name: (
                f"SELECT {', '.join('x.' + _q(k) for k in info[by_name[name]][1])}, md5(x::text) "
                f"FROM {_q(by_name[name][0])}.{_q(by_name[name][1])} AS x "
                f"WHERE (hashtext({_key(info[by_name[name]][1])}::text) & {BUCKETS - 1}) = ANY(%s)",
                (groups_,),
            )
            for name, groups_ in odd.items()
        }
        a, b = _both(here, there, rows_of) if rows_of else ({}, {})
        out: Suspects = {}
        for name, rows in a.items():
            mine = {tuple(r[:-1]): r[-1] for r in rows}
            theirs = {tuple(r[:-1]): r[-1] for r in b.get(name, [])}
            keys = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
            if keys:
                out[by_name[name]] = keys
            if sum(len(v) for v in out.values()) > SUSPECTS_MAX:
                return None
        return out

    def _sessions(self, j: Journal) -> tuple[list[Any], list[Any]]:
        """`VERIFY_SESSIONS` sessions on each side for `_verify_fenced_pg` (opened before the lock)."""
        here = [self._connect(j.source, timeout_s=_QUERY_TIMEOUT_S) for _ in range(VERIFY_SESSIONS)]
        there = [self._connect(j.target, timeout_s=_QUERY_TIMEOUT_S) for _ in range(VERIFY_SESSIONS)]
        for c in here + there:
            c.execute(_ISO)
        return here, there

    def _verify_fenced_pg(
        self, j: Journal, info: TableInfo, suspects: Suspects, sessions: tuple[list[Any], list[Any]]
    ) -> None:
        """Under the fence, after `_compare_snapshots`: each table's row count and newest key, and each
        suspect row's hash, on both sides (see the module), on ``sessions`` (the source's, the target's)."""
        queries: dict[str, tuple[str, Any]] = {}
        for (s, t), (cols, keys) in info.items():
            name = f"{s}.{t}"
            queries[name] = (f"SELECT count(*), max(x.{_q(keys[0])})::text FROM {_q(s)}.{_q(t)} AS x", None)
            found = suspects.get((s, t))
            if found:
                types = dict(cols)
                one = "(" + ", ".join(f"%s::{types[k]}" for k in keys) + ")"
                queries[name + " rows"] = (
                    f"SELECT {', '.join('x.' + _q(k) for k in keys)}, md5(x::text) FROM {_q(s)}.{_q(t)} AS x "
                    f"WHERE ({', '.join('x.' + _q(k) for k in keys)}) IN ({', '.join([one] * len(found))})",
                    [v for key in found for v in key],
                )
        self.move.say(
            f"verify: {len(info)} tables, row counts, newest keys and "
            f"{sum(len(k) for k in suspects.values())} changed row(s) on both sides"
        )
        here, there = _both(sessions[0], sessions[1], queries)
        wrong = sorted({k.removesuffix(" rows") for k in here if sorted(here[k]) != sorted(there.get(k, []))})
        if wrong:
            raise MoveError(
                f"verify: rows differ for {', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''}; "
                "the source was unlocked and keeps serving: resume to try again, or abort"
            )
        rows = sum(int(here[f"{s}.{t}"][0][0]) for s, t in info)
        self.move.say(f"verify: {len(info)} tables ({rows} rows) end alike on both sides")
