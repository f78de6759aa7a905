"""Hostile input, property-based: every bad argument gets a specific `StoreError`, and nothing is written.

Each property feeds one kind of bad input to every call that takes it: IDs
(every integer edge, floats, bools, None, strings, bytes, containers),
collections of IDs and pairs, object data (too deep, too large, lone
surrogates, NaN, non-string keys, non-JSON types, ints over 64 bits), unique
key values, relation and type names, cursors (forged, truncated, mutated, of
another list, direction, range or store, too long), page arguments, the ID
functions, config fields (each replaced in turn) and CLI arguments. The call
must raise a `StoreError` subclass (not the root, not a `BackendError`: bad
input never reaches a database) whose message is one printable line of
bounded length that names the problem; and a fingerprint of every table
(rows, versions, live flags, pairs and their sequences, counts, unique keys)
must not change.

The ID, collection, data and cursor properties run on SQLite, SQLite with the
in-process caches and MariaDB; the others on SQLite. Each runs 500 examples;
named edges are ``@example``s, so they run whatever hypothesis draws.

Cursors are not signed: a cursor is a position in one list, so one changed
character may be refused or may name another position in the same list, and
another store's cursor is refused unless it names a list of the same
relation and from_id.
"""

from __future__ import annotations

import base64
import collections
import datetime as dt
import decimal
import enum
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from store import Store, StoreConfig
from store.backends.tables import MAX_UNIQUE_VALUE_BYTES
from store.cli import main
from store.cursors import encode_cursor
from store.exceptions import (
    BackendError,
    ConfigError,
    CursorError,
    DataError,
    IdError,
    LimitError,
    StoreError,
    UnknownRelationError,
    UnknownTypeError,
)
from store.ids import (
    decode_instagram,
    decode_pinterest,
    encode_instagram,
    encode_pinterest,
    instagram_datetime,
)
from tests.conftest import sqlite_config

BHP = "board_has_pins"
MAX_OBJECT_BYTES = 4096
MAX_DEPTH = 12
MAX_CURSOR = 256
LIMITS = {"max_object_bytes": MAX_OBJECT_BYTES, "max_depth": MAX_DEPTH, "max_cursor_bytes": MAX_CURSOR}
UNIQUE = {"user_by_name": {"type": "user", "field": "name"}}

PROPERTY = settings(
    max_examples=500,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)


# -- the stores under attack -------------------------------------------------------------------


class World:
    """A store with a few objects and links, and a fingerprint of all its tables."""

    def __init__(self, store: Store, folder: Path | None = None) -> None:
        self.store = store
        self.folder = folder
        s = store
        self.board = s.create("board", {"name": "b"}, shard=1)
        self.other_board = s.create("board", {"name": "c"}, shard=5)
        self.pins = [s.create("pin", {"n": i}, near=self.board) for i in range(3)]
        self.pin = self.pins[0]
        self.far_pin = s.create("pin", {"n": 9}, shard=6)
        self.user = s.create("user", {"name": f"ada-{self.board}"}, shard=2)
        for p in [*self.pins, self.far_pin]:
            s.link(BHP, self.board, p)
        s.link(BHP, self.other_board, self.far_pin)
        s.link("users_likes_pins", self.user, self.pin)
        self.live = {self.board, self.other_board, *self.pins, self.far_pin, self.user}
        self.cursor = s.page(BHP, self.board, limit=1).next_cursor
        assert self.cursor is not None
        self.baseline = self.fingerprint()

    def fingerprint(self) -> list[tuple[Any, ...]]:
        """Per shard: rows, versions and live flags of every object table; pairs; counts; unique keys."""
        s = self.store
        ctx = s.admin_context()
        config = s.config
        out: list[tuple[Any, ...]] = []
        for r in s.shard_map:
            for shard in r.shards():
                h = ctx.engines.shard(shard, r.master)
                cols = []
                for t in config.types.values():
                    table = h.table(t.table)
                    cols += [
                        f"(SELECT COUNT(*) FROM {table})",
                        f"(SELECT COALESCE(SUM(version), 0) FROM {table})",
                        f"(SELECT COALESCE(SUM(active), 0) FROM {table})",
                    ]
                for rel in config.relations:
                    table = h.table(rel)
                    cols += [
                        f"(SELECT COUNT(*) FROM {table})",
                        f"(SELECT COALESCE(SUM((sequence & 1048575) + (to_id & 1048575)), 0) FROM {table})",
                    ]
                counts = h.table("relation_counts")
                cols += [f"(SELECT COUNT(*) FROM {counts})", f"(SELECT COALESCE(SUM(n), 0) FROM {counts})"]
                if config.unique:
                    cols.append(f"(SELECT COUNT(*) FROM {h.table('unique_keys')})")
                row = h.read("SELECT " + ", ".join(cols), (), one=True)
                out.append((shard, *(int(v) for v in row)))
        return out

    def unchanged(self) -> None:
        """Nothing was written since the world was made (after a failure, the next test starts afresh)."""
        now = self.fingerprint()
        if now != self.baseline:
            before, self.baseline = self.baseline, now
            changed = [(b, a) for b, a in zip(before, now, strict=True) if b != a]
            raise AssertionError(f"a refused call wrote something: {changed}")


def _config(folder: Path, **extra: Any) -> dict[str, Any]:
    raw = sqlite_config(folder)
    raw["limits"] = dict(LIMITS)
    raw["unique"] = UNIQUE
    raw.update(extra)
    return raw


@pytest.fixture(scope="module")
def sqlite_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    folder = tmp_path_factory.mktemp("hostile")
    with Store.from_config(_config(folder)) as s:
        yield World(s, folder)


