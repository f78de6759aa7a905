"""The Redis list backend answers every read as the in-process one does (the reference), on a real Redis.

A cached head is one string of packed members; reads find a cursor's place
by binary search over its bytes. Hypothesis draws lists (sequences that collide,
negative ones, to_ids at the ends of their range) and reads of every kind:
by rank either way, after a member either way, between lex bounds, whole,
meta only; one at a time and many in one pipeline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import green
from store.cache.lists import (
    IN_PLACE_MAX,
    ListRead,
    MemoryListBackend,
    encode_member,
    encode_members,
    lex_bound,
)
from store.cache.redis_lists import RedisListBackend
from tests.conftest import REDIS_TEST_URL

PREFIX = "rl:"

rows_st = st.lists(
    st.tuples(
        st.one_of(st.integers(0, 6), st.integers(-(1 << 63), (1 << 63) - 1)),
        st.one_of(st.integers(0, 6), st.integers(0, (1 << 63) - 1)),
    ),
    max_size=40,
    unique=True,
).map(sorted)
member_st = st.builds(
    encode_member, st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, (1 << 63) - 1)
) | st.sampled_from([b"\x00" * 16, b"\xff" * 16])


@pytest.fixture(scope="module")
def backends(redis_ready: str) -> Iterator[tuple[RedisListBackend, MemoryListBackend]]:
    r = RedisListBackend(REDIS_TEST_URL, prefix=PREFIX, timeout_s=2, connect_timeout_s=2)
    yield r, MemoryListBackend()
    r.close()


def _ops(draw: st.DrawFn, members: list[bytes]) -> list[tuple[object, ...]]:
    probe = st.sampled_from(members) | member_st if members else member_st
    ops: list[tuple[object, ...]] = [("meta",), ("all",)]
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["rank", "after", "lex"]))
        desc = draw(st.booleans())
        if kind == "rank":
            start = draw(st.integers(0, len(members) + 2))
            ops.append(("rank", start, start + draw(st.integers(0, 8)), desc))
        elif kind == "after":
            ops.append(("after", draw(probe), draw(st.integers(1, 10)), desc))
        else:
            low = lex_bound(draw(st.none() | probe), inclusive=draw(st.booleans()), low=True)
            high = lex_bound(draw(st.none() | probe), inclusive=draw(st.booleans()), low=False)
            ops.append(("lex", low, high, draw(st.integers(1, 10)), desc))
    return ops


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[tuple[int, int]], int, list[tuple[object, ...]], bool]:
    rows = draw(rows_st)
    more = draw(st.sampled_from([0, 0, 5]))  # the list is longer than its cached head
    newest = draw(st.booleans())  # the head is the list's newest entries (else its oldest)
    return rows, len(rows) + more, _ops(draw, [encode_member(s, t) for s, t in rows]), newest


def _same(got: ListRead | None, want: ListRead | None) -> None:
    assert got is not None
    assert want is not None
    assert (got.meta, got.members, got.last, got.read_ms, got.newest) == (
        want.meta,
        want.members,
        want.last,
        want.read_ms,
        want.newest,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_every_read_matches_the_reference(
    backends: tuple[RedisListBackend, MemoryListBackend],
    case: tuple[list[tuple[int, int]], int, list[tuple[object, ...]], bool],
) -> None:
    rows, n, ops, newest = case
    key = f"{PREFIX}l:case"
    for b in backends:
        b.invalidate([key], 60)
        version = b.read(key, ("meta",))
        assert version is not None
        assert b.fill(key, version.version, n, encode_members(rows), 60, 1234, 0, newest)
    red, ref = backends
    many = red.read_many([key] * len(ops), ops)
    for op, together in zip(ops, many, strict=True):
        want = ref.read(key, op)
        _same(red.read(key, op), want)
        _same(together, want)


def test_a_list_not_cached_and_a_stale_fill(backends: tuple[RedisListBackend, MemoryListBackend]) -> None:
    red, ref = backends
    key = f"{PREFIX}l:gone"
    for b in backends:
        b.invalidate([key], 60)
    for op in (("meta",), ("all",), ("after", b"\x00" * 16, 5, False), ("lex", b"-", b"+", 5, True)):
        got, want = red.read(key, op), ref.read(key, op)
        assert got is not None
        assert want is not None
        assert (got.meta, got.members, got.last) == (None, [], None) == (want.meta, want.members, want.last)
    seen = red.read(key, ("meta",))
    assert seen is not None
    red.invalidate([key], 60)  # a writer between the read and the fill: the fill is refused
    assert not red.fill(key, seen.version, 1, encode_members([(1, 2)]), 60, 1)
    now = red.read(key, ("meta",))
    assert now is not None
    assert now.meta is None
    assert red.fill(key, now.version, 0, b"", 60, 1)  # an empty list is cached too
    empty = red.read(key, ("all",))
    assert empty is not None
    assert (empty.meta, empty.members) == ((0, 0), [])


def test_a_list_key_of_the_old_layout_reads_as_not_cached(
    backends: tuple[RedisListBackend, MemoryListBackend],
) -> None:
    """An earlier version kept a sorted set under the list's key: it is a miss, and a fill replaces it."""
    red, _ref = backends
    key = f"{PREFIX}l:old"
    raw = redis.Redis.from_url(REDIS_TEST_URL)
    raw.delete(key, key + ":m")
    raw.zadd(key, {encode_member(1, 2): 0})
    raw.set(key + ":m", b"1:1:99")
    got = red.read(key, ("after", b"\x00" * 16, 5, False))
    assert got is not None
    assert got.meta is None
    assert red.breaker.allow()  # not counted as a failure of the server
    assert red.fill(key, got.version, 1, encode_members([(3, 4)]), 60, 5)
    again = red.read(key, ("all",))
    assert again is not None
    assert again.members == [encode_member(3, 4)]
    raw.delete(key, key + ":m", key + ":v")


