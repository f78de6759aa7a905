"""Resource bounds: IDs per call (``limits.max_ids``), IDs per query (``limits.id_chunk``),
cursor length, object size and nesting depth.

Queries are counted at `ShardHandle.read`, with the parameters each one
carried: a call over many IDs must run as several queries of at most
``id_chunk`` IDs, and a call over ``max_ids`` must be refused before any.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store import JsonSerde, Store, StoreConfig
from store.engines import ShardHandle
from store.exceptions import CursorError, LimitError, NotSerializableError, ObjectTooLargeError
from store.ids import encode_pinterest
from tests.conftest import TEST_SHARDS, sqlite_config

BHP = "board_has_pins"


class Reads:
    """Every `ShardHandle.read` while installed: (host, shard, number of parameters)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, int, int]] = []
        real = ShardHandle.read

        def read(h: ShardHandle, sql: str, params: Any, *, one: bool) -> Any:
            self.calls.append((h.host, h.shard, len(params)))
            return real(h, sql, params, one=one)

        monkeypatch.setattr(ShardHandle, "read", read)

    def clear(self) -> None:
        self.calls.clear()

    @property
    def largest(self) -> int:
        return max(n for _h, _s, n in self.calls)


def _sqlite(folder: Path, **limits: int) -> dict[str, Any]:
    raw = sqlite_config(folder)
    raw["limits"] = limits
    return raw


