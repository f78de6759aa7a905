"""The DDL in schemas/ is what `store init` runs (kept in step by this test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from store import StoreConfig
from store.schema import database_name, render_shard_sql, shard_ddl

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("backend", ["mysql", "sqlite"])
def test_shipped_schema_matches_the_generator(backend: str) -> None:
    config = StoreConfig.from_file(ROOT / "config" / "local.yaml")
    shipped = (ROOT / "schemas" / backend / "shard.sql").read_text()
    fix = f"store schema --config config/local.yaml --backend {backend} > schemas/{backend}/shard.sql"
    assert shipped == render_shard_sql(backend, 0, config), f"regenerate: {fix}"


def test_database_names() -> None:
    assert database_name(0) == "db00000"
    assert database_name(3429) == "db03429"
    assert database_name(65535) == "db65535"


def test_relation_index_serves_order_by_sequence() -> None:
    config = StoreConfig.from_file(ROOT / "config" / "local.yaml")
    ddl = "\n".join(shard_ddl("mysql", 7, config.types.values(), config.relations.values()))
    assert "KEY `from_sequence_to` (`from_id`, `sequence`, `to_id`)" in ddl
    assert "PRIMARY KEY (`from_id`, `to_id`)" in ddl
    assert " INT " not in ddl.replace("BIGINT", "")  # the article's INT columns overflow
    with pytest.raises(ValueError, match="no shard DDL"):
        shard_ddl("oracle", 0, [], [])
