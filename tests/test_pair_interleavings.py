"""Every interleaving of two writes of one pair ends with both sides agreeing with the last one.

A small stateless model checker (`tests.interleavings`): each write runs in
a thread that pauses at the steps of the pair protocol (`PairWriter.step`:
start, primary written, inverse committed / primary committed); a scheduler
releases one thread at a time and tries every order of releases (depth
first, replaying a prefix of choices from a fresh pair each time). A thread
that does not reach its next step soon is waiting on a database lock: it is
left blocked, and the others go on. After each schedule the rows are read
back: the primary row, the inverse row and both counts must agree with the
writes replayed in the order they returned. Two of one write (two links,
two unlinks, two relinks to one position) are twins: of a schedule and its
mirror, the two swapped, only the one where the first goes first runs.

Each backend is a real database: MariaDB with the two sides on two host
names, SQLite with the two sides in two shard files (locked in shard order),
and PostgreSQL with Instagram IDs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import psycopg
import pymysql
import pytest

from store import Store, StoreConfig
from store.admin import repair_relations
from store.exceptions import NotFound
from tests.asyncface import blocking_store
from tests.conftest import NAMESPACE, sqlite_config
from tests.interleavings import Hook, Schedule, run_schedule
from tests.interleavings import explore as explore_all

BHP = "board_has_pins"
POB = "pin_owned_by_board"
OPS: dict[str, tuple[str, int | None]] = {
    "link": ("link", None),
    "unlink": ("unlink", None),
    "relink@500": ("link", 500),
    "relink@900": ("link", 900),
}
#: The same writes as batches (`link_many`, `unlink_many`), each with a second pair of the same hosts.
BATCH_OPS: dict[str, tuple[str, int | None]] = {
    "link_many": ("link", None),
    "unlink_many": ("unlink", None),
    "relink_many@500": ("link", 500),
}


def replay(initial: tuple[bool, int | None], names: list[str]) -> tuple[bool, int | None]:
    """The pair's state after ``names``, in order: (present, sequence or None for any)."""
    present, seq = initial
    for name in names:
        kind, at = {**OPS, **BATCH_OPS}[name]
        if kind == "unlink":
            present, seq = False, None
        elif at is not None:
            present, seq = True, at
        elif not present:
            present, seq = True, None  # the time of adding: any value
    return present, seq


def run_one(
    store: Store, board: int, pin: int, names: list[str], choices: list[int], other: int = 0
) -> Schedule:
    writer = store.admin_context().relations.pairs
    calls: list[Callable[[], object]] = []
    for name in names:
        kind, at = {**OPS, **BATCH_OPS}[name]

        def call(kind: str = kind, at: int | None = at, batch: bool = name in BATCH_OPS) -> object:
            if batch:
                pairs = [(board, pin), (board, other)]
                if kind == "unlink":
                    return store.unlink_many(BHP, pairs)
                return store.link_many(BHP, pairs, sequence=at)
            if kind == "unlink":
                return store.unlink(BHP, board, pin)
            return store.link(BHP, board, pin, sequence=at)

        calls.append(call)

    def install(hook: Hook | None) -> None:
        writer.step = hook

    waiting = lock_waits(store)
    try:
        out = run_schedule(install, calls, choices, waiting=waiting)
    finally:
        if waiting is not None:
            waiting.close()
    errors = [o for o in out.outcomes if isinstance(o, BaseException)]
    assert errors == [], errors
    return out


class LockWaits:
    """How many of a store's transactions wait on a lock now (the scheduler's proof that a write is
    blocked, not slow), asked on one connection of its own, opened at the first question and
    closed by `close` (a connection a question cost a server process on PostgreSQL, a thread on
    MariaDB, each time): on the test MariaDB, those waiting on this session's databases; on
    PostgreSQL, the sessions of the store's database waiting on a lock (row or advisory)."""

    def __init__(self, database: str | None) -> None:
        self.database = database  # PostgreSQL's; None: the test MariaDB
        self._conn: Any = None

    def __call__(self) -> int:
        if self.database is not None:
            if self._conn is None:
                self._conn = psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True)
            row = self._conn.execute(
                "SELECT count(DISTINCT l.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                " WHERE NOT l.granted AND a.datname = %s",
                (self.database,),
            ).fetchone()
            return int(row[0]) if row else 0
        if self._conn is None:
            self._conn = pymysql.connect(host="127.0.0.1", port=3306, user="root", autocommit=True)
        with self._conn.cursor() as cur:
            cur.execute(
                "SELECT w.requesting_trx_id, l.lock_table FROM information_schema.INNODB_LOCK_WAITS w"
                " JOIN information_schema.INNODB_LOCKS l ON l.lock_id = w.requested_lock_id"
            )
            rows = cur.fetchall()
        return len({trx for trx, table in rows if str(table).startswith(f"`{NAMESPACE}_")})

    def close(self) -> None:
        """Close the connection, if one was opened."""
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()


