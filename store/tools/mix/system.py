"""What every system in the mix benchmark offers: the operations of the mix, and its data set copy.

A system gets its own copy of the data set (same shape, its own IDs), so
one system's writes never change what another starts from. IDs are the
store's 64-bit Pinterest IDs on MariaDB (shard in bits 46-61, type in bits
36-45, local id in bits 0-35) or its Instagram IDs on PostgreSQL (shard in
bits 10-22, no type: node operations are told it), so a hand-written
system can route them too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import redis

from store.naming import database_name, schema_name

__all__ = ["MixSchema", "PageRows", "System", "flush_redis"]

#: (pin ID, pin object) for each live pin of a board page, in list order.
PageRows = list[tuple[int, dict[str, Any]]]


@dataclass(frozen=True)
class MixSchema:
    """The store layout the systems share: hosts, shards, tables and relations."""

    #: host name -> SQLAlchemy URL (mysql+pymysql://user:pw@host:port).
    hosts: dict[str, str]
    #: shard -> host name of its master.
    masters: dict[int, str]
    #: type name -> (type id, table name): pin, board, user.
    types: dict[str, tuple[int, str]]
    #: relation name -> (from type, to type, inverse relation name or None).
    relations: dict[str, tuple[str, str, str | None]]
    #: The counts table (relation, from_id, n), kept by the store only.
    counts_table: str = "relation_counts"
    #: "pinterest" (MariaDB, a database per shard) or "instagram" (PostgreSQL, a schema per shard).
    ids: str = "pinterest"

    @staticmethod
    def database(shard: int) -> str:
        """The database of ``shard`` on its host: ``db00042``."""
        return database_name(shard)

    @staticmethod
    def schema(shard: int) -> str:
        """The PostgreSQL schema of ``shard``: ``shard0042``."""
        return schema_name(shard)


class System(Protocol):
    """One system under test. Every method is called from many threads at once."""

    name: str

    def get_node(self, id_: int, type_name: str | None = None) -> dict[str, Any] | None:
        """The live object, or None (absent or deleted).

        ``type_name`` (each node operation takes it): the ID's type, which an
        Instagram ID does not carry; Pinterest-ID systems read it off the ID.
        """

    def add_node(self, type_name: str, data: dict[str, Any], near: int) -> int:
        """Create an object on ``near``'s shard; its new ID."""

    def update_node(self, id_: int, changes: dict[str, Any], type_name: str | None = None) -> None:
        """Merge ``changes`` into the live object (no-op if it is gone)."""

    def delete_node(self, id_: int, type_name: str | None = None) -> None:
        """Soft-delete the object (``active = 0``)."""

    def board_page(self, board_id: int, limit: int) -> PageRows:
        """The first ``limit`` entries of the board's pins in (sequence, to_id) order, with their objects.

        Entries whose pin is gone are skipped (a page may then be short).
        """

    def link_ids(self, relation: str, from_id: int, limit: int) -> list[int]:
        """The first ``limit`` to_ids of ``from_id``'s list in (sequence, to_id) order."""

    def count_links(self, relation: str, from_id: int) -> int:
        """How many pairs start at ``from_id`` (the rows, exactly)."""

    def add_link(self, relation: str, from_id: int, to_id: int, sequence: int) -> None:
        """Add the pair and its inverse at ``sequence`` (an existing pair keeps its place)."""

    def update_link(self, relation: str, from_id: int, to_id: int, sequence: int) -> None:
        """Put the pair (and its inverse) at ``sequence``, adding it if absent."""

    def delete_link(self, relation: str, from_id: int, to_id: int) -> None:
        """Remove the pair and its inverse."""

    def has_link(self, relation: str, from_id: int, to_id: int) -> bool:
        """Whether the pair exists."""

    def flush(self) -> None:
        """Empty this system's caches (the cold runs start from this)."""

    def close(self) -> None:
        """Release connections."""


def flush_redis(url: str, prefix: str) -> None:
    """Delete every Redis key under ``prefix`` (a system's cold start), leaving other keys alone."""
    client = redis.Redis.from_url(url)
    try:
        batch = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(batch), 1000):
            client.delete(*batch[i : i + 1000])
    finally:
        client.close()
