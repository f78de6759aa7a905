"""`store bench` runs every case on each backend and reports ratios (no timing asserts)."""

from __future__ import annotations

import math

from store import Store
from store.tools.bench import format_results, run_bench


def test_bench_reports_every_case(store: Store) -> None:
    results = run_bench(store, n=60)
    expected = ["create", "get", "get_many(50)", "page 1", "page 200 cursor", "page 200 offset", "count"]
    expected += ["has_links(500)", "board_pins_many(20)"]
    if store.config.cache.memcached and store.config.cache.redis:
        expected += ["warm get", "warm get_many(50)", "warm board page"]
        expected += ["warm has_links(500)", "warm board_pins_many(20)"]
    assert [r.case for r in results] == expected
    for r in results:
        for v in (r.store_median_us, r.raw_median_us, r.store_p99_us, r.raw_p99_us):
            assert math.isfinite(v)
            assert v > 0
        assert r.as_dict()["ratio_median"] == r.store_median_us / r.raw_median_us
    table = format_results(results)
    assert table.splitlines()[0].startswith("case")
    assert len(table.splitlines()) == len(expected) + 2
    assert "cursor page 200 (depth 9,950) costs" in table