def test_a_head_whose_meta_disagrees_reads_as_not_cached(
    backends: tuple[RedisListBackend, MemoryListBackend],
) -> None:
    """Eviction can take the head and leave its meta (or the reverse): that list is a miss, never a
    short or empty page."""
    red, _ref = backends
    key = f"{PREFIX}l:apart"
    raw = redis.Redis.from_url(REDIS_TEST_URL)
    red.invalidate([key], 60)
    seen = red.read(key, ("meta",))
    assert seen is not None
    assert red.fill(key, seen.version, 3, encode_members([(1, 1), (2, 2), (3, 3)]), 60, 7)
    raw.delete(key)  # the head evicted, its meta kept
    for op in (("all",), ("rank", 0, 1, False), ("after", b"\x00" * 16, 2, False)):
        got = red.read(key, op)
        assert got is not None
        assert (got.meta, got.members) == (None, []), op
    raw.delete(key + ":m", key + ":v")


change_st = st.tuples(
    st.integers(0, 2),  # which list
    st.sampled_from([0, 0, 1, 2, 3, 4]),  # how far past the cached version (0: unknown)
    st.sampled_from(["add", "add", "move", "remove"]),
    st.integers(1, 6),  # the sequence of the member put in place
    st.integers(1, 6),  # the to_id
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=rows_st,
    changes=st.lists(change_st, max_size=12) | st.lists(change_st, min_size=17, max_size=40),
    cap=st.integers(1, 8),
)
def test_a_batch_of_changes_ends_as_each_change_in_turn(
    backends: tuple[RedisListBackend, MemoryListBackend],
    rows: list[tuple[int, int]],
    changes: list[tuple[int, int, str, int, int]],
    cap: int,
) -> None:
    """One Lua call for a writer's whole batch (its lists with a change of unknown version only
    dropped, `split_changes`) leaves every list as the reference does making each change in turn,
    but a list with more than `IN_PLACE_MAX` changes, which it drops; a list it dropped refuses a
    fill read before the batch."""
    keys = [f"{PREFIX}l:batch{i}" for i in range(3)]
    at = 10  # the database's list version each list is cached at
    for b in backends:
        b.invalidate(keys, 60)
        for key in keys:
            seen = b.read(key, ("meta",))
            assert seen is not None
            assert b.fill(key, seen.version, len(rows), encode_members(rows), 60, 1234, at)
    red, ref = backends
    before = [red.read(key, ("meta",)) for key in keys]
    batch = [
        (keys[k], at + ahead if ahead else 0, kind, b"" if kind == "remove" else encode_member(s, t), t)
        for k, ahead, kind, s, t in changes
    ]
    red.apply(batch, 60, cap)
    for change in batch:
        ref.apply([change], 60, cap)
    for key, old in zip(keys, before, strict=True):
        mine = [c for c in batch if c[0] == key]
        if len(mine) > IN_PLACE_MAX:
            got = red.read(key, ("all",))
            assert got is not None
            assert got.meta is None  # dropped
        else:
            _same(red.read(key, ("all",)), ref.read(key, ("all",)))
        if len(mine) > IN_PLACE_MAX or any(not c[1] for c in mine):
            assert old is not None
            assert not red.fill(key, old.version, 1, encode_members([(1, 2)]), 60, 1)  # bumped


