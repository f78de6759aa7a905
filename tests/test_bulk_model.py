"""A hypothesis model test: batches and single calls mixed, against a plain-dict model.

`create_many`, `link_many` and `unlink_many` mixed with `create`, `link`
and `unlink`; after every step the objects, the lists (both sides) and the
counts match the model, and each call's result is the model's. On SQLite,
on MariaDB (with caches, two host names) and on PostgreSQL (Instagram IDs,
two host names: a batch's new pairs are one statement a side there); few
examples, so it runs in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import Store, StoreConfig
from tests.conftest import cached_mariadb_config, sqlite_config

BHP = "board_has_pins"
POB = "pin_owned_by_board"

# An op: (name, args), the args indexes into the boards and pins made so far.
_index = st.integers(0, 7)
_pairs = st.lists(st.tuples(_index, _index), min_size=0, max_size=6)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("create_many"), st.integers(0, 4)),
        st.tuples(st.just("create"), st.just(1)),
        st.tuples(st.just("link"), st.tuples(_index, _index)),
        st.tuples(st.just("unlink"), st.tuples(_index, _index)),
        st.tuples(st.just("link_many"), _pairs),
        st.tuples(st.just("unlink_many"), _pairs),
    ),
    min_size=1,
    max_size=10,
)


def run_against_model(store: Store, ops: list[tuple[str, Any]]) -> None:
    boards = store.create_many("board", [{"b": i} for i in range(3)])
    pins: list[int] = []
    objects: dict[int, dict[str, Any]] = {b: {"b": i} for i, b in enumerate(boards)}
    lists: dict[int, set[int]] = {b: set() for b in boards}

    def pair(i: int, j: int) -> tuple[int, int] | None:
        return (boards[i % len(boards)], pins[j % len(pins)]) if pins else None

    for name, arg in ops:
        if name in ("create_many", "create"):
            items = [{"p": len(pins) + k} for k in range(arg)]
            made = (
                store.create_many("pin", items) if name == "create_many" else [store.create("pin", items[0])]
            )
            assert len(made) == len(items)
            for p, item in zip(made, items, strict=True):
                objects[p] = item
            pins += made
        elif name in ("link", "unlink"):
            got = pair(*arg)
            if got is None:
                continue
            b, p = got
            if name == "link":
                assert store.link(BHP, b, p) is (p not in lists[b])
                lists[b].add(p)
            else:
                assert store.unlink(BHP, b, p) is (p in lists[b])
                lists[b].discard(p)
        else:
            chosen = [got for i, j in arg if (got := pair(i, j)) is not None]
            distinct = list(dict.fromkeys(chosen))
            if name == "link_many":
                want = sum(p not in lists[b] for b, p in distinct)
                assert store.link_many(BHP, chosen) == want
                for b, p in distinct:
                    lists[b].add(p)
            else:
                want = sum(p in lists[b] for b, p in distinct)
                assert store.unlink_many(BHP, chosen) == want
                for b, p in distinct:
                    lists[b].discard(p)
        # The model, after every op: objects, both sides of every list, and the counts.
        assert {
            **store.get_many(boards, type_name="board"),
            **store.get_many(pins, type_name="pin"),
        } == objects
        for b in boards:
            assert set(store.links(BHP, b, limit=100)) == lists[b]
            assert store.count(BHP, b) == len(lists[b])
        for p in pins:
            owners = {b for b in boards if p in lists[b]}
            assert set(store.links(POB, p)) == owners
            assert store.count(POB, p) == len(owners)


_SETTINGS = settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_SETTINGS
@given(ops=OPS)
def test_batches_and_single_calls_match_the_model_on_sqlite(tmp_path_factory: Any, ops: Any) -> None:
    folder: Path = tmp_path_factory.mktemp("model")
    with Store(StoreConfig.from_dict({**sqlite_config(folder), "cache": {"memory": True}})) as store:
        run_against_model(store, ops)


@pytest.mark.mariadb
@_SETTINGS
@given(ops=OPS)
def test_batches_and_single_calls_match_the_model_on_mariadb(
    mariadb_ready: StoreConfig, memcached_pair: list[str], redis_ready: str, ops: Any
) -> None:
    with Store(StoreConfig.from_dict(cached_mariadb_config(memcached_pair, redis_ready))) as store:
        run_against_model(store, ops)


@_SETTINGS
@given(ops=OPS)
def test_batches_and_single_calls_match_the_model_on_postgres(postgres_ready: StoreConfig, ops: Any) -> None:
    with Store(postgres_ready) as store:
        run_against_model(store, ops)
