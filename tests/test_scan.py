"""`Store.scan`: every object of a type in shard and key order, resumable, across a live move."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

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
