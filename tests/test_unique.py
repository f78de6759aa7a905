"""Unique keys (config ``unique:``): lookup rows sharded by the key's hash, claimed first.

On SQLite and MariaDB (each with and without caches) and PostgreSQL with
Instagram IDs: create and update refuse a taken value and change nothing;
16 threads racing for one username give it to exactly one, every round; a
rename under concurrent lookups never shows the name free; repair removes
orphaned rows and adds missing ones.
"""

from __future__ import annotations

import json
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from store import CacheConfig, DataError, DuplicateKeyError, Store, StoreConfig, UnknownTypeError
from store.admin import init_shards, repair_unique
from store.specs import UniqueSpec
from store.unique import CLAIM_GRACE_S, key_shard
from tests.asyncface import blocking_store
from tests.conftest import repair_past_every_grace

#: The ``store`` fixture's tests run on the sync and the async face (`tests.asyncface`).
BOTH_FACES = True

UNIQUE = {
    "user_by_username": UniqueSpec("user_by_username", "user", "username"),
    "user_by_email": UniqueSpec("user_by_email", "user", "email"),
}


@pytest.fixture
def ustore(config: StoreConfig, backend: str, face: str) -> Iterator[Store]:
    """The ``store`` fixture's backends and faces, with two unique keys on users."""
    keyed = replace(config, unique=UNIQUE)
    if backend.startswith("mariadb"):
        init_shards(keyed)  # adds the unique_keys table (idempotent)
    with blocking_store(keyed, face) as s:
        yield s


