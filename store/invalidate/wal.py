"""PostgreSQL's write-ahead log as an invalidation source (``cache.invalidation: wal``).

The leader reads the server's changes through a logical replication slot
of its own (``store_invalidate_DATABASE``, ``NAME_`` before it in a
namespace; plugin ``test_decoding``, which every
PostgreSQL ships), with SQL on its lock's connection: no log rows are
written, and no replication connection is needed. The server must run with
``wal_level = logical``.

Each tick, as the binlog source does (`store.invalidate.sources.BinlogSource`):
the changes of every transaction that committed before the WAL position
taken at the previous tick's time t0 are read and their keys deleted (a
tick after t0: every write acknowledged before t0 was visible before t0, so
the delete follows it), and the heartbeat's T becomes t0. Then the next t0
and position are taken. Two queries a tick.

Keys a cache did not take are kept and sent again at the next tick, and T
does not move meanwhile. The slot itself moves on as it is read, so a
leader that dies with keys not yet deleted loses them: the next leader
vouches only from its own start (S), and entries filled before it are
trusted for the window alone.

A slot keeps the server's WAL until it is read. A daemon stopped for good
leaves its slot behind, holding WAL: ``store invalidate --from-now`` makes
it anew, and ``SELECT pg_drop_replication_slot('store_invalidate_DATABASE')``
drops it (see the README's caching section).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from store.cache.heartbeat import Heartbeat
from store.cache.leases import wall_ms
from store.exceptions import ConfigError
from store.invalidate.sources import BinlogKeys

__all__ = ["WalSource", "parse_change", "slot_name"]

log = logging.getLogger(__name__)

#: The plugin that turns the WAL into text (contrib's, shipped with every PostgreSQL).
PLUGIN = "test_decoding"
#: Change lines read from the slot per query (the server ends each read at a transaction's end).
READ_BATCH = 10_000

_IDENT = r'(?:"(?:[^"]|"")*"|[^."\s:]+)'
_HEAD = re.compile(rf"table ({_IDENT})\.({_IDENT}): (INSERT|UPDATE|DELETE|TRUNCATE):")
# One column: name[type]:value; a type may hold spaces and ``[]``; a value is quoted (with ''
# for a quote) or runs to the next space.
_COLUMN = re.compile(r" ?(?:\"(?:[^\"]|\"\")*\"|[^\[\s]+)\[(?:[^\[\]]|\[\])*\]:('(?:[^']|'')*'|\S*)")


def slot_name(prefix: str, database: str) -> str:
    """The invalidation slot of a namespace (``prefix``: the config's names' prefix) in ``database``
    (a slot decodes one database's changes, and its name is the whole server's):
    ``store_invalidate_store``, ``NAME_store_invalidate_store``."""
    tail = re.sub(r"[^a-z0-9_]", "_", database.lower())
    return f"{prefix}store_invalidate_{tail}"[:63]


def _unquote(ident: str) -> str:
    return ident[1:-1].replace('""', '"') if ident.startswith('"') else ident


def _value(text: str) -> Any:
    if text.startswith("'"):
        return text[1:-1].replace("''", "'")
    if text == "null":
        return None
    try:
        return int(text)
    except ValueError:
        return text


def parse_change(
    line: str, *, columns: Callable[[str], int] = lambda _table: 1
) -> tuple[str, str, list[Any]] | None:
    """(schema, table, the row's first values in column order) of one ``test_decoding`` change line;
    None for a line that is no row change (BEGIN, COMMIT, TRUNCATE).

    ``columns(table)``: how many leading values to read (a DELETE gives the key's columns only; an
    UPDATE that changed the key gives the new row's). The rest of the line is not parsed.
    """
    head = _HEAD.match(line)
    if head is None or head.group(3) == "TRUNCATE":
        return None
    schema, table = _unquote(head.group(1)), _unquote(head.group(2))
    rest = line[head.end() :]
    marker = rest.find(" new-tuple:")
    if rest.startswith(" old-key:") and marker >= 0:
        rest = rest[marker + len(" new-tuple:") :]
    want = columns(table)
    values: list[Any] = []
    pos = 0
    while len(values) < want:
        m = _COLUMN.match(rest, pos)
        if m is None:
            break
        values.append(_value(m.group(1)))
        pos = m.end()
    return schema, table, values


class WalSource:
    """The server's WAL through a logical slot of the leader's, read with SQL on the lock's connection."""

    def __init__(
        self,
        name: str,
        prefix: str,
        keys: BinlogKeys,
        apply: Callable[[list[str]], None],
        *,
        from_now: bool = False,
    ) -> None:
        self.name = name
        self._prefix = prefix
        #: The slot's name, once leading (`slot_name`).
        self.slot = ""
        self._keys = keys
        self._apply = apply
        self._from_now = from_now
        self._conn: Any = None
        self._target: tuple[int, str] | None = None
        #: Keys read but not yet taken by the caches: sent again first.
        self._pending: list[str] = []
        self._since_ms = 0
        self.covered_ms = 0
        #: Transactions read since this process started.
        self.transactions = 0

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        cur = self._conn.cursor()
        try:
            cur.execute(sql, params or None)
            return list(cur.fetchall()) if cur.description else []
        finally:
            cur.close()

    def start(self, conn: Any) -> None:
        """Lead on ``conn``: check the server can decode its WAL, make the slot if it is missing."""
        self._conn = conn
        self._target, self._pending, self.covered_ms = None, [], 0
        level = str(self._query("SHOW wal_level")[0][0])
        if level != "logical":
            raise ConfigError(
                f"PostgreSQL server {self.name} has wal_level = {level}: cache.invalidation wal reads "
                "the WAL through a logical slot; set wal_level = logical (and restart the server), "
                "or use cache.invalidation: log"
            )
        self.slot = slot_name(self._prefix, str(self._query("SELECT current_database()")[0][0]))
        found = self._query("SELECT plugin FROM pg_replication_slots WHERE slot_name = %s", (self.slot,))
        if found and found[0][0] != PLUGIN:
            raise ConfigError(
                f"PostgreSQL server {self.name} has a replication slot {self.slot} with plugin "
                f"{found[0][0]}, not {PLUGIN}: drop it "
                f"(SELECT pg_drop_replication_slot('{self.slot}')) and start again"
            )
        if found and self._from_now:
            self._query("SELECT pg_drop_replication_slot(%s)", (self.slot,))
            found = []
        if not found:
            self._query("SELECT 1 FROM pg_create_logical_replication_slot(%s, %s)", (self.slot, PLUGIN))
            log.info("invalidator %s: made replication slot %s", self.name, self.slot)
        self._from_now = False  # (a later term resumes the slot)
        self._since_ms = wall_ms()

    def tick(self) -> Heartbeat | None:
        """Delete the keys of what committed before the last target, then take the next target."""
        if self._pending:
            self._apply(self._pending)  # raises if a cache missed a delete: kept for the next tick
            self._pending = []
        target = self._target
        if target is not None:
            texts = self._read(target[1])
            if texts:
                self._pending = texts
                self._apply(texts)
                self._pending = []
            self.covered_ms = target[0]
            self._target = None
        t0 = wall_ms()
        lsn = str(self._query("SELECT pg_current_wal_lsn()::text")[0][0])
        self._target = (t0, lsn)
        return Heartbeat(self.covered_ms, self._since_ms) if self.covered_ms else None

    def _read(self, upto: str) -> list[str]:
        """The keys of each transaction that committed before ``upto``, one log text each (the slot
        moves past them). Read `READ_BATCH` lines at a time (whole transactions: the server stops
        at the first commit past the batch), so a backlog is never held whole as text."""
        schemas, tables = self._keys.schemas, self._keys.tables
        texts: list[str] = []
        changes: list[tuple[str, str, list[Any]]] = []
        while True:
            rows = self._query(
                "SELECT data FROM pg_logical_slot_get_changes(%s, %s::pg_lsn, %s, "
                "'include-xids', '0', 'skip-empty-xacts', '1')",
                (self.slot, upto, READ_BATCH),
            )
            for (data,) in rows:
                line = str(data)
                if line.startswith("COMMIT"):
                    self.transactions += 1
                    if changes:
                        text = self._keys.entries(changes)
                        if text:
                            texts.append(text)
                    changes = []
                    continue
                got = parse_change(line, columns=_columns)
                if got is not None and got[0] in schemas and (tables is None or got[1] in tables):
                    changes.append(got)
            if len(rows) < READ_BATCH:
                return texts

    def position(self) -> str:
        """The WAL position the next tick reads up to."""
        return "" if self._target is None else self._target[1]

    def stop(self) -> None:
        """Stop leading (the caller closes the connection; the slot stays for the next leader)."""
        self._conn = None


def _columns(table: str) -> int:
    """Leading values `BinlogKeys.entries` reads: a count's relation, from_id, n and version; a row's key."""
    return 4 if table == "relation_counts" else 1
