"""The peer of the mix benchmark: SQLAlchemy's ``horizontal_shard`` extension over the store's shards.

This is how a user of SQLAlchemy's horizontal sharding would write the mix's
operations: declarative classes for the object and relation tables, one
:class:`~sqlalchemy.ext.horizontal_shard.ShardedSession` per call from a
:class:`~sqlalchemy.orm.sessionmaker`, and shard ids (the strings of the shard
numbers) bound to per-shard views of one Engine per host name, so the shards
of a host share its connection pool. No cache.

Every statement names its shard (``identity_token`` for ``Session.get``,
:class:`~sqlalchemy.ext.horizontal_shard.set_shard_id` for statements,
``bind_arguments`` for inserts); the choosers are the extension's fallbacks
for anything that does not, and fan a read out to every shard.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from threading import Lock
from typing import Any, cast

from sqlalchemy import JSON, BigInteger, FetchedValue, create_engine, delete, func, select, update
from sqlalchemy.dialects.mysql import insert as mysql_insert
from sqlalchemy.engine import Engine
from sqlalchemy.ext.horizontal_shard import ShardedSession, set_shard_id
from sqlalchemy.orm import DeclarativeBase, Mapped, Mapper, ORMExecuteState, mapped_column, sessionmaker
from sqlalchemy.sql import ClauseElement

from store.tools.mix.system import MixSchema, PageRows

__all__ = [
    "Base",
    "LinkRow",
    "ObjectRow",
    "ShardedPeer",
    "link_row",
    "local_of",
    "make_id",
    "object_row",
    "shard_of",
    "type_of",
]

SHARD_SHIFT = 46
TYPE_SHIFT = 36
LOCAL_MASK = (1 << TYPE_SHIFT) - 1


def shard_of(id_: int) -> int:
    """The shard bits (46-61) of a 64-bit Pinterest ID."""
    return (id_ >> SHARD_SHIFT) & 0xFFFF


def type_of(id_: int) -> int:
    """The type bits (36-45) of a 64-bit Pinterest ID."""
    return (id_ >> TYPE_SHIFT) & 0x3FF


def local_of(id_: int) -> int:
    """The local id (bits 0-35) of a 64-bit Pinterest ID: its row's key in its shard."""
    return id_ & LOCAL_MASK


def make_id(shard: int, type_id: int, local_id: int) -> int:
    """The 64-bit Pinterest ID of row ``local_id`` of type ``type_id`` on ``shard``."""
    return (shard << SHARD_SHIFT) | (type_id << TYPE_SHIFT) | local_id


def _dumps(value: Any) -> str:
    """JSON text as the store writes it: compact, UTF-8 kept as is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class Base(DeclarativeBase):
    """The declarative base of the peer's tables; the database of a shard comes from its engine view."""


class ObjectRow(Base):
    """Columns of an object table (pins, boards, users); one mapped subclass per table."""

    __abstract__ = True

    local_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    active: Mapped[bool] = mapped_column(default=True)
    ts: Mapped[datetime] = mapped_column(server_default=FetchedValue(), server_onupdate=FetchedValue())

    #: The shard a new row goes to (read by the shard chooser; not a column).
    shard: int | None = None


class LinkRow(Base):
    """Columns of a relation table (one mapped subclass per relation); a pair lives on from_id's shard."""

    __abstract__ = True

    from_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    to_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    sequence: Mapped[int] = mapped_column(BigInteger)


_mapped_lock = Lock()
_mapped_classes: dict[tuple[type[Base], str], type[Base]] = {}


def _mapped(kind: type[Base], table: str) -> type[Base]:
    """The subclass of ``kind`` mapped to ``table``, made once per process (a Table is defined once)."""
    with _mapped_lock:
        cls = _mapped_classes.get((kind, table))
        if cls is None:
            cls = type(f"{kind.__name__}_{table}", (kind,), {"__tablename__": table})
            _mapped_classes[kind, table] = cls
        return cls


def object_row(table: str) -> type[ObjectRow]:
    """The mapped class of object table ``table`` (the same class for every peer)."""
    return cast("type[ObjectRow]", _mapped(ObjectRow, table))


def link_row(relation: str) -> type[LinkRow]:
    """The mapped class of the relation table ``relation`` (the same class for every peer)."""
    return cast("type[LinkRow]", _mapped(LinkRow, relation))


