"""A writer SIGKILLed at every step boundary of create, rename and delete, then `store relations repair`.

Each write of an object with unique keys is a plan of steps (`store.steps`):
the writer runs in a process of its own that kills itself (SIGKILL: no
cleanup, no rollback but the server's) just before its k-th step, for every
k until the write finishes. After each kill, `store relations repair` runs
as an operator would. Then, as of that repair: no value is held by two live
objects, no key row names a dead or pending object or one that does not hold
its value, every value a live object holds has its row, the killed write was
applied at most once (once if its object's step committed), and the value can
be taken by a new create when no live object holds it.

On MariaDB with the object on one host and its keys' rows on the other. The
writers and the repairs are children of a process that imported the package
once (`tests.prefork`): each a process of its own, without a Python start.

A rename killed after its claim leaves a row its live object does not hold,
which repair must leave for the grace period (the rename may be under way,
see `store.unique`). Such a row becomes one to fix when its grace runs out,
whenever that is: on a loaded machine, a minute after its claim falls in a
later case of this test, after that case's last repair. So the rows are
judged as of the last repair's start, not of the moment the test looks.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from store import DuplicateKeyError, Store, StoreConfig
from store import unique as unique_module
from store.admin import init_shards, repair_unique
from store.unique import CLAIM_GRACE_S, Holder, key_shard
from tests.conftest import mariadb_config, repair_past_every_grace
from tests.prefork import Prefork

UNIQUE = {
    "user_by_username": {"type": "user", "field": "username"},
    "user_by_email": {"type": "user", "field": "email"},
}
SHARDS = 8
OBJECT_SHARD = 1  # on host MySQL001A; every key below lives on MySQL002A (shards 4-7)

WRITER = """
import json, os, signal, sys, yaml
from store import Store
raw = yaml.safe_load(open(sys.argv[1]))
op, kill_at, args = sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
seen = []
def hook(name):
    seen.append(name)
    print("STEP", name, flush=True)
    if len(seen) == kill_at + 1:
        os.kill(os.getpid(), signal.SIGKILL)
with Store.from_config(raw) as store:
    store.admin_context().steps.hook = hook
    if op == "create":
        out = store.create("user", args["data"], shard=args["shard"])
    elif op == "rename":
        out = store.update(args["id"], lambda o: {**o, "username": args["to"], "n": o["n"] + 1})
    else:
        out = store.delete(args["id"])
    print("DONE", json.dumps(out), flush=True)