def _absent_pins(n: int, shards: int = TEST_SHARDS) -> list[int]:
    """``n`` well-formed pin IDs over every shard, with local ids no test reaches."""
    return [encode_pinterest(i % shards, 1, 10**9 + i // shards) for i in range(n)]


# -- get_many over 100,000 IDs ---------------------------------------------------------------


@pytest.mark.mariadb
def test_get_many_of_100000_ids_on_mariadb_runs_in_bounded_queries(
    mariadb_ready: StoreConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Store(mariadb_ready) as store:
        chunk = store.config.id_chunk
        real = {store.create("pin", {"i": s}, shard=s): {"i": s} for s in (0, 3, 4, 7)}
        ids = _absent_pins(100_000)
        for k, id_ in enumerate(real):
            ids.insert(k * 25_000, id_)
        reads = Reads(monkeypatch)
        assert store.get_many(ids) == real
        per_host: dict[str, list[int]] = {}
        for host, _shard, n in reads.calls:
            per_host.setdefault(host, []).append(n)
        assert reads.largest <= chunk
        # Every ID asked exactly once, each host in ceil(its IDs / id_chunk) queries.
        assert sum(sum(ns) for ns in per_host.values()) == len(ids)
        for host, ns in per_host.items():
            assert len(ns) == math.ceil(sum(ns) / chunk), (host, ns)
        assert sorted(per_host) == ["MySQL001A", "MySQL002A"]


@pytest.mark.parametrize("cache", [False, True], ids=["no cache", "memory cache"])
def test_get_many_on_sqlite_runs_in_bounded_queries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: bool
) -> None:
    raw = _sqlite(tmp_path, id_chunk=1000)
    if cache:
        raw["cache"] = {"memory": True}
    with Store.from_config(raw) as store:
        real = {store.create("pin", {"s": s}, shard=s): {"s": s} for s in range(TEST_SHARDS)}
        ids = [*_absent_pins(20_000), *real]
        reads = Reads(monkeypatch)
        assert store.get_many(iter(ids)) == real  # any iterable
        assert reads.largest <= 1000
        assert sum(n for _h, _s, n in reads.calls) == len(ids)
        if not cache:  # a shard file's queries: ceil(its IDs / id_chunk), 2,500 + 1 IDs each here
            for shard in range(TEST_SHARDS):
                assert sum(1 for _h, s, _n in reads.calls if s == shard) == 3
        if cache:  # and again: every ID comes from the cache now, absent ones included
            reads.clear()
            assert store.get_many(ids) == real
            assert reads.calls == []


# -- max_ids: refused before any query ---------------------------------------------------------


@pytest.fixture
def small(tmp_path: Path) -> Iterator[Store]:
    with Store.from_config(_sqlite(tmp_path, max_ids=10, id_chunk=7)) as store:
        yield store


def test_more_than_max_ids_is_refused_before_any_query(small: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    s = small
    board = s.create("board", {}, shard=1)
    pins = [s.create("pin", {"n": i}, near=board) for i in range(11)]
    reads = Reads(monkeypatch)
    calls = {
        "get_many": lambda ids: s.get_many(ids),
        "get_many typed": lambda ids: s.get_many(ids, type_name="pin"),
        "has_links": lambda ids: s.has_links(BHP, board, ids),
        "has_links_many": lambda ids: s.has_links_many(BHP, [(board, p) for p in ids]),
        "pages_many": lambda ids: s.pages_many(BHP, [board] * len(ids)),
        "board_pins_many": lambda ids: s.board_pins_many([board] * len(ids)),
    }
    for name, call in calls.items():
        with pytest.raises(LimitError, match=r"limits\.max_ids \(10\)") as info:
            call(pins)
        assert "11" in str(info.value), name
    assert reads.calls == []
    # an endless iterator is refused too, after reading max_ids + 1 of it
    endless = itertools.count(pins[0])
    with pytest.raises(LimitError, match="more than 10 IDs"):
        s.get_many(endless)
    assert next(endless) == pins[0] + 11
    with pytest.raises(LimitError, match="more than 10 pairs"):
        s.has_links_many(BHP, ((board, p) for p in itertools.repeat(pins[0])))
    assert reads.calls == []
    # max_ids itself is fine
    assert len(s.get_many(pins[:10])) == 10


def test_relation_reads_over_id_chunk_run_as_bounded_queries(
    small: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = small  # id_chunk 7: every read below is over it
    boards = [s.create("board", {"b": i}, shard=i % TEST_SHARDS) for i in range(9)]
    pins = {b: [s.create("pin", {"k": k}, near=b) for k in range(3)] for b in boards}
    for b, ps in pins.items():
        for p in ps:
            s.link(BHP, b, p)
    everything = [p for ps in pins.values() for p in ps]
    reads = Reads(monkeypatch)
    assert s.has_links(BHP, boards[0], everything[:10]) == set(pins[boards[0]])
    assert s.has_links_many(BHP, [(b, p) for b in boards[:2] for p in everything[:5]]) == {
        (boards[0], p) for p in pins[boards[0]]
    } | {(boards[1], p) for p in everything[3:5]}
    assert {b: p.ids for b, p in s.pages_many(BHP, boards[:10], limit=2).items()} == {
        b: ps[:2] for b, ps in pins.items()
    }
    assert {b: p.ids for b, p in s.board_pins_many(boards[:10], limit=3).items()} == pins
    assert reads.calls
    assert reads.largest <= 7


# -- cursors, object size, nesting ---------------------------------------------------------------


def _nested(depth: int) -> dict[str, Any]:
    node: Any = 1
    for _ in range(depth - 1):
        node = [node]
    return {"a": node}


def test_cursor_length_limit(tmp_path: Path) -> None:
    with Store.from_config(_sqlite(tmp_path, max_cursor_bytes=64)) as s:
        board = s.create("board", {}, shard=1)
        for _ in range(2):
            s.link(BHP, board, s.create("pin", {}, near=board))
        cursor = s.page(BHP, board, limit=1).next_cursor
        assert cursor is not None
        assert len(cursor) > 64  # a real cursor, over this store's limit
        with pytest.raises(CursorError, match=r"over limits\.max_cursor_bytes \(64\)"):
            s.page(BHP, board, limit=1, cursor=cursor)
        with pytest.raises(CursorError, match=r"max_cursor_bytes"):
            s.board_pins(board, limit=1, cursor=cursor)
    with Store.from_config(_sqlite(tmp_path)) as s:  # the default limit (1,024) takes it
        assert len(s.page(BHP, board, limit=1, cursor=cursor).ids) == 1


def test_object_size_and_depth_limits(tmp_path: Path) -> None:
    with Store.from_config(_sqlite(tmp_path, max_object_bytes=100, max_depth=3)) as s:
        assert s.config.max_depth == 3
        ok = s.create("pin", _nested(3))  # the object and two arrays: three levels
        s.update(ok, {"b": _nested(3)["a"]})
        with pytest.raises(NotSerializableError, match=r"nested more than 3 levels.*limits\.max_depth"):
            s.create("pin", _nested(4))
        with pytest.raises(NotSerializableError, match="nested more than 3 levels"):
            s.update(ok, {"b": _nested(3)})
        with pytest.raises(ObjectTooLargeError, match="over the limit of 100"):
            s.create("pin", {"a": "x" * 100})
        with pytest.raises(ObjectTooLargeError, match="over the limit of 100"):
            s.update(ok, lambda old: {**old, "c": "x" * 90})
        assert s.get(ok) == {"a": [[1]], "b": [[1]]}


def test_depth_beyond_what_json_encoding_allows() -> None:
    serde = JsonSerde(max_depth=1000)  # orjson encodes 254 levels: a larger limit acts as 254
    serde.dumps(_nested(254))
    with pytest.raises(NotSerializableError, match="JSON encoding stops at 254 levels"):
        serde.dumps(_nested(255))
    with pytest.raises(NotSerializableError, match="nested more than 254 levels"):
        serde.dumps(_nested(900))
