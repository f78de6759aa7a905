"""The shape of the data: ``map:``, ``types:``, ``relations:``, ``unique:`` and ``open_shards:``."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy.engine import URL

from store.config.checks import _IDENT, _keys
from store.exceptions import ConfigError, brief
from store.shardmap import ShardMap, ShardRange
from store.specs import RelationSpec, TypeSpec, UniqueSpec

#: Table names the store keeps for itself in every shard (store.schema names them; schema imports
#: config, not back): relation counts, and the marker of a shard that moved away.
RESERVED_TABLES = {
    "relation_counts": "relation counts",
    "store_tombstone": "the tombstone of a moved shard",
    "unique_keys": "unique keys (config unique:)",
}


def _pair(value: object, what: str, shards: int) -> tuple[int, int]:
    if (
        not isinstance(value, list | tuple)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise ConfigError(f"{what} must be [first, last] shard numbers, got {brief(value)}")
    low, high = value
    if low > high:
        raise ConfigError(f"{what} [{brief(low)}, {brief(high)}] is reversed: write [low, high]")
    if low < 0 or high >= shards:
        raise ConfigError(
            f"{what} [{brief(low)}, {brief(high)}] goes beyond shards 0..{shards - 1}; "
            "shrink it or raise shards"
        )
    return low, high


def _map(raw: object, shards: int, hosts: Mapping[str, URL]) -> ShardMap:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(
            f"map must be a list of ranges, e.g. [{{range: [0, {shards - 1}], master: HOST, slave: HOST}}]"
        )
    ranges = []
    for i, item in enumerate(raw):
        what = f"map[{i}]"
        if not isinstance(item, Mapping):
            raise ConfigError(f"{what} must be a mapping with range, master and optional slave")
        extra = set(item) - {"range", "master", "slave"}
        if extra:
            raise ConfigError(f"{what} has unknown key(s) {_keys(extra)}; known: range, master, slave")
        low, high = _pair(item.get("range"), f"{what}.range", shards)
        for role in ("master", "slave"):
            host = item.get(role)
            if host is None and role == "slave":
                continue
            if not isinstance(host, str) or host not in hosts:
                raise ConfigError(
                    f"{what}.{role} is {brief(host)}, which is not under hosts; "
                    f"known hosts: {', '.join(hosts)}"
                )
        ranges.append(ShardRange(low, high, item["master"], item.get("slave")))
    return ShardMap(ranges, shards=shards)


def _types(raw: object, ids: str) -> dict[str, TypeSpec]:
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError("types must map type names to {id: N, table: NAME}, e.g. pin: {id: 1, table: pins}")
    out: dict[str, TypeSpec] = {}
    by_id: dict[int, str] = {}
    tables: dict[str, str] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not _IDENT.fullmatch(name):
            raise ConfigError(
                f"types: type name {brief(name)} must be lower_snake_case (a-z, 0-9, _), 64 chars at most"
            )
        if not isinstance(spec, Mapping) or set(spec) - {"id", "table"}:
            raise ConfigError(f"types.{name} must be {{id: N, table: NAME}}, got {brief(spec)}")
        type_id = spec.get("id")
        if not isinstance(type_id, int) or isinstance(type_id, bool) or not 0 <= type_id <= 1023:
            raise ConfigError(f"types.{name}.id must be an int in 0..1023 (10 bits), got {brief(type_id)}")
        if type_id in by_id:
            raise ConfigError(
                f"types.{name}.id {type_id} is already used by type {brief(by_id[type_id])}; "
                "each type needs its own id"
            )
        table = spec.get("table", name)
        if not isinstance(table, str) or not _IDENT.fullmatch(table):
            raise ConfigError(f"types.{name}.table {brief(table)} must be lower_snake_case, at most 64 chars")
        if table in RESERVED_TABLES:
            raise ConfigError(f"types.{name}.table {brief(table)} is reserved for {RESERVED_TABLES[table]}")
        if table in tables:
            raise ConfigError(
                f"types.{name}.table {brief(table)} is also the table of type {brief(tables[table])}"
            )
        by_id[type_id] = name
        tables[table] = name
        out[name] = TypeSpec(name, type_id, table)
    return out


def _relations(raw: object, types: Mapping[str, TypeSpec]) -> dict[str, RelationSpec]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError("relations must map names to {from: TYPE, to: TYPE, inverse: NAME}")
    tables = {t.table for t in types.values()}
    out: dict[str, RelationSpec] = {}

    def add(spec: RelationSpec) -> None:
        if spec.name in tables:
            raise ConfigError(f"relations: {brief(spec.name)} has the same name as an object table")
        if spec.name in RESERVED_TABLES:
            raise ConfigError(
                f"relations: {brief(spec.name)} is the table of {RESERVED_TABLES[spec.name]}; "
                "pick another relation name"
            )
        old = out.get(spec.name)
        if old is None:
            out[spec.name] = spec
        elif (old.from_type, old.to_type, old.inverse) != (spec.from_type, spec.to_type, spec.inverse):
            raise ConfigError(
                f"relations: {brief(spec.name)} is defined twice, differently "
                f"(once as the inverse of {brief(old.inverse or spec.inverse)}); make them agree"
            )

    for name, spec in raw.items():
        if not isinstance(name, str) or not _IDENT.fullmatch(name):
            raise ConfigError(
                f"relations: relation name {brief(name)} must be lower_snake_case (a-z, 0-9, _), "
                "64 chars at most"
            )
        if not isinstance(spec, Mapping) or set(spec) - {"from", "to", "inverse"}:
            raise ConfigError(f"relations.{name} must be {{from: TYPE, to: TYPE, inverse: NAME}}")
        for end in ("from", "to"):
            if not isinstance(spec.get(end), str) or spec.get(end) not in types:
                raise ConfigError(
                    f"relations.{name}.{end} is {brief(spec.get(end))}, which is not a type; "
                    f"known types: {', '.join(types)}"
                )
        inverse = spec.get("inverse")
        if inverse is not None and (not isinstance(inverse, str) or not _IDENT.fullmatch(inverse)):
            raise ConfigError(f"relations.{name}.inverse {brief(inverse)} must be lower_snake_case")
        if inverse == name:
            raise ConfigError(f"relations.{name}.inverse names the relation itself")
        add(RelationSpec(name, spec["from"], spec["to"], inverse))
        if inverse is not None:
            add(RelationSpec(inverse, spec["to"], spec["from"], name, primary=False))
    return out


def _unique(raw: object, types: Mapping[str, TypeSpec]) -> dict[str, UniqueSpec]:
    shape = (
        "unique must map key names to {type: TYPE, field: FIELD}, "
        "e.g. user_by_username: {type: user, field: username}"
    )
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(shape)
    out: dict[str, UniqueSpec] = {}
    seen: dict[tuple[str, str], str] = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not _IDENT.fullmatch(name):
            raise ConfigError(
                f"unique: key name {brief(name)} must be lower_snake_case (a-z, 0-9, _), 64 chars at most"
            )
        if not isinstance(spec, Mapping) or set(spec) != {"type", "field"}:
            raise ConfigError(f"unique.{name} must be {{type: TYPE, field: FIELD}}")
        if not isinstance(spec["type"], str) or spec["type"] not in types:
            raise ConfigError(
                f"unique.{name}.type is {brief(spec['type'])}, which is not a type; "
                f"known types: {', '.join(types)}"
            )
        fld = spec["field"]
        if not isinstance(fld, str) or not fld:
            raise ConfigError(f"unique.{name}.field must be the name of a top-level field of the object")
        other = seen.get((spec["type"], fld))
        if other is not None:
            raise ConfigError(f"unique.{name} and unique.{other} both index {spec['type']}.{fld}; keep one")
        seen[(spec["type"], fld)] = name
        out[name] = UniqueSpec(name, spec["type"], fld)
    return out


def _open_shards(raw: object, shards: int) -> tuple[tuple[int, int], ...]:
    if raw is None:
        return ((0, shards - 1),)
    if isinstance(raw, list) and raw and all(isinstance(v, list | tuple) for v in raw):
        return tuple(_pair(v, f"open_shards[{i}]", shards) for i, v in enumerate(raw))
    return (_pair(raw, "open_shards", shards),)