"""


def name_on_other_host(tag: str) -> str:
    """A value whose rows (both keys) live on shards 4-7, the host the object is not on."""
    for i in range(10_000):
        name = f"{tag}-{uuid.uuid4().hex[:6]}-{i}"
        if all(key_shard(k, name.encode(), SHARDS) >= 4 for k in UNIQUE):
            return name
    raise AssertionError("no such name")


def run_writer(
    children: Prefork, config_file: Path, op: str, kill_at: int, args: dict[str, Any]
) -> tuple[bool, list[str], Any]:
    """(killed, the steps it reached, its result if it finished)."""
    done = children.run([str(config_file), op, str(kill_at), json.dumps(args)], code=WRITER, timeout=60)
    lines = done.stdout.splitlines()
    steps = [line.split(" ", 1)[1] for line in lines if line.startswith("STEP ")]
    if done.returncode == -signal.SIGKILL:
        return True, steps, None
    assert done.returncode == 0, done.stderr
    result = [json.loads(line.split(" ", 1)[1]) for line in lines if line.startswith("DONE ")]
    return False, steps, result[0]


def keys_consistent(store: Store, repaired_ms: int) -> None:
    """Rows and objects agree exactly as of the repair started at ``repaired_ms``.

    `repair_unique`'s dry run, judging claims' ages at that instant, finds
    nothing to fix. And, read row by row (not by repair's own rules): every
    row names a live object that holds its value, or one that claimed it
    within the grace period before that repair (a killed rename's claim,
    which repair had to leave; its grace may have run out since).
    """
    with pytest.MonkeyPatch.context() as m:
        m.setattr(unique_module, "_now_ms", lambda: repaired_ms)
        report = repair_unique(store, dry_run=True)
    assert report.conflicts == [], f"a value held by several live objects: {report.conflicts}"
    assert report.dead_owners == [], f"rows that name no live holder: {report.dead_owners}"
    assert report.unclaimed == [], f"values held with no row: {report.unclaimed}"
    assert (report.removed, report.added, report.repointed) == ({}, {}, {}), report

    ctx = store.admin_context()
    assert ctx.unique is not None
    grace_from = repaired_ms - int(CLAIM_GRACE_S * 1000)
    for name, spec in ctx.config.unique.items():
        for value, owner, claimed_ms, _h in ctx.unique.rows(name):
            state, data = ctx.objects.holder(spec.type, owner)
            row = (name, value.decode(), owner, state.value, data, claimed_ms)
            assert state is Holder.LIVE, f"a row of an object not live: {row}"
            assert data is not None
            if ctx.unique.held(spec, data) != value:
                assert claimed_ms >= grace_from, f"a claim past its grace at the repair, left: {row}"


@pytest.fixture
def setup(mariadb_ready: StoreConfig, tmp_path: Path) -> Iterator[tuple[Path, StoreConfig]]:
    raw = mariadb_config()
    raw["unique"] = UNIQUE
    config_file = tmp_path / "store.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    config = StoreConfig.from_dict(raw)
    init_shards(config.for_admin())  # the unique-key tables (idempotent)
    yield config_file, config
    # The killed renames' claims, left for their grace period, would be a later test's orphans
    # (the namespace's tables are shared by the session's tests).
    with Store(config) as store:
        repair_past_every_grace(store)


@pytest.fixture(scope="module")
def children() -> Iterator[Prefork]:
    with Prefork() as server:
        yield server


def repair(children: Prefork, config_file: Path) -> int:
    """`store relations repair`; the time it started (it judges claims' ages no earlier)."""
    started = unique_module._now_ms()
    done = children.run(["relations", "repair", "--config", str(config_file)], module="store.cli")
    assert done.returncode == 0, done.stderr
    return started


@pytest.mark.parametrize("op", ["create", "rename", "delete"])
def test_a_writer_killed_at_every_step_leaves_nothing_repair_cannot_fix(
    setup: tuple[Path, StoreConfig], children: Prefork, op: str
) -> None:
    config_file, config = setup
    kills = 0
    repaired_ms = (
        unique_module._now_ms()
    )  # no repair yet (each case's first writer is killed, and repair runs)
    for kill_at in range(40):
        with Store(config) as store:
            name = name_on_other_host(op)
            mail = name + "@x"
            args: dict[str, Any]
            if op == "create":
                args = {"data": {"username": name, "email": mail, "n": 0}, "shard": OBJECT_SHARD}
            else:
                old = name_on_other_host("old")
                uid = store.create("user", {"username": old, "email": old + "@x", "n": 0}, shard=OBJECT_SHARD)
                args = {"id": uid, "to": name}
        killed, steps, result = run_writer(children, config_file, op, kill_at, args)
        if killed:
            kills += 1
            repaired_ms = repair(children, config_file)
        with Store(config) as store:
            keys_consistent(store, repaired_ms)
            where = f"{op} killed before step {kill_at} ({steps[-1] if steps else '-'}); steps {steps}"
            if op == "create":
                holder = store.lookup("user_by_username", name)
                if not killed:
                    assert holder == result, where
                if holder is not None:
                    assert store.get(holder) == args["data"], where
                    assert store.lookup("user_by_email", mail) == holder, where
                else:  # never went live: the value is free again
                    assert store.lookup("user_by_email", mail) is None, where
                    assert store.create("user", {"username": name}) > 0, where
            elif op == "rename":
                got = store.get_with_version(args["id"])
                assert got is not None, where
                renamed = got.data["username"] == name
                # Applied once, or not at all: the count, the version and the name move together.
                assert got.data["n"] == int(renamed), (where, got)
                assert got.version == 1 + int(renamed), (where, got)
                assert not killed or "write" in steps or not renamed, where
                found = store.lookup("user_by_username", name)
                if renamed:
                    assert found == args["id"], where
                else:  # killed after its claim: the name stays its claim for the grace period at most
                    assert found in (None, args["id"]), where
                if renamed:
                    with pytest.raises(DuplicateKeyError):
                        store.create("user", {"username": name})
            else:
                live = store.get(args["id"]) is not None
                assert live == (killed and steps == ["delete"][: len(steps)] and len(steps) <= 1), where
                if not killed:
                    assert result is True, where
                if not live:  # deleted: its values are free, after repair at the latest
                    old_name = store.get_with_version(args["id"])
                    assert old_name is None
                    assert store.lookup("user_by_username", name) is None, where
        if not killed:
            break
    assert kills >= 3, f"the {op} was killed only {kills} times: its steps were not seen"
    print(f"{op}: killed at each of {kills} step boundaries, then finished")
