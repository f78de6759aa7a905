"""The DDL in schemas/ is what `store init` runs (kept in step by this test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from store import StoreConfig
from store.schema import database_name, render_shard_sql, shard_ddl

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("config_name", "backend", "shipped_as"),
    [
        # The embedded default: the same types and relations as local.yaml, and no namespace
        # (local.yaml's is dev), so the shipped files show the names a store without one makes.
        ("embedded.yaml", "mysql", "mysql/shard.sql"),
        ("embedded.yaml", "sqlite", "sqlite/shard.sql"),
        ("instagram.yaml", "mysql", "mysql/shard-instagram.sql"),
        ("instagram.yaml", "postgresql", "postgres/shard.sql"),
    ],
)
def test_shipped_schema_matches_the_generator(config_name: str, backend: str, shipped_as: str) -> None:
    config = StoreConfig.from_file(ROOT / "config" / config_name)
    shipped = (ROOT / "schemas" / shipped_as).read_text()
    fix = f"store schema --config config/{config_name} --backend {backend} > schemas/{shipped_as}"
    assert shipped == render_shard_sql(backend, 0, config), f"regenerate: {fix}"


def test_database_names() -> None:
    assert database_name(0) == "db00000"
    assert database_name(3429) == "db03429"
    assert database_name(65535) == "db65535"


def test_relation_index_serves_order_by_sequence() -> None:
    config = StoreConfig.from_file(ROOT / "config" / "local.yaml")
    ddl = "\n".join(shard_ddl("mysql", 7, config.types.values(), config.relations.values()))
    index = "INDEX IF NOT EXISTS board_has_pins_from_sequence_to ON db00007.board_has_pins"
    assert f"{index} (from_id, sequence, to_id)" in ddl
    assert "PRIMARY KEY (from_id, to_id)" in ddl
    assert " INT " not in ddl.replace("BIGINT", "")  # the article's INT columns overflow
    with pytest.raises(ValueError, match="no backend 'oracle'; supported: mysql, postgresql, sqlite"):
        shard_ddl("oracle", 0, [], [])
