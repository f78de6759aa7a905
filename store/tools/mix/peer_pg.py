"""The mix's peer on PostgreSQL: SQLAlchemy's ``horizontal_shard`` over the store's schema shards.

As `store.tools.mix.peer` does on MariaDB: declarative classes for the object
and relation tables, one :class:`~sqlalchemy.ext.horizontal_shard.ShardedSession`
per call, and shard ids (the strings of the shard numbers) bound to views of
one Engine per host name with ``schema_translate_map`` naming the shard's
schema, so the shards of a host share its connection pool. No cache.

An object's row key is its Instagram ID, made by the schema's ``next_id()``
and read back with ``INSERT ... RETURNING id``; the shard is in the ID's bits
10-22, so ``Session.get`` names it (``identity_token``), as statements do
(:class:`~sqlalchemy.ext.horizontal_shard.set_shard_id`).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from threading import Lock
from typing import Any, cast

import orjson
from sqlalchemy import (
    BigInteger,
    FetchedValue,
    SmallInteger,
    Text,
    create_engine,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.ext.horizontal_shard import ShardedSession, set_shard_id
from sqlalchemy.orm import DeclarativeBase, Mapped, Mapper, ORMExecuteState, mapped_column, sessionmaker
from sqlalchemy.sql import ClauseElement
from sqlalchemy.types import TypeDecorator

from store.tools.mix.pg import shard_of
from store.tools.mix.system import MixSchema, PageRows

__all__ = ["JSONText", "PgBase", "PgLinkRow", "PgObjectRow", "PgShardedPeer"]


class JSONText(TypeDecorator[Any]):
    """JSON kept in a ``text`` column (the store's ``data``), dumped and loaded with orjson."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        """The JSON text of ``value``."""
        return None if value is None else orjson.dumps(value).decode()

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        """The value of JSON text."""
        return None if value is None else orjson.loads(value)


class PgBase(DeclarativeBase):
    """The declarative base of the PostgreSQL peer's tables; the schema comes from the engine view."""


class PgObjectRow(PgBase):
    """Columns of an object table; one mapped subclass per table."""

    __abstract__ = True

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, server_default=FetchedValue())
    data: Mapped[dict[str, Any]] = mapped_column(JSONText)
    active: Mapped[int] = mapped_column(SmallInteger, default=1)
    ts: Mapped[datetime] = mapped_column(server_default=FetchedValue(), server_onupdate=FetchedValue())

    #: The shard a new row goes to (read by the shard chooser; not a column).
    shard: int | None = None


class PgLinkRow(PgBase):
    """Columns of a relation table; a pair lives on its from_id's shard."""

    __abstract__ = True

    from_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    to_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    sequence: Mapped[int] = mapped_column(BigInteger)


_mapped_lock = Lock()
_mapped_classes: dict[tuple[type[PgBase], str], type[PgBase]] = {}


def _mapped(kind: type[PgBase], table: str) -> type[PgBase]:
    """The subclass of ``kind`` mapped to ``table``, made once per process."""
    with _mapped_lock:
        cls = _mapped_classes.get((kind, table))
        if cls is None:
            cls = type(f"Pg{kind.__name__}_{table}", (kind,), {"__tablename__": table})
            _mapped_classes[kind, table] = cls
        return cls


