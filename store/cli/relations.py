"""`store links`, `has-link`, `count`, `link`, `unlink` and `relations repair`, thin over `Store`.

`page` (a page with its objects) is in `reads`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from store.cli.common import (
    config_option,
    echo_json,
    one_line,
    open_admin,
    open_store,
    parse_id,
    parse_shards,
    progress_bar,
)
from store.cli.logs import admin_log
from store.exceptions import IdError, LimitError, StoreError

__all__ = ["count", "has_link", "link", "links", "relations", "unlink"]


@click.command()
@click.argument("relation")
@click.argument("from_text", metavar="FROM_ID")
@config_option
@click.option("--limit", default=50, show_default=True, help="Entries per page.")
@click.option("--cursor", help="Continue after this cursor (printed by the previous page).")
@click.option("--offset", type=int, help="Use LIMIT/OFFSET paging instead of a cursor.")
@click.option("--newest-first", is_flag=True, help="Highest sequence first.")
@click.option("--since", type=int, help="Only entries with sequence >= SINCE (microseconds by default).")
@click.option("--until", type=int, help="Only entries with sequence < UNTIL (exclusive).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: {ids, next_cursor}.")
def links(
    relation: str,
    from_text: str,
    config_path: Path | None,
    limit: int,
    cursor: str | None,
    offset: int | None,
    newest_first: bool,
    since: int | None,
    until: int | None,
    as_json: bool,
) -> None:
    """List the IDs FROM_ID links to through RELATION, in sequence order.

    --since/--until keep to a sequence range (since inclusive, until
    exclusive); a --cursor from such a page needs the same range.
    """
    from_id = parse_id(from_text)
    with open_store(config_path) as store:
        if offset is not None:
            if cursor is not None:
                raise IdError("give --cursor or --offset, not both")
            if since is not None or until is not None:
                raise LimitError("--since/--until page by cursor: leave out --offset")
            ids = store.links(relation, from_id, limit=limit, offset=offset, newest_first=newest_first)
            next_cursor = None
        else:
            page = store.page(
                relation,
                from_id,
                limit=limit,
                cursor=cursor,
                newest_first=newest_first,
                since=since,
                until=until,
            )
            ids, next_cursor = page.ids, page.next_cursor
    if as_json:
        echo_json({"ids": ids, "next_cursor": next_cursor})
        return
    for i in ids:
        click.echo(i)
    if next_cursor is not None:
        click.echo(f"next page: --cursor {next_cursor}", err=True)


@click.command("has-link")
@click.argument("relation")
@click.argument("from_text", metavar="FROM_ID")
@click.argument("to_text", metavar="TO_ID")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the answer as a JSON boolean.")
def has_link(relation: str, from_text: str, to_text: str, config_path: Path | None, as_json: bool) -> None:
    """Print true if TO_ID is in FROM_ID's RELATION list, else false (exit 0 either way)."""
    with open_store(config_path) as store:
        linked = store.has_link(relation, parse_id(from_text), parse_id(to_text))
    click.echo(json.dumps(linked) if as_json else ("true" if linked else "false"))


@click.command()
@click.argument("relation")
@click.argument("from_text", metavar="FROM_ID")
@config_option
def count(relation: str, from_text: str, config_path: Path | None) -> None:
    """Print how many entries FROM_ID's RELATION list has."""
    with open_store(config_path) as store:
        click.echo(store.count(relation, parse_id(from_text)))


@click.command()
@click.argument("relation")
@click.argument("from_text", metavar="FROM_ID")
@click.argument("to_text", metavar="TO_ID")
@config_option
@click.option("--sequence", type=int, help="Position (default: now in microseconds; moves an existing pair).")
def link(relation: str, from_text: str, to_text: str, config_path: Path | None, sequence: int | None) -> None:
    """Add TO_ID to FROM_ID's RELATION list (and the inverse, if configured)."""
    with open_store(config_path) as store:
        new = store.link(relation, parse_id(from_text), parse_id(to_text), sequence=sequence)
    click.echo("linked" if new else "already linked")


@click.command()
@click.argument("relation")
@click.argument("from_text", metavar="FROM_ID")
@click.argument("to_text", metavar="TO_ID")
@config_option
def unlink(relation: str, from_text: str, to_text: str, config_path: Path | None) -> None:
    """Remove TO_ID from FROM_ID's RELATION list (and the inverse)."""
    with open_store(config_path) as store:
        gone = store.unlink(relation, parse_id(from_text), parse_id(to_text))
    click.echo("unlinked" if gone else "not linked")


