"""`store move`: move a range of shards to another MariaDB host without losing a write.

Phases, recorded in a journal file so that a crash or Ctrl-C can be resumed
(``--resume``) or undone (``--abort``):

1. plan: the shards, tables, rows and bytes that will move (``--dry-run`` stops here).
2. copy: ``mariadb-dump --single-transaction --gtid`` of the shard databases
   from the source, loaded into the target, while the application writes.
3. catch up: the target replicates those databases from the source (a named
   replication connection with a ``replicate_wild_do_table`` filter, from the
   dump's GTID position) until it is level.
   Then, still unfenced, ``CHECKSUM TABLE`` of every moving table on both
   sides at one GTID position (a consistent snapshot on the source; the
   target's replication stopped ``UNTIL`` that position for its snapshot,
   then resumed), and the target catches up once more.
4. fence: `FENCE_SESSIONS` sessions on the source take ``LOCK TABLES ...
   WRITE`` on the moving tables, each on whole databases (writers wait;
   other shards are untouched; if the sessions' locks cross a writer's
   transaction over two shards, one session takes them all instead), read
   the source's GTID position and wait
   until the target has applied it (a few events: it was level just before).
5. verify, under the lock: the target replicates strictly from the
   checksummed position without error, and each table's newest row is the
   same on both sides (with a ``slave_exec_mode`` other than STRICT,
   ``CHECKSUM TABLE`` of everything instead). A mismatch, before or under
   the fence, unlocks and stops with the journal kept (resume, or abort).
6. switch: replication stops; under the lock every moving table is renamed
   (each fence session its own tables, side by side) into an archive
   database ``moved_dbNNNNN`` (not binlogged), the new map
   is written (version + 1), and the lock is released. Then each moved
   shard's database on the source becomes a tombstone (see
   `store.admin.ownership`): views that refuse every read and write where the
   tables were, and a marker naming the target and the map version. Writers
   that waited, and processes still holding the old map, are refused by the
   source: they reload the map and retry on the target. Nothing can be
   written to the source copy after the fence, even if something creates
   the tables there again. The switch holds the shards' admin locks, so an
   ``init`` running at the same time finds the tombstone, not a gap.
7. cleanup (``--cleanup``, later): drop the archive databases; tombstones stay.

A crash while fenced releases the lock (the session dies) and the source
keeps taking writes; resuming restarts replication and fences again, and
only tables still on the source are fenced, so a half-done switch finishes.
The source needs ROW binlogs with GTIDs (MariaDB's default GTID mode) and the
target must be able to connect to it as the configured user.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL

from store.admin.ownership import SHARD_LOCK_TIMEOUT_S
from store.backends import backend_for
from store.backends.mysql import (
    STASH_SUFFIX,
    MySQLBackend,
    dump_databases,
    id_trigger,
    leave_tombstones,
    load_dump,
    mysql_connector,
    table_triggers,
)
from store.exceptions import BackendError, ConfigError, MoveError
from store.naming import DEFAULT_NAMES, TOMBSTONE_TABLE, Names, like_escape
from store.store import Store

__all__ = ["MoveError", "MovePlan", "MoveProgress", "Mover", "TerminalProgress", "progress_line"]

log = logging.getLogger("store.admin.move")

#: The move's replication connection on the target (`store.naming.Names.replication_name` in a namespace).
REPLICATION_NAME = "store_move"
CATCH_UP_TIMEOUT_S = 120
FENCE_WAIT_TIMEOUT_S = 30
# Moves copy MariaDB shard databases: every host of a move is checked to be one (`_url`).
_MYSQL = MySQLBackend()
LOCK_WAIT_TIMEOUT_S = 10
#: How many source sessions take the fence's locks and rename the fenced tables, side by side.
FENCE_SESSIONS = 4
#: Before the fence, the target catches up again until a round takes less than this (at most LEVEL_ROUNDS).
LEVEL_BEFORE_FENCE_S = 0.05
LEVEL_ROUNDS = 5
#: How long the fence sessions may take to hold their locks together before one session takes them all.
LOCK_TOGETHER_S = 0.2


def _together(calls: list[Callable[[], object]]) -> None:
    """Run ``calls`` at once (each in a thread but the first); the first error, once all have ended."""
    errors: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls[1:]]
    for t in threads:
        t.start()
    run(calls[0])
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def _first_key_columns(cur: Any, dbs: list[str]) -> dict[tuple[str, str], str]:
    """(database, table) -> the first column of its primary key, for the tables of ``dbs`` that have one."""
    cur.execute(
        "SELECT table_schema, table_name, column_name FROM information_schema.statistics "
        f"WHERE table_schema IN ({', '.join(['%s'] * len(dbs))}) AND index_name = 'PRIMARY' "
        "AND seq_in_index = 1",
        dbs,
    )
    return {(str(d), str(t)): str(c) for d, t, c in cur.fetchall()}


def _compare(here: dict[str, Any], there: dict[str, Any], where: str, what: str = "checksums") -> None:
    """`MoveError` naming the tables whose ``what`` differ between the source (``here``) and the target."""
    wrong = sorted(k for k in here if here[k] != there.get(k))
    if wrong:
        raise MoveError(
            f"verify: {what} differ for {', '.join(wrong[:5])}{' ...' if len(wrong) > 5 else ''}{where}: "
            "resume to try again, or abort"
        )


@dataclass
class MovePlan:
    """What a move of shards ``low..high`` from ``source`` to ``target`` involves."""

    low: int
    high: int
    source: str
    target: str
    slave: str | None
    tables: list[tuple[str, str, int, int]] = field(default_factory=list)  # db, table, rows, bytes
    #: The names of the config's namespace (``NAME_db00042``).
    names: Names = field(default=DEFAULT_NAMES, repr=False)

    @property
    def rows(self) -> int:
        """Rows in all moving tables (InnoDB's estimate)."""
        return sum(t[2] for t in self.tables)

    @property
    def bytes(self) -> int:
        """Data and index bytes of all moving tables."""
        return sum(t[3] for t in self.tables)

    def databases(self) -> list[str]:
        """The shard databases that move."""
        return [self.names.database_name(s) for s in range(self.low, self.high + 1)]


@dataclass
class Journal:
    """Where a move stands; written after every phase."""

    low: int
    high: int
    source: str
    target: str
    slave: str | None
    phase: str = "copy"  # copy -> catch_up -> switch -> done (or aborted)
    gtid: str = ""
    replicating: bool = False
    map_version: int = 0
    #: The map version in which the target took the shards (set at the switch).
    switched_version: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    #: The config's namespace when the move began: only a store of the same namespace carries it on.
    namespace: str | None = None

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Journal:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise MoveError(f"cannot read the move journal {path}: {exc}") from exc


#: How often a running move samples its target (rows loaded, replication lag) into its progress file.
PROGRESS_EVERY_S = 0.25

# Where the progress bar stands at each step (the load fills LOAD_FROM..LOAD_TO by rows on the target).
_STEP_AT = {
    "plan": 0.0,
    "dump": 0.02,
    "load": 0.1,
    "loaded": 0.6,
    "catch_up": 0.65,
    "fence": 0.8,
    "verify": 0.88,
    "switch": 0.95,
    "done": 1.0,
    "aborted": 0.0,
}
_LOAD_FROM, _LOAD_TO = 0.1, 0.6


class MoveProgress:
    """Where a running move stands, for operators (`store serve`, metrics): a JSON file beside the journal.

    Written at every step and, while the move runs, every
    `PROGRESS_EVERY_S` by a sampler thread that reads the target's row count
    while the copy loads and its replication lag while it catches up. It is
    only ever read by others: a move never depends on it, and a sampler error
    is ignored.
    """

    def __init__(self, mover: Mover, j: Journal) -> None:
        from store.metrics import move_progress_path  # no prometheus_client needed: a path helper

        self._mover = mover
        self.path = move_progress_path(mover.journal_path)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.data: dict[str, Any] = {
            "low": j.low,
            "high": j.high,
            "source": j.source,
            "target": j.target,
            "phase": j.phase,
            "step": j.phase,
            "progress": 0.0,
            "rows_total": 0,
            "rows_copied": 0,
            "bytes_total": 0,
            "bytes_copied": 0,
            "tables_total": 0,
            "tables_copied": 0,
            "disk_total": 0,
            "disk_copied": 0,
            "lag_s": None,
            "lag_max_s": None,
            "fence_started": None,
            "fence_ended": None,
            "fenced_s": None,
            "started": time.time(),
            "updated": time.time(),
            "pid": os.getpid(),
            "running": True,
            "error": "",
        }
        self._dbs: list[str] = mover._units(j)

    def set(self, **changes: Any) -> None:
        """Record ``changes`` (and the progress their step implies) and write the file."""
        with self._lock:
            self.data.update(changes)
            d = self.data
            at = _STEP_AT.get(str(d["step"]), d["progress"])
            if d["step"] == "load" and d["rows_total"]:
                share = min(1.0, d["rows_copied"] / d["rows_total"])
                at = _LOAD_FROM + (_LOAD_TO - _LOAD_FROM) * share
            if d["step"] not in ("aborted",):
                at = max(at, d["progress"])  # a bar never goes back
            d["progress"] = round(at, 4)
            if d["fence_started"] is not None:
                end = d["fence_ended"] if d["fence_ended"] is not None else time.time()
                d["fenced_s"] = round(end - d["fence_started"], 3)
            if d["lag_s"] is not None and (d["lag_max_s"] is None or d["lag_s"] > d["lag_max_s"]):
                d["lag_max_s"] = d["lag_s"]
            d["updated"] = time.time()
            text = json.dumps(d)
            seen = dict(d)
            with suppress(OSError):
                tmp = self.path.with_name(self.path.name + ".tmp")
                tmp.write_text(text)
                os.replace(tmp, self.path)
        watch = getattr(self._mover, "watch", None)
        if watch is not None:
            with suppress(Exception):  # a progress bar never disturbs the move
                watch(seen)

    def start(self) -> None:
        """Begin sampling the target in a background thread."""
        self.set()
        self._thread = threading.Thread(target=self._sample, name="store-move-progress", daemon=True)
        self._thread.start()

    def stop(self, **final: Any) -> None:
        """Stop sampling; write ``final`` changes with ``running`` false."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.set(running=False, **final)

    def _sample(self) -> None:
        """Every `PROGRESS_EVERY_S`, read where the target stands (`_read`) on a connection of its own."""
        conn: Any = None
        while not self._stop.wait(PROGRESS_EVERY_S):
            try:
                if conn is None:
                    conn = self._connect()
                self._read(conn, self.data["step"])
            except Exception:  # progress is for people: never let it disturb the move
                _close_quietly(conn)
                conn = None
        _close_quietly(conn)

    def _connect(self) -> Any:
        """A connection to the target for the sampler."""
        return mysql_connector(self._mover._url(self.data["target"]))()

    def _read(self, conn: Any, step: str) -> None:
        """Record the target's rows, tables and bytes while the copy loads, its lag while it catches up."""
        cur = conn.cursor()
        if step == "load":
            marks = ", ".join(["%s"] * len(self._dbs))
            cur.execute(
                "SELECT COALESCE(SUM(table_rows), 0), COUNT(*), "
                "COALESCE(SUM(data_length + index_length), 0) FROM information_schema.tables "
                f"WHERE table_schema IN ({marks}) AND table_type = 'BASE TABLE'",
                self._dbs,
            )
            got = cur.fetchone()
            self.set(rows_copied=int(got[0]), tables_copied=int(got[1]), disk_copied=int(got[2]))
        elif step == "catch_up":
            cur.execute(f"SHOW SLAVE '{self._mover.names.replication_name}' STATUS")
            names = [c[0] for c in cur.description]
            row = dict(zip(names, cur.fetchone() or (), strict=False))
            lag = row.get("Seconds_Behind_Master")
            self.set(lag_s=None if lag is None else float(lag))
        else:
            self.set()
        cur.close()


def _close_quietly(conn: Any) -> None:
    """Close a connection that may be broken or None (a sampler's)."""
    if conn is not None:
        with suppress(Exception):
            conn.close()


#: The fence's bar fills over this many seconds (the time writers may be held, as a budget).
FENCE_BAR_S = 1.0
_LABEL = 9  # "catch up" and a space


def _bar(share: float, width: int) -> str:
    n = round(max(0.0, min(1.0, share)) * width)
    return "[" + "#" * n + "-" * (width - n) + "]"


def progress_line(data: dict[str, Any], *, width: int = 24, now: float | None = None) -> str:
    """The bar of the phase a move is in, as one line for a terminal, from `MoveProgress` figures.

    copy: rows and tables on the target against the source's (InnoDB's
    estimates) and the bytes they take; catch up: the replication lag
    against the largest seen; fence (verify and switch too): how long the
    writers have been held, against `FENCE_BAR_S`. "" for other steps.
    """
    step = str(data.get("step"))
    label = ""
    if step == "dump":
        label, share = "copy", 0.0
        text = f"dumping {int(data.get('tables_total') or 0):,} tables"
    elif step in ("load", "loaded"):
        label = "copy"
        rows, rows_total = int(data.get("rows_copied") or 0), int(data.get("rows_total") or 0)
        tables, tables_total = int(data.get("tables_copied") or 0), int(data.get("tables_total") or 0)
        disk, disk_total = int(data.get("disk_copied") or 0), int(data.get("disk_total") or 0)
        if step == "loaded":
            share, rows, tables, disk = 1.0, max(rows, rows_total), tables_total, max(disk, disk_total)
        else:
            share = min(1.0, rows / rows_total) if rows_total else 0.0
        text = (
            f"{share:4.0%}  {min(rows, rows_total) if rows_total else rows:,}/{rows_total:,} rows  "
            f"{min(tables, tables_total) if tables_total else tables}/{tables_total} tables  "
            f"{disk / 1e6:.1f}/{disk_total / 1e6:.1f} MB"
        )
    elif step == "catch_up":
        label = "catch up"
        lag, top = data.get("lag_s"), data.get("lag_max_s")
        if lag is None:
            share, text = 0.0, "lag -"
        else:
            share = 1.0 - float(lag) / float(top) if top else 1.0
            text = f"lag {float(lag):.0f} s" + (f" (at most {float(top):.0f} s)" if top else "")
    elif step in ("fence", "verify", "switch") and data.get("fence_started") is not None:
        label = "fence"
        end = data.get("fence_ended")
        held = (end if end is not None else (time.time() if now is None else now)) - data["fence_started"]
        share = held / FENCE_BAR_S
        text = f"writers held {held:.2f} s ({step})"
    else:
        return ""
    return f"{label:<{_LABEL}}{_bar(share, width)} {text}"


class TerminalProgress:
    """Draws `progress_line` in place on a terminal: one live bar under the move's lines.

    Give `say` as the `Mover`'s ``say`` and `update` as its ``watch``: a
    line said clears the bar, is written, and the bar comes back under it.
    Redraws at most every ``every_s`` unless the step changed.
    """

    def __init__(self, stream: Any, *, every_s: float = 0.1, width: int = 24) -> None:
        self._stream = stream
        self._every_s = every_s
        self._width = width
        self._lock = threading.Lock()
        self._line = ""
        self._drawn = 0.0
        self._step_drawn = ""

    def _draw(self, line: str) -> None:
        self._stream.write("\r" + line.ljust(len(self._line)))
        self._stream.flush()
        self._line = line

    def _clear(self) -> None:
        if self._line:
            self._stream.write("\r" + " " * len(self._line) + "\r")
            self._line = ""

    def update(self, data: dict[str, Any]) -> None:
        """Redraw the bar for ``data`` (`MoveProgress` figures)."""
        line = progress_line(data, width=self._width)
        with self._lock:
            if not line:
                self._clear()
                self._stream.flush()
                return
            step = str(data.get("step"))
            if step == self._step_drawn and time.monotonic() - self._drawn < self._every_s:
                return
            self._draw(line)
            self._drawn, self._step_drawn = time.monotonic(), step

    def say(self, msg: str) -> None:
        """Write ``msg`` as a line of its own above the bar."""
        with self._lock:
            line = self._line
            self._clear()
            self._stream.write(msg + "\n")
            if line:
                self._draw(line)
            self._stream.flush()

    def close(self) -> None:
        """Take the bar away (the move's last line stays)."""
        with self._lock:
            self._clear()
            self._stream.flush()


class Mover:
    """Runs, resumes, aborts and cleans up one move, journaled in ``journal``."""

    def __new__(cls, store: Store, journal: str | os.PathLike[str], **_kw: Any) -> Mover:
        """A `store.admin.pg_move.PgMover` where the move is of PostgreSQL schema shards."""
        if cls is Mover:
            from store.admin.pg_move import PgMover, moves_postgres

            if moves_postgres(store, journal):
                return super().__new__(PgMover)
        return super().__new__(cls)

    def __init__(
        self, store: Store, journal: str | os.PathLike[str], *, say: Callable[[str], None] = print
    ) -> None:
        self.store = store
        self.journal_path = Path(journal)
        self._say = say
        self.progress: MoveProgress | None = None
        #: Called with a copy of the progress figures each time they change (`MoveProgress.set`).
        self.watch: Callable[[dict[str, Any]], None] | None = None

    @property
    def names(self) -> Names:
        """The names of the store's namespace: which databases (or schemas) are the shards'."""
        return self.store.config.names

    @property
    def _mysql(self) -> MySQLBackend:
        """MariaDB, naming the store's namespace."""
        backend = _MYSQL.named(self.names)
        assert isinstance(backend, MySQLBackend)
        return backend

    def _load(self) -> Journal:
        """The journal, refused if the move was begun by a store of another namespace."""
        j = Journal.load(self.journal_path)
        if j.namespace != self.names.namespace:
            raise MoveError(
                f"the move journaled in {self.journal_path} moves shards of namespace "
                f"{j.namespace or '(none)'}; this config's namespace is {self.names.namespace or '(none)'}: "
                "carry it on with the config that began it"
            )
        return j

    def say(self, msg: str) -> None:
        """Tell the operator ``msg`` (the ``say`` given) and log it on ``store.admin.move``."""
        log.info(msg, extra={"fields": {"journal": str(self.journal_path)}})
        self._say(msg)

    def _step(self, **changes: Any) -> None:
        if self.progress is not None:
            self.progress.set(**changes)

    # -- helpers ---------------------------------------------------------------

    def _url(self, host: str) -> URL:
        url = self.store.config.hosts.get(host)
        if url is None:
            raise MoveError(f"host {host!r} is not under hosts in the config")
        backend = backend_for(url)
        if backend.schema_shards:
            raise MoveError(
                f"host {host!r} is PostgreSQL and these shards are on MariaDB: a move copies shards "
                "between servers of one kind (MariaDB databases to MariaDB, PostgreSQL schemas to PostgreSQL)"
            )
        if not backend.can_move:
            raise MoveError(f"host {host!r} is not MariaDB: moves copy MariaDB shard databases")
        return url

    def _id_triggers(self) -> dict[str, str]:
        """Object table -> its ID trigger's name, for the config's types (none with Pinterest IDs)."""
        if self.store.config.ids != "instagram":
            return {}
        return {t.table: f"{t.table}_next_id" for t in self.store.config.types.values()}

    # -- what a kind of move puts in (`store.admin.pg_move.PgMover` for PostgreSQL) --

    def _check_source(self, source: str) -> None:
        """Refuse a source the move cannot catch up from (MariaDB: ROW binlogs with GTIDs)."""
        self._check_source_binlog(source)

    def _units(self, j: Journal) -> list[str]:
        """What is copied, one per shard: the shard databases."""
        return [self.names.database_name(s) for s in range(j.low, j.high + 1)]

    def _progress_for(self, j: Journal) -> MoveProgress:
        """The progress sampler of this move."""
        return MoveProgress(self, j)

    def _check_source_binlog(self, source: str) -> None:
        with self._conn(source) as cur:
            cur.execute("SELECT @@log_bin, @@binlog_format")
            log_bin, fmt = cur.fetchone()
        if not log_bin or str(fmt).upper() != "ROW":
            raise MoveError(f"the source {source} needs --log-bin with --binlog-format=ROW for a move")

    def _refuse_what_cannot_move(self, source: str, to: str, dbs: list[str]) -> None:
        """`MoveError` for anything on the hosts or in the shard databases that a move could not finish."""
        for host in (source, to):
            with self._conn(host) as cur:
                cur.execute("SELECT @@version")
                version = str(cur.fetchone()[0])
            if "mariadb" not in version.lower():
                raise MoveError(
                    f"{host} runs {version}, not MariaDB: moves replicate by MariaDB GTID "
                    "(named replication connections)"
                )
        self._check_source_binlog(source)
        marks = ", ".join(["%s"] * len(dbs))
        archives = [self.names.archive(d) for d in dbs]
        with self._conn(source) as cur:
            cur.execute(
                f"SELECT schema_name FROM information_schema.schemata WHERE schema_name IN ({marks})", dbs
            )
            missing = sorted(set(dbs) - {str(r[0]) for r in cur.fetchall()})
            if missing:
                raise MoveError(
                    f"{source} has no database {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}: "
                    "nothing to move there; run store init first"
                )
            cur.execute(
                f"SELECT schema_name FROM information_schema.schemata WHERE schema_name IN ({marks})",
                archives,
            )
            left = sorted(str(r[0]) for r in cur.fetchall())
            if left:
                raise MoveError(
                    f"{source} still holds the archive {', '.join(left[:3])}{' ...' if len(left) > 3 else ''}"
                    " of an earlier move of these shards: run store move --cleanup (or --abort) with that "
                    "move's journal first"
                )
            cur.execute(
                "SELECT table_schema, table_name, table_type FROM information_schema.tables "
                f"WHERE table_schema IN ({marks}) AND (table_type <> 'BASE TABLE' OR table_name LIKE %s) "
                "ORDER BY 1, 2",
                [*dbs, "%" + STASH_SUFFIX.replace("_", "\\_")],
            )
            odd = [(str(d), str(t), str(k)) for d, t, k in cur.fetchall()]
            if odd:
                d, t, kind = odd[0]
                if t.endswith(STASH_SUFFIX):
                    raise MoveError(
                        f"{source} holds {d}.{t}, a table an interrupted move was fencing: finish that move "
                        "with store move --resume, or undo it with --abort, using its journal"
                    )
                raise MoveError(
                    f"{d}.{t} on {source} is a {kind.lower()}, not a table: store move copies and fences "
                    "only tables; drop it first"
                )
            for what, query in (
                ("routine", f"SELECT routine_schema, routine_name FROM information_schema.routines "
                            f"WHERE routine_schema IN ({marks}) ORDER BY 1, 2"),
                ("event", f"SELECT event_schema, event_name FROM information_schema.events "
                          f"WHERE event_schema IN ({marks}) ORDER BY 1, 2"),
            ):  # fmt: skip
                cur.execute(query, dbs)
                found = cur.fetchone()
                if found is not None:
                    raise MoveError(
                        f"{found[0]} on {source} has the {what} {found[1]}, which store move does not carry: "
                        f"drop it, or move the shard by hand"
                    )
            ours = self._id_triggers()
            for (d, t), names in table_triggers(cur, dbs).items():
                if names != [ours.get(t)]:
                    raise MoveError(
                        f"{d}.{t} on {source} has the trigger(s) {', '.join(names)}; store move carries only "
                        "the Instagram ID trigger of each object table (ids: instagram): drop the others"
                    )

    @contextmanager
    def _conn(self, host: str) -> Iterator[Any]:
        conn = mysql_connector(self._url(host))()
        try:
            yield conn.cursor()
        finally:
            conn.close()

    def _tables(self, host: str, databases: list[str]) -> list[tuple[str, str, int, int]]:
        marks = ", ".join(["%s"] * len(databases))
        with self._conn(host) as cur:
            cur.execute(
                "SELECT table_schema, table_name, COALESCE(table_rows, 0), "
                "COALESCE(data_length, 0) + COALESCE(index_length, 0) FROM information_schema.tables "
                f"WHERE table_schema IN ({marks}) AND table_type = 'BASE TABLE' ORDER BY 1, 2",
                databases,
            )
            return [(str(r[0]), str(r[1]), int(r[2]), int(r[3])) for r in cur.fetchall()]

    def _forget_replication(self, j: Journal) -> None:
        """Stop and remove the move's replication connection on the target (if any)."""
        with self._conn(j.target) as cur:
            with suppress(Exception):
                cur.execute(f"STOP SLAVE '{self.names.replication_name}'")
            with suppress(Exception):
                cur.execute(f"RESET SLAVE '{self.names.replication_name}' ALL")

    def _drop_target_copy(self, j: Journal, dbs: list[str]) -> None:
        """Forget the replication and drop the target's copies of the moving databases."""
        self._forget_replication(j)
        with self._conn(j.target) as cur:
            for db in dbs:
                cur.execute(f"DROP DATABASE IF EXISTS `{db}`")

    # -- plan ------------------------------------------------------------------

    def _source_of(self, low: int, high: int, to: str) -> str:
        """The one live master of shards ``low``-``high``, checked to be a move to another host."""
        self.store.refresh_map(force=True)
        m = self.store.shard_map
        if not 0 <= low <= high < m.shards:
            raise MoveError(f"--shards {low}-{high} must lie within 0-{m.shards - 1}")
        sources = {m.master(s) for s in range(low, high + 1)}
        if len(sources) != 1:
            raise MoveError(
                f"shards {low}-{high} have several masters ({', '.join(sorted(sources))}): "
                "move one host's range at a time"
            )
        source = sources.pop()
        if source == to:
            raise MoveError(f"shards {low}-{high} are already on {to}")
        return source

    def plan(self, low: int, high: int, to: str, slave: str | None = None) -> MovePlan:
        """Check the request and measure what would move."""
        source = self._source_of(low, high, to)
        m = self.store.shard_map  # as refreshed just now
        there_id, here_id = _MYSQL.server_identity(self._url(to)), _MYSQL.server_identity(self._url(source))
        if there_id == here_id:  # the copy would first drop the databases it is about to copy
            raise MoveError(
                f"{source} and {to} are the same server ({here_id}): a move copies shards between two servers"
            )
        if slave is not None:
            self._url(slave)
        if self.store.config.map_source is None:
            raise ConfigError("a move must publish a new map to every running store: configure map_source")
        plan = MovePlan(low, high, source, to, slave, names=self.names)
        plan.tables = self._tables(source, plan.databases())
        with self._conn(source) as cur:
            gone = self._mysql.tombstones(cur, range(low, high + 1))
        if gone:
            shard, (moved_to, version) = min(gone.items())
            raise MoveError(
                f"{source} holds only a tombstone of shard {shard} (moved to {moved_to} in map version "
                f"{version}), yet the live map (version {m.version}) names {source}: the map source is "
                "behind the hosts; run store check"
            )
        there = sorted({db for db, t, _r, _b in self._tables(to, plan.databases()) if t != TOMBSTONE_TABLE})
        if there:
            raise MoveError(
                f"{to} already holds tables of {', '.join(there[:3])}{' ...' if len(there) > 3 else ''}, "
                f"which the live map (version {m.version}) does not give it: a leftover copy? Run store "
                "check, and drop them before moving these shards there"
            )
        self._refuse_what_cannot_move(source, to, plan.databases())
        return plan

    # -- run -------------------------------------------------------------------

    def start(self, plan: MovePlan) -> Journal:
        """Begin the move described by ``plan`` (refused if a journal is open)."""
        if self.journal_path.exists():
            j = Journal.load(self.journal_path)
            if j.phase not in ("done", "aborted"):
                raise MoveError(
                    f"a move of shards {j.low}-{j.high} is in phase {j.phase}: "
                    "run store move --resume or --abort"
                )
        self._check_source(plan.source)
        j = Journal(
            plan.low,
            plan.high,
            plan.source,
            plan.target,
            plan.slave,
            map_version=self.store.shard_map.version,
            namespace=self.names.namespace,
        )
        j.save(self.journal_path)
        return self.resume()

    def resume(self) -> Journal:
        """Carry a journaled move on from where it stopped."""
        j = self._load()
        if j.phase in ("done", "aborted"):
            raise MoveError(f"the move of shards {j.low}-{j.high} is already {j.phase}")
        self.store.refresh_map(force=True)
        m = self.store.shard_map
        masters = {m.master(s) for s in range(j.low, j.high + 1)}
        if masters not in ({j.source}, {j.target}):
            raise MoveError(
                f"the live map (version {m.version}) gives shards {j.low}-{j.high} to "
                f"{', '.join(sorted(masters))}, not to {j.source} as when this move began: it is out of "
                "date; run store move --abort"
            )
        units = self._units(j)
        self.progress = self._progress_for(j)
        self.progress.start()
        try:
            if j.phase == "copy":
                self._copy(j, units)
            if j.phase == "catch_up":
                self._catch_up(j, units)
            if j.phase == "switch":
                self._switch(j, units)
        except BaseException as exc:
            self.progress.set(error=f"{type(exc).__name__}: {exc}"[:300])
            raise
        finally:
            self.progress.stop(phase=j.phase, **({"step": "done"} if j.phase == "done" else {}))
            self.progress = None
        return j

    def _phase(self, j: Journal, phase: str, started: float, step: str) -> None:
        j.timings[step] = round(time.monotonic() - started, 3)
        j.phase = phase
        j.save(self.journal_path)
        self._step(phase=phase)

    def _copy(self, j: Journal, dbs: list[str]) -> None:
        t0 = time.monotonic()
        self.say(f"copy: dumping {len(dbs)} shard database(s) from {j.source}")
        if self.progress is not None:
            with suppress(Exception):  # only for the progress bar
                measured = self._tables(j.source, dbs)
                self._step(
                    rows_total=sum(t[2] for t in measured),
                    bytes_total=sum(t[3] for t in measured),
                    tables_total=len(measured),
                    disk_total=sum(t[3] for t in measured),
                )
        self._step(phase="copy", step="dump")
        self._drop_target_copy(j, dbs)
        try:
            dump, gtid = dump_databases(self._url(j.source), dbs)
            self.say(f"copy: loading {len(dump) / 1e6:.1f} MB into {j.target}")
            self._step(step="load", bytes_copied=0, bytes_total=len(dump))
            load_dump(self._url(j.target), dump)
            self._step(step="loaded", bytes_copied=len(dump))
        except BackendError as exc:
            raise MoveError(f"copying from {j.source} to {j.target}: {exc}") from exc
        j.gtid = gtid
        j.timings["copy_bytes"] = len(dump)
        self._phase(j, "catch_up", t0, "copy_s")

    def _start_replication(self, j: Journal, dbs: list[str]) -> None:
        src = self._url(j.source)
        # The target connects to the source itself: from where it runs, the source's address
        # may not be the URL's (hosts.NAME.replication_host, e.g. a compose service name).
        host, port = self.store.config.replication_address(j.source, 3306)
        with self._conn(j.target) as cur:
            if not j.replicating:
                cur.execute("SET GLOBAL gtid_slave_pos = %s", (j.gtid,))
                cur.execute(
                    f"CHANGE MASTER '{self.names.replication_name}' TO MASTER_HOST = %s, MASTER_PORT = %s, "
                    "MASTER_USER = %s, MASTER_PASSWORD = %s, MASTER_USE_GTID = slave_pos",
                    (host, port, src.username or "root", src.password or ""),
                )
                cur.execute(
                    f"SET GLOBAL {self.names.replication_name}.replicate_wild_do_table = %s",
                    (",".join(f"{like_escape(d)}.%" for d in dbs),),
                )
                j.replicating = True
                j.save(self.journal_path)
            cur.execute(f"START SLAVE '{self.names.replication_name}'")

    def _wait_level(self, j: Journal, position: str, timeout_s: float) -> None:
        with self._conn(j.target) as cur:
            cur.execute("SELECT MASTER_GTID_WAIT(%s, %s)", (position, timeout_s))
            if cur.fetchone()[0] != 0:
                cur.execute(f"SHOW SLAVE '{self.names.replication_name}' STATUS")
                names = [d[0] for d in cur.description]
                status = dict(zip(names, cur.fetchone() or (), strict=False))
                raise MoveError(
                    f"{j.target} did not catch up with {j.source} within {timeout_s:.0f} s "
                    f"(IO {status.get('Slave_IO_Running')}, SQL {status.get('Slave_SQL_Running')}, "
                    f"error {status.get('Last_Error') or status.get('Last_IO_Error') or '-'}); "
                    "resume when it has, or abort"
                )

    def _catch_up(self, j: Journal, dbs: list[str]) -> None:
        t0 = time.monotonic()
        self._start_replication(j, dbs)
        with self._conn(j.source) as cur:
            cur.execute("SELECT @@gtid_binlog_pos")
            position = str(cur.fetchone()[0])
        self.say(f"catch up: {j.target} replicating from {j.source} up to {position}")
        self._step(phase="catch_up", step="catch_up")
        self._wait_level(j, position, CATCH_UP_TIMEOUT_S)
        self._step(lag_s=0.0)
        self._phase(j, "switch", t0, "catch_up_s")

    def _switch(self, j: Journal, dbs: list[str]) -> None:
        # One session on the source does the whole switch, holding the moving
        # shards' admin locks: an init that waits on them finds the tombstone.
        conn = mysql_connector(self._url(j.source))()
        src = conn.cursor()
        try:
            with self._mysql.admin_lock(src, range(j.low, j.high + 1), timeout_s=SHARD_LOCK_TIMEOUT_S):
                self._archive_stashed(j.source, dbs)  # a crash in the switch left some on their way
                tables = [(db, t) for db, t, _r, _b in self._tables(j.source, dbs) if t != TOMBSTONE_TABLE]
                if tables:
                    self._start_replication(j, dbs)  # again after a crash: the lock died with its session
                    self._fence_and_rename(j, src, dbs, tables)
                elif not self._map_switched(j):
                    self._write_map(j)
                if not j.switched_version:  # a crash came between the map write and the journal
                    j.switched_version = self.store.shard_map.version
                    j.save(self.journal_path)
                left = leave_tombstones(
                    src, range(j.low, j.high + 1), j.target, j.switched_version, names=self.names
                )
        finally:
            conn.close()  # also releases the locks if anything above failed
        self._forget_replication(j)
        self._done(j, left)

    def _done(self, j: Journal, tombstones: int) -> None:
        """Journal the move as done and say so."""
        j.phase = "done"
        j.save(self.journal_path)
        self._step(phase="done", step="done", map_version=j.switched_version)
        self.say(
            f"done: shards {j.low}-{j.high} are served by {j.target} (map version {j.switched_version}); "
            f"{tombstones} tombstone(s) on {j.source}"
        )

    def _fence_and_rename(
        self, j: Journal, fence: Any, dbs: list[str], tables: list[tuple[str, str]]
    ) -> None:
        """Fence ``tables`` on the source, check the target has everything, archive them, switch the map.

        Before the lock: the checksums of every table are compared at one
        GTID position (`_checksum_before_fence`) and the target catches up
        once more (`_level_before_fence`), so that under the lock only the
        last few events remain to wait for and cheap checks to make. The
        lock is taken by `FENCE_SESSIONS` sessions at once, each on whole
        databases, and each renames its own tables: the renames, most of the
        fenced time, run side by side. If their locks cross a writer's
        transaction that spans two of them (`_lock_together`), one session
        takes every lock, as it always did, and renames alone. A crash
        releases every session's lock.
        """
        fence.execute("SET SESSION sql_log_bin = 0")  # the archive and renames stay off the binlog
        for db in dbs:
            fence.execute(f"CREATE DATABASE IF NOT EXISTS `{self.names.archive(db)}`")
        triggered = table_triggers(fence, dbs)  # MariaDB renames these only within their database
        checked_at = self._checksum_before_fence(j, tables)
        keys = _first_key_columns(fence, dbs) if checked_at else {}
        self._level_before_fence(j)
        by_db: dict[str, list[tuple[str, str]]] = {}
        for d, t in tables:
            by_db.setdefault(d, []).append((d, t))
        groups: list[list[tuple[str, str]]] = [[] for _ in range(min(FENCE_SESSIONS, len(by_db)))]
        for i, d in enumerate(sorted(by_db)):
            groups[i % len(groups)].extend(by_db[d])
        extra = [mysql_connector(self._url(j.source))() for _ in groups]
        sessions = [c.cursor() for c in extra]
        own = list(sessions)
        marks: dict[str, float] = {}
        try:
            for cur in [fence, *sessions]:
                cur.execute("SET SESSION sql_log_bin = 0")
                cur.execute(f"SET SESSION lock_wait_timeout = {LOCK_WAIT_TIMEOUT_S}")
            t0 = time.monotonic()
            try:
                if not self._lock_together(j, sessions, groups):
                    # A writer's transaction across two groups (a link between two shards of
                    # this host) held a table one session waited for while it waited for a
                    # table another held. One session takes every lock in one statement: any
                    # such wait is then one MariaDB sees, and it turns the writer away.
                    log.info(
                        "fence: the sessions' locks crossed a writer's transaction; locking in one session"
                    )
                    for c in extra:  # whatever they hold goes with them
                        with suppress(Exception):
                            c.close()
                    own, sessions, groups = [], [fence], [[dt for g in groups for dt in g]]
                    fence.execute("LOCK TABLES " + ", ".join(f"`{d}`.`{t}` WRITE" for d, t in groups[0]))
                j.timings["fenced_sessions"] = len(sessions)
                self._step(phase="switch", step="fence", fence_started=time.time(), fence_ended=None)
                marks["lock_s"] = time.monotonic()
                fence.execute("SELECT @@gtid_binlog_pos")
                position = str(fence.fetchone()[0])
                self.say(f"fence: {len(tables)} tables locked on {j.source}; {j.target} to reach {position}")
                self._wait_level(j, position, FENCE_WAIT_TIMEOUT_S)
                marks["level_s"] = time.monotonic()
                self._step(step="verify", lag_s=0.0)
                if checked_at:
                    self._verify_fenced(j, sessions, groups, position, checked_at, keys)
                else:  # the target may skip row events it cannot apply: compare everything, fenced
                    self._verify(j, sessions, groups)
                marks["verify_s"] = time.monotonic()

                def stop_replication() -> None:  # on the target, while the source renames
                    with self._conn(j.target) as cur:
                        cur.execute(f"STOP SLAVE '{self.names.replication_name}'")

                def rename(cur: Any, group: list[tuple[str, str]]) -> None:
                    for d, t in sorted(group, key=lambda dt: dt not in triggered):
                        if (d, t) in triggered:  # out of reach first; to the archive below
                            cur.execute(f"ALTER TABLE `{d}`.`{t}` RENAME `{d}`.`{t}{STASH_SUFFIX}`")
                        else:
                            cur.execute(f"ALTER TABLE `{d}`.`{t}` RENAME `{self.names.archive(d)}`.`{t}`")

                _together(
                    [
                        stop_replication,
                        *(
                            lambda cur=cur, group=group: rename(cur, group)
                            for cur, group in zip(sessions, groups, strict=True)
                        ),
                    ]
                )
                marks["rename_s"] = time.monotonic()
                if triggered:
                    self._archive_stashed(j.source, dbs)
                    marks["archive_s"] = time.monotonic()
                self._step(step="switch")
                if not self._map_switched(j):
                    self._write_map(j)
                j.switched_version = self.store.shard_map.version
                marks["map_s"] = time.monotonic()
            finally:
                for cur in [*own, fence]:
                    with suppress(Exception):  # a dead session has released the lock already
                        cur.execute("UNLOCK TABLES")
                        cur.execute("SET SESSION sql_log_bin = 1")
        finally:
            for c in extra:
                with suppress(Exception):
                    c.close()
        self._step(fence_ended=time.time())
        end = time.monotonic()
        j.timings["fenced_s"] = round(end - t0, 3)
        last = t0
        for name, at in marks.items():  # where the fenced time went
            j.timings[f"fence_{name}"] = round(at - last, 3)
            last = at
        j.timings["fence_unlock_s"] = round(end - last, 3)
        j.save(self.journal_path)
        self.say(
            f"fence: held {j.timings['fenced_s']:.3f} s ("
            + ", ".join(f"{k[6:-2]} {v:.3f}" for k, v in j.timings.items() if k.startswith("fence_"))
            + ")"
        )

    def _lock_together(self, j: Journal, sessions: list[Any], groups: list[list[tuple[str, str]]]) -> bool:
        """Each of ``sessions`` locks its group of tables (``LOCK TABLES ... WRITE``), all at once.

        True when all hold their locks. False, with none held, when they do
        not within `LOCK_TOGETHER_S`: a writer's transaction that spans two
        groups can hold a table one session waits for while it waits for a
        table another session holds, a wait MariaDB cannot see as a
        deadlock. The sessions still waiting are interrupted (``KILL
        QUERY``); they are not used again.
        """
        ids = []
        for cur in sessions:
            cur.execute("SELECT CONNECTION_ID()")
            ids.append(int(cur.fetchone()[0]))
        errors: list[BaseException] = []

        def lock(cur: Any, group: list[tuple[str, str]]) -> None:
            try:
                cur.execute("LOCK TABLES " + ", ".join(f"`{d}`.`{t}` WRITE" for d, t in group))
            except BaseException as exc:  # re-raised below, or the interrupted wait
                errors.append(exc)

        threads = [
            threading.Thread(target=lock, args=(cur, group), daemon=True)
            for cur, group in zip(sessions, groups, strict=True)
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + LOCK_TOGETHER_S
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        waiting = [i for i, t in enumerate(threads) if t.is_alive()]
        if waiting:
            with self._conn(j.source) as cur:
                for i in waiting:
                    with suppress(Exception):
                        cur.execute(f"KILL QUERY {ids[i]}")
            for t in threads:
                t.join(LOCK_WAIT_TIMEOUT_S + 5)
        if waiting or errors:
            for cur in sessions:
                with suppress(Exception):
                    cur.execute("UNLOCK TABLES")
        if errors and not waiting:
            raise errors[0]
        return not waiting

    def _checksum_before_fence(self, j: Journal, tables: list[tuple[str, str]]) -> str:
        """Compare every table's checksum on both sides at one GTID position, before the fence; that position.

        The source takes a consistent snapshot and the GTID position it
        stands at; the target's replication applies exactly up to that
        position (``START SLAVE UNTIL``), takes its snapshot there and goes
        on. Both checksum in their snapshots while writes go on. The fenced
        check (`_verify_fenced`) then relies on the target replicating
        strictly (a row event it cannot apply stops it) from that position:
        with any other ``slave_exec_mode`` this returns "" and the fence
        compares checksums itself.
        """
        with self._conn(j.target) as cur:
            cur.execute("SELECT @@slave_exec_mode")
            if "STRICT" not in str(cur.fetchone()[0]).upper():
                return ""
        t0 = time.monotonic()
        names = ", ".join(f"`{d}`.`{t}`" for d, t in tables)
        here_conn = mysql_connector(self._url(j.source))()
        there_conn = mysql_connector(self._url(j.target))()
        try:
            here, there = here_conn.cursor(), there_conn.cursor()
            there.execute(f"STOP SLAVE '{self.names.replication_name}'")  # UNTIL needs both threads stopped
            try:
                here.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                here.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")
                snap = {str(k).lower(): str(v) for k, v in here.fetchall()}
                here.execute(
                    "SELECT BINLOG_GTID_POS(%s, %s)",
                    (snap["binlog_snapshot_file"], int(snap["binlog_snapshot_position"])),
                )
                at = str(here.fetchone()[0] or "")
                if not at:
                    raise MoveError(f"verify: {j.source} gave no GTID position for its snapshot")
                there.execute(
                    f"START SLAVE '{self.names.replication_name}' UNTIL master_gtid_pos = %s", (at,)
                )
                self._until_stopped(j, there, at)
                there.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            finally:  # from another session: START SLAVE would end the snapshot's transaction
                with self._conn(j.target) as cur:
                    cur.execute(
                        f"STOP SLAVE '{self.names.replication_name}'"
                    )  # a no-op once UNTIL has stopped it
                    cur.execute(f"START SLAVE '{self.names.replication_name}'")
            sums: list[dict[str, Any]] = [{}, {}]

            def checksum(cur: Any, into: dict[str, Any]) -> None:
                cur.execute(f"CHECKSUM TABLE {names}")
                into.update({str(r[0]): r[1] for r in cur.fetchall()})

            _together([lambda: checksum(here, sums[0]), lambda: checksum(there, sums[1])])
        finally:
            here_conn.close()
            there_conn.close()
        _compare(sums[0], sums[1], f" at {at}, before the fence; the source keeps serving")
        j.timings["checksum_s"] = round(time.monotonic() - t0, 3)
        self.say(f"catch up: {len(sums[0])} table checksums equal on both sides at {at}, before the fence")
        return at

    def _until_stopped(self, j: Journal, cur: Any, at: str) -> None:
        """Wait until the target's replication, started ``UNTIL`` ``at``, has applied it and stopped."""
        deadline = time.monotonic() + FENCE_WAIT_TIMEOUT_S
        while True:
            cur.execute(f"SHOW SLAVE '{self.names.replication_name}' STATUS")
            names = [d[0] for d in cur.description]
            status = dict(zip(names, cur.fetchone() or (), strict=False))
            if status.get("Last_SQL_Errno"):
                raise MoveError(
                    f"{j.target} stopped replicating from {j.source}: {status.get('Last_SQL_Error')}; "
                    "resume when it has been fixed, or abort"
                )
            if status.get("Slave_SQL_Running") == "No" and status.get("Slave_IO_Running") == "No":
                break
            if time.monotonic() > deadline:
                raise MoveError(
                    f"{j.target} did not reach {at} within {FENCE_WAIT_TIMEOUT_S} s; resume, or abort"
                )
            time.sleep(0.005)
        cur.execute("SELECT MASTER_GTID_WAIT(%s, %s)", (at, 1))
        if cur.fetchone()[0] != 0:
            raise MoveError(f"{j.target} stopped replicating before {at}; resume, or abort")

    def _level_before_fence(self, j: Journal) -> None:
        """Let the target catch up again, until a round takes under `LEVEL_BEFORE_FENCE_S`: little is left
        for the fence to wait for."""
        with self._conn(j.source) as cur:
            for _ in range(LEVEL_ROUNDS):
                cur.execute("SELECT @@gtid_binlog_pos")
                position = str(cur.fetchone()[0])
                t0 = time.monotonic()
                self._wait_level(j, position, CATCH_UP_TIMEOUT_S)
                if time.monotonic() - t0 < LEVEL_BEFORE_FENCE_S:
                    break

    def _verify_fenced(
        self,
        j: Journal,
        sessions: list[Any],
        groups: list[list[tuple[str, str]]],
        position: str,
        at: str,
        keys: dict[tuple[str, str], str],
    ) -> None:
        """The fenced check after `_checksum_before_fence`: the target applied every event from ``at``
        to ``position`` (waited for already) and still replicates without error (strictly: a row
        event it could not apply would have stopped it), and each table's newest row, by the first
        column of its primary key (``keys``; an index lookup, not a scan), is the same on both sides.

        What this does not see, and the full checksums under the fence did: a row changed on the
        target behind replication's back after ``at`` (nothing of the store's writes there: the map
        does not name the target until the switch)."""
        with self._conn(j.target) as cur:
            cur.execute(f"SHOW SLAVE '{self.names.replication_name}' STATUS")
            names = [d[0] for d in cur.description]
            status = dict(zip(names, cur.fetchone() or (), strict=False))
        if status.get("Slave_SQL_Running") != "Yes" or status.get("Last_SQL_Errno"):
            raise MoveError(
                f"verify: {j.target} is not replicating ({status.get('Last_SQL_Error') or 'stopped'}); "
                "the source was unlocked and keeps serving: resume to try again, or abort"
            )

        def newest(group: list[tuple[str, str]]) -> str:
            return " UNION ALL ".join(
                f"SELECT '{d}.{t}', MAX(`{keys[d, t]}`) FROM `{d}`.`{t}`"
                if (d, t) in keys
                else f"SELECT '{d}.{t}', NULL"  # no primary key: nothing cheap to compare
                for d, t in group
            )

        here, there = self._both_sides(j, sessions, groups, newest)
        _compare(here, there, "; the source was unlocked and keeps serving", "newest rows")
        self.say(
            f"verify: {j.target} applied {position} and replicates without error; {len(here)} tables end "
            f"with the same row on both sides (checksums equal at {at})"
        )

    def _archive_stashed(self, host: str, dbs: list[str]) -> int:
        """Drop the triggers of the fenced tables under their stash names and rename them into the archive.

        From a session of its own: the fence session's renames took them out
        of its lock. They are out of reach of every writer already, and their
        contents were verified before they were renamed, so a resumed move
        finishes this too. How many tables it moved.
        """
        stashed = [(d, t) for d, t, _r, _b in self._tables(host, dbs) if t.endswith(STASH_SUFFIX)]
        if not stashed:
            return 0
        with self._conn(host) as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            triggers = table_triggers(cur, sorted({d for d, _t in stashed}))
            for d, t in stashed:
                for name in triggers.get((d, t), []):
                    cur.execute(f"DROP TRIGGER IF EXISTS `{d}`.`{name}`")
                cur.execute(f"CREATE DATABASE IF NOT EXISTS `{self.names.archive(d)}`")
                cur.execute(
                    f"ALTER TABLE `{d}`.`{t}` RENAME `{self.names.archive(d)}`.`{t[: -len(STASH_SUFFIX)]}`"
                )
        return len(stashed)

    def _restore_source(self, j: Journal, dbs: list[str]) -> None:
        """Put every table a switch had fenced back where it was on the source, with its ID trigger.

        A table whose trigger must come back goes through its stash name: the
        trigger is made on it there, and only the rename within the database,
        which keeps it, makes the table reachable again. The counter table
        comes back first. Idempotent: an abort that crashed is run again.
        """
        ours = self._id_triggers()
        epoch = self.store.config.instagram_epoch_ms
        archived = [(d, t) for d, t, _r, _b in self._tables(j.source, [self.names.archive(d) for d in dbs])]
        with self._conn(j.source) as cur:
            cur.execute("SET SESSION sql_log_bin = 0")
            leftover = table_triggers(cur, sorted({d for d, _t in archived}))
            for a, t in sorted(archived, key=lambda at: at[1] in ours):
                for name in leftover.get((a, t), []):  # none made by a move; a rename would refuse them
                    cur.execute(f"DROP TRIGGER IF EXISTS `{a}`.`{name}`")
                live = self.names.unarchive(a)
                cur.execute(
                    f"ALTER TABLE `{a}`.`{t}` RENAME `{live}`.`{t}{STASH_SUFFIX if t in ours else ''}`"
                )
            for d, stash, _r, _b in self._tables(j.source, dbs):
                if not stash.endswith(STASH_SUFFIX):
                    continue
                t = stash[: -len(STASH_SUFFIX)]
                if t in ours:
                    shard = self.names.database_shard(d)
                    assert shard is not None
                    cur.execute(id_trigger(shard, t, epoch, on=stash, db=d))
                cur.execute(f"ALTER TABLE `{d}`.`{stash}` RENAME `{d}`.`{t}`")
            for db in dbs:
                cur.execute(f"DROP DATABASE IF EXISTS `{self.names.archive(db)}`")

    def _verify(self, j: Journal, sessions: list[Any], groups: list[list[tuple[str, str]]]) -> None:
        """Compare every fenced table's checksum on both sides, each fence session its own tables."""
        here, there = self._both_sides(
            j, sessions, groups, lambda group: "CHECKSUM TABLE " + ", ".join(f"`{d}`.`{t}`" for d, t in group)
        )
        _compare(here, there, "; the source was unlocked and keeps serving")
        self.say(f"verify: {len(here)} table checksums equal on both sides")

    def _both_sides(
        self,
        j: Journal,
        sessions: list[Any],
        groups: list[list[tuple[str, str]]],
        query: Callable[[list[tuple[str, str]]], str],
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """``query`` of each fence session's tables on that session (it holds their locks), and of all
        of them on the target, at once: (table -> the source's answer, table -> the target's)."""
        answers: list[dict[str, Any]] = [{} for _ in range(len(sessions) + 1)]

        def ask(cur: Any, group: list[tuple[str, str]], into: dict[str, Any]) -> None:
            if group:
                cur.execute(query(group))
                into.update({str(r[0]): r[1] for r in cur.fetchall()})

        def target_side() -> None:
            with self._conn(j.target) as cur:
                ask(cur, [dt for g in groups for dt in g], answers[-1])

        _together(
            [
                target_side,
                *(
                    lambda cur=cur, group=group, into=into: ask(cur, group, into)
                    for cur, group, into in zip(sessions, groups, answers, strict=False)
                ),
            ]
        )
        return {k: v for a in answers[:-1] for k, v in a.items()}, answers[-1]

    def _map_switched(self, j: Journal) -> bool:
        self.store.refresh_map(force=True)
        m = self.store.shard_map
        return all(m.master(s) == j.target for s in range(j.low, j.high + 1))

    def _write_map(self, j: Journal) -> None:
        current = self.store.map_source.load()
        assert current is not None
        new = current.with_move(j.low, j.high, j.target, j.slave)
        self.store.map_source.write(new, expected_version=current.version)
        self.store.refresh_map(force=True)
        self.say(f"switch: map version {new.version} names {j.target} for shards {j.low}-{j.high}")

    # -- abort and cleanup -------------------------------------------------------

    def abort(self) -> Journal:
        """Undo a move that has not switched the map: the source serves again, the target copy goes."""
        j = self._load()
        if j.phase == "done":
            raise MoveError("the move is done and the map switched: move the shards back instead")
        dbs = self._units(j)
        if self._map_switched(j):
            raise MoveError(
                "the map already names the target: finish with --resume, then move back if needed"
            )
        self._drop_target_copy(j, dbs)
        self._restore_source(j, dbs)  # tables a crashed switch had fenced: back they go
        j.phase = "aborted"
        j.save(self.journal_path)
        MoveProgress(self, j).stop(phase="aborted", step="aborted")
        self.say(f"aborted: shards {j.low}-{j.high} stay on {j.source}")
        return j

    def cleanup(self) -> list[str]:
        """After a finished move: drop the archived copies on the source; its tombstones stay."""
        return self.cleanup_journaled(self._load())

    def cleanup_journaled(self, j: Journal) -> list[str]:
        """`cleanup` for the move journaled in ``j`` (a rebalance keeps each of its moves' journals)."""
        if j.phase != "done":
            raise MoveError(f"the move is in phase {j.phase}: cleanup comes after it is done")
        dropped = []
        dbs = self._units(j)
        with (
            self._conn(j.source) as cur,
            self._mysql.admin_lock(cur, range(j.low, j.high + 1), timeout_s=SHARD_LOCK_TIMEOUT_S),
        ):
            cur.execute("SET SESSION sql_log_bin = 0")
            for db in dbs:
                cur.execute(f"DROP DATABASE IF EXISTS `{self.names.archive(db)}`")
                dropped.append(self.names.archive(db))
        return dropped