@pytest.fixture(scope="module", params=["sqlite", "sqlite-cached", "mariadb"])
def world(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The same attack on each backend: SQLite, SQLite with the in-process caches, MariaDB."""
    if request.param == "mariadb":
        from tests.conftest import mariadb_config

        request.getfixturevalue("mariadb_ready")
        raw = mariadb_config()
        raw["limits"] = dict(LIMITS)  # no unique keys: the shared shards were made without them
    else:
        raw = _config(tmp_path_factory.mktemp(request.param))
        if request.param == "sqlite-cached":
            raw["cache"] = {"memory": True}
    with Store.from_config(raw) as s:
        yield World(s)


# -- what a refusal must look like -------------------------------------------------------------


def check_message(exc: BaseException) -> str:
    """One printable line, not empty, not a wall of text."""
    msg = str(exc)
    assert msg.strip(), f"{type(exc).__name__} without a message"
    assert "\n" not in msg, msg
    assert len(msg) <= 700, f"{len(msg)} characters: {msg[:200]}..."
    msg.encode("utf-8")  # no lone surrogates: it prints on any terminal
    return msg


def refused(call: Callable[[], object], *kinds: type[StoreError]) -> StoreError:
    """The `StoreError` ``call`` raises (of ``kinds``, if given); anything else fails the test."""
    with pytest.raises(StoreError) as info:
        call()
    exc = info.value
    check_message(exc)
    assert type(exc) is not StoreError, f"the root class says nothing specific: {exc}"
    assert not isinstance(exc, BackendError), f"bad input reached the database: {exc!r}"
    if kinds:
        assert isinstance(exc, kinds), f"{type(exc).__name__} ({exc}), expected one of {kinds}"
    return exc


def routes(store: Store, value: object) -> bool:
    """True if ``value`` is a well-formed ID of a configured type on a mapped shard."""
    try:
        store.locate(value)  # type: ignore[arg-type]
    except StoreError:
        return False
    return True


# -- IDs ---------------------------------------------------------------------------------------


class Color(enum.IntEnum):
    RED = 1


EDGE_INTS = [
    0,
    -1,
    1,
    -(1 << 63),
    -(1 << 63) - 1,
    (1 << 62) - 1,  # shard 65535: not in the map
    1 << 62,  # a reserved bit
    (1 << 63) - 1,
    1 << 63,
    (1 << 64) - 1,
    1 << 64,
    10**30,
    10**5000,  # too long even to print
    -(10**5000),
    encode_pinterest(0, 7, 1),  # a type id no type uses
    encode_pinterest(0, 1, 0),  # local id 0
    encode_pinterest(9, 1, 1),  # shard 9 of 8
    encode_pinterest(0xFFFF, 1, 1),
]
ODD_IDS: list[object] = [
    0.0,
    1.5,
    float(1 << 40),
    math.nan,
    math.inf,
    -math.inf,
    True,
    False,
    None,
    "",
    "1",
    "0x10",
    "\ud800",
    b"1",
    bytearray(b"1"),
    [1],
    (1,),
    {1: 2},
    {1},
    1 + 2j,
    decimal.Decimal(1),
    object(),
]
HOSTILE_IDS = st.one_of(
    st.sampled_from(EDGE_INTS),
    st.sampled_from(ODD_IDS),
    st.integers(),
    st.integers(min_value=1 << 62),
    st.integers(max_value=-1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.binary(max_size=10),
    st.lists(st.integers(), max_size=3),
    st.tuples(st.integers()),
    st.dictionaries(st.integers(), st.integers(), max_size=2),
)

# Each call that takes an ID, with the bad one in the ID's place (w: the world, v: the value).
ID_CALLS: dict[str, Callable[[World, Any], object]] = {
    "get": lambda w, v: w.store.get(v),
    "require": lambda w, v: w.store.require(v),
    "get typed": lambda w, v: w.store.get(v, type_name="pin"),
    "get_with_version": lambda w, v: w.store.get_with_version(v),
    "get_many": lambda w, v: w.store.get_many([w.pin, v]),
    "get_many typed": lambda w, v: w.store.get_many([w.pin, v], type_name="pin"),
    "locate": lambda w, v: w.store.locate(v),
    "update": lambda w, v: w.store.update(v, {"x": 1}),
    "update fn": lambda w, v: w.store.update(v, lambda o: {**o, "x": 1}),
    "delete": lambda w, v: w.store.delete(v),
    "create near": lambda w, v: w.store.create("pin", {"n": 1}, near=v),
    "create shard": lambda w, v: w.store.create("pin", {"n": 1}, shard=v),
    "link from": lambda w, v: w.store.link(BHP, v, w.pin),
    "link to": lambda w, v: w.store.link(BHP, w.board, v),
    "link sequence": lambda w, v: w.store.link(BHP, w.board, w.pin, sequence=v),
    "unlink from": lambda w, v: w.store.unlink(BHP, v, w.pin),
    "unlink to": lambda w, v: w.store.unlink(BHP, w.board, v),
    "unlink to, no inverse": lambda w, v: w.store.unlink("users_has_pins", w.user, v),
    "link to, no inverse": lambda w, v: w.store.link("users_has_pins", w.user, v),
    "has_link": lambda w, v: w.store.has_link(BHP, w.board, v),
    "links": lambda w, v: w.store.links(BHP, v),
    "page": lambda w, v: w.store.page(BHP, v),
    "page with cursor": lambda w, v: w.store.page(BHP, v, cursor=w.cursor),
    "count": lambda w, v: w.store.count(BHP, v),
    "board_pins": lambda w, v: w.store.board_pins(v),
    "has_links from": lambda w, v: w.store.has_links(BHP, v, [w.pin]),
    "has_links to": lambda w, v: w.store.has_links(BHP, w.board, [w.pin, v]),
    "has_links to, many": lambda w, v: w.store.has_links(BHP, w.board, [*w.pins * 8, v]),
    "has_links_many from": lambda w, v: w.store.has_links_many(BHP, [(w.board, w.pin), (v, w.pin)]),
    "has_links_many to": lambda w, v: w.store.has_links_many(BHP, [(w.board, w.pin), (w.board, v)]),
    "pages_many": lambda w, v: w.store.pages_many(BHP, [w.board, v]),
    "board_pins_many": lambda w, v: w.store.board_pins_many([w.board, v]),
}
# Where the value is not an ID but a number: a shard, a sequence (None there means "none given").
NUMBERS = {"create shard": (0, 8), "link sequence": (-(1 << 63), 1 << 63)}


@PROPERTY
@given(bad=HOSTILE_IDS, call=st.sampled_from(sorted(ID_CALLS)))
@example(bad=10**5000, call="get_many")
@example(bad=1 << 63, call="link to")
@example(bad=math.nan, call="update")
@example(bad=True, call="has_links to")
@example(bad=None, call="has_link")
@example(bad=None, call="unlink to, no inverse")
@example(bad=None, call="link to, no inverse")
@example(bad=0, call="create near")
@example(bad=5, call="create near")  # shard bits 0, type 0: no object's ID
@example(bad=[1], call="pages_many")
@example(bad={1: 2}, call="has_links_many to")
@example(bad=1 << 63, call="link sequence")
@example(bad=10**5000, call="create shard")
def test_hostile_ids(world: World, bad: object, call: str) -> None:
    if call in NUMBERS:
        low, high = NUMBERS[call]
        assume(bad is not None and not (type(bad) is int and low <= bad < high))
    else:
        assume(bad is not None or call != "create near")  # near=None: no placement asked
        assume(not routes(world.store, bad))
    refused(lambda: ID_CALLS[call](world, bad))
    world.unchanged()


# -- collections of IDs ------------------------------------------------------------------------

NOT_COLLECTIONS = st.one_of(
    st.sampled_from([0, 5, 1 << 64, 10**5000, 1.5, math.nan, True, None, "123", b"12", bytearray(b"1")]),
    st.integers(),
    st.text(min_size=1, max_size=10),
    st.binary(min_size=1, max_size=10),
    st.floats(),
)
BAD_PAIRS = st.one_of(
    st.sampled_from([[(1, 2, 3)], [1], [(1,)], [None], ["ab"], [([1], 2)], [({}, 2)], [[1, 2, 3]]]),
    st.lists(st.tuples(HOSTILE_IDS, HOSTILE_IDS), min_size=1, max_size=3),
)
COLLECTION_CALLS: dict[str, Callable[[World, Any], object]] = {
    "get_many": lambda w, v: w.store.get_many(v),
    "has_links": lambda w, v: w.store.has_links(BHP, w.board, v),
    "pages_many": lambda w, v: w.store.pages_many(BHP, v),
    "board_pins_many": lambda w, v: w.store.board_pins_many(v),
    "has_links_many": lambda w, v: w.store.has_links_many(BHP, v),
}


@PROPERTY
@given(bad=NOT_COLLECTIONS, call=st.sampled_from(sorted(COLLECTION_CALLS)))
@example(bad=10**5000, call="get_many")
@example(bad="12", call="has_links")
@example(bad=None, call="pages_many")
def test_hostile_id_collections(world: World, bad: object, call: str) -> None:
    refused(lambda: COLLECTION_CALLS[call](world, bad), IdError)
    world.unchanged()


@PROPERTY
@given(bad=BAD_PAIRS)
@example(bad=[([1], 2)])
@example(bad=[(1, 2, 3)])
def test_hostile_pairs(world: World, bad: list[Any]) -> None:
    assume(
        not all(isinstance(p, tuple) and len(p) == 2 and all(routes(world.store, v) for v in p) for p in bad)
    )
    refused(lambda: world.store.has_links_many(BHP, bad))
    world.unchanged()


def test_wrong_types_in_each_place(world: World) -> None:
    w = world
    s = w.store
    for call in (
        lambda: s.link(BHP, w.pin, w.pin),
        lambda: s.link(BHP, w.board, w.board),
        lambda: s.link(BHP, w.user, w.pin),
        lambda: s.unlink(BHP, w.board, w.user),
        lambda: s.get(w.board, type_name="pin"),
        lambda: s.get_many([w.pin, w.board], type_name="pin"),
        lambda: s.update(w.board, {"x": 1}, type_name="pin"),
        lambda: s.delete(w.pin, type_name="user"),
        lambda: s.page(BHP, w.pin),
        lambda: s.count(BHP, w.user),
        lambda: s.has_links(BHP, w.board, [w.pin, w.board]),
        lambda: s.has_links_many(BHP, [(w.pin, w.pin)]),
        lambda: s.pages_many(BHP, [w.board, w.pin]),
        lambda: s.board_pins_many([w.pin]),
        lambda: s.board_pins(w.pin),
    ):
        refused(call, IdError)
    w.unchanged()


# -- object data -------------------------------------------------------------------------------


def nested(depth: int, leaf: object = 1) -> dict[str, Any]:
    """A dict ``depth`` containers deep (dicts and lists taking turns)."""
    node: object = leaf
    for i in range(depth - 1):
        node = {"k": node} if i % 2 else [node]
    return {"top": node}


class Slotted:
    __slots__ = ()


BAD_LEAVES = st.one_of(
    st.sampled_from(
        [
            math.nan,
            math.inf,
            -math.inf,
            1 << 64,
            -(1 << 63) - 1,
            10**5000,
            {1, 2},
            frozenset(),
            (1, 2),
            b"bytes",
            bytearray(b"x"),
            dt.datetime(2020, 1, 1),
            dt.date(2020, 1, 1),
            decimal.Decimal("1.5"),
            1 + 2j,
            Color.RED,
            collections.OrderedDict(a=1),
            Slotted(),
            object(),
            range(3),
            "\ud800",
            "ok\udfffok",
        ]
    ),
    st.integers(min_value=1 << 64),
    st.integers(max_value=-(1 << 63) - 1),
    st.floats(allow_nan=True, allow_infinity=True).filter(lambda f: not math.isfinite(f)),
    st.builds(
        lambda a, s, b: a + s + b,
        st.text(max_size=5),
        st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
        st.text(max_size=5),
    ),
    st.sets(st.integers(), max_size=3),
    st.tuples(st.integers()),
)
BAD_KEYS = st.one_of(
    st.integers(),
    st.none(),
    st.booleans(),
    st.floats(),
    st.tuples(st.integers()),
    st.binary(max_size=4),
    st.builds(lambda s: "k" + s, st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)),
)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(1 << 63), (1 << 63) - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)


@st.composite
def bad_data(draw: st.DrawFn) -> object:
    """Object data with one bad thing in it, somewhere."""
    kind = draw(st.sampled_from(["leaf", "key", "deep", "large", "top"]))
    if kind == "deep":
        return nested(draw(st.integers(MAX_DEPTH + 1, 400)))
    if kind == "large":
        return {"big": "x" * draw(st.integers(MAX_OBJECT_BYTES, 4 * MAX_OBJECT_BYTES)), "n": 1}
    if kind == "top":
        return draw(
            st.one_of(
                st.lists(JSON_SCALARS, max_size=3),
                JSON_SCALARS,
                BAD_LEAVES,
                st.just(collections.OrderedDict()),
            )
        )
    bad = draw(BAD_LEAVES) if kind == "leaf" else {draw(BAD_KEYS): 1}
    # Put it down a random path, beside good values.
    for _ in range(draw(st.integers(0, min(4, MAX_DEPTH - 2)))):
        siblings = draw(st.dictionaries(st.text(max_size=5), JSON_SCALARS, max_size=3))
        if draw(st.booleans()):
            bad = [*draw(st.lists(JSON_SCALARS, max_size=2)), bad]
        else:
            bad = {**siblings, draw(st.text(max_size=5)): bad}
    good = draw(st.dictionaries(st.text(max_size=5), JSON_SCALARS, max_size=3))
    return {**good, draw(st.text(max_size=5)): bad}


DATA_CALLS: dict[str, Callable[[World, Any], object]] = {
    "create": lambda w, v: w.store.create("pin", v, near=w.board),
    "create user": lambda w, v: w.store.create("user", v),
    "update": lambda w, v: w.store.update(w.pin, v),
    "update fn": lambda w, v: w.store.update(w.pin, lambda old: v),
    "update fn merged": lambda w, v: w.store.update(w.pin, lambda old: {**old, "new": v}),
    "update keyed": lambda w, v: w.store.update(w.user, v),
    "update keyed fn": lambda w, v: w.store.update(w.user, lambda old: {**old, "name": "renamed", "x": v}),
}


@PROPERTY
@given(data=bad_data(), call=st.sampled_from(sorted(DATA_CALLS)))
@example(data=nested(MAX_DEPTH + 1), call="create")
@example(data=nested(300), call="update")  # deeper than orjson encodes
@example(data={"s": "\ud800"}, call="create")
@example(data={"\ud800": 1}, call="update keyed fn")
@example(data={"a": math.nan}, call="update fn")
@example(data={1: "int key"}, call="create user")
@example(data={"a": 10**5000}, call="update keyed")
@example(data={"a": {1, 2}}, call="create")
@example(data={"a": "x" * (2 * MAX_OBJECT_BYTES)}, call="update fn merged")
@example(data=[1, 2], call="update")
@example(data=None, call="create")
def test_hostile_object_data(world: World, data: object, call: str) -> None:
    if call in ("update fn merged", "update keyed fn"):
        assume(isinstance(data, dict) and data)  # (a plain value put in a dict may be fine)
    refused(lambda: DATA_CALLS[call](world, data), DataError)
    world.unchanged()
    assert world.store.get(world.pin) == {"n": 0}


# -- unique key values ---------------------------------------------------------------------------

BAD_UNIQUE_VALUES = st.one_of(
    st.sampled_from(
        ["", "x" * (MAX_UNIQUE_VALUE_BYTES + 1), "é" * MAX_UNIQUE_VALUE_BYTES, [], ["ada"], {"a": 1}]
    ),
    st.sampled_from([True, False, 1.5, 1 << 64, -(1 << 63) - 1, 10**5000]),
    st.text(min_size=MAX_UNIQUE_VALUE_BYTES + 1, max_size=MAX_UNIQUE_VALUE_BYTES + 100),
    st.lists(st.text(max_size=3), max_size=2),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)
UNIQUE_CALLS: dict[str, Callable[[World, Any], object]] = {
    "create": lambda w, v: w.store.create("user", {"name": v}),
    "update": lambda w, v: w.store.update(w.user, {"name": v}),
    "update fn": lambda w, v: w.store.update(w.user, lambda old: {**old, "name": v}),
    "lookup": lambda w, v: w.store.lookup("user_by_name", v),
}


@PROPERTY
@given(
    value=BAD_UNIQUE_VALUES | st.sampled_from(["\ud800", None]), call=st.sampled_from(sorted(UNIQUE_CALLS))
)
@example(value="\ud800", call="lookup")
@example(value=10**5000, call="lookup")
@example(value="", call="update")
@example(value=["ada"], call="create")
def test_hostile_unique_values(sqlite_world: World, value: object, call: str) -> None:
    w = sqlite_world
    assume(value is not None or call == "lookup")  # None: no value, nothing to index
    refused(lambda: UNIQUE_CALLS[call](w, value), DataError)
    w.unchanged()
    assert w.store.lookup("user_by_name", f"ada-{w.board}") == w.user


# -- names -------------------------------------------------------------------------------------

HOSTILE_NAMES = st.one_of(
    st.sampled_from(
        [
            "",
            " ",
            "board_has_pins ",
            "BOARD_HAS_PINS",
            "pin; DROP TABLE pins; --",
            "pins` WHERE 1=1 -- ",
            "relation_counts",
            "unique_keys",
            "'",
            '"',
            "\x00",
            "\ud800",
            "é",
            "x" * 10_000,
            None,
            0,
            1.5,
            b"pin",
            ["pin"],
            {"pin": 1},
            ("pin",),
        ]
    ),
    st.text(),
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz_;'`\"-() *=", max_size=40),
    st.integers(),
    st.binary(max_size=10),
)
TYPE_CALLS: dict[str, Callable[[World, Any], object]] = {
    "create": lambda w, v: w.store.create(v, {"n": 1}),
    "get": lambda w, v: w.store.get(w.pin, type_name=v),
    "get_many": lambda w, v: w.store.get_many([w.pin], type_name=v),
    "get_many empty": lambda w, v: w.store.get_many([], type_name=v),
    "update": lambda w, v: w.store.update(w.pin, {"n": 5}, type_name=v),
    "delete": lambda w, v: w.store.delete(w.pin, type_name=v),
    "locate": lambda w, v: w.store.locate(w.pin, type_name=v),
    "lookup": lambda w, v: w.store.lookup(v, "ada"),
}
RELATION_CALLS: dict[str, Callable[[World, Any], object]] = {
    "link": lambda w, v: w.store.link(v, w.board, w.pin),
    "unlink": lambda w, v: w.store.unlink(v, w.board, w.pin),
    "links": lambda w, v: w.store.links(v, w.board),
    "page": lambda w, v: w.store.page(v, w.board),
    "page with cursor": lambda w, v: w.store.page(v, w.board, cursor=w.cursor),
    "count": lambda w, v: w.store.count(v, w.board),
    "has_link": lambda w, v: w.store.has_link(v, w.board, w.pin),
    "has_links": lambda w, v: w.store.has_links(v, w.board, [w.pin]),
    "has_links_many": lambda w, v: w.store.has_links_many(v, [(w.board, w.pin)]),
    "pages_many": lambda w, v: w.store.pages_many(v, [w.board]),
}


@PROPERTY
@given(name=HOSTILE_NAMES, call=st.sampled_from(sorted(TYPE_CALLS) + sorted(RELATION_CALLS)))
@example(name=["pin"], call="get")
@example(name={"pin": 1}, call="create")
@example(name=10**5000, call="lookup")
@example(name="x" * 10_000, call="count")
@example(name="\ud800", call="link")
@example(name=["board_has_pins"], call="has_links_many")
def test_hostile_names(sqlite_world: World, name: object, call: str) -> None:
    w = sqlite_world
    config = w.store.config
    known = set(config.types) | set(config.relations) | set(config.unique)
    assume(not (isinstance(name, str) and name in known))
    assume(name is not None or call in ("create", "lookup") or call in RELATION_CALLS)  # type_name=None: any
    if call in TYPE_CALLS:
        refused(lambda: TYPE_CALLS[call](w, name), UnknownTypeError)
    else:
        refused(lambda: RELATION_CALLS[call](w, name), UnknownRelationError)
    w.unchanged()


# -- cursors -----------------------------------------------------------------------------------


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _valid_at(i: int, v: object) -> bool:
    """Whether ``v`` is a valid field ``i`` of an oldest-first cursor of BHP (the from_id aside)."""
    if i == 0:
        return v == 1
    if i == 1:
        return v == BHP
    if i == 3:
        return type(v) is int and v == 0
    if i == 4:
        return type(v) is int and -(1 << 63) <= v < 1 << 63
    return type(v) is int and 0 <= v < 1 << 63  # 5: the to_id


@st.composite
def forged_cursors(draw: st.DrawFn, from_id: int) -> str:
    """A cursor of the right list whose JSON has a field of the wrong kind, out of range, or one too many."""
    fields: list[Any] = [1, BHP, from_id, 0, 5, 7]
    if draw(st.booleans()):
        fields.append(draw(JSON_SCALARS))
    else:
        i = draw(st.sampled_from([0, 1, 3, 4, 5]))
        value = draw(
            st.one_of(
                st.sampled_from([None, "x", 1.5, [], {}, True, 1 << 63, (1 << 64) - 1, -(1 << 63), 2, -1]),
                st.integers(-(1 << 63), (1 << 64) - 1),  # what JSON (orjson) carries
                st.text(max_size=5),
            )
        )
        assume(not _valid_at(i, value))
        fields[i] = value
    return b64(orjson.dumps(fields))


HOSTILE_CURSORS = st.one_of(
    st.sampled_from(
        ["", "=", "====", "AAAA", "\ud800", "é", "x" * (MAX_CURSOR + 1), "W10", b64(b"[]"), b64(b"{}")]
    ),
    st.text(max_size=80),
    st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=", max_size=120),
    st.binary(max_size=60).map(b64),
    st.integers(MAX_CURSOR + 1, 20 * MAX_CURSOR).map(lambda n: "W" * n),
    st.sampled_from([0, 10**5000, 1.5, b"abc", ["x"], {"a": 1}, True]),
    st.lists(JSON_SCALARS, max_size=9).map(lambda f: b64(orjson.dumps(f))),
)


def _page(w: World, cursor: Any, **kw: Any) -> object:
    return w.store.page(BHP, w.board, limit=1, cursor=cursor, **kw)


@PROPERTY
@given(cursor=HOSTILE_CURSORS, where=st.sampled_from(["page", "page newest", "page ranged", "board_pins"]))
@example(cursor="x" * (MAX_CURSOR + 1), where="page")
@example(cursor=10**5000, where="board_pins")
@example(cursor="\ud800", where="page ranged")
def test_hostile_cursors(world: World, cursor: Any, where: str) -> None:
    w = world
    calls: dict[str, Callable[[], object]] = {
        "page": lambda: _page(w, cursor),
        "page newest": lambda: _page(w, cursor, newest_first=True),
        "page ranged": lambda: _page(w, cursor, since=0),
        "board_pins": lambda: w.store.board_pins(w.board, limit=1, cursor=cursor),
    }
    exc = refused(calls[where], CursorError)
    if isinstance(cursor, str) and len(cursor) > MAX_CURSOR:
        assert "max_cursor_bytes" in str(exc)
    w.unchanged()


@PROPERTY
@given(cut=st.integers(0, 200), data=st.data(), flip=st.integers(0, 200), char=st.sampled_from("A_-0z="))
def test_truncated_forged_and_mutated_cursors(
    world: World, cut: int, data: st.DataObject, flip: int, char: str
) -> None:
    w = world
    valid = w.cursor
    # A truncated cursor: never a cursor.
    refused(lambda: _page(w, valid[: cut % len(valid)]), CursorError)
    # A forged one: this list, but a field of the wrong kind or out of range.
    forged = data.draw(forged_cursors(w.board))
    refused(lambda: _page(w, forged), CursorError)
    # One character changed: refused, or another position in the same list (a cursor is a
    # position, not a secret); either way a page of this list comes back, or a CursorError.
    i = flip % len(valid)
    mutated = valid[:i] + char + valid[i + 1 :]
    try:
        page = w.store.page(BHP, w.board, limit=1, cursor=mutated)
    except CursorError as exc:
        check_message(exc)
    else:
        assert set(page.ids) <= set(w.store.links(BHP, w.board, limit=100))
    w.unchanged()


def test_cursors_of_other_lists_directions_ranges_and_stores(world: World, tmp_path: Path) -> None:
    w = world
    s = w.store
    seq, to_id = 1, w.pin
    ranged = s.page(BHP, w.board, limit=1, since=0).next_cursor
    newest = s.page(BHP, w.board, limit=1, newest_first=True).next_cursor
    inverse = s.page("pin_owned_by_board", w.far_pin, limit=1).next_cursor
    assert ranged is not None
    assert newest is not None
    assert inverse is not None
    refused(lambda: _page(w, ranged), CursorError)  # a ranged cursor without its range
    refused(lambda: _page(w, ranged, since=1), CursorError)  # with another range
    refused(lambda: _page(w, ranged, since=0, until=5), CursorError)
    refused(lambda: _page(w, w.cursor, since=0), CursorError)  # an unranged one with a range
    refused(lambda: _page(w, newest), CursorError)  # another direction
    refused(lambda: _page(w, w.cursor, newest_first=True), CursorError)
    refused(lambda: _page(w, inverse), CursorError)  # another relation (the inverse)
    refused(lambda: s.page("users_likes_pins", w.user, cursor=w.cursor), CursorError)
    refused(lambda: _page(w, encode_cursor(BHP, w.other_board, False, seq, to_id)), CursorError)
    refused(lambda: s.board_pins(w.other_board, cursor=w.cursor), CursorError)  # another board
    refused(lambda: s.board_pins(w.board, cursor=newest), CursorError)
    # Another store's cursor, for its own board: refused here. (A board with the same ID would
    # name the same relation and from_id: a position in that list, which is all a cursor is.)
    with Store.from_config(_config(tmp_path)) as elsewhere:
        b = elsewhere.create("board", {}, shard=3)
        for p in [elsewhere.create("pin", {}, near=b) for _ in range(2)]:
            elsewhere.link(BHP, b, p)
        theirs = elsewhere.page(BHP, b, limit=1).next_cursor
    assert theirs is not None
    assert b not in (w.board, w.other_board)
    refused(lambda: _page(w, theirs), CursorError)
    w.unchanged()


# -- other page arguments ----------------------------------------------------------------------

HOSTILE_INTS = st.one_of(
    st.sampled_from(
        [0, -1, 1 << 63, 1 << 64, 10**5000, -(10**5000), True, None, 1.5, math.nan, "5", b"5", [5]]
    ),
    st.integers(),
    st.floats(),
    st.text(max_size=5),
)


@PROPERTY
@given(
    value=HOSTILE_INTS,
    arg=st.sampled_from(["limit", "offset", "since", "until", "newest_first", "if_version"]),
)
@example(value=1 << 63, arg="offset")
@example(value=10**5000, arg="if_version")
@example(value="false", arg="newest_first")
def test_hostile_page_arguments(sqlite_world: World, value: Any, arg: str) -> None:
    w = sqlite_world
    s = w.store
    if arg == "limit":
        assume(not (type(value) is int and 1 <= value <= s.config.max_page))
        call: Callable[[], object] = lambda: s.page(BHP, w.board, limit=value)  # noqa: E731
    elif arg == "offset":
        assume(not (type(value) is int and 0 <= value < 1 << 63))
        call = lambda: s.links(BHP, w.board, offset=value)  # noqa: E731
    elif arg in ("since", "until"):
        assume(value is not None and not (type(value) is int and -(1 << 63) <= value < 1 << 63))
        call = lambda: s.page(BHP, w.board, **{arg: value})  # noqa: E731
    elif arg == "newest_first":
        assume(value is not True and value is not False)
        call = lambda: s.page(BHP, w.board, newest_first=value)  # noqa: E731
    else:
        assume(value is not None and not (type(value) is int and 1 <= value < 1 << 63))
        call = lambda: s.update(w.pin, {"n": 7}, if_version=value)  # noqa: E731
    refused(call, LimitError, DataError)
    w.unchanged()


# -- the ID functions -----------------------------------------------------------------------------

ID_FUNCTIONS: dict[str, Callable[[Any], object]] = {
    "decode_pinterest": lambda v: decode_pinterest(v),
    "decode_instagram": lambda v: decode_instagram(v),
    "instagram_datetime epoch": lambda v: instagram_datetime(5, v),
    "encode_pinterest shard": lambda v: encode_pinterest(v, 1, 1),
    "encode_pinterest type": lambda v: encode_pinterest(1, v, 1),
    "encode_pinterest local": lambda v: encode_pinterest(1, 1, v),
    "encode_instagram ms": lambda v: encode_instagram(v, 1, 1),
    "encode_instagram shard": lambda v: encode_instagram(1, v, 1),
}


@PROPERTY
@given(
    value=HOSTILE_IDS | st.sampled_from([1 << 62, -(1 << 62), 1 << 50]),
    call=st.sampled_from(sorted(ID_FUNCTIONS)),
)
@example(value=1 << 62, call="instagram_datetime epoch")
@example(value=10**5000, call="encode_pinterest local")
def test_hostile_id_functions(value: object, call: str) -> None:
    try:
        ID_FUNCTIONS[call](value)
    except IdError as exc:
        check_message(exc)
    # (a value in range is fine: these are pure functions)


@pytest.mark.parametrize(
    "source",
    [5, 1.5, b"store.yaml", ["store.yaml"], object(), 10**5000],
    ids=["int", "float", "bytes", "list", "object", "huge int"],
)
def test_store_from_a_config_of_the_wrong_kind(source: object) -> None:
    refused(lambda: Store.from_config(source), ConfigError)  # type: ignore[arg-type]


# -- configs -----------------------------------------------------------------------------------


def full_config(folder: Path) -> dict[str, Any]:
    """A valid config dict that sets every section."""
    raw = _config(folder)
    raw["cache"] = {"memory": True, "prefix": "h:", "ttl_s": 60, "max_stale_s": 5, "list_entries": 100}
    raw["limits"] = {
        "max_object_bytes": 4096,
        "max_page": 100,
        "max_ids": 1000,
        "id_chunk": 100,
        "max_cursor_bytes": 256,
        "max_depth": 10,
    }
    raw["open_shards"] = [[0, 3], [5, 6]]
    raw["pool_size"] = 4
    raw["connect_timeout_s"] = 2
    raw["map_source"] = {"file": str(folder / "map.yaml"), "poll_s": 1}
    raw["tickets"] = {"servers": ["mysql+pymysql://root@127.0.0.1:3306"], "counters": ["photos"]}
    return raw


def _paths(node: object, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


#: Every place in the config (() is the whole of it), in a stable order.
CONFIG_PATHS = sorted(_paths(full_config(Path("folder"))), key=repr)
HOSTILE_VALUES = st.one_of(
    st.sampled_from(
        [
            None,
            0,
            -1,
            1 << 63,
            10**5000,
            1.5,
            math.nan,
            math.inf,
            True,
            False,
            "",
            "x",
            "\ud800",
            "x" * 5000,
            b"x",
            [],
            [1],
            [[1, 2]],
            [None],
            {},
            {"a": 1},
            {1: 2},
            {None: 1},
            {(1,): 2},
            {1: 2, "a": 3},
            ("a",),
            {"x"},
            object(),
        ]
    ),
    st.integers(),
    st.floats(),
    st.text(max_size=20),
    st.lists(st.integers() | st.text(max_size=3), max_size=3),
    st.dictionaries(st.text(max_size=3) | st.integers(), st.integers() | st.text(max_size=3), max_size=3),
)
HOSTILE_KEYS = st.sampled_from([1, None, True, (1,), "", "\ud800", "x" * 300, b"x"])


@pytest.fixture(scope="module")
def config_base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("config")
    raw = full_config(folder)
    StoreConfig.from_dict(raw, base_dir=folder, environ={})  # it is valid
    return folder, raw


def _replaced(raw: dict[str, Any], path: tuple[Any, ...], value: object, as_key: bool) -> object:
    """``raw`` with the value at ``path`` (or its key, ``as_key``) replaced by ``value``."""
    if not path:
        return value
    out: dict[str, Any] = orjson.loads(orjson.dumps(raw))  # a deep copy (it is plain JSON)
    node: Any = out
    for k in path[:-1]:
        node = node[k]
    if as_key and isinstance(node, dict):
        node[value] = node.pop(path[-1])
    else:
        node[path[-1]] = value
    return out


@PROPERTY
@given(path=st.sampled_from(CONFIG_PATHS), value=HOSTILE_VALUES, as_key=st.booleans(), key=HOSTILE_KEYS)
@example(path=("map", 0, "master"), value=[1], as_key=False, key=1)
@example(path=("relations", BHP, "from"), value={}, as_key=False, key=1)
@example(path=("limits", "max_page"), value=10**5000, as_key=False, key=1)
@example(path=("tickets", "servers", 0), value="x", as_key=False, key=1)
@example(path=("cache",), value=10**5000, as_key=False, key=1)
@example(path=(), value={1: 2, "a": 3}, as_key=False, key=1)
def test_hostile_config_fields(
    config_base: tuple[Path, dict[str, Any]], path: tuple[Any, ...], value: object, as_key: bool, key: object
) -> None:
    """Each field (or key) of a valid config replaced in turn: a `ConfigError`, or a valid config."""
    folder, raw = config_base
    changed = _replaced(raw, path, key if as_key else value, as_key)
    try:
        StoreConfig.from_dict(changed, base_dir=folder, environ={})  # type: ignore[arg-type]
    except ConfigError as exc:
        check_message(exc)


# -- the CLI -----------------------------------------------------------------------------------

ID_TEXT = st.one_of(
    st.sampled_from(
        [
            *("", " ", "x", "9" * 5000, "-1", "0x10", "0b1", "1e5", "1.0", " 1", "٣", "\udcff"),
            *(str(1 << 63), str(1 << 64), "--", "nan"),
        ]
    ),
    st.text(max_size=25),
    st.integers().map(str),
)
ARG_TEXT = st.one_of(
    st.sampled_from(["", "x", "-1", "0", "9" * 400, "\udcff", "'; DROP TABLE pins; --", "nan", str(1 << 64)]),
    st.text(max_size=25),
    st.integers().map(str),
)
BAD_JSON = st.one_of(
    st.sampled_from(
        [
            *("", "{", "[]", "null", "1", '"x"', '{"a": NaN}', '{"a": Infinity}', '{"a": 1e999}'),
            *('{"a": "\\ud800"}', '{"\\udfff": 1}', '{"a": ' + "1" * 30 + "}", '{"a": {"b": -Infinity}}'),
        ]
    ),
    st.text(max_size=30).filter(lambda t: not t.strip().startswith("{")),
    st.integers(MAX_DEPTH + 1, 200).map(lambda n: '{"a": ' + "[" * n + "]" * n + "}"),
    st.integers(MAX_OBJECT_BYTES, 3 * MAX_OBJECT_BYTES).map(lambda n: '{"a": "' + "x" * n + '"}'),
)


def _as_int(text: str, base: int = 10) -> int | None:
    """``text`` as click (base 10) or the ID parser (base 0) reads it, or None."""
    try:
        return int(text, base)
    except ValueError:
        return None


@st.composite
def cli_args(draw: st.DrawFn, w: World, command: str) -> list[str]:
    """Arguments for ``command`` with at least one of them bad; writes never get a valid set."""
    board, pin = str(w.board), str(w.pin)
    if command == "get":
        return ["get", draw(ID_TEXT)]
    if command == "ids decode":
        scheme = draw(st.sampled_from([[], ["--json"], ["--scheme", "instagram"]]))
        epoch = ["--epoch-ms", draw(ARG_TEXT | st.sampled_from([str(1 << 62), str(-(1 << 62))]))]
        return ["ids", "decode", draw(ID_TEXT), *scheme, *(epoch if "instagram" in scheme else [])]
    if command == "links":
        option = draw(st.sampled_from(["--limit", "--cursor", "--offset", "--since", "--until", None]))
        if option is None:
            return ["links", draw(ARG_TEXT), draw(st.just(board) | ID_TEXT)]
        return ["links", BHP, board, option, draw(ARG_TEXT)]
    if command == "link":
        args = [BHP, board, pin]
        which = draw(st.sampled_from(["relation", "from", "to", "sequence"]))
        if which == "sequence":
            value = draw(ARG_TEXT)
            number = _as_int(value)
            assume(number is None or not -(1 << 63) <= number < 1 << 63)
            return ["link", *args, "--sequence", value]
        i = ["relation", "from", "to"].index(which)
        args[i] = draw(ARG_TEXT if which == "relation" else ID_TEXT)
        assume(
            args[0] not in w.store.config.relations
            or not all(routes(w.store, _as_int(a, 0)) for a in args[1:])
        )
        return ["link", *args]
    which = draw(st.sampled_from(["type", "json", "near", "shard"]))
    if which == "type":
        name = draw(ARG_TEXT)
        assume(name not in w.store.config.types)
        return ["create", name, '{"n": 1}']
    if which == "json":
        return ["create", "pin", draw(BAD_JSON)]
    if which == "near":
        near = draw(ID_TEXT)
        number = _as_int(near, 0)
        assume(number is None or not routes(w.store, number))
        return ["create", "pin", '{"n": 1}', "--near", near]
    shard = draw(ARG_TEXT)
    number = _as_int(shard)
    assume(number is None or not 0 <= number < w.store.config.shards)
    return ["create", "pin", '{"n": 1}', "--shard", shard]


def _check_cli(w: World, config_file: Path, args: list[str]) -> int:
    """Run ``store ARGS``: exit 0, 1 with one ``error:`` line, or 2 with click's usage error; no traceback."""
    full = args if args[0] == "ids" else [*args, "--config", str(config_file)]
    result = CliRunner().invoke(main, full)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"store {' '.join(args)!r:.200}: a traceback") from result.exception
    code, err = result.exit_code, result.stderr
    if code == 1:
        lines = err.splitlines()
        assert len(lines) == 1, (args, err[:300])
        assert lines[0].startswith("error: "), (args, err[:300])
    elif code == 2:
        assert "Usage:" in err or "Error:" in err, (args, err[:300])
    else:
        assert code == 0, (args, code, err[:300])
    w.unchanged()
    return int(code)