@click.group()
def relations() -> None:
    """Maintain relation tables."""


@relations.command("repair")
@click.argument("relation", required=False)
@config_option
@click.option("--shards", "shard_text", help="Only tables on these shards, A-B (default: all).")
@click.option("--dry-run", is_flag=True, help="Report what is wrong; change nothing.")
@click.option("--json", "as_json", is_flag=True, help='Print JSON (an error too: {"error": ...}, exit 1).')
def relations_repair(
    relation: str | None, config_path: Path | None, shard_text: str | None, dry_run: bool, as_json: bool
) -> None:
    """Restore missing inverse pairs, drop dangling ones, fix counts; fix unique-key rows (config unique:).

    With --shards, only the tables stored on those shards are scanned (the
    other end of a pair, or a key's row, is read where it lives).
    """
    try:
        _relations_repair(relation, config_path, shard_text, dry_run, as_json)
    except StoreError as exc:
        if not as_json:
            raise
        echo_json({"error": str(exc), "error_type": type(exc).__name__})
        click.echo(f"error: {one_line(exc)}", err=True)
        sys.exit(1)


def _relations_repair(
    relation: str | None, config_path: Path | None, shard_text: str | None, dry_run: bool, as_json: bool
) -> None:
    from store.admin import repair_relations

    with open_admin(config_path) as store:
        only = parse_shards(shard_text, store.config.shards)
        wanted = only or range(store.config.shards)
        if relation is not None:
            store.admin_context().router.relation(relation)  # fail before the progress bar starts
        with progress_bar(len(wanted), "shards") as step:
            log = admin_log("repair")
            log.info("repair: starting", extra={"fields": {"relation": relation, "dry_run": dry_run}})
            report = repair_relations(
                store, relation, shards=wanted, dry_run=dry_run, on_shard=lambda _s: step(1)
            )
            log.info(
                "repair: done",
                extra={"fields": {"rows_scanned": report.rows_scanned, "changes": report.changes}},
            )
        unique = bool(store.config.unique)
    if as_json:
        doc: dict[str, Any] = {
            "dry_run": report.dry_run, "rows_scanned": report.rows_scanned,
            "inverse_added": report.inverse_added, "inverse_removed": report.inverse_removed,
            "counts_fixed": report.counts_fixed, "unroutable": report.unroutable,
        }  # fmt: skip
        if relation is None and unique:
            from store.admin.repair import repair_unique

            with open_admin(config_path) as store:
                found = repair_unique(store, dry_run=dry_run, shards=only)
            doc["unique_keys"] = {
                "checked": found.checked, "removed": found.removed, "added": found.added,
                "repointed": found.repointed, "conflicts": found.conflicts,
            }  # fmt: skip
        echo_json(doc)
        return
    verb = "would " if dry_run else ""
    for name, f, t in report.inverse_added:
        click.echo(f"{verb}add {name} {f} -> {t} (its primary pair exists)")
    for name, f, t in report.inverse_removed:
        click.echo(f"{verb}remove {name} {f} -> {t} (its primary pair is gone)")
    for name, f, kept, actual in report.counts_fixed:
        click.echo(f"{verb}set count of {name} {f} from {kept} to {actual}")
    for name, f, t, why in report.unroutable:
        click.echo(f"cannot check {name} {f} -> {t}: {why}")
    click.echo(f"{report.rows_scanned} rows scanned on {len(wanted)} shard(s): {report.changes} fix(es)")
    if relation is None and unique:
        _repair_unique(config_path, dry_run, only)


def _repair_unique(config_path: Path | None, dry_run: bool, shards: range | None) -> None:
    from store.admin.repair import repair_unique

    with open_admin(config_path) as store:
        found = repair_unique(store, dry_run=dry_run, shards=shards)
    verb = "would " if dry_run else ""
    for what, counts in (("remove", found.removed), ("add", found.added), ("repoint", found.repointed)):
        for name, n in counts.items():
            click.echo(f"unique key {name}: {verb}{what} {n} row(s)")
    for name, value, ids in found.conflicts:
        click.echo(
            f"unique key {name}: {value!r} is held by {len(ids)} live objects {ids}; change all but one"
        )
    where = "" if shards is None else f" on shards {shards.start}-{shards.stop - 1}"
    click.echo(f"unique keys: {found.checked} row(s) checked{where}")