def lock_waits(store: Store) -> LockWaits | None:
    """The `LockWaits` of ``store``'s servers (the test MariaDB, or one PostgreSQL database);
    SQLite: None (time alone)."""
    backends = {url.get_backend_name() for url in store.config.hosts.values()}
    if backends == {"postgresql"}:
        (database,) = {url.database for url in store.config.hosts.values()}
        return LockWaits(database)
    return LockWaits(None) if backends == {"mysql"} else None


def read_pair(store: Store, board: int, pin: int) -> tuple[tuple[bool, int | None], tuple[bool, int | None]]:
    repo = store.admin_context().relation_repository
    loc_b, loc_p = store.locate(board, type_name="board"), store.locate(pin, type_name="pin")
    primary = repo.sequence_of(store.admin_context().engines.shard(loc_b.shard, loc_b.host), BHP, board, pin)
    inverse = repo.sequence_of(store.admin_context().engines.shard(loc_p.shard, loc_p.host), POB, pin, board)
    return (primary is not None, primary), (inverse is not None, inverse)


def explore(store: Store, names: list[str], initial_present: bool, pin_shard: int = 5) -> int:
    """Run every schedule of the writes ``names`` (the board on shard 0, the pins on ``pin_shard``);
    the number of schedules run."""

    def run(prefix: list[int]) -> tuple[Schedule, Callable[[], None]]:
        board = store.create("board", {}, shard=0)
        pin, other = store.create_many("pin", [{}, {}], shard=pin_shard)
        if initial_present:
            store.link(BHP, board, pin, sequence=7)
        initial = (initial_present, 7 if initial_present else None)
        done = run_one(store, board, pin, names, prefix, other)

        def check() -> None:
            (p_present, p_seq), (i_present, i_seq) = read_pair(store, board, pin)
            want_present, want_seq = replay(initial, [names[i] for i in done.commit_order()])
            state = "present" if initial_present else "absent"
            where = f"writes {names} from {state}, schedule {done.taken}: {done.steps(names)}"
            assert (p_present, p_seq) == (i_present, i_seq), f"sides differ after {where}"
            assert p_present == want_present, f"not the last write's result after {where}"
            if want_seq is not None:
                assert p_seq == want_seq, f"wrong position after {where}"
            (o_present, o_seq), other_inverse = read_pair(store, board, other)
            assert (o_present, o_seq) == other_inverse, f"the batch's other pair differs after {where}"
            assert store.count(BHP, board) == int(p_present) + int(o_present), where
            assert store.count(POB, pin) == int(i_present), where

        return done, check

    # Two of one write (link+link, unlink+unlink, relink@500+relink@500): twins, whose mirrored
    # schedules (the two swapped) run alike and check alike (`tests.interleavings.explore`).
    return explore_all(run, twins=(0, 1) if _twins(names) else None)


def _twins(names: list[str]) -> bool:
    """Whether the two writes are one write twice (their mirrored schedules run alike)."""
    return len(names) == 2 and names[0] == names[1]


def least_runs(names: list[str]) -> int:
    """The schedules an exploration of ``names`` must have run: both orders, or for twins the
    one order left of the two (where a write locks its shards up front, SQLite, that is all)."""
    return 1 if _twins(names) else 2


PAIRS = [list(p) for p in itertools.product(OPS, repeat=2) if p != ("relink@900", "relink@900")]


@pytest.mark.parametrize("initial_present", [False, True], ids=["absent", "present"])
@pytest.mark.parametrize("names", PAIRS, ids=["+".join(p) for p in PAIRS])
def test_two_writes_of_one_pair_on_mariadb(
    mariadb_ready: StoreConfig, names: list[str], initial_present: bool
) -> None:
    with Store(mariadb_ready) as store:
        runs = explore(store, names, initial_present)
        print(f"schedules: {runs}")
        assert runs >= least_runs(names)


@pytest.mark.parametrize("initial_present", [False, True], ids=["absent", "present"])
@pytest.mark.parametrize("names", PAIRS[:6], ids=["+".join(p) for p in PAIRS[:6]])
def test_two_writes_of_one_pair_on_sqlite(tmp_path: object, names: list[str], initial_present: bool) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    with Store(StoreConfig.from_dict(sqlite_config(tmp_path))) as store:
        runs = explore(store, names, initial_present)
        print(f"schedules: {runs}")
        assert runs >= least_runs(names)


BATCH_RACES = [
    ["link_many", "unlink"],
    ["unlink_many", "link"],
    ["relink_many@500", "relink@900"],
    ["link_many", "unlink_many"],
]


