"""`store get`, `store page` and `store ping`: reads and the health check, thin over `Store`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from store.cli.common import (
    config_option,
    echo_json,
    load_config,
    open_store,
    parse_id,
    read_ids,
    require_type,
    type_option,
)
from store.config import StoreConfig
from store.exceptions import ConfigError, IdError, StoreError
from store.store import Store

__all__ = ["get", "page", "ping"]


def _line(value: Any) -> str:
    """One compact JSON line."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


@click.command()
@click.argument("id_texts", metavar="ID [ID ...]", nargs=-1, required=True)
@config_option
@type_option
@click.option("--json", "as_json", is_flag=True, help="Add each object's type, shard, local id and host.")
def get(id_texts: tuple[str, ...], config_path: Path | None, type_name: str | None, as_json: bool) -> None:
    """Print the object with ID; with several IDs (or - for IDs on stdin), one JSON line per ID.

    One ID prints its object (exit 1 if there is none). Several IDs, or -
    (IDs read from stdin, whitespace separated), are read in one batch and
    print one line per ID, in the order given: {"id": ID, "data": OBJECT},
    "data" null for an ID with no live object (then exit 1, after every line).
    --json adds "type", "shard", "local_id" and "host".
    """
    ids = read_ids(id_texts)
    if not ids:
        raise IdError("no IDs to get: pass IDs, or - with IDs on stdin (whitespace separated)")
    several = len(id_texts) > 1 or "-" in id_texts
    with open_store(config_path) as store:
        for i in ids[:1]:
            require_type(store.config, type_name, i)
        if not several:
            _get_one(store, ids[0], type_name, as_json)
            return
        found = store.get_many(ids, type_name=type_name)
        for i in ids:
            doc: dict[str, Any] = {"id": i, "data": found.get(i)}
            if as_json:
                doc.update(_location(store, i, type_name))
            click.echo(_line(doc))
    if any(i not in found for i in ids):
        sys.exit(1)


def _location(store: Store, id_: int, type_name: str | None) -> dict[str, Any]:
    loc = store.locate(id_, type_name=type_name)
    return {"type": loc.type.name, "shard": loc.shard, "local_id": loc.local_id, "host": loc.host}


def _get_one(store: Store, id_: int, type_name: str | None, as_json: bool) -> None:
    """`store get ID`: the object alone (or with its location, --json); `NotFound` if none."""
    loc = _location(store, id_, type_name)
    data = store.require(id_, type_name=type_name)
    if as_json:
        echo_json({"id": id_, **loc, "data": data})
    else:
        click.echo(json.dumps(data, ensure_ascii=False))


@click.command()
@click.argument("relation")
@click.argument("from_text", metavar="FROM_ID")
@config_option
@click.option(
    "--objects", "with_objects", is_flag=True, help="Read each entry's object too (gone ones skipped)."
)
@click.option("--limit", default=50, show_default=True, help="Entries per page.")
@click.option("--cursor", help="Continue after this cursor (printed by the previous page).")
@click.option("--newest-first", is_flag=True, help="Highest sequence first.")
@click.option("--since", type=int, help="Only entries with sequence >= SINCE (microseconds by default).")
@click.option("--until", type=int, help="Only entries with sequence < UNTIL (exclusive).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document: {ids, objects, next_cursor}.")
def page(
    relation: str,
    from_text: str,
    config_path: Path | None,
    with_objects: bool,
    limit: int,
    cursor: str | None,
    newest_first: bool,
    since: int | None,
    until: int | None,
    as_json: bool,
) -> None:
    """Print one page of FROM_ID's RELATION list: an ID per line, or with --objects a JSON line per entry.

    --objects prints {"id": ID, "data": OBJECT} per entry (Store.page_objects:
    entries whose object is gone are skipped and the page filled). The next
    page's cursor goes to stderr ("next page: --cursor C"); --json prints
    {"ids": [...], "objects": [...], "next_cursor": C} instead ("objects"
    only with --objects).
    """
    from_id = parse_id(from_text)
    kw: dict[str, Any] = {
        "limit": limit,
        "cursor": cursor,
        "newest_first": newest_first,
        "since": since,
        "until": until,
    }
    with open_store(config_path) as store:
        got = (
            store.page_objects(relation, from_id, **kw)
            if with_objects
            else store.page(relation, from_id, **kw)
        )
    if as_json:
        doc: dict[str, Any] = {"ids": got.ids, "next_cursor": got.next_cursor}
        if with_objects:
            doc["objects"] = got.objects
        echo_json(doc)
        return
    if with_objects:
        for i, data in zip(got.ids, got.objects, strict=True):
            click.echo(_line({"id": i, "data": data}))
    else:
        for i in got.ids:
            click.echo(i)
    if got.next_cursor is not None:
        click.echo(f"next page: --cursor {got.next_cursor}", err=True)


@click.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def ping(config_path: Path | None, as_json: bool) -> None:
    """Ask every host, cache server and the map source; exit 1 if any did not answer in its timeout.

    Prints a table (KIND, NAME, OK, MS, ERROR), or with --json the report of
    Store.ping(): {"ok", "hosts", "caches", "map_source"}.
    """
    config = load_config(config_path)
    try:
        store = Store(config)
    except StoreError as exc:  # a map source that cannot be read stops the store from starting
        if isinstance(exc, ConfigError):
            raise
        report = _unstarted(config, exc)
    else:
        with store:
            report = store.ping()
    if as_json:
        echo_json(report)
    else:
        _table(report)
    if not report["ok"]:
        sys.exit(1)


def _unstarted(config: StoreConfig, exc: StoreError) -> dict[str, Any]:
    """The report of a store that could not start: its map source failed, nothing else was asked."""
    kind = "static" if config.map_source is None else config.map_source[0]
    failed = {"kind": kind, "ok": False, "ms": 0.0, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": False, "hosts": {}, "caches": {}, "map_source": failed}


def _table(report: dict[str, Any]) -> None:
    """The report as a table, one row per probe."""
    rows: list[tuple[str, str, dict[str, Any]]] = [("host", n, p) for n, p in report["hosts"].items()]
    for kind, servers in report["caches"].items():
        rows += [(kind, n, p) for n, p in servers.items()]
    source = report["map_source"]
    rows.append(("map_source", source.get("kind", ""), source))
    width = max(len(n) for _k, n, _p in rows)
    click.echo(f"{'KIND':<10} {'NAME':<{width}} {'OK':<4} {'MS':>9}  ERROR")
    for kind, name, probe in rows:
        ok = "ok" if probe["ok"] else "FAIL"
        click.echo(f"{kind:<10} {name:<{width}} {ok:<4} {probe['ms']:>9.1f}  {probe['error'] or ''}".rstrip())
    click.echo("all answered" if report["ok"] else "some did not answer", err=True)