def _unique_name(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


def test_create_claims_and_lookup_finds(ustore: Store) -> None:
    name, mail = _unique_name("ada"), _unique_name("ada@x")
    ada = ustore.create("user", {"username": name, "email": mail})
    assert ustore.lookup("user_by_username", name) == ada
    assert ustore.lookup("user_by_email", mail) == ada
    assert ustore.lookup("user_by_username", name + "-other") is None
    with pytest.raises(DuplicateKeyError) as err:
        ustore.create("user", {"username": name, "email": _unique_name("b@x")})
    assert (err.value.key, err.value.value, err.value.owner) == ("user_by_username", name, ada)
    assert name in str(err.value)
    # The refused create changed nothing: its other key is still free.
    free = _unique_name("c@x")
    with pytest.raises(DuplicateKeyError):
        ustore.create("user", {"username": name, "email": free})
    assert ustore.lookup("user_by_email", free) is None
    # A user without the field holds no key.
    anon = ustore.create("user", {"email": _unique_name("anon@x")})
    assert ustore.get(anon) is not None


def test_values_are_exact_and_checked(ustore: Store) -> None:
    name = _unique_name("Bob")
    bob = ustore.create("user", {"username": name})
    assert ustore.lookup("user_by_username", name.lower()) is None  # exact bytes, no case folding
    other = ustore.create("user", {"username": name.lower()})
    assert other != bob
    for bad in ({"x": 1}, [1], 1.5, True, "", "x" * 600):
        with pytest.raises(DataError, match="unique key"):
            ustore.create("user", {"username": bad})
    with pytest.raises(UnknownTypeError, match="no unique key"):
        ustore.lookup("user_by_nothing", "x")
    number = uuid.uuid4().int % 10**15
    n = ustore.create("user", {"username": number})  # an int is its decimal text
    assert ustore.lookup("user_by_username", str(number)) == n


def test_rename_claims_the_new_value_and_frees_the_old(ustore: Store) -> None:
    old, new = _unique_name("old"), _unique_name("new")
    u = ustore.create("user", {"username": old})
    ustore.update(u, {"username": new})
    assert ustore.lookup("user_by_username", new) == u
    assert ustore.lookup("user_by_username", old) is None
    v = ustore.create("user", {"username": old})  # the old value is free again
    # A rename onto a taken value is refused whole: nothing written, nothing claimed.
    with pytest.raises(DuplicateKeyError):
        ustore.update(v, {"username": new, "bio": "x"})
    assert ustore.get(v) == {"username": old}
    assert ustore.lookup("user_by_username", old) == v
    # A function update is keyed too; an update that leaves the value keeps it.
    ustore.update(u, lambda o: {**o, "bio": "hi"})
    assert ustore.lookup("user_by_username", new) == u


def test_delete_frees_the_values(ustore: Store) -> None:
    name = _unique_name("gone")
    u = ustore.create("user", {"username": name})
    ustore.delete(u)
    assert ustore.lookup("user_by_username", name) is None
    again = ustore.create("user", {"username": name})
    assert ustore.lookup("user_by_username", name) == again


def test_sixteen_threads_racing_for_one_name_give_it_to_one(ustore: Store, backend: str) -> None:
    rounds = 200 if backend == "mariadb" else 30
    lock = threading.Lock()
    for r in range(rounds):
        name = f"race-{r}-{_unique_name('u')}"
        won: list[int] = []
        refused = [0]
        start = threading.Barrier(16)

        def claim(name: str, won: list[int], refused: list[int], start: threading.Barrier) -> None:
            start.wait()
            try:
                made = ustore.create("user", {"username": name})
            except DuplicateKeyError:
                with lock:
                    refused[0] += 1
                return
            with lock:
                won.append(made)

        threads = [threading.Thread(target=claim, args=(name, won, refused, start)) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, f"round {r}: {len(won)} owners"
        assert refused[0] == 15
        assert ustore.lookup("user_by_username", name) == won[0]


def test_a_rename_never_shows_the_name_free(ustore: Store) -> None:
    """Readers look up both names while a user renames back and forth: at every moment one of them is held."""
    a, b = _unique_name("a"), _unique_name("b")
    u = ustore.create("user", {"username": a})
    stop = threading.Event()
    bad: list[str] = []
    #: Renames begun and ended so far (read by the readers to know how many overlapped their reads).
    began, ended = [0], [0]

    def reader() -> None:
        while not stop.is_set():
            # Read b first, then a: a rename a->b claims b before freeing a, b->a claims a before freeing b.
            # Three reads that see nothing held prove a moment with both names free only if at most one
            # rename overlapped them (two renames in between can free each name just before its read).
            done_before = ended[0]
            first = ustore.lookup("user_by_username", b)
            second = ustore.lookup("user_by_username", a)
            if first is None and second is None:
                third = ustore.lookup("user_by_username", b)
                if third is None and began[0] - done_before <= 1:
                    bad.append("both free")
            for got in (first, second):
                if got not in (None, u):
                    bad.append(f"held by {got}")

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for t in readers:
        t.start()
    try:
        for i in range(40):
            began[0] += 1
            ustore.update(u, {"username": b if i % 2 == 0 else a})
            ended[0] += 1
    finally:
        stop.set()
        for t in readers:
            t.join()
    assert not bad, bad[:5]


def _create_killed_after_its_claim(store: Store, name: str) -> int:
    """What a create killed between its claim and making the object live leaves: a pending
    object and a claim in its ID's name. The ID."""
    ctx = store.admin_context()
    assert ctx.unique is not None
    spec = ctx.router.type("user")
    new, _key = ctx.objects._insert(spec, 0, json.dumps({"username": name}), pending=True)
    claim = ctx.unique.claim_of(UNIQUE["user_by_username"], name)
    assert claim is not None
    ctx.unique.claim(claim, new, holders=ctx.objects)
    return new


def test_repair_removes_orphans_and_adds_missing_rows(ustore: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = ustore.admin_context()
    assert ctx.unique is not None
    repair_past_every_grace(ustore)  # what earlier tests of the namespace left
    kept, lost = _unique_name("kept"), _unique_name("lost")
    u = ustore.create("user", {"username": kept})
    w = ustore.create("user", {"username": lost})
    # Orphans: a claim whose create died before the object went live, a claim of an earlier
    # version's create (owner 0), and a missing row (released behind the store's back).
    dead = _unique_name("dead")
    pending = _create_killed_after_its_claim(ustore, dead)
    dead_claim = ctx.unique.claim_of(UNIQUE["user_by_username"], dead)
    assert dead_claim is not None
    assert ctx.unique.owner_of(dead_claim) is not None  # its row names it,
    assert ustore.lookup("user_by_username", dead) is None  # but a pending object holds nothing
    legacy = _unique_name("legacy")
    claim = ctx.unique.claim_of(UNIQUE["user_by_username"], legacy)
    assert claim is not None
    ctx.unique.claim(claim, 0, holders=ctx.objects)
    lost_claim = ctx.unique.claim_of(UNIQUE["user_by_username"], lost)
    assert lost_claim is not None
    ctx.unique.release([lost_claim], w)
    assert ustore.lookup("user_by_username", lost) is None
    # The dead create's claim goes at once (its object is abandoned: it can never go live);
    # a young owner-0 row may still be an earlier version's create under way: left alone.
    young = repair_unique(ustore, dry_run=True)
    assert young.removed == {"user_by_username": 1}
    assert young.dead_owners == [("user_by_username", dead, pending)]
    assert young.added == {"user_by_username": 1}
    assert young.unclaimed == [("user_by_username", lost, w)]
    fixed = repair_unique(ustore)
    assert fixed.removed == {"user_by_username": 1}
    assert ustore.lookup("user_by_username", dead) is None
    assert ustore.admin_context().objects.holder("user", pending)[0].value == "dead"
    assert ustore.lookup("user_by_username", lost) == w
    assert ustore.lookup("user_by_username", kept) == u
    # Once past the grace period, the owner-0 row goes too.
    import store.unique as unique_module

    monkeypatch.setattr(unique_module, "CLAIM_GRACE_S", -1.0)
    later = repair_unique(ustore)
    assert later.removed == {"user_by_username": 1}
    assert ustore.lookup("user_by_username", legacy) is None
    again = repair_unique(ustore)
    assert (again.removed, again.added, again.repointed) == ({}, {}, {})


def test_a_dead_claim_is_taken_over(ustore: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # A create that died after its claim: its object may still be under way until the grace
    # period is over; then the next claim abandons it (it can never go live) and takes the name.
    name = _unique_name("stuck")
    pending = _create_killed_after_its_claim(ustore, name)
    with pytest.raises(DuplicateKeyError) as err:
        ustore.create("user", {"username": name})
    assert err.value.owner == pending
    import store.unique as unique_module

    with monkeypatch.context() as m:
        m.setattr(unique_module, "CLAIM_GRACE_S", -1.0)
        u = ustore.create("user", {"username": name})
    assert ustore.lookup("user_by_username", name) == u
    ctx = ustore.admin_context()
    assert ctx.objects.abandon("user", pending) is False  # abandoned already: it never goes live
    assert ustore.get(pending) is None
    # A deleted owner's row (a delete killed before its release) is free at once.
    other = _unique_name("gone")
    v = ustore.create("user", {"username": other})
    ctx.objects.repo.delete(
        ctx.engines.shard(ctx.router.route(v)[0], ctx.router.route(v)[3]), "users", ctx.router.route(v)[2]
    )
    other_claim = ctx.unique.claim_of(UNIQUE["user_by_username"], other)
    assert other_claim is not None
    assert (ctx.unique.owner_of(other_claim) or (0, 0))[0] == v  # the row still names it,
    assert ustore.lookup("user_by_username", other) is None  # but a deleted user holds nothing
    w = ustore.create("user", {"username": other})
    assert ustore.lookup("user_by_username", other) == w
    # A live owner that holds the value never loses it, whatever the row's age.
    with monkeypatch.context() as m:
        m.setattr(unique_module, "CLAIM_GRACE_S", -1.0)
        with pytest.raises(DuplicateKeyError):
            ustore.create("user", {"username": other})


def test_check_reports_rows_of_dead_holders_and_values_without_rows(tmp_path: Path) -> None:
    from store.admin import check_store
    from tests.conftest import sqlite_config

    config = replace(StoreConfig.from_dict(sqlite_config(tmp_path)), unique=UNIQUE)
    with Store(config) as store:
        ctx = store.admin_context()
        assert ctx.unique is not None
        assert check_store(store).ok
        gone, bare, dead = _unique_name("gone"), _unique_name("bare"), _unique_name("dead")
        u = store.create("user", {"username": gone})
        v = store.create("user", {"username": bare})
        pending = _create_killed_after_its_claim(store, dead)
        # A delete killed after its mark, before its release; a row lost behind the store's back.
        shard, _spec, key, host = ctx.router.route(u)
        ctx.objects.repo.delete(ctx.engines.shard(shard, host), "users", key)
        bare_claim = ctx.unique.claim_of(UNIQUE["user_by_username"], bare)
        assert bare_claim is not None
        ctx.unique.release([bare_claim], v)
        report = check_store(store)
        lines = [f.line() for f in report.problems if f.kind == "unique key"]
        assert len(lines) == 3, lines
        assert any(gone in line and str(u) in line for line in lines)
        assert any(dead in line and str(pending) in line for line in lines)
        assert any(bare in line and str(v) in line and "no user_by_username row" in line for line in lines)
        repair_unique(store)
        assert check_store(store).ok
        assert store.lookup("user_by_username", bare) == v
        assert store.lookup("user_by_username", gone) is None


def test_key_rows_live_on_the_shard_of_the_keys_hash() -> None:
    shards = {key_shard("user_by_username", f"user{i}".encode(), 8) for i in range(200)}
    assert shards == set(range(8))
    assert key_shard("k", b"v", 8) == key_shard("k", b"v", 8)
    assert CLAIM_GRACE_S > 0


def test_config_unique_is_checked() -> None:
    from tests.conftest import base_config

    raw = base_config(shards=1, hosts={"A": "sqlite:///x"}, map=[{"range": [0, 0], "master": "A"}])
    ok = StoreConfig.from_dict({**raw, "unique": {"user_by_username": {"type": "user", "field": "username"}}})
    assert ok.unique["user_by_username"] == UniqueSpec("user_by_username", "user", "username")
    for bad, words in (
        ({"x": {"type": "nope", "field": "f"}}, "not a type"),
        ({"x": {"type": "user"}}, "unique.x must be"),
        ({"Bad Name": {"type": "user", "field": "f"}}, "lower_snake_case"),
        ({"a": {"type": "user", "field": "f"}, "b": {"type": "user", "field": "f"}}, "keep one"),
        (["x"], "unique must map"),
    ):
        with pytest.raises(Exception, match=words):
            StoreConfig.from_dict({**raw, "unique": bad})


@pytest.mark.parametrize("cached", [False, True], ids=["uncached", "memory-cache"])
def test_instagram_ids_on_postgresql(postgres_ready: StoreConfig, cached: bool) -> None:
    keyed = replace(
        postgres_ready, unique=UNIQUE, cache=CacheConfig(memory=True) if cached else postgres_ready.cache
    )
    init_shards(keyed)
    with Store(keyed) as s:
        name = _unique_name("pg")
        u = s.create("user", {"username": name})
        assert s.lookup("user_by_username", name) == u
        with pytest.raises(DuplicateKeyError):
            s.create("user", {"username": name})
        s.update(u, {"username": name + "2"}, type_name="user")
        assert s.lookup("user_by_username", name) is None
        assert s.lookup("user_by_username", name + "2") == u


def test_cli_lookup_and_repair(tmp_path: Path) -> None:
    """`store lookup` and `store relations repair` in processes of their own, on SQLite files."""
    import yaml

    from tests.conftest import run_cli, sqlite_config

    raw = sqlite_config(tmp_path)
    raw["unique"] = {"user_by_username": {"type": "user", "field": "username"}}
    path = tmp_path / "store.yaml"
    path.write_text(yaml.safe_dump(raw))
    with Store.from_config(path) as s:
        ada = s.create("user", {"username": "ada"})
    assert run_cli(path, "lookup", "user_by_username", "ada").strip() == str(ada)
    assert json.loads(run_cli(path, "lookup", "user_by_username", "ada", "--json")) == {
        "key": "user_by_username",
        "value": "ada",
        "id": ada,
    }
    with pytest.raises(subprocess.CalledProcessError) as err:
        run_cli(path, "lookup", "user_by_username", "nobody")
    assert err.value.returncode == 1
    assert "no live object holds user_by_username 'nobody'" in err.value.stderr
    out = run_cli(path, "relations", "repair", "--dry-run")
    assert "unique keys: 1 row(s) checked" in out
    doc = json.loads(run_cli(path, "relations", "repair", "--dry-run", "--json"))
    assert doc["unique_keys"] == {"checked": 1, "removed": {}, "added": {}, "repointed": {}, "conflicts": []}


def test_plain_function_updates_that_rename_always_land(
    ustore: Store, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """6 threads rename one user, each new name made from the old object: no ConflictError without
    if_version (a claim made from a stale read is made again until it lands), each call applied once."""
    base = _unique_name("n")
    u = ustore.create("user", {"username": f"{base}-0", "n": 0})
    per_thread = 25 if backend.startswith("mariadb") else 10
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def renamer() -> None:
        start.wait()
        try:
            for _i in range(per_thread):
                ustore.update(u, lambda o: {**o, "username": f"{base}-{o['n'] + 1}", "n": o["n"] + 1})
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=renamer) for _k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], errors[:3]
    got = ustore.get_with_version(u)
    assert got is not None
    total = 6 * per_thread
    assert got.data == {"username": f"{base}-{total}", "n": total}
    assert got.version == total + 1
    assert ustore.lookup("user_by_username", f"{base}-{total}") == u
    # Names claimed from stale reads may stay the user's claims for the grace period (a create
    # of one is refused, and lookup says so); none is anybody else's, and then they go.
    assert {ustore.lookup("user_by_username", f"{base}-{k}") for k in range(total)} <= {u, None}
    import store.unique as unique_module

    monkeypatch.setattr(unique_module, "CLAIM_GRACE_S", -1.0)
    repair_unique(ustore)
    for k in range(total):
        assert ustore.lookup("user_by_username", f"{base}-{k}") is None
