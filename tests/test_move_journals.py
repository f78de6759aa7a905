"""Journals written by `store move` before journals named their engine, resumed and aborted.

``tests/fixtures/move-journal-mariadb.json`` and ``move-journal-postgres.json``
are the journals of real moves (`tests.moves.kill_move_in_phase`) killed at
their first "fence:" line, written before journals had a ``kind``. Each test
kills a move at the same point, so that the servers stand where that journal
says, puts the old journal in place of the one just written, and resumes or
aborts it; then checks the map and every acknowledged write.
"""

from __future__ import annotations

import random
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from store import Store, StoreConfig
from store.admin import check_store, init_shards
from store.admin.move import Journal, MariaDBEngine, Mover, PostgresEngine
from store.admin.move.journal import infer_kind
from tests.moves import kill_move_in_phase
from tests.servers import MariaDBServer, binlog_pair

FIXTURES = Path(__file__).parent / "fixtures"
MARIADB_JOURNAL = FIXTURES / "move-journal-mariadb.json"
POSTGRES_JOURNAL = FIXTURES / "move-journal-postgres.json"


def test_an_old_journal_gets_its_kind_from_the_source_host_or_its_position() -> None:
    old_mariadb, old_postgres = Journal.load(MARIADB_JOURNAL), Journal.load(POSTGRES_JOURNAL)
    assert old_mariadb.kind == old_postgres.kind == ""
    assert infer_kind(old_mariadb, "mariadb") == "mariadb"
    assert infer_kind(old_postgres, "postgres") == "postgres"
    assert infer_kind(old_mariadb, None) == "mariadb"  # 0-1-3671: a MariaDB GTID
    assert infer_kind(old_postgres, None) == "postgres"  # 0/1DA8FF8: a PostgreSQL LSN
    assert infer_kind(Journal(0, 1, "A", "B", None), None) is None  # killed before its copy: nothing tells
    assert infer_kind(Journal(0, 1, "A", "B", None, kind="postgres"), "mariadb") == "postgres"


def _writes(
    store: Store, shards: int, done: threading.Event, acked: dict[int, Any], errors: list[Any]
) -> None:
    """Create pins on every shard until ``done`` (each acknowledged one into ``acked``)."""
    rng = random.Random(1)
    try:
        while not done.is_set():
            pin = store.create("pin", {"w": 1}, shard=rng.randrange(shards))
            acked[pin] = {"w": 1}
    except BaseException as exc:  # surfaced by the test
        errors.append(exc)


def _carry_on(store: Store, journal: Path, fixture: Path, then: str) -> Mover:
    """Put the old ``fixture`` journal where the killed move's is, and resume or abort it."""
    written = Journal.load(journal)
    old = Journal.load(fixture)
    assert written.kind != ""  # today's journals name their engine
    assert (written.low, written.high, written.source, written.target) == (old.low, old.high, "A", "B")
    assert (written.phase, written.replicating) == (old.phase, old.replicating) == ("switch", True)
    shutil.copy(fixture, journal)
    mover = Mover(store, journal, say=lambda _m: None)
    if then == "resume":
        assert mover.resume().phase == "done"
    else:
        assert mover.abort().phase == "aborted"
    return mover


@pytest.fixture
def mariadb_pair() -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    with binlog_pair() as servers:
        yield servers


