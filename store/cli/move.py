"""`store move`: move a shard range to another host (`store.admin.move`), or report the journaled move."""

from __future__ import annotations

import json
from pathlib import Path

import click

from store.cli.common import config_option, move_output, open_admin, parse_shards
from store.cli.logs import admin_log
from store.exceptions import ConfigError

__all__ = ["move"]


@click.command()
@config_option
@click.option("--shards", "shard_text", help="The range to move, A-B.")
@click.option("--to", "to_host", help="The new master (a host name under hosts).")
@click.option("--slave", "slave_host", help="The new slave, if any.")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--resume", is_flag=True, help="Carry on a move that stopped.")
@click.option("--abort", "abort_", is_flag=True, help="Undo a move that has not switched the map.")
@click.option("--cleanup", is_flag=True, help="After a move: drop the source's archived copies.")
@click.option("--journal", default="store-move.json", show_default=True, help="The move's journal file.")
@click.option(
    "--status", is_flag=True, help="Print the journaled move's phase, timings and progress; change nothing."
)
@click.option("--json", "as_json", is_flag=True, help="With --status: print one JSON object.")
def move(
    config_path: Path | None,
    shard_text: str | None,
    to_host: str | None,
    slave_host: str | None,
    dry_run: bool,
    yes: bool,
    resume: bool,
    abort_: bool,
    cleanup: bool,
    journal: str,
    status: bool,
    as_json: bool,
) -> None:
    """Move shards A-B to another MariaDB (or PostgreSQL) host: copy, catch up, fence, verify, switch."""
    from store.admin.move import Mover

    if status:  # files only: no config or server needed
        from store.admin.status import format_move_status, move_status

        if any((shard_text, to_host, slave_host, dry_run, resume, abort_, cleanup)):
            raise ConfigError("store move --status takes only --journal and --json")
        found = move_status(journal)
        if as_json:
            click.echo(json.dumps(found, sort_keys=True, default=str))
        else:
            for line in format_move_status(found):
                click.echo(line)
        return
    if as_json:
        raise ConfigError("--json goes with store move --status")
    with open_admin(config_path) as store, move_output() as (say, watch):
        mover = Mover(store, journal, say=say)
        mover.watch = watch
        if resume or abort_ or cleanup:
            if sum((resume, abort_, cleanup)) > 1:
                raise ConfigError("give one of --resume, --abort, --cleanup")
            if resume:
                mover.resume()
            elif abort_:
                mover.abort()
            else:
                click.echo("dropped: " + ", ".join(mover.cleanup()))
            return
        if shard_text is None or to_host is None:
            raise ConfigError("store move needs --shards A-B and --to HOST (or --resume/--abort/--cleanup)")
        wanted = parse_shards(shard_text, store.config.shards)
        assert wanted is not None
        plan = mover.plan(wanted.start, wanted.stop - 1, to_host, slave_host)
        admin_log("move").info(
            "move: planned",
            extra={
                "fields": {
                    "shards": f"{plan.low}-{plan.high}",
                    "source": plan.source,
                    "target": plan.target,
                    "tables": len(plan.tables),
                    "rows": plan.rows,
                    "bytes": plan.bytes,
                }
            },
        )
        click.echo(
            f"plan: shards {plan.low}-{plan.high} from {plan.source} to {plan.target}"
            f"{f' (slave {plan.slave})' if plan.slave else ''}: {len(plan.databases())} databases, "
            f"{len(plan.tables)} tables, about {plan.rows:,} rows, {plan.bytes / 1e6:.1f} MB"
        )
        if dry_run:
            return
        if not yes:
            click.confirm("start the move?", abort=True)
        mover.start(plan)
