"""Unique keys, every interleaving: creates, renames and deletes of one value, its object and its row apart.

The interleaving checker of `tests.interleavings` over the plans of
`store.objects`: each write runs in a thread that pauses at `Steps.hook`
before each of its steps ("claim user_by_handle", "read holder", "abandon",
"activate", "read", "write", "release ...", "delete"), and every order of
the releases is tried. The users live on shard 1 (host MySQL001A; SQLite:
folder a), and every value is picked so that its key row lives on shards
4-7 (MySQL002A; folder b): an object and its key row are never on one host.

The writes, over a value V (and W, W2 for renames away from it): a create
of a new user holding V; a rename to V of a user holding another value (X
from a, Y from b); a rename from V to W (W2) of H, the user holding V; a
delete of H; a function update of H that keeps its name (a counter goes up:
applied once, whatever ran again). The initial states: V free; V held by H;
and the rows that writers killed between steps leave for V: a deleted
user's row (a delete killed before its release), a pending user's row (a
create killed before it went live), and the row of Z, a live user that
renamed V to z (a rename killed before its release; Z may rename back to V,
or be deleted). Every row the setup makes was claimed long ago (past
`CLAIM_GRACE_S`), as rows are in a store that has run a while.

After each schedule, read from the databases: (1) no value is held by two
live objects; (2) every key row of the schedule's values names a live
object holding its value, and no user is left pending: no row of a dead or
pending object, or of one that renamed away, once every write returned;
(3) every value a live object holds has its row, naming it; (4) `lookup`
says the same; and `repair_unique`'s dry run finds nothing to do anywhere.
The one row allowed to back nothing is the killed writer's row of the
setup, untouched, when no write claimed V (a delete of Z and a rename of Z
that found it deleted): a claim takes it over at once, and repair reports
that row alone. (5) The writes' results and the final state are those of
some serial order of the writes that keeps real time: a write that returned
before another made its first step goes first. A refusal
(`DuplicateKeyError`) must name the user that holds V at that point of the
serial order.

Steps that touch only rows no other write of the schedule can tell apart
run without a pause (`QUIET`): a create's insert of its pending row (no row
names it yet), the removal of a pending row that no row names or that was
abandoned (it reads as dead either way), and a delete's sweep of its lists
(no user here is in a list). Their order against the others' steps cannot
change a result, so pausing there would only repeat schedules. A pair of
kinds is run once, not in both orders: the checker tries every order of
their steps either way. Two writes of one kind are one write twice (the
same call, or a rename to V of X and one of Y, two users made alike whose
IDs the store only compares for equality; a rename of H to W and one to W2,
two fresh values): of each schedule and its mirror, the same schedule with
the two swapped, only the one where the first of them goes first runs
(`tests.interleavings.explore`'s ``twins``), and the checks, which name
neither by its place, pass for both or for neither.

Also here: the same checks with every claim past the grace period the
moment it is made (as if each writer stalled that long between steps), and
two known-bad variants the checker must catch.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

import store.unique as unique_module
from store import DuplicateKeyError, NotFound, Store, StoreConfig, WriteTimeoutError
from store.admin import init_shards, repair_unique
from store.ids import encode_pinterest
from store.objects import ObjectService
from store.specs import UniqueSpec
from store.unique import CLAIM_GRACE_S, Holder, UniqueKeys, key_shard
from tests.conftest import sqlite_config
from tests.interleavings import Hook, Schedule, explore, run_schedule

#: The users' shard: on the first host; every value's key row is on the second (shards 4-7).
OBJECT_SHARD = 1
#: Steps whose order against the other writes' steps changes nothing (see the module's text).
#: ("read row": a rename's read of the rows it will drop, right after its read of the object and
#: before its claims; "locked": inside the write's transaction, which the row lock serializes; the
#: marks that a write is over, after its last step.)
QUIET = frozenset(
    {
        "insert pending",
        "remove pending",
        "read lists",
        "sweep",
        "locked",
        "read row",
        "created",
        "updated",
        "deleted",
    }
)


@dataclass(frozen=True)
class Key:
    """A unique key of users: its name and the field it indexes."""

    name: str
    field: str


HANDLE = Key("user_by_handle", "handle")
#: The known-bad variants' key: what they leave behind stays out of the other tests' repair checks.
NICK = Key("user_by_nick", "nick")


@dataclass(frozen=True)
class Write:
    """One write of a schedule: ``kind`` of user ``who`` (a create: the new user's label), to ``value``."""

    kind: str  # create | rename | delete | touch
    who: str
    value: str = ""

    def __str__(self) -> str:
        if self.kind == "create":
            return f"create {self.who}={self.value}"
        if self.kind == "rename":
            return f"rename {self.who}->{self.value}"
        return f"{self.kind} {self.who}"


#: The writes of each kind: the first of a kind in a schedule, the second, the third.
VARIANTS: dict[str, list[Write]] = {
    "create": [Write("create", "N1", "V"), Write("create", "N2", "V"), Write("create", "N3", "V")],
    "rename-in": [Write("rename", "X", "V"), Write("rename", "Y", "V")],
    "rename-out": [Write("rename", "H", "W"), Write("rename", "H", "W2")],
    "delete": [Write("delete", "H"), Write("delete", "H")],
    "touch": [Write("touch", "H"), Write("touch", "H")],
    # H renamed to V, which it holds: nothing to do, unless a rename took it away meanwhile.
    "rename-home": [Write("rename", "H", "V"), Write("rename", "H", "V")],
    # A live user whose old row V was left behind by a killed rename: back to V, or deleted.
    "rename-back": [Write("rename", "Z", "V")],
    "delete-stale": [Write("delete", "Z"), Write("delete", "Z")],
}

#: The kinds of write that make sense from each initial state.
KINDS: dict[str, list[str]] = {
    "free": ["create", "rename-in"],
    "held": ["create", "rename-in", "rename-out", "rename-home", "delete", "touch"],
    "dead-row": ["create", "rename-in"],
    "pending-row": ["create", "rename-in"],
    "stale-row": ["create", "rename-in", "rename-back", "delete-stale"],
}
#: The labels of the values a schedule uses; each gets a fresh text.
VALUES = ("V", "W", "W2", "a", "b", "z")


def writes_of(kinds: Sequence[str]) -> list[Write]:
    """The writes of ``kinds``: the n-th of a kind is its n-th variant."""
    seen: dict[str, int] = {}
    out = []
    for kind in kinds:
        n = seen.get(kind, 0)
        seen[kind] = n + 1
        out.append(VARIANTS[kind][n])
    return out


def pairs() -> list[tuple[str, list[str]]]:
    """(initial state, two kinds) for every state and pair of its kinds that has writes for both."""
    out = []
    for initial, kinds in KINDS.items():
        for pair in itertools.combinations_with_replacement(kinds, 2):
            if pair[0] == pair[1] and len(VARIANTS[pair[0]]) < 2:
                continue
            out.append((initial, list(pair)))
    return out


# -- the state before the writes ---------------------------------------------------------------


@dataclass
class World:
    """One schedule's users and values, and what the model says holds what before the writes."""

    key: Key
    ids: dict[str, int]
    values: dict[str, str]
    #: The model: live users' labels and the label of the value each holds.
    live: dict[str, str]
    #: (owner, claimed ms) of the row of V a killed writer left (dead-row, pending-row, stale-row).
    left_row: tuple[int, int] | None = None
    #: The local id of this schedule's first user: its users are those at or past it.
    first_local: int = 0

    def label(self, id_or_value: object) -> str:
        """The label of an ID or a value's text ("?..." for one this schedule did not make)."""
        for label, known in (*self.ids.items(), *self.values.items()):
            if known == id_or_value:
                return label
        return f"?{id_or_value}"


def fresh_value(store: Store, key: Key, label: str) -> str:
    """A new value whose key row lives on the other host (shards 4-7) from the users (shard 1)."""
    shards = store.shard_map.shards
    while True:
        text = f"{label}-{uuid.uuid4().hex[:12]}"
        if key_shard(key.name, text.encode(), shards) >= shards // 2:
            return text


@contextlib.contextmanager
def claims_long_ago() -> Iterator[None]:
    """Claims made in here are dated past the grace period, as a store's rows are once it has run a while."""
    real = unique_module._now_ms
    with pytest.MonkeyPatch.context() as m:
        m.setattr(unique_module, "_now_ms", lambda: real() - 2 * int(CLAIM_GRACE_S * 1000))
        yield


def set_up(store: Store, key: Key, initial: str) -> World:
    """Fresh users and values for one schedule, in state ``initial`` (see `KINDS`)."""
    ctx = store.admin_context()
    assert ctx.unique is not None
    values = {label: fresh_value(store, key, label) for label in VALUES}
    world = World(key=key, ids={}, values=values, live={})

    def make(label: str, value: str) -> int:
        made = store.create("user", {key.field: values[value]}, shard=OBJECT_SHARD)
        world.ids[label] = made
        return made

    with claims_long_ago():
        for label, value in (("X", "a"), ("Y", "b")):
            make(label, value)
            world.live[label] = value
        if initial == "held":
            make("H", "V")
            world.live["H"] = "V"
        elif initial == "dead-row":
            # A delete killed after its mark, before its release.
            dead = make("D", "V")
            shard, spec, local_id, host = ctx.router.route(dead)
            ctx.objects.repo.delete(ctx.engines.shard(shard, host), spec.table, local_id)
        elif initial == "pending-row":
            # A create killed after its claim, before it went live.
            spec = ctx.router.type("user")
            text = json.dumps({key.field: values["V"]})
            pending, _local = ctx.objects._insert(spec, OBJECT_SHARD, text, pending=True)
            claim = ctx.unique.claim_of(ctx.config.unique[key.name], values["V"])
            assert claim is not None
            ctx.unique.claim(claim, pending, holders=ctx.objects)
            world.ids["P"] = pending
        elif initial == "stale-row":
            # A rename V -> z killed after its write, before its release.
            stale = make("Z", "V")
            with pytest.MonkeyPatch.context() as m:
                m.setattr(UniqueKeys, "release", lambda _self, _claims, _owner: None)
                store.update(stale, {key.field: values["z"]})
            world.live["Z"] = "z"
        else:
            assert initial == "free", initial
    world.first_local = ctx.router.route(world.ids["X"])[2]
    if initial != "free" and initial != "held":
        claim = ctx.unique.claim_of(ctx.config.unique[key.name], values["V"])
        assert claim is not None
        world.left_row = ctx.unique.owner_of(claim)
    return world


def bump(old: dict[str, Any]) -> dict[str, Any]:
    """The update that keeps the name: a counter goes up by one."""
    return {**old, "bio": int(old.get("bio", 0)) + 1}


def call_of(store: Store, world: World, w: Write) -> Callable[[], object]:
    """The call that makes write ``w``."""
    key, values, ids = world.key, world.values, world.ids
    if w.kind == "create":
        return lambda: store.create("user", {key.field: values[w.value]}, shard=OBJECT_SHARD)
    if w.kind == "rename":
        return lambda: store.update(ids[w.who], {key.field: values[w.value]})
    if w.kind == "delete":
        return lambda: store.delete(ids[w.who])
    assert w.kind == "touch", w
    return lambda: store.update(ids[w.who], bump)


# -- the checks ------------------------------------------------------------------------------

Result = tuple[object, ...]


def note_created(world: World, ws: list[Write], outcomes: list[object]) -> None:
    """Name the users the creates made (N1, N2, ...): the checks speak of them by label."""
    for w, outcome in zip(ws, outcomes, strict=True):
        if w.kind == "create" and isinstance(outcome, int):
            world.ids[w.who] = outcome


def results_of(world: World, ws: list[Write], outcomes: list[object], *, timeouts: bool) -> list[Result]:
    """Each write's outcome as the model states it: ("ok", ...), ("refused", holder), ("not found",), ..."""
    key = world.key
    out: list[Result] = []
    for w, outcome in zip(ws, outcomes, strict=True):
        if isinstance(outcome, DuplicateKeyError):
            assert (outcome.key, outcome.value) == (key.name, world.values[w.value]), f"{w}: {outcome}"
            out.append(("refused", world.label(outcome.owner)))
        elif isinstance(outcome, NotFound):
            out.append(("not found",))
        elif isinstance(outcome, WriteTimeoutError) and timeouts:
            out.append(("timed out",))
        elif isinstance(outcome, BaseException):
            raise AssertionError(f"{w} raised {outcome!r}") from outcome
        elif w.kind == "create":
            assert isinstance(outcome, int), outcome
            out.append(("ok",))
        elif w.kind == "delete":
            out.append((outcome,))
        else:
            assert isinstance(outcome, dict), outcome
            held = world.label(outcome.get(key.field))
            out.append(("ok", held) if w.kind == "rename" else ("ok", held, outcome.get("bio")))
    return out


def serial(
    live_before: dict[str, str], ws: list[Write], order: Sequence[int], skipped: set[int]
) -> tuple[dict[int, Result], dict[str, str], dict[str, int]]:
    """The writes run one after another in ``order``: each one's result, who holds what, the counters.

    The writes in ``skipped`` (timed out) change nothing.
    """
    live = dict(live_before)
    bio: dict[str, int] = {}
    results: dict[int, Result] = {}
    for i in order:
        w = ws[i]
        holder = next((u for u, v in live.items() if v == w.value and u != w.who), None)
        if i in skipped:
            results[i] = ("timed out",)
        elif w.kind == "delete":
            results[i] = (live.pop(w.who, None) is not None,)
        elif w.kind != "create" and w.who not in live:
            results[i] = ("not found",)
        elif w.kind == "touch":
            bio[w.who] = bio.get(w.who, 0) + 1
            results[i] = ("ok", live[w.who], bio[w.who])
        elif holder is not None:
            results[i] = ("refused", holder)
        else:
            live[w.who] = w.value
            results[i] = ("ok",) if w.kind == "create" else ("ok", w.value)
    return results, live, {u: n for u, n in bio.items() if u in live}


def check_serial(
    store: Store, world: World, ws: list[Write], run: Schedule, where: str, *, timeouts: bool
) -> None:
    """(5): the results and the final state are those of a serial order that keeps real time."""
    ctx = store.admin_context()
    results = results_of(world, ws, run.outcomes, timeouts=timeouts)
    live: dict[str, str] = {}
    bio: dict[str, int] = {}
    for label, id_ in world.ids.items():
        state, data = ctx.objects.holder("user", id_)
        if state is Holder.LIVE:
            assert data is not None
            live[label] = world.label(data.get(world.key.field))
            if data.get("bio"):
                bio[label] = int(data["bio"])
    first: dict[int, int] = {}
    returned: dict[int, int] = {}
    for n, (kind, i, _step) in enumerate(run.events):
        if kind == "step":
            first.setdefault(i, n)
        else:
            returned[i] = n
    # A write that returned before another made its first step comes first in any serial order.
    before = [(a, b) for a in returned for b in first if a != b and returned[a] < first[b]]
    skipped = {i for i, r in enumerate(results) if r == ("timed out",)}
    tried = []
    for order in itertools.permutations(range(len(ws))):
        at = {i: n for n, i in enumerate(order)}
        if any(at[a] > at[b] for a, b in before):
            continue
        want, want_live, want_bio = serial(world.live, ws, order, skipped)
        if [want[i] for i in range(len(ws))] == results and want_live == live and want_bio == bio:
            return
        tried.append(f"{[str(ws[i]) for i in order]}: {[want[i] for i in range(len(ws))]} {want_live}")
    raise AssertionError(
        f"no serial order explains {where}:\nresults {results}, holding {live}, counters {bio}\n"
        + "\n".join(tried)
    )


def users_of(store: Store, world: World) -> list[tuple[int, str, dict[str, Any]]]:
    """(ID, live/pending/dead, data) of every user of the schedule, read from the users' shard."""
    ctx = store.admin_context()
    spec = ctx.router.type("user")
    h = ctx.engines.shard(OBJECT_SHARD, ctx.shard_map.master(OBJECT_SHARD))
    sql = (
        f"SELECT local_id, active, version, data FROM {h.table(spec.table)} "
        f"WHERE local_id >= {int(world.first_local)}"
    )
    out = []
    for local_id, active, version, text in h.read(sql, (), one=False):
        state = "live" if active else "dead" if int(version) else "pending"
        out.append((encode_pinterest(OBJECT_SHARD, spec.id, int(local_id)), state, json.loads(text)))
    return out


def check_rows(store: Store, world: World, where: str) -> None:
    """(1)-(4) and repair's dry run, on what the databases hold now (every write has returned).

    The row a killed writer left before the schedule (`World.left_row`) may stay as it was
    if no write claimed its value: it backs nothing, a claim takes it over, and repair
    reports it, alone.
    """
    ctx = store.admin_context()
    assert ctx.unique is not None
    key = world.key
    ours = {text.encode(): label for label, text in world.values.items()}
    rows: dict[bytes, tuple[int, int]] = {}
    for value, owner, ms, h in ctx.unique.rows(key.name):
        if value in ours:
            assert h.shard == key_shard(key.name, value, store.shard_map.shards), where
            rows[value] = (owner, ms)
    v = world.values["V"].encode()
    left = world.left_row is not None and rows.get(v) == world.left_row
    left_owner = world.left_row[0] if left and world.left_row is not None else None
    users = users_of(store, world)
    holding: dict[bytes, list[int]] = {}
    for id_, state, data in users:
        value = str(data.get(key.field, "")).encode()
        if value not in ours:
            continue
        if state == "pending":
            assert id_ == left_owner, (
                f"(2) user {world.label(id_)} left pending holding {ours[value]} after {where}"
            )
        if state == "live":
            holding.setdefault(value, []).append(id_)
    for value, ids in holding.items():
        held_by = [world.label(i) for i in ids]
        assert len(ids) == 1, f"(1) {ours[value]} held by live users {held_by} after {where}"
    for value, (owner, _ms) in rows.items():
        if left and value == v:
            continue
        now, now_data = ctx.objects.holder("user", owner)
        held = None if now_data is None else str(now_data.get(key.field, "")).encode()
        assert (now, held) == (Holder.LIVE, value), (
            f"(2) the row of {ours[value]} names {world.label(owner)}, {now.value}"
            f"{'' if held is None else ' holding ' + world.label(held.decode())}, after {where}"
        )
    for value, ids in holding.items():
        row_owner = rows.get(value, (None, 0))[0]
        assert row_owner == ids[0], (
            f"(3) {world.label(ids[0])} holds {ours[value]}, its row names {world.label(row_owner)}, "
            f"after {where}"
        )
    for value, label in ours.items():
        found = store.lookup(key.name, value.decode())
        want: int | None = holding[value][0] if value in holding else None
        if left and value == v:
            want = left_owner  # (a lookup reads the row: repair's to fix)
        assert found == want, (
            f"(4) lookup({label}) = {world.label(found)}, not {world.label(want)}, after {where}"
        )
    report = repair_unique(store, dry_run=True)
    found_any = (
        report.removed,
        report.added,
        report.repointed,
        report.conflicts,
        report.dead_owners,
        report.unclaimed,
    )
    expected: tuple[object, ...] = ({}, {}, {}, [], [], [])
    if left:
        expected = ({key.name: 1}, {}, {}, [], [(key.name, world.values["V"], left_owner)], [])
    assert found_any == expected, f"repair would change {found_any} after {where}"


def retire(store: Store, world: World) -> None:
    """Take a schedule's users and rows away once it is checked (passed or not): every later check,
    and repair's dry run (which reads every live user), sees only its own."""
    ctx = store.admin_context()
    assert ctx.unique is not None
    spec = ctx.config.unique[world.key.name]
    for text in world.values.values():
        claim = ctx.unique.claim_of(spec, text)
        assert claim is not None
        row = ctx.unique.owner_of(claim)
        if row is not None:
            ctx.unique.release([claim], row[0])
    h = ctx.engines.shard(OBJECT_SHARD, ctx.shard_map.master(OBJECT_SHARD))
    table = ctx.router.type("user").table
    for id_, state, _data in users_of(store, world):
        if state == "live":
            ctx.objects.repo.delete(h, table, ctx.router.route(id_)[2])
        elif state == "pending":
            ctx.objects.abandon("user", id_)


def explore_writes(
    store: Store, key: Key, initial: str, kinds: Sequence[str], *, timeouts: bool = False
) -> int:
    """Run every schedule of the writes of ``kinds`` from state ``initial``, checking each; how many ran.

    ``timeouts``: a write may time out (`WriteTimeoutError`, nothing written), as when every
    claim is past the grace period the moment it is made.
    """
    ws = writes_of(kinds)
    labels = [str(w) for w in ws]
    steps = store.admin_context().steps
    assert steps is not None

    def install(hook: Hook | None) -> None:
        steps.hook = hook

    def run(prefix: list[int]) -> tuple[Schedule, Callable[[], None]]:
        world = set_up(store, key, initial)
        done = run_schedule(install, [call_of(store, world, w) for w in ws], prefix, quiet=QUIET)

        def check() -> None:
            where = f"{' + '.join(labels)} from {initial}: {done.steps(labels)}"
            note_created(world, ws, done.outcomes)
            try:
                check_rows(store, world, where)
                check_serial(store, world, ws, done, where, timeouts=timeouts)
            finally:
                retire(store, world)

        return done, check

    # Two writes of one kind: twins (see the module's text).
    return explore(run, twins=(0, 1) if _twins(kinds) else None)


def _twins(kinds: list[str]) -> bool:
    """Whether the two writes are one kind twice (their mirrored schedules run alike)."""
    return len(kinds) == 2 and kinds[0] == kinds[1]


def least_runs(kinds: list[str]) -> int:
    """The schedules an exploration of two writes must have run: both orders, or for twins the one
    order left of the two (where a write locks its shard up front, SQLite, that can be all)."""
    return 1 if _twins(kinds) else 2


def keyed(config: StoreConfig, key: Key) -> StoreConfig:
    """``config`` with ``key`` as its one unique key."""
    return replace(config, unique={key.name: UniqueSpec(key.name, "user", key.field)})


@pytest.fixture(scope="module")
def mariadb_keyed(mariadb_ready: StoreConfig) -> StoreConfig:
    """The MariaDB test config (shards 0-3 on MySQL001A, 4-7 on MySQL002A) with its key tables made."""
    config = keyed(mariadb_ready, HANDLE)
    init_shards(config)  # adds the unique_keys table (idempotent)
    return config


#: Violations this checker found in `store` as it is, each with the schedule that shows it.
FOUND: dict[tuple[str, ...], pytest.MarkDecorator] = {}


def params(cases: list[tuple[str, list[str]]]) -> list[Any]:
    """``cases`` as pytest parameters, "state:kind+kind" each, marked if in `FOUND`."""
    return [pytest.param(i, k, id=f"{i}:{'+'.join(k)}", marks=FOUND.get((i, *k), ())) for i, k in cases]


@pytest.mark.parametrize(("initial", "kinds"), params(pairs()))
def test_two_writes_of_one_value_on_mariadb(
    mariadb_keyed: StoreConfig, initial: str, kinds: list[str]
) -> None:
    with Store(mariadb_keyed) as store:
        runs = explore_writes(store, HANDLE, initial, kinds)
        print(f"schedules: {runs}")
        assert runs >= least_runs(kinds)


SQLITE_PAIRS = [
    ("free", ["create", "create"]),
    ("free", ["create", "rename-in"]),
    ("held", ["create", "delete"]),
    ("held", ["rename-in", "rename-out"]),
    ("held", ["rename-out", "delete"]),
    ("pending-row", ["create", "create"]),
    ("held", ["rename-out", "rename-home"]),
]


@pytest.mark.parametrize(("initial", "kinds"), params(SQLITE_PAIRS))
def test_two_writes_of_one_value_on_sqlite(tmp_path: Path, initial: str, kinds: list[str]) -> None:
    with Store(keyed(StoreConfig.from_dict(sqlite_config(tmp_path)), HANDLE)) as store:
        runs = explore_writes(store, HANDLE, initial, kinds)
        print(f"schedules: {runs}")
        assert runs >= least_runs(kinds)


THREES = [
    # Two takers racing the delete that frees the value.
    ("held", ["delete", "create", "rename-in"]),
    # The old bug's race (a delete and a rename of one user), and a create of the value it frees.
    ("held", ["rename-out", "delete", "create"]),
]


@pytest.mark.parametrize(("initial", "kinds"), params(THREES))
def test_three_writes_of_one_value_on_mariadb(
    mariadb_keyed: StoreConfig, initial: str, kinds: list[str]
) -> None:
    with Store(mariadb_keyed) as store:
        runs = explore_writes(store, HANDLE, initial, kinds)
        print(f"schedules: {runs}")
        assert runs >= 20


#: (free: create + rename-in holds too, but over some 3,000 schedules: minutes, not seconds.)
EXPIRED = [
    ("free", ["create", "create"]),
    ("held", ["create", "rename-out"]),
    ("held", ["rename-in", "rename-out"]),
]


@pytest.mark.parametrize(("initial", "kinds"), params(EXPIRED))
def test_two_writes_when_every_claim_is_past_the_grace_period(
    mariadb_keyed: StoreConfig, initial: str, kinds: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As if each write stalled past `CLAIM_GRACE_S` between any two steps: every takeover rule applies."""
    monkeypatch.setattr(unique_module, "CLAIM_GRACE_S", -1.0)
    with Store(mariadb_keyed) as store:
        runs = explore_writes(store, HANDLE, initial, kinds, timeouts=True)
        print(f"schedules: {runs}")
        assert runs >= least_runs(kinds)


def test_the_checker_finds_a_delete_that_frees_what_it_read_before_its_lock(
    mariadb_keyed: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old bug: a delete racing a rename (V to W) frees the value read before the rename's lock,
    so W stays held by a deleted user. The checker finds it."""

    def delete_unlocked(self: ObjectService, id: int, *, type_name: str | None) -> bool:  # noqa: A002
        shard, spec, local_id, _host = self._router.route(id, type_name)
        unique = self._unique
        assert unique is not None
        text = self._steps("read", lambda: self.repo.get(self._at(shard), spec.table, local_id))
        held = [] if text is None else unique.held_by(spec.name, self.repo.decode(text))
        was_live = self._steps("delete", lambda: self.repo.delete(self._at(shard), spec.table, local_id))
        unique.release(held, id)
        return was_live

    with Store(keyed(mariadb_keyed, NICK)) as store:
        with monkeypatch.context() as m:
            m.setattr(ObjectService, "delete", delete_unlocked)
            with pytest.raises(AssertionError, match=r"\(2\) the row of W names H, dead") as found:
                explore_writes(store, NICK, "held", ["rename-out", "delete"])
        print(str(found.value).splitlines()[0])


def test_the_checker_finds_a_takeover_that_does_not_ask_the_holder(
    mariadb_keyed: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim that takes any row over without asking its holder: two creates both go live holding V."""
    with Store(keyed(mariadb_keyed, NICK)) as store:
        with monkeypatch.context() as m:
            m.setattr(UniqueKeys, "_free", lambda _self, _c, holder, *_rest: holder != 0)
            with pytest.raises(AssertionError, match=r"\(1\) V held by live users") as found:
                explore_writes(store, NICK, "free", ["create", "create"])
        print(str(found.value).splitlines()[0])