@pytest.fixture(scope="module")
def cli_config(sqlite_world: World, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config file for the world's SQLite folders (the CLI opens a store of its own on them)."""
    assert sqlite_world.folder is not None
    path = tmp_path_factory.mktemp("cli") / "store.yaml"
    path.write_text(yaml.safe_dump(_config(sqlite_world.folder)))
    return path


CLI_COMMANDS = ["get", "ids decode", "links", "link", "create"]


@PROPERTY
@given(command=st.sampled_from(CLI_COMMANDS), data=st.data())
def test_hostile_cli_arguments(
    sqlite_world: World, cli_config: Path, command: str, data: st.DataObject
) -> None:
    args = data.draw(cli_args(sqlite_world, command))
    code = _check_cli(sqlite_world, cli_config, args)
    if command in ("link", "create"):
        assert code != 0, f"store {args!r:.200} wrote"


@pytest.mark.parametrize(
    "args",
    [
        ["get", "9" * 5000],
        ["get", "\udcff"],
        ["get", str(1 << 64)],
        ["links", BHP, "{board}", "--offset", str(1 << 63)],
        ["links", BHP, "{board}", "--cursor", "x" * 5000],
        ["links", BHP, "{board}", "--limit", "9" * 30],
        ["links", "\udcff", "{board}"],
        ["link", BHP, "{board}", "{board}"],
        ["link", BHP, "{board}", "{pin}", "--sequence", str(1 << 70)],
        ["create", "pin", "{{}}", "--near", "5"],
        ["create", "pin", '{{"\udcff": 1}}'],
        ["create", "pin", '{{"a": "\\ud800"}}'],
        ["create", "pin", "{{}}", "--shard", str(1 << 70)],
        ["ids", "decode", "--scheme", "instagram", str(1 << 62), "--epoch-ms", str(1 << 62)],
        ["ids", "decode", "--scheme", "instagram", "5", "--epoch-ms", str(-(1 << 62))],
    ],
    ids=lambda a: " ".join(a)[:40],
)
def test_cli_named_edges(sqlite_world: World, cli_config: Path, args: list[str]) -> None:
    w = sqlite_world
    filled = [a.format(board=w.board, pin=w.pin) if "{" in a else a for a in args]
    assert _check_cli(w, cli_config, filled) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["create", "pin", '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"],
        ["create", "pin", '{"a": ' + "9" * 5000 + "}"],
        ["get", "9" * 5000],
    ],
    ids=["deep JSON", "long int in JSON", "long ID"],
)
def test_cli_arguments_python_cannot_parse(sqlite_world: World, cli_config: Path, args: list[str]) -> None:
    assert _check_cli(sqlite_world, cli_config, args) == 1
    result = CliRunner().invoke(main, [*args, "--config", str(cli_config)])
    assert len(result.stderr) <= 300, result.stderr[:100]