@pytest.mark.parametrize("initial_present", [False, True], ids=["absent", "present"])
@pytest.mark.parametrize("names", PAIRS, ids=["+".join(p) for p in PAIRS])
def test_two_writes_of_one_pair_on_postgres(
    postgres_ready: StoreConfig, names: list[str], initial_present: bool
) -> None:
    """The sides on two host names (the inverse a transaction of its own, under the primary's
    advisory lock); each side's write and its count one statement."""
    with Store(postgres_ready) as store:
        runs = explore(store, names, initial_present, pin_shard=9)
        print(f"schedules: {runs}")
        assert runs >= least_runs(names)


@pytest.mark.parametrize("initial_present", [False, True], ids=["absent", "present"])
@pytest.mark.parametrize("names", PAIRS[:6], ids=["+".join(p) for p in PAIRS[:6]])
def test_two_writes_of_one_pair_on_one_postgres_host(
    postgres_ready: StoreConfig, names: list[str], initial_present: bool
) -> None:
    """Both sides on one host name: one transaction writes both, after the primary's advisory lock."""
    with Store(postgres_ready) as store:
        runs = explore(store, names, initial_present, pin_shard=5)
        print(f"schedules: {runs}")
        assert runs >= 1


@pytest.mark.parametrize("initial_present", [False, True], ids=["absent", "present"])
@pytest.mark.parametrize("names", BATCH_RACES, ids=["+".join(p) for p in BATCH_RACES])
def test_a_batch_racing_a_single_write_of_one_pair_on_mariadb(
    mariadb_ready: StoreConfig, names: list[str], initial_present: bool
) -> None:
    with Store(mariadb_ready) as store:
        runs = explore(store, names, initial_present)
        print(f"schedules: {runs}")
        assert runs >= least_runs(names)


@pytest.mark.parametrize("initial_present", [False, True], ids=["absent", "present"])
@pytest.mark.parametrize("names", BATCH_RACES, ids=["+".join(p) for p in BATCH_RACES])
def test_a_batch_racing_a_single_write_of_one_pair_on_one_mariadb_host(
    mariadb_ready: StoreConfig, names: list[str], initial_present: bool
) -> None:
    """Board and pins on one host: the batch tries both sides in one request (`_both`)."""
    with Store(mariadb_ready) as store:
        runs = explore(store, names, initial_present, pin_shard=1)
        print(f"schedules: {runs}")
        assert runs >= least_runs(names)


@pytest.mark.parametrize("initial_present", [False, True], ids=["absent", "present"])
@pytest.mark.parametrize("names", BATCH_RACES, ids=["+".join(p) for p in BATCH_RACES])
def test_a_batch_racing_a_single_write_of_one_pair_on_postgres(
    postgres_ready: StoreConfig, names: list[str], initial_present: bool
) -> None:
    """Two host names: a batch's side is one pipelined request of every pair's advisory lock and
    counted write, racing a single write of one of its pairs."""
    with Store(postgres_ready) as store:
        runs = explore(store, names, initial_present, pin_shard=9)
        print(f"schedules: {runs}")
        assert runs >= least_runs(names)


@pytest.mark.parametrize("names", BATCH_RACES[:2], ids=["+".join(p) for p in BATCH_RACES[:2]])
def test_a_batch_racing_a_single_write_of_one_pair_on_sqlite(tmp_path: object, names: list[str]) -> None:
    from pathlib import Path

    assert isinstance(tmp_path, Path)
    with Store(StoreConfig.from_dict(sqlite_config(tmp_path))) as store:
        runs = explore(store, names, True)
        print(f"schedules: {runs}")
        assert runs >= least_runs(names)


def explore_delete_and_link(store: Store, initial_present: bool, pin_shard: int) -> int:
    """Every schedule of ``delete(pin)`` racing ``link(board, pin)``, paused at every step of both
    (the delete's mark, list read and sweep, `Steps.hook`; each pair write's protocol steps,
    `PairWriter.step`): whatever the order, no pair is left on either side and the board's count
    is 0. The link either commits first (and the delete's sweep removes it) or is refused
    (`NotFound`: the pin was marked deleted)."""
    ctx = store.admin_context()
    writer = ctx.relations.pairs
    assert ctx.steps is not None
    steps = ctx.steps

    def run(prefix: list[int]) -> tuple[Schedule, Callable[[], None]]:
        board = store.create("board", {}, shard=0)
        pin = store.create("pin", {}, shard=pin_shard)
        if initial_present:
            store.link(BHP, board, pin, sequence=7)

        def link() -> object:
            try:
                return store.link(BHP, board, pin)
            except NotFound:
                return "refused"

        def install(hook: Hook | None) -> None:
            writer.step = hook
            steps.hook = hook

        waiting = lock_waits(store)
        try:
            calls = [link, lambda: store.delete(pin, type_name="pin")]
            done = run_schedule(install, calls, prefix, waiting=waiting)
        finally:
            if waiting is not None:
                waiting.close()

        def check() -> None:
            where = f"delete racing link from {'present' if initial_present else 'absent'}, " + (
                f"schedule {done.taken}: {done.steps(['link', 'delete'])}"
            )
            errors = [o for o in done.outcomes if isinstance(o, BaseException)]
            assert errors == [], (errors, where)
            assert read_pair(store, board, pin) == ((False, None), (False, None)), where
            assert store.count(BHP, board) == 0, where
            assert store.get(pin, type_name="pin") is None, where

        return done, check

    return explore_all(run)