class PgShardedPeer:
    """The mix's operations on a :class:`ShardedSession` over schema shards; thread-safe."""

    name: str = "horizontal_shard"

    def __init__(self, schema: MixSchema, *, pool_size: int = 16) -> None:
        """Map the tables, one Engine per host name and a view of it per shard (its schema)."""
        self.schema = schema
        self._objects = {
            name: cast("type[PgObjectRow]", _mapped(PgObjectRow, table))
            for name, (_type_id, table) in schema.types.items()
        }
        self._links = {name: cast("type[PgLinkRow]", _mapped(PgLinkRow, name)) for name in schema.relations}
        self._inverse = {name: inverse for name, (_, _, inverse) in schema.relations.items()}
        self._engines: dict[str, Engine] = {
            host: create_engine(schema.hosts[host], pool_size=pool_size, max_overflow=pool_size)
            for host in sorted(set(schema.masters.values()))
        }
        self._all_shards = [str(shard) for shard in sorted(schema.masters)]
        self._session = sessionmaker(
            class_=ShardedSession,
            shards={
                str(shard): self._engines[host].execution_options(
                    schema_translate_map={None: schema.schema(shard)}
                )
                for shard, host in schema.masters.items()
            },
            shard_chooser=self._shard_chooser,
            identity_chooser=self._identity_chooser,
            execute_chooser=self._execute_chooser,
            expire_on_commit=False,
        )

    # -- the extension's choosers ------------------------------------------------------------------

    def _shard_chooser(
        self, mapper: Mapper[Any] | None, instance: Any, clause: ClauseElement | None = None
    ) -> str:
        """The shard of a row being flushed: a pair's from_id shard, a new object's ``shard`` mark."""
        if isinstance(instance, PgLinkRow):
            return str(shard_of(instance.from_id))
        if isinstance(instance, PgObjectRow):
            if instance.shard is not None:
                return str(instance.shard)
            if instance.id is not None:
                return str(shard_of(instance.id))
        raise LookupError(f"no shard for {instance!r} ({mapper}): set a new object's ``shard``")

    def _identity_chooser(
        self, mapper: Mapper[Any], primary_key: Any, *, lazy_loaded_from: Any, **kw: Any
    ) -> Iterable[str]:
        """Where a primary key is: the shard bits of its ID (an object's, or a pair's from_id)."""
        if lazy_loaded_from is not None:
            return [str(lazy_loaded_from.identity_token)]
        return [str(shard_of(primary_key[0]))]

    def _execute_chooser(self, context: ORMExecuteState) -> Iterable[str]:
        """Shards for a statement that names none: every shard for a read, update or delete."""
        if context.is_insert:
            raise LookupError("an INSERT must name its shard (bind_arguments={'shard_id': ...})")
        if context.lazy_loaded_from is not None:
            return [str(context.lazy_loaded_from.identity_token)]
        return self._all_shards

    # -- objects -----------------------------------------------------------------------------------

    def get_node(self, id_: int, type_name: str | None = None) -> dict[str, Any] | None:
        """The live object, or None (absent or deleted)."""
        with self._session() as s:
            row = s.get(self._objects[type_name or "pin"], id_, identity_token=str(shard_of(id_)))
            return row.data if row is not None and row.active else None

    def add_node(self, type_name: str, data: dict[str, Any], near: int) -> int:
        """Create an object on ``near``'s shard; its new ID (made by the schema's next_id())."""
        row = self._objects[type_name](data=data, active=1)
        row.shard = shard_of(near)
        with self._session() as s, s.begin():
            s.add(row)
        return row.id

    def update_node(self, id_: int, changes: dict[str, Any], type_name: str | None = None) -> None:
        """Merge ``changes`` into the live object under SELECT ... FOR UPDATE (no-op if it is gone)."""
        with self._session() as s, s.begin():
            row = s.get(
                self._objects[type_name or "pin"],
                id_,
                identity_token=str(shard_of(id_)),
                with_for_update=True,
            )
            if row is not None and row.active:
                row.data = {**row.data, **changes}

    def delete_node(self, id_: int, type_name: str | None = None) -> None:
        """Soft-delete the object (``active = 0``); its list entries stay."""
        cls = self._objects[type_name or "pin"]
        stmt = (
            update(cls)
            .where(cls.id == id_)
            .values(active=0)
            .options(set_shard_id(str(shard_of(id_))))
            .execution_options(synchronize_session=False)
        )
        with self._session() as s, s.begin():
            s.execute(stmt)

    # -- relations ---------------------------------------------------------------------------------

    def _list(self, relation: str, from_id: int, limit: int) -> list[int]:
        """The first ``limit`` to_ids of ``from_id``'s rows by (sequence, to_id), from its shard."""
        cls = self._links[relation]
        stmt = (
            select(cls.to_id)
            .where(cls.from_id == from_id)
            .order_by(cls.sequence, cls.to_id)
            .limit(limit)
            .options(set_shard_id(str(shard_of(from_id))))
        )
        with self._session() as s:
            return list(s.scalars(stmt))

    def board_page(self, board_id: int, limit: int) -> PageRows:
        """The first ``limit`` pins of the board's list with their live objects (one query per shard)."""
        pin_ids = self._list("board_has_pins", board_id, limit)
        by_shard: dict[int, list[int]] = {}
        for pin_id in pin_ids:
            by_shard.setdefault(shard_of(pin_id), []).append(pin_id)
        found: dict[int, dict[str, Any]] = {}
        cls = self._objects[self.schema.relations["board_has_pins"][1]]
        with self._session() as s:
            for shard, ids in by_shard.items():
                stmt = select(cls).where(cls.id.in_(ids), cls.active == 1).options(set_shard_id(str(shard)))
                with s.begin():  # one connection at a time: the transaction ends before the next shard
                    for row in s.scalars(stmt):
                        found[row.id] = row.data
        return [(pin_id, found[pin_id]) for pin_id in pin_ids if pin_id in found]

    def link_ids(self, relation: str, from_id: int, limit: int) -> list[int]:
        """The first ``limit`` to_ids of ``from_id``'s list in (sequence, to_id) order."""
        return self._list(relation, from_id, limit)

    def count_links(self, relation: str, from_id: int) -> int:
        """How many pairs start at ``from_id`` (COUNT(*) of its rows)."""
        cls = self._links[relation]
        stmt = (
            select(func.count())
            .select_from(cls)
            .where(cls.from_id == from_id)
            .options(set_shard_id(str(shard_of(from_id))))
        )
        with self._session() as s:
            return int(s.scalar(stmt) or 0)

    def has_link(self, relation: str, from_id: int, to_id: int) -> bool:
        """Whether the pair exists."""
        cls = self._links[relation]
        with self._session() as s:
            return s.get(cls, (from_id, to_id), identity_token=str(shard_of(from_id))) is not None

    def _sides_by_shard(
        self, relation: str, from_id: int, to_id: int
    ) -> dict[int, list[tuple[type[PgLinkRow], int, int]]]:
        """The pair and, if the relation has an inverse, the inverse pair, as (class, from, to) by shard."""
        sides = [(self._links[relation], from_id, to_id)]
        inverse = self._inverse[relation]
        if inverse is not None:
            sides.append((self._links[inverse], to_id, from_id))
        by_shard: dict[int, list[tuple[type[PgLinkRow], int, int]]] = {}
        for side in sides:
            by_shard.setdefault(shard_of(side[1]), []).append(side)
        return by_shard

    def _write_sides(self, relation: str, from_id: int, to_id: int, sequence: int, *, upsert: bool) -> None:
        """Insert both sides (keeping an existing pair, or moving it to ``sequence`` if ``upsert``)."""
        for shard, sides in self._sides_by_shard(relation, from_id, to_id).items():
            with self._session() as s, s.begin():
                for cls, f, t in sides:
                    ins = pg_insert(cls).values(from_id=f, to_id=t, sequence=sequence)
                    stmt = (
                        ins.on_conflict_do_update(
                            index_elements=["from_id", "to_id"], set_={"sequence": ins.excluded.sequence}
                        )
                        if upsert
                        else ins.on_conflict_do_nothing()
                    )
                    s.execute(stmt, bind_arguments={"shard_id": str(shard)})

    def add_link(self, relation: str, from_id: int, to_id: int, sequence: int) -> None:
        """Add the pair and its inverse at ``sequence`` (an existing pair keeps its place)."""
        self._write_sides(relation, from_id, to_id, sequence, upsert=False)

    def update_link(self, relation: str, from_id: int, to_id: int, sequence: int) -> None:
        """Put the pair (and its inverse) at ``sequence``, adding it if absent."""
        self._write_sides(relation, from_id, to_id, sequence, upsert=True)

    def delete_link(self, relation: str, from_id: int, to_id: int) -> None:
        """Remove the pair and its inverse (one transaction per shard involved)."""
        for shard, sides in self._sides_by_shard(relation, from_id, to_id).items():
            with self._session() as s, s.begin():
                for cls, f, t in sides:
                    stmt = (
                        delete(cls)
                        .where(cls.from_id == f, cls.to_id == t)
                        .options(set_shard_id(str(shard)))
                        .execution_options(synchronize_session=False)
                    )
                    s.execute(stmt)

    # -- lifecycle ---------------------------------------------------------------------------------

    def flush(self) -> None:
        """Nothing to empty: the peer has no cache."""

    def close(self) -> None:
        """Dispose every host's Engine (its pool's connections)."""
        for engine in self._engines.values():
            engine.dispose()
