"""`Store.scan`: every object of a type in shard and key order, resumable, across a live move."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from store import CursorError, IdError, LimitError, RoutingError, Store, StoreConfig, UnknownTypeError
from store.admin import init_shards
from tests.conftest import base_config, sqlite_config


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Any:
    config = StoreConfig.from_dict(sqlite_config(tmp_path))
    init_shards(config)
    with Store(config) as store:
        yield store


def _fill(store: Store, n: int, *, type_name: str = "pin") -> list[int]:
    return [store.create(type_name, {"i": i}, shard=i % store.config.shards) for i in range(n)]


def test_scan_returns_every_object_once_in_shard_and_key_order(sqlite_store: Store) -> None:
    pins = _fill(sqlite_store, 30)
    boards = _fill(sqlite_store, 3, type_name="board")
    gone = pins[4]
    sqlite_store.delete(gone)
    seen = list(sqlite_store.scan("pin", batch=4))
    ids = [i for i, _d in seen]
    assert sorted(ids) == sorted(set(pins) - {gone})
    assert ids == sorted(ids, key=lambda i: (i >> 46, i & ((1 << 36) - 1)))
    assert dict(seen)[pins[0]] == {"i": 0}
    assert {i for i, _d in sqlite_store.scan("pin", include_deleted=True)} == set(pins)
    assert [i for i, _d in sqlite_store.scan("board")] == sorted(boards)
    only = [i for i, _d in sqlite_store.scan("pin", shards=range(2, 4))]
    assert sorted(only) == sorted(p for p in pins if p >> 46 in (2, 3) and p != gone)


def test_scan_resumes_after_the_last_object_it_returned(sqlite_store: Store) -> None:
    pins = _fill(sqlite_store, 20)
    scan = sqlite_store.scan("pin", batch=3)
    first = [next(scan)[0] for _ in range(7)]
    token = scan.resume_token
    assert isinstance(token, str)
    rest = [i for i, _d in sqlite_store.scan("pin", batch=3, resume=token)]
    assert first + rest == [i for i, _d in sqlite_store.scan("pin")]
    assert sorted(first + rest) == sorted(pins)
    # A token taken before anything was returned starts at the beginning; at the end, nothing is left.
    assert len(list(sqlite_store.scan("pin", resume=sqlite_store.scan("pin").resume_token))) == 20
    done = sqlite_store.scan("pin")
    list(done)
    assert list(sqlite_store.scan("pin", resume=done.resume_token)) == []


def test_scan_refuses_bad_arguments_before_reading(sqlite_store: Store) -> None:
    with pytest.raises(UnknownTypeError):
        sqlite_store.scan("pins")
    with pytest.raises(LimitError, match="batch"):
        sqlite_store.scan("pin", batch=0)
    with pytest.raises(RoutingError, match="shard 8"):
        sqlite_store.scan("pin", shards=[1, 8])
    with pytest.raises(IdError, match="shards"):
        sqlite_store.scan("pin", shards="0-3")  # type: ignore[arg-type]
    with pytest.raises(CursorError, match="resume_token"):
        sqlite_store.scan("pin", resume="nope")
    token = sqlite_store.scan("board").resume_token
    with pytest.raises(CursorError, match="board"):
        sqlite_store.scan("pin", resume=token)
    with pytest.raises(CursorError, match="include_deleted"):
        sqlite_store.scan("board", resume=token, include_deleted=True)


# -- across a live move (MariaDB servers the test starts) ---------------------------------------

MOVE_SHARDS = 16


@pytest.mark.moves
def test_a_scan_across_a_live_move_sees_every_object_exactly_once(tmp_path: Path) -> None:
    from store.admin.move import Mover
    from tests.servers import binlog_pair, free_port

    with binlog_pair(free_port(), free_port()) as (source, target):

        def raw(poll_s: float) -> dict[str, Any]:
            return base_config(
                shards=MOVE_SHARDS,
                hosts={"A": source.url, "B": target.url},
                map=[{"range": [0, MOVE_SHARDS - 1], "master": "A"}],
                map_source={"file": str(tmp_path / "map.yaml"), "poll_s": poll_s},
            )

        config = StoreConfig.from_dict(raw(0.05))
        init_shards(config)
        with Store(config) as store, Store(StoreConfig.from_dict(raw(3600))) as stale:
            pins = {store.create("pin", {"i": i}, shard=i % MOVE_SHARDS) for i in range(320)}
            # A scan paused inside the moving shards, by a store that reloads its map only when a
            # host refuses it: its next page meets the tombstone on the source.
            paused = stale.scan("pin", batch=7)
            before = [next(paused)[0] for _ in range(230)]
            assert before[-1] >> 46 in range(8, 16)
            token = paused.resume_token
            # A scan that reads on while the move runs.
            during: list[int] = []
            versions: list[int] = []
            errors: list[BaseException] = []
            moving = threading.Event()
            moved = threading.Event()

            def scan_during() -> None:
                try:
                    with Store(config) as reader:
                        for i, _d in reader.scan("pin", batch=3):
                            during.append(i)
                            if i >> 46 in range(8, 16):
                                versions.append(reader.shard_map.version)
                                moving.wait(30)  # the first moving shard's pages: once the copy began
                                if len(versions) == 150:
                                    moved.wait(60)  # the last pages: once the map has switched
                                elif not moved.is_set():
                                    time.sleep(0.01)  # reads go on through the copy, fence and switch
                except BaseException as exc:  # surfaced below
                    errors.append(exc)

            thread = threading.Thread(target=scan_during)
            thread.start()
            mover = Mover(store, tmp_path / "move.json", say=lambda _m: moving.set())
            journal = mover.start(mover.plan(8, MOVE_SHARDS - 1, "B"))
            moving.set()
            moved.set()
            thread.join(60)
            assert journal.phase == "done"
            assert errors == []
            # The moving shards were read partly before the map switched, partly after.
            assert 1 in versions
            assert 2 in versions
            assert stale.shard_map.version == 1  # nothing told it of the move yet
            after = [i for i, _d in paused]
            assert stale.shard_map.version == 2  # the tombstone did
            for seen in (before + after, during):
                assert len(seen) == len(set(seen)), "an object was returned twice"
                assert set(seen) == pins, "an object was missed"
            # A token taken before the move goes on from the same place on the new host.
            assert [i for i, _d in store.scan("pin", resume=token)] == after