@pytest.mark.parametrize("initial_present", [False, True], ids=["absent", "present"])
def test_a_delete_racing_a_link_of_its_object_leaves_no_pair_on_mariadb(
    mariadb_ready: StoreConfig, initial_present: bool
) -> None:
    with Store(mariadb_ready) as store:
        runs = explore_delete_and_link(store, initial_present, pin_shard=5)
        print(f"schedules: {runs}")
        assert runs >= 3


@pytest.mark.parametrize("initial_present", [False, True], ids=["absent", "present"])
def test_a_delete_racing_a_link_of_its_object_leaves_no_pair_on_postgres(
    postgres_ready: StoreConfig, initial_present: bool
) -> None:
    with Store(postgres_ready) as store:
        runs = explore_delete_and_link(store, initial_present, pin_shard=9)
        print(f"schedules: {runs}")
        assert runs >= 3


#: Pairs of writes run through the async face (a subset: the same code runs under it).
ASYNC_PAIRS = [["link", "unlink"], ["unlink", "relink@500"], ["relink@500", "relink@900"], ["link", "link"]]


@pytest.mark.parametrize("face", ["async", "native"])
@pytest.mark.parametrize("initial_present", [False, True], ids=["absent", "present"])
@pytest.mark.parametrize("names", ASYNC_PAIRS, ids=["+".join(p) for p in ASYNC_PAIRS])
def test_two_writes_of_one_pair_through_the_async_face_on_mariadb(
    mariadb_ready: StoreConfig, names: list[str], initial_present: bool, face: str
) -> None:
    """The writes are `AsyncStore` calls awaited on one event loop. On the ``async`` face each is
    paused at the pair protocol's steps in the store's worker thread, where the caller's context
    (which write it is) goes with the call; on the ``native`` face each is a greenlet on the loop,
    paused at an await there, while the loop runs the other write."""
    with blocking_store(mariadb_ready, face) as store:
        runs = explore(store, names, initial_present)
        print(f"schedules: {runs}")
        assert runs >= least_runs(names)


@pytest.mark.parametrize("face", ["async", "native"])
def test_a_delete_racing_a_link_through_the_async_face_on_mariadb(
    mariadb_ready: StoreConfig, face: str
) -> None:
    with blocking_store(mariadb_ready, face) as store:
        runs = explore_delete_and_link(store, True, pin_shard=5)
        print(f"schedules: {runs}")
        assert runs >= 3


def test_three_writes_of_one_pair_on_mariadb(mariadb_ready: StoreConfig) -> None:
    with Store(mariadb_ready) as store:
        runs = explore(store, ["link", "unlink", "relink@500"], False)
        print(f"schedules: {runs}")
        assert runs >= 6


def test_the_checker_finds_the_race_of_writing_each_side_in_its_own_transaction(
    mariadb_ready: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The protocol as it was before: commit the primary side, then write the inverse. It fails here."""
    from store.engines import Cursor
    from store.relations.repository import Side
    from store.relations.writer import PairWriter

    def separate(
        self: PairWriter,
        primary: Side,
        inverse: Side | None,
        first: Callable[[Cursor], tuple[bool, int]],
        second: Callable[[Cursor, tuple[bool, int]], None],
        at_once: object = None,  # (both sides in one transaction: never, here)
        alone: object = None,  # (the inverse side's own commit: the plain one, here)
    ) -> None:
        step = self.step or (lambda _s: None)
        step("start")
        state = primary.h.transaction(first)
        step("primary committed")
        assert inverse is not None
        inverse.h.transaction(lambda cur: second(cur, state))

    with Store(mariadb_ready) as store:
        with monkeypatch.context() as m:
            m.setattr(PairWriter, "_run", separate)
            with pytest.raises(AssertionError, match=r"sides differ|not the last"):
                explore(store, ["link", "unlink"], False)
        repair_relations(store, shards=[0, 5])  # leave no split pair behind for other tests
