"""Export and import (`store.exchange`): NDJSON round trips, resumable exports, idempotent imports."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from store import BadRecordError, Store, StoreConfig, StoreError
from store.admin import init_shards
from tests.conftest import NAMESPACE, sqlite_config


def _workload(store: Store) -> dict[str, Any]:
    """Users, boards, pins, links both ways, a deleted pin and an updated board."""
    users = [store.create("user", {"name": f"u{i}"}, shard=i % store.config.shards) for i in range(3)]
    boards = [store.create("board", {"name": f"b{i}"}, near=users[i % 3]) for i in range(4)]
    pins = [store.create("pin", {"title": f"p{i}", "n": i}, near=boards[i % 4]) for i in range(24)]
    for i, p in enumerate(pins):
        store.link("board_has_pins", boards[i % 4], p, sequence=1000 + i)
        if i % 3 == 0:
            store.link("users_likes_pins", users[i % 3], p)
    store.update(boards[0], {"views": 7})
    store.delete(pins[5])  # leaves its board's list; its row stays, marked
    return {"users": users, "boards": boards, "pins": pins}


def snapshot(store: Store) -> dict[str, Any]:
    """Every row the store keeps that an export carries: objects, pairs and counts."""
    out: dict[str, Any] = {}
    for t in store.config.types:
        out[t] = sorted((r.id, r.data, r.version, r.live) for r in store.scan(t, include_deleted=True).rows())
    ctx = store.admin_context()
    for rel in store.config.relations:
        rows = []
        counts = []
        for shard in range(store.config.shards):
            h = ctx.engines.shard(shard, store.shard_map.master(shard))
            rows += [
                tuple(r)
                for r in h.read(f"SELECT from_id, to_id, sequence FROM {h.table(rel)}", (), one=False)
            ]
            counts += [
                (int(f), int(n))
                for f, n in h.read(
                    f"SELECT from_id, n FROM {h.table('relation_counts')} "
                    f"WHERE relation = {h.backend.param} AND n <> 0",
                    (rel,),
                    one=False,
                )
            ]
        out[rel] = (sorted(rows), sorted(counts))
    return out


def _fresh(folder: Path) -> Store:
    config = StoreConfig.from_dict(sqlite_config(folder))
    init_shards(config)
    return Store(config)


def test_round_trip_on_sqlite_gives_the_same_rows_and_counts(tmp_path: Path) -> None:
    with _fresh(tmp_path / "one") as src:
        _workload(src)
        before = snapshot(src)
        text = io.StringIO()
        report = src.export(text)
    lines = text.getvalue().splitlines()
    assert json.loads(lines[0])["kind"] == "export"
    assert json.loads(lines[-1]) == {"kind": "end", "objects": report.objects, "links": report.links}
    assert report.objects == 31
    assert any(json.loads(line).get("deleted") for line in lines)
    with _fresh(tmp_path / "two") as dst:
        first = dst.import_records(lines)
        assert (first.objects_added, first.objects_present) == (31, 0)
        assert first.links_added == report.links
        assert snapshot(dst) == before
        again = dst.import_records(lines)  # idempotent: nothing added, nothing changed
        assert (again.objects_added, again.links_added) == (0, 0)
        assert (again.objects_present, again.links_present) == (31, report.links)
        assert snapshot(dst) == before
        # The imported store goes on making IDs after the imported ones.
        made = dst.create("pin", {"new": True}, shard=0)
        assert made not in {i for i, _ in dst.scan("pin", include_deleted=True)} - {made}
        assert dst.get(made) == {"new": True}


def test_a_bad_line_refuses_its_batch_and_names_every_bad_line(tmp_path: Path) -> None:
    with _fresh(tmp_path / "one") as src:
        made = _workload(src)
        text = io.StringIO()
        src.export(text)
    lines = text.getvalue().splitlines()
    bad = list(lines)
    bad[2] = bad[2].replace('"version":', '"versio":')
    bad[4] = "{not json"
    bad[6] = json.dumps({"kind": "object", "type": "pin", "id": made["users"][0], "data": {}, "version": 1})
    bad[8] = json.dumps({"kind": "link", "relation": "board_has_pin", "from": 1, "to": 2, "sequence": 3})
    with _fresh(tmp_path / "two") as dst:
        with pytest.raises(BadRecordError) as err:
            dst.import_records(bad)
        assert [n for n, _why in err.value.lines] == [3, 5, 7, 9]
        assert "line 3" in str(err.value)
        assert "versio" in str(err.value)
        assert "board_has_pin" in str(err.value)
        assert snapshot(dst) == snapshot(_fresh(tmp_path / "empty"))  # nothing written
        header = json.dumps({"kind": "export", "format": 1, "ids": "instagram", "shards": [[0, 7]]})
        with pytest.raises(BadRecordError, match="line 1: the export holds 'instagram' IDs"):
            dst.import_records([header, *lines[1:]])


def test_an_export_cut_short_resumes_from_its_last_complete_line(tmp_path: Path) -> None:
    out = tmp_path / "export.ndjson"
    with _fresh(tmp_path / "one") as src:
        _workload(src)
        whole = io.StringIO()
        src.export(whole)
        src.export(out)
        with pytest.raises(StoreError, match="resume"):
            src.export(out)
        complete = out.read_text()
        assert complete == whole.getvalue()
        for cut in (len(complete) // 3, len(complete) // 2 + 7, complete.index("\n") + 1):
            out.write_text(complete[:cut])  # a partial last line, as a killed export leaves
            report = src.export(out, resume=True)
            assert report.resumed
            assert out.read_text() == complete
        assert src.export(out, resume=True).complete_already
        other = tmp_path / "notes.txt"
        other.write_text("not an export\npartial")
        with pytest.raises(StoreError, match="not an export"):
            src.export(other, resume=True)
        assert other.read_text() == "not an export\npartial"  # refused: nothing cut
        with pytest.raises(StoreError, match="shards"):
            src.export(out, resume=True, shards=range(2))  # resumed with other --shards


def test_the_cli_exports_and_imports(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from store.cli import main

    raw = sqlite_config(tmp_path / "one")
    (tmp_path / "one.yaml").write_text(json.dumps(raw))
    raw2 = sqlite_config(tmp_path / "two")
    (tmp_path / "two.yaml").write_text(json.dumps(raw2))
    with _fresh(tmp_path / "one") as src:
        _workload(src)
        before = snapshot(src)
    runner = CliRunner()
    exported = runner.invoke(main, ["export", "--config", str(tmp_path / "one.yaml")])
    assert exported.exit_code == 0, exported.output
    init = runner.invoke(main, ["init", "--config", str(tmp_path / "two.yaml")])
    assert init.exit_code == 0, init.output
    done = runner.invoke(main, ["import", "--config", str(tmp_path / "two.yaml"), "-"], input=exported.stdout)
    assert done.exit_code == 0, done.output
    assert "31 objects added" in done.stdout
    with Store.from_config(tmp_path / "two.yaml") as dst:
        assert snapshot(dst) == before
    part = runner.invoke(
        main,
        [
            "export",
            "--config",
            str(tmp_path / "one.yaml"),
            "--shards",
            "0-3",
            "--out",
            str(tmp_path / "a.ndjson"),
        ],
    )
    assert part.exit_code == 0, part.output
    assert part.stdout == ""
    shards = {
        json.loads(line).get("id", 0) >> 46 for line in (tmp_path / "a.ndjson").read_text().splitlines()
    }
    assert shards <= {0, 1, 2, 3}
    bad = runner.invoke(
        main, ["import", "--config", str(tmp_path / "two.yaml"), "-"], input='{"kind": "nope"}\n'
    )
    assert bad.exit_code == 1
    assert "line 1" in bad.stderr


# -- MariaDB (Pinterest IDs) and PostgreSQL (Instagram IDs): export, drop, init, import ---------

MARIADB_NS = NAMESPACE + "x"  # namespaces of this process's own (see tests/conftest.py)
PG_NS = NAMESPACE + "p"


def _drop_mariadb(ns: str) -> None:
    from tests.conftest import root_sql

    for (name,) in root_sql(f"SHOW DATABASES LIKE '{ns}\\_%'"):
        root_sql(f"DROP DATABASE `{name}`")


def _drop_pg(ns: str) -> None:
    import psycopg

    from tests.conftest import PG_TEST_DB

    with psycopg.connect(f"host=127.0.0.1 user=postgres dbname={PG_TEST_DB}", autocommit=True) as conn:
        names = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (f"{ns}\\_%",)
        ).fetchall()
        for (name,) in names:
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def _mariadb_raw() -> dict[str, Any]:
    from tests.conftest import MARIADB_URL, base_config, require_port

    require_port("MariaDB", 3306)
    return base_config(
        namespace=MARIADB_NS,
        shards=4,
        hosts={"A": MARIADB_URL, "B": MARIADB_URL},
        map=[{"range": [0, 1], "master": "A"}, {"range": [2, 3], "master": "B"}],
    )


def _pg_raw() -> dict[str, Any]:
    from tests.conftest import PG_URL, base_config

    return base_config(
        ids="instagram",
        namespace=PG_NS,
        shards=4,
        hosts={"P": PG_URL, "Q": PG_URL},
        map=[{"range": [0, 1], "master": "P"}, {"range": [2, 3], "master": "Q"}],
    )


def _instagram_workload(store: Store) -> dict[str, Any]:
    boards = [store.create("board", {"name": f"b{i}"}, shard=i) for i in range(4)]
    pins = [store.create("pin", {"n": i}, shard=i % 4) for i in range(20)]
    for i, p in enumerate(pins):
        store.link("board_has_pins", boards[i % 4], p, sequence=p)  # the ID as the sequence
    store.update(pins[1], {"n": 100}, type_name="pin")
    store.delete(pins[2], type_name="pin")
    return {"boards": boards, "pins": pins}


@pytest.mark.parametrize("backend", ["mariadb", "postgresql"])
def test_round_trip_through_drop_and_init(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if backend == "mariadb":
        raw, drop, ns = _mariadb_raw(), _drop_mariadb, MARIADB_NS
    else:
        request.getfixturevalue("postgres_ready")  # the test database exists
        raw, drop, ns = _pg_raw(), _drop_pg, PG_NS
    drop(ns)
    config = StoreConfig.from_dict(raw)
    out = tmp_path / "export.ndjson"
    try:
        init_shards(config)
        with Store(config) as store:
            if backend == "mariadb":
                _workload(store)
            else:
                made = _instagram_workload(store)
                # Instagram IDs carry no type: a scan is of one type's tables.
                pins = [i for i, _d in store.scan("pin")]
                assert sorted(pins, key=lambda i: ((i >> 10) & 0x1FFF, i)) == pins
                assert set(pins) == set(made["pins"]) - {made["pins"][2]}
                assert {i for i, _d in store.scan("board")} == set(made["boards"])
            before = snapshot(store)
            report = store.export(out)
        drop(ns)
        init_shards(config)
        with Store(config) as store:
            assert snapshot(store) != before
            with out.open("rb") as lines:
                first = store.import_records(lines)
            assert first.objects_added == report.objects
            assert first.links_added == report.links
            assert snapshot(store) == before
            with out.open("rb") as lines:
                again = store.import_records(lines)
            assert (again.objects_added, again.links_added) == (0, 0)
            assert snapshot(store) == before
            # New objects get new IDs beside the imported ones.
            fresh = store.create("pin", {"after": True}, shard=0)
            assert fresh not in {row[0] for row in before["pin"]}
    finally:
        drop(ns)


def test_an_import_makes_the_unique_keys_rows_of_its_objects(tmp_path: Path) -> None:
    def fresh(folder: Path) -> Store:
        raw = sqlite_config(folder)
        raw["unique"] = {"user_by_username": {"type": "user", "field": "username"}}
        config = StoreConfig.from_dict(raw)
        init_shards(config)
        return Store(config)

    with fresh(tmp_path / "one") as src:
        ada = src.create("user", {"username": "ada"}, shard=1)
        bob = src.create("user", {"username": "bob"}, shard=6)
        text = io.StringIO()
        src.export(text)
    lines = text.getvalue().splitlines()
    with fresh(tmp_path / "two") as dst:
        assert dst.import_records(lines).unique_added == 2
        assert dst.lookup("user_by_username", "ada") == ada
        assert dst.lookup("user_by_username", "bob") == bob
        assert dst.import_records(lines).unique_added == 0