@pytest.mark.moves
@pytest.mark.parametrize("then", ["resume", "abort"])
def test_an_old_mariadb_journal_killed_while_fenced_resumes_or_aborts(
    mariadb_pair: tuple[MariaDBServer, MariaDBServer], tmp_path: Path, then: str
) -> None:
    from tests.test_move import SHARDS, config_for, rows

    source, target = mariadb_pair
    raw = config_for(source, target, tmp_path, poll_s=0.2)
    config_file = tmp_path / "store.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    config = StoreConfig.from_dict(raw)
    init_shards(config)
    moving = range(8, 16)
    with Store(config) as store:
        acked: dict[int, Any] = {
            store.create("pin", {"n": i}, shard=s): {"n": i} for i, s in enumerate(list(range(SHARDS)) * 3)
        }
        done, errors = threading.Event(), []  # type: ignore[var-annotated]
        w = threading.Thread(target=_writes, args=(store, SHARDS, done, acked, errors))
        w.start()
        try:
            journal = tmp_path / "move.json"
            kill_move_in_phase(config_file, journal, "fence:")
            time.sleep(0.3)  # writers carry on against what the crash left
            mover = _carry_on(store, journal, MARIADB_JOURNAL, then)
            assert isinstance(mover.engine, MariaDBEngine)  # from the source host: the journal has no kind
            time.sleep(0.3)
        finally:
            done.set()
            w.join()
        assert errors == [], errors
        after = {store.create("pin", {"after": s}, shard=s): {"after": s} for s in moving}
        acked.update(after)
    expected = "B" if then == "resume" else "A"
    with Store(config) as fresh:
        assert fresh.shard_map.version == (2 if then == "resume" else 1)
        assert {fresh.shard_map.master(s) for s in moving} == {expected}
        assert {fresh.shard_map.master(s) for s in range(8)} == {"A"}
        got = fresh.get_many(list(acked))
        assert [p for p in acked if got.get(p) != acked[p]] == [], "acknowledged writes were lost"
        report = check_store(fresh)
        assert report.ok, [f.line() for f in report.problems]
    pins = (
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema LIKE 'db%' "
        "AND table_name = 'pins' AND table_type = 'BASE TABLE'"  # a tombstone's pins is a view
    )
    archives = "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name LIKE 'moved_db%'"
    if then == "resume":
        assert rows(target, pins) == [(len(moving),)]
        assert rows(source, archives) == [(len(moving),)]
        assert rows(source, pins) == [(SHARDS - len(moving),)]  # the moved shards' are tombstones
    else:
        assert rows(
            target, "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name LIKE 'db%'"
        ) == [(0,)]
        assert rows(source, archives) == [(0,)]
        assert rows(source, pins) == [(SHARDS,)]


@pytest.mark.moves
@pytest.mark.parametrize("then", ["resume", "abort"])
def test_an_old_postgres_journal_killed_while_fenced_resumes_or_aborts(tmp_path: Path, then: str) -> None:
    from tests.test_move_postgres import clusters, config_for, leftovers, shard_of

    shards, moving = 8, range(4, 8)
    with clusters():
        raw = config_for(shards, tmp_path, poll_s=0.2)
        config_file = tmp_path / "store.yaml"
        config_file.write_text(yaml.safe_dump(raw))
        config = StoreConfig.from_dict(raw)
        init_shards(config)
        with Store(config) as store:
            acked: dict[int, Any] = {
                store.create("pin", {"n": i}, shard=s): {"n": i}
                for i, s in enumerate(list(range(shards)) * 3)
            }
            done, errors = threading.Event(), []  # type: ignore[var-annotated]
            w = threading.Thread(target=_writes, args=(store, shards, done, acked, errors))
            w.start()
            try:
                journal = tmp_path / "move.json"
                kill_move_in_phase(config_file, journal, "fence:", shards="4-7")
                time.sleep(0.3)  # writers carry on against what the crash left
                mover = _carry_on(store, journal, POSTGRES_JOURNAL, then)
                assert isinstance(
                    mover.engine, PostgresEngine
                )  # from the source host: the journal has no kind
                time.sleep(0.3)
            finally:
                done.set()
                w.join()
            assert errors == [], errors
            before = {s: max(q for q in acked if shard_of(q) == s) for s in moving}
            after = {store.create("pin", {"after": s}, shard=s): {"after": s} for s in moving}
            assert all(p > before[shard_of(p)] for p in after), "an ID the source handed out came again"
            acked.update(after)
        expected = "B" if then == "resume" else "A"
        leftovers(expected, moving)
        with Store(config) as fresh:
            assert fresh.shard_map.version == (2 if then == "resume" else 1)
            assert {fresh.shard_map.master(s) for s in moving} == {expected}
            got = fresh.get_many(list(acked), type_name="pin")
            assert [p for p in acked if got.get(p) != acked[p]] == [], "acknowledged writes were lost"
            report = check_store(fresh)
            assert report.ok, [f.line() for f in report.problems]