@given(
    keys=st.lists(st.text(max_size=20), max_size=4),
    args=st.lists(
        st.one_of(st.text(max_size=20), st.binary(max_size=40), st.integers(-(1 << 64), 1 << 64)), max_size=8
    ),
)
def test_the_script_call_is_packed_as_redis_py_packs_it(keys: list[str], args: list[object]) -> None:
    from redis._parsers import Encoder
    from redis.connection import PythonRespSerializer

    from store.cache.redis_lists import _evalsha

    theirs = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)
    sha = "0123456789abcdef0123456789abcdef01234567"
    assert _evalsha(sha, keys, args) == b"".join(theirs.pack("EVALSHA", sha, len(keys), *keys, *args))


@pytest.mark.parametrize("bad", [True, 1.5, None, ["x"]])
def test_a_script_argument_of_another_type_is_refused(bad: object) -> None:
    from store.cache.redis_lists import _evalsha

    with pytest.raises(redis.DataError, match="str, bytes or int"):
        _evalsha("0" * 40, ["k"], [bad])


def test_connections_made_again_past_redis_pys_count(redis_ready: str) -> None:
    """A connection closed outside redis-py's pool (an error, a fork, `close`) and made again is
    not counted against the pool's ``max_connections`` (100): the 101st is a connection too."""
    red = RedisListBackend(REDIS_TEST_URL, prefix=PREFIX, timeout_s=2, connect_timeout_s=2)
    key = f"{PREFIX}l:churn"
    try:
        red.invalidate([key], 60)
        for i in range(130):
            seen = red.read(key, ("meta",))
            assert seen is not None, i
            red.close()  # its connection closed: the next call makes one
        assert red.stats.errors == 0, red.stats.last_error
    finally:
        red.close()


def test_more_calls_at_once_than_redis_pys_count(redis_ready: str) -> None:
    """200 reads at once, each a call on one event loop parked on its reply: 200 connections
    open together, each read answered."""
    red = RedisListBackend(REDIS_TEST_URL, prefix=PREFIX, timeout_s=5, connect_timeout_s=5)
    key = f"{PREFIX}l:wide"
    red.invalidate([key], 60)
    assert red.fill(key, red.read(key, ("meta",)).version, 1, encode_members([(1, 2)]), 60, 1)  # type: ignore[union-attr]

    def read() -> ListRead | None:
        return red.read(key, ("all",))

    async def main() -> list[ListRead | None]:
        return await asyncio.gather(*(green.run(read) for _ in range(200)))

    try:
        got = asyncio.run(main())
        assert all(g is not None and g.members == [encode_member(1, 2)] for g in got)
        assert red.stats.errors == 0, red.stats.last_error
        assert len(red._idle) > 100  # (they were open at once)
    finally:
        red.close()