class ShardedPeer:
    """The mix's operations on a :class:`ShardedSession`; thread-safe (one session per call)."""

    name: str = "horizontal_shard"

    def __init__(self, schema: MixSchema, *, pool_size: int = 16) -> None:
        """Map the schema's tables and make one Engine per host name and a view of it per shard."""
        self.schema = schema
        self._objects = {
            name: (type_id, object_row(table)) for name, (type_id, table) in schema.types.items()
        }
        self._by_type_id = {type_id: cls for type_id, cls in self._objects.values()}
        self._links = {name: link_row(name) for name in schema.relations}
        self._inverse = {name: inverse for name, (_, _, inverse) in schema.relations.items()}
        self._engines: dict[str, Engine] = {
            host: create_engine(
                schema.hosts[host], pool_size=pool_size, max_overflow=pool_size, json_serializer=_dumps
            )
            for host in sorted(set(schema.masters.values()))
        }
        self._all_shards = [str(shard) for shard in sorted(schema.masters)]
        self._session = sessionmaker(
            class_=ShardedSession,
            shards={
                str(shard): self._engines[host].execution_options(
                    schema_translate_map={None: schema.database(shard)}
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
        if isinstance(instance, LinkRow):
            return str(shard_of(instance.from_id))
        if isinstance(instance, ObjectRow) and instance.shard is not None:
            return str(instance.shard)
        raise LookupError(
            f"no shard for {instance!r} ({mapper}): set a new object's ``shard`` before adding it"
        )

    def _identity_chooser(
        self, mapper: Mapper[Any], primary_key: Any, *, lazy_loaded_from: Any, **kw: Any
    ) -> Iterable[str]:
        """Where a primary key may be: a pair by its from_id; an object's bare local_id could be anywhere."""
        if lazy_loaded_from is not None:
            return [str(lazy_loaded_from.identity_token)]
        if issubclass(mapper.class_, LinkRow):
            return [str(shard_of(primary_key[0]))]
        return self._all_shards

    def _execute_chooser(self, context: ORMExecuteState) -> Iterable[str]:
        """Shards for a statement that names none: every shard for a read, update or delete."""
        if context.is_insert:
            raise LookupError("an INSERT must name its shard (bind_arguments={'shard_id': ...})")
        if context.lazy_loaded_from is not None:
            return [str(context.lazy_loaded_from.identity_token)]
        return self._all_shards

    # -- objects -----------------------------------------------------------------------------------

    def _object(self, id_: int) -> type[ObjectRow]:
        """The mapped class of the ID's type."""
        return self._by_type_id[type_of(id_)]

    def get_node(self, id_: int, type_name: str | None = None) -> dict[str, Any] | None:
        """The live object, or None (absent or deleted)."""
        with self._session() as s:
            row = s.get(self._object(id_), local_of(id_), identity_token=str(shard_of(id_)))
            return row.data if row is not None and row.active else None

    def add_node(self, type_name: str, data: dict[str, Any], near: int) -> int:
        """Create an object on ``near``'s shard; its new ID."""
        type_id, cls = self._objects[type_name]
        shard = shard_of(near)
        row = cls(data=data, active=True)
        row.shard = shard
        with self._session() as s, s.begin():
            s.add(row)
        return make_id(shard, type_id, row.local_id)

    def update_node(self, id_: int, changes: dict[str, Any], type_name: str | None = None) -> None:
        """Merge ``changes`` into the live object under SELECT ... FOR UPDATE (no-op if it is gone)."""
        with self._session() as s, s.begin():
            row = s.get(
                self._object(id_), local_of(id_), identity_token=str(shard_of(id_)), with_for_update=True
            )
            if row is not None and row.active:
                row.data = {**row.data, **changes}

    def delete_node(self, id_: int, type_name: str | None = None) -> None:
        """Soft-delete the object (``active = 0``); its list entries stay."""
        cls = self._object(id_)
        stmt = (
            update(cls)
            .where(cls.local_id == local_of(id_))
            .values(active=False)
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
        cls = self._objects[self.schema.relations["board_has_pins"][1]][1]
        with self._session() as s:
            for shard, ids in by_shard.items():
                by_local = {local_of(pin_id): pin_id for pin_id in ids}
                stmt = (
                    select(cls)
                    .where(cls.local_id.in_(by_local), cls.active)
                    .options(set_shard_id(str(shard)))
                )
                with s.begin():  # one connection at a time: the transaction ends before the next shard
                    for row in s.scalars(stmt):
                        found[by_local[row.local_id]] = row.data
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
    ) -> dict[int, list[tuple[type[LinkRow], int, int]]]:
        """The pair and, if the relation has an inverse, the inverse pair, as (class, from, to) by shard."""
        sides = [(self._links[relation], from_id, to_id)]
        inverse = self._inverse[relation]
        if inverse is not None:
            sides.append((self._links[inverse], to_id, from_id))
        by_shard: dict[int, list[tuple[type[LinkRow], int, int]]] = {}
        for side in sides:
            by_shard.setdefault(shard_of(side[1]), []).append(side)
        return by_shard

    def _write_sides(self, relation: str, from_id: int, to_id: int, sequence: int, *, upsert: bool) -> None:
        """Insert both sides (keeping an existing pair, or moving it to ``sequence`` if ``upsert``).

        Sides on the same shard share a transaction; on different shards they are separate ones.
        """
        for shard, sides in self._sides_by_shard(relation, from_id, to_id).items():
            with self._session() as s, s.begin():
                for cls, f, t in sides:
                    stmt = mysql_insert(cls).values(from_id=f, to_id=t, sequence=sequence)
                    stmt = (
                        stmt.on_duplicate_key_update(sequence=sequence)
                        if upsert
                        else stmt.prefix_with("IGNORE")
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
