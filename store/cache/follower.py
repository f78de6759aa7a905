"""The invalidation log: every write logs what it invalidates, and every store follows the log.

A writer deletes what its write changed from the caches after it commits.
When that delete is lost (the cache unreachable from the writer only, the
writer killed between its commit and its delete, a cache restarted), other
processes could serve the old value until the entry expires. The trust
window alone (`cache.max_stale_s`) bounds that, but at a price: every entry
is read again from the database once it is older than the window, so data
read less often than every few seconds is never served from the cache.

The log removes the price. Each write transaction also inserts one row
into its server's ``store_log.cache_log`` (sent with the COMMIT: no extra
round trip), naming the cache keys it invalidates; the row commits if and
only if the write does. Every store with shared caches runs a `Follower`
that reads the new rows of each server twice a second and deletes their
keys again. So every write committed before the start of the follower's
last complete pass is invalidated, by its writer or by a follower. While
that pass began within ``max_stale_s``, an entry of any age can be
trusted: a value it holds can be stale only by a write committed since,
less than ``max_stale_s`` ago. When the follower falls behind (a server
unreachable, the log missing), entries are trusted for ``max_stale_s``
after their read again, as before.

Where the database keeps list versions (MariaDB/MySQL), a list's entry
names the version the write left the list at (``l<key>@<version>``, read in
the writer's transaction), and the follower drops a cached list only if it
holds an older version: lists that writers updated in place stay cached.

It is the binlog follower of the big deployments, on a table: it needs no
binlog, no daemon and no privileges beyond the store's own, and a fault
that stops the follower only brings back the trust window.

Rows become visible in commit order, not in id order: a row whose id is
below the highest one seen may commit later. Ids skipped in a pass are
kept as gaps and asked for again in the next passes for `GAP_WAIT_S`
(the row is inserted with the COMMIT, so a gap that lasts longer is a
rolled-back write). Rows older than `KEEP_S` are deleted by the followers.

A child of ``os.fork()`` does not have its parent's follower thread: its
follower starts again, from the end of each log, at the child's next cache
read (`Follower.trusted_since_ms`); until its first pass, entries are
trusted for the window only.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from store.forks import at_fork

__all__ = [
    "CLEAN_BATCH",
    "GAP_WAIT_S",
    "KEEP_S",
    "LOG_DATABASE",
    "LOG_TABLE",
    "VERSION_MARK",
    "Follower",
    "build_follower",
    "LogSource",
    "list_version",
    "merged_entries",
    "settled_versions",
    "log_entries",
    "parse_entries",
]

log = logging.getLogger(__name__)

LOG_DATABASE = "store_log"
LOG_TABLE = "cache_log"
#: How long an id skipped by a pass is asked for again.
GAP_WAIT_S = 30.0
#: How long log rows are kept.
KEEP_S = 600.0
#: Rows read per query; a pass goes on until a query returns fewer.
BATCH = 5000
#: A follower starts this many ids before the end of each log.
START_BACK = 1000
#: Old rows deleted per pass at most (a short statement: writers' inserts never wait long on it).
CLEAN_BATCH = 2000

#: The kinds of cache key a log row names: object cache, list cache.
OBJECT, LIST = "o", "l"
#: Between a list's key and the version the write made, in a log entry (``l<key>@<version>``).
VERSION_MARK = "@"


def log_entries(objects: Sequence[str] = (), lists: Sequence[str] = ()) -> str:
    """The text of one log row: the object and list cache keys a write invalidates."""
    return " ".join([*(OBJECT + k for k in objects), *(LIST + k for k in lists)])


def merged_entries(texts: Sequence[str]) -> str:
    """One log row's text naming what ``texts`` (log entries, `log_entries`) name, each key once:
    an object once; a list at the version a follower settles it at (`settled_versions`). A
    batch's hundred changes of a board's list log it once."""
    if not texts or (len(texts) == 1 and " " not in texts[0]):
        return texts[0] if texts else ""
    objects, lists = parse_entries(texts)
    named = [OBJECT + k for k in dict.fromkeys(objects)]
    named += [LIST + (k if v == 0 else f"{k}{VERSION_MARK}{v}") for k, v in settled_versions(lists).items()]
    return " ".join(named)


def settled_versions(entries: Iterable[str]) -> dict[str, int]:
    """Each list key of ``entries`` (list entries of `parse_entries`) and the version a follower
    settles it at: the newest named, or 0 (dropped whatever it holds) if one entry names none."""
    newest: dict[str, int] = {}
    for entry in entries:
        key, version = list_version(entry)
        held = newest.get(key)
        newest[key] = 0 if version == 0 or held == 0 else max(held or 0, version)
    return newest


def list_version(entry: str) -> tuple[str, int]:
    """(list key, version) of a list entry of `parse_entries`; version 0 where the entry names none."""
    key, mark, version = entry.rpartition(VERSION_MARK)
    if not mark or not version.isdigit():
        return entry, 0
    return key, int(version)


def parse_entries(texts: Sequence[str]) -> tuple[list[str], list[str]]:
    """The object keys and list entries named by log rows (a list entry may end in its version:
    `list_version`)."""
    objects: list[str] = []
    lists: list[str] = []
    for text in texts:
        for token in text.split():
            (objects if token[0] == OBJECT else lists).append(token[1:])
    return objects, lists


@dataclass
class LogSource:
    """One server's log: how to open a cursor on it, and where this follower is in it."""

    name: str
    connect: Callable[[], Any]  # a context manager giving a connection whose cursor() runs SQL
    table: str
    last: int = -1  # highest id seen (-1: not started)
    gaps: dict[int, float] = field(default_factory=dict)  # id -> when first missed (monotonic)
    step: int = 1  # the server's auto_increment_increment
    checkpoints: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, last)
    cleaned: float = 0.0
    clean_upto: int | None = None  # rows up to this id are being deleted, a batch a pass
    #: The server's id step query (None: ids step by 1) and its DELETE of a batch of old rows
    #: (`Backend.change_log_step_sql`, `Backend.change_log_clean`; None: MariaDB's).
    step_sql: str | None = "SELECT @@auto_increment_increment"
    clean_sql: str | None = None


