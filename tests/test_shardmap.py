"""The shard map: construction checks, lookup, immutability."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from store import ConfigError, RoutingError, ShardMap, ShardRange


def pinterest_map() -> ShardMap:
    # Pinterest's start: 8 hosts x 512 shards.
    return ShardMap(
        [ShardRange(i * 512, i * 512 + 511, f"MySQL00{i + 1}A", f"MySQL00{i + 1}B") for i in range(8)],
        shards=4096,
    )


def test_lookup_finds_each_range() -> None:
    m = pinterest_map()
    assert m.master(0) == "MySQL001A"
    assert m.master(511) == "MySQL001A"
    assert m.master(512) == "MySQL002A"
    assert m.master(3429) == "MySQL007A"
    assert m.range_for(4095).slave == "MySQL008B"
    assert m.version == 1
    assert len(m.hosts()) == 16
    assert list(m.shards_of("MySQL002A")) == list(range(512, 1024))


@given(st.integers(0, 4095))
def test_lookup_agrees_with_a_scan(shard: int) -> None:
    m = pinterest_map()
    assert m.range_for(shard) == next(r for r in m.ranges if shard in r)


@pytest.mark.parametrize("shard", [-1, 4096, 70000])
def test_unmapped_shard_is_a_routing_error(shard: int) -> None:
    with pytest.raises(RoutingError, match=f"shard {shard} is not in the shard map"):
        pinterest_map().master(shard)


def test_single_range_fast_path_still_checks_bounds() -> None:
    m = ShardMap([ShardRange(0, 15, "a")], shards=16)
    assert m.master(15) == "a"
    with pytest.raises(RoutingError):
        m.master(16)


@pytest.mark.parametrize(
    ("ranges", "message"),
    [
        ([ShardRange(0, 10, "a"), ShardRange(12, 15, "b")], "gap: shards 11..11"),
        ([ShardRange(1, 15, "a")], "gap: shards 0..0"),
        ([ShardRange(0, 10, "a"), ShardRange(10, 15, "b")], "overlap at shard 10"),
        ([ShardRange(0, 14, "a")], "gap: shards 15..15"),
        ([ShardRange(0, 16, "a")], "beyond the last shard 15"),
        ([ShardRange(5, 0, "a")], "reversed"),
        ([], "map is empty"),
    ],
)
def test_bad_maps_are_rejected(ranges: list[ShardRange], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ShardMap(ranges, shards=16)


def test_map_is_immutable_and_comparable() -> None:
    a, b = pinterest_map(), pinterest_map()
    assert a == b
    assert hash(a) == hash(b)
    with pytest.raises(AttributeError):
        a.version = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        a.ranges[0].master = "x"  # type: ignore[misc]


def test_a_map_and_a_config_pickle_and_come_back_equal() -> None:
    """A config crosses to another process (spawn pickles it): the map comes back the same."""
    import pickle

    from store import StoreConfig
    from tests.conftest import mariadb_config

    config = StoreConfig.from_dict(mariadb_config())
    again = pickle.loads(pickle.dumps(config))
    assert again == config
    assert again.shard_map == config.shard_map
    assert again.shard_map.version == config.shard_map.version
    with pytest.raises(AttributeError):
        again.shard_map.version = 9  # type: ignore[misc]
