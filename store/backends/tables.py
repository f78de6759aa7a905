"""The store's tables, defined once as SQLAlchemy Core `Table` objects.

Every shard holds:

* one object table per type: the key (``local_id``, an auto-increment local
  id, for Pinterest IDs; ``id``, the whole ID made by the database, for
  Instagram IDs), ``data`` (the JSON), ``active`` (soft delete), ``ts`` and
  ``version`` (1 at create, one more at each update: compare-and-set);
* one table per relation, keyed ``(from_id, to_id)``, with an index
  ``(from_id, sequence, to_id)`` that serves ``ORDER BY sequence`` (the
  article's ``(board_id, pin_id, sequence)`` cannot);
* ``relation_counts``: the exact length of every list, kept in the same
  transaction as every link and unlink.

The structure is here; each backend gives the column types and table
options (`ColumnTypes`), so every dialect's DDL is generated from the same
definition. Statements name the shard's schema as `SHARD`, replaced by the
shard's own name when a statement is first used for that shard.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column, Index, LargeBinary, MetaData, PrimaryKeyConstraint, Table, text
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.types import TypeEngine

from store.naming import COUNTS_TABLE
from store.specs import RelationSpec, TypeSpec

__all__ = [
    "COUNTS_TABLE",
    "MAX_UNIQUE_VALUE_BYTES",
    "SHARD",
    "UNIQUE_TABLE",
    "VERSION_COLUMN",
    "ColumnTypes",
    "counts_table",
    "object_table",
    "relation_table",
    "shard_tables",
    "unique_table",
]

#: An object's version: 1 at create, one more at each update (added by `store init` to older tables).
VERSION_COLUMN = "version"

#: Every shard's table of unique-key rows (config ``unique:``), and the longest value it takes.
UNIQUE_TABLE = "unique_keys"
MAX_UNIQUE_VALUE_BYTES = 512

#: The schema name compiled into statements, replaced by each shard's namespace.
SHARD = "__shard__"


@dataclass(frozen=True)
class ColumnTypes:
    """A backend's column types, defaults and table options for the store's tables."""

    local_id: TypeEngine[Any]
    instagram_id: TypeEngine[Any]
    data: TypeEngine[Any]
    flag: TypeEngine[Any]
    timestamp: TypeEngine[Any]
    timestamp_default: str
    pair_id: TypeEngine[Any]
    sequence: TypeEngine[Any]
    relation_name: TypeEngine[Any]
    count: TypeEngine[Any]
    #: The server default of an Instagram ``id`` column, given (schema, shard); None: a trigger sets it.
    instagram_default: Callable[[str | None, int], TextClause | None] = lambda _schema, _shard: None
    #: A unique key's value (UTF-8 bytes, compared exactly, at most `MAX_UNIQUE_VALUE_BYTES`).
    key_value: TypeEngine[Any] = field(default_factory=LargeBinary)
    object_options: dict[str, Any] = field(default_factory=dict)
    relation_options: dict[str, Any] = field(default_factory=dict)


def object_table(
    md: MetaData, name: str, types: ColumnTypes, *, ids: str, schema: str | None, shard: int
) -> Table:
    """The table of one object type."""
    if ids == "instagram":
        key = Column(
            "id",
            types.instagram_id,
            primary_key=True,
            autoincrement=False,
            server_default=types.instagram_default(schema, shard),
        )
    else:
        key = Column("local_id", types.local_id, primary_key=True, autoincrement=True)
    return Table(
        name,
        md,
        key,
        Column("data", types.data, nullable=False),
        Column("active", types.flag, nullable=False, server_default=text("1")),
        Column("ts", types.timestamp, nullable=False, server_default=text(types.timestamp_default)),
        Column(VERSION_COLUMN, types.count, nullable=False, server_default=text("1")),
        schema=schema,
        **(types.object_options if ids != "instagram" else _no_autoincrement(types.object_options)),
    )


def relation_table(md: MetaData, name: str, types: ColumnTypes, *, schema: str | None) -> Table:
    """One direction of a relation: pairs keyed (from_id, to_id), ordered by sequence."""
    t = Table(
        name,
        md,
        Column("from_id", types.pair_id, nullable=False, autoincrement=False),
        Column("to_id", types.pair_id, nullable=False, autoincrement=False),
        Column("sequence", types.sequence, nullable=False),
        PrimaryKeyConstraint("from_id", "to_id"),
        schema=schema,
        **types.relation_options,
    )
    Index(f"{name}_from_sequence_to", t.c.from_id, t.c.sequence, t.c.to_id)
    return t


def counts_table(md: MetaData, types: ColumnTypes, *, schema: str | None) -> Table:
    """The exact length of every relation list of the shard, and its version."""
    return Table(
        COUNTS_TABLE,
        md,
        Column("relation", types.relation_name, nullable=False),
        Column("from_id", types.pair_id, nullable=False, autoincrement=False),
        Column("n", types.count, nullable=False),
        # Bumped by every change of the list's rows, in the same transaction: cached lists are
        # updated in place only in version order (`store.cache.lists`).
        Column(VERSION_COLUMN, types.count, nullable=False, server_default=text("1")),
        PrimaryKeyConstraint("relation", "from_id"),
        schema=schema,
        **types.relation_options,
    )


def unique_table(md: MetaData, types: ColumnTypes, *, schema: str | None) -> Table:
    """Unique-key rows: (key name, value) owned by ``object_id`` (0 while its create runs).

    ``claimed_ms`` is when the row was last claimed: a claim stays the
    claimant's for a grace period even if its object does not show the
    value yet (its create or rename is under way).
    """
    return Table(
        UNIQUE_TABLE,
        md,
        Column("name", types.relation_name, nullable=False),
        Column("value", types.key_value, nullable=False),
        Column("object_id", types.pair_id, nullable=False, autoincrement=False),
        Column("claimed_ms", types.count, nullable=False),
        PrimaryKeyConstraint("name", "value"),
        schema=schema,
        **types.relation_options,
    )


def shard_tables(
    types: ColumnTypes,
    object_types: Iterable[TypeSpec],
    relations: Iterable[RelationSpec],
    *,
    ids: str,
    schema: str | None,
    shard: int,
    unique: bool = False,
) -> list[Table]:
    """Every table of one shard, in creation order (``unique``: with the unique-key table)."""
    md = MetaData()
    out = [object_table(md, t.table, types, ids=ids, schema=schema, shard=shard) for t in object_types]
    rels = list(relations)
    out += [relation_table(md, r.name, types, schema=schema) for r in rels]
    if rels:
        out.append(counts_table(md, types, schema=schema))
    if unique:
        out.append(unique_table(md, types, schema=schema))
    return out


def _no_autoincrement(options: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k != "sqlite_autoincrement"}