class Follower:
    """Reads every server's invalidation log and deletes the keys it names (see the module's text)."""

    def __init__(
        self,
        discover: Callable[[], Sequence[LogSource]],
        apply: Callable[[list[str], list[str]], None],
        *,
        poll_s: float = 0.5,
        wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    ) -> None:
        #: The servers' logs, found again at each pass (a move may bring a new server).
        self._discover = discover
        self.sources: list[LogSource] = []
        self._apply = apply
        self._poll_s = poll_s
        self._wall_ms = wall_ms
        self._covered_ms = 0
        self._started_ms = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.rows = 0
        self.errors = 0
        self.last_error = ""
        #: The process the thread runs in; a follower started in another one starts again here.
        self._pid = os.getpid()
        self._restart = False
        self._start_lock = threading.Lock()
        at_fork(self, Follower._after_fork)

    def _after_fork(self) -> None:
        """In a forked child: the thread stayed in the parent. Forget what it read (a pass cut
        short by the fork may have moved past rows it had not applied yet), and start again on
        the next `trusted_since_ms`."""
        if self._pid == os.getpid():
            return
        self._pid = os.getpid()
        self._start_lock = threading.Lock()
        self._restart = self._thread is not None and not self._stop.is_set()
        self._stop = threading.Event()
        self._thread = None
        self.sources = []
        self._covered_ms = 0
        self._started_ms = 0

    def covered_ms(self) -> int:
        """When the last complete pass began (ms since the epoch; 0: none yet)."""
        return self._covered_ms

    def started_ms(self) -> int:
        """When the first complete pass began (ms since the epoch; 0: none yet)."""
        return self._started_ms

    def trusted_since_ms(self, now_ms: int, window_ms: int) -> int | None:
        """Entries read at or after this time may be trusted at any age; None: only the window holds.

        That is the start of the first pass (earlier writes were not all
        read), while the last complete pass began less than ``window_ms`` ago.
        """
        if self._pid != _getpid():  # a fork the hook missed
            self._after_fork()
        if self._restart:
            with self._start_lock:
                if self._restart:
                    self._restart = False
                    self.start()
        if self._covered_ms and self._covered_ms >= now_ms - window_ms:
            return self._started_ms
        return None

    def key_trusted_since_ms(self, key: str, now_ms: int, window_ms: int) -> int | None:
        """`trusted_since_ms`: a follower reads every host's log, so it vouches for all or none."""
        return self.trusted_since_ms(now_ms, window_ms)

    def start(self) -> None:
        """Follow in a daemon thread, a pass every ``poll_s``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="store-log-follower", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stop following (entries are then trusted for the window only)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._covered_ms = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.run_pass()
            except Exception as exc:  # a server down: entries fall back to the trust window
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.debug("invalidation log pass failed: %s", self.last_error)
            self._stop.wait(max(0.0, self._poll_s - (time.monotonic() - began)))

    def run_pass(self) -> None:
        """Read every server's new rows and delete their keys; then the pass counts as complete."""
        began_ms = self._wall_ms()
        known = {s.name: s for s in self.sources}
        self.sources = [known.get(s.name, s) for s in self._discover()]
        saved = [(s.last, dict(s.gaps)) for s in self.sources]
        texts: list[str] = []
        try:
            for source in self.sources:
                texts += self._read(source)
            if texts:
                objects, lists = parse_entries(texts)
                self._apply(objects, lists)
        except BaseException:
            # Read again next pass: a row is passed over only once its keys were deleted.
            for source, (last, gaps) in zip(self.sources, saved, strict=True):
                source.last, source.gaps = last, gaps
            raise
        self.rows += len(texts)
        self.passes += 1
        self._started_ms = self._started_ms or began_ms
        self._covered_ms = began_ms

    def _read(self, s: LogSource) -> list[str]:
        now = time.monotonic()
        out: list[str] = []
        with s.connect() as conn:
            cur = conn.cursor()
            try:
                if s.last < 0:
                    # Start near the end: the rows of writes in flight now are read
                    # (or kept as gaps) like any others.
                    if s.step_sql is not None:
                        cur.execute(s.step_sql)
                        s.step = max(1, int(cur.fetchone()[0]))
                    cur.execute(f"SELECT COALESCE(MAX(id), 0) FROM {s.table}")
                    s.last = max(0, int(cur.fetchone()[0]) - START_BACK * s.step)
                    s.checkpoints.append((now, s.last))
                s.gaps = {g: t for g, t in s.gaps.items() if now - t < GAP_WAIT_S}
                while True:
                    gaps = sorted(s.gaps)[:BATCH]
                    where = "id > %s" + (f" OR id IN ({', '.join(['%s'] * len(gaps))})" if gaps else "")
                    cur.execute(
                        f"SELECT id, entries FROM {s.table} WHERE {where} ORDER BY id LIMIT {BATCH}",
                        (s.last, *gaps),
                    )
                    rows = cur.fetchall()
                    for id_, text in rows:
                        out.append(text if isinstance(text, str) else bytes(text).decode())
                        s.gaps.pop(int(id_), None)
                    new = sorted(int(r[0]) for r in rows if int(r[0]) > s.last)
                    expected = s.last + s.step
                    for id_ in new:
                        while expected < id_:
                            s.gaps[expected] = now
                            expected += s.step
                        expected = id_ + s.step
                    if new:
                        s.last = new[-1]
                    if len(rows) < BATCH:
                        break
                self._clean(cur, s, now)
            finally:
                cur.close()
        return out

    def _clean(self, cur: Any, s: LogSource, now: float) -> None:
        """Now and then, delete rows older than `KEEP_S` (any follower may; they agree): at most
        `CLEAN_BATCH` a pass, the next pass going on, so no one statement holds the table long."""
        if s.clean_upto is None:
            if now - s.cleaned < 60:
                return
            s.cleaned = now
            s.checkpoints.append((now, s.last))
            old = [c for c in s.checkpoints if now - c[0] >= KEEP_S]
            if not old:
                return
            s.clean_upto = old[-1][1]
            s.checkpoints = [c for c in s.checkpoints if now - c[0] < KEEP_S]
        clean = s.clean_sql or f"DELETE FROM {s.table} WHERE id <= %s LIMIT {CLEAN_BATCH}"
        cur.execute(clean, (s.clean_upto,))
        if cur.rowcount < CLEAN_BATCH:
            s.clean_upto = None  # done, until the next checkpoint is old enough


_getpid = os.getpid


def build_follower(
    hosts: Callable[[], Sequence[tuple[str, Callable[[], Any], str, str | None, str]]],
    objects: Callable[[list[str]], None] | None,
    lists: Callable[[list[str]], None] | None,
    *,
    poll_s: float,
) -> Follower:
    """A follower of the logs ``hosts()`` names, as (name, connect, table, id step query, DELETE of
    old rows: `LogSource`), deleting through the caches."""

    def apply(object_keys: list[str], list_keys: list[str]) -> None:
        if objects is not None and object_keys:
            objects(sorted(set(object_keys)))
        if lists is not None and list_keys:
            lists(sorted(set(list_keys)))

    def discover() -> list[LogSource]:
        return [
            LogSource(name, connect, table, step_sql=step, clean_sql=clean)
            for name, connect, table, step, clean in hosts()
        ]

    return Follower(discover, apply, poll_s=poll_s)
