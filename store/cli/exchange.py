"""`store export` and `store import`: every object and relation entry as NDJSON (`store.exchange`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from store.cli.common import config_option, echo_json, open_admin, parse_shards, progress_bar
from store.exceptions import ConfigError

__all__ = ["export", "import_"]


@click.command()
@config_option
@click.option("--shards", "shard_text", help="Only these shards, A-B (default: all).")
@click.option(
    "--out", "out", type=click.Path(dir_okay=False, path_type=Path), help="Write to FILE (default: stdout)."
)
@click.option("--resume", is_flag=True, help="Go on with the partial export in --out after its last line.")
def export(config_path: Path | None, shard_text: str | None, out: Path | None, resume: bool) -> None:
    """Every object (deleted ones marked) and relation entry as NDJSON, one JSON object a line."""
    with open_admin(config_path) as store:
        wanted = parse_shards(shard_text, store.config.shards)
        if resume and out is None:
            raise ConfigError("--resume goes on with the export in --out FILE: give --out")
        total = len(store.config.types) + len(store.config.relations)
        with progress_bar(total * len(wanted or range(store.config.shards)), "export") as step:
            seen = [0]

            def progress(done: int, _total: int) -> None:
                step(done - seen[0])
                seen[0] = done

            target: Any = out if out is not None else sys.stdout
            try:
                report = store.export(target, shards=wanted, resume=resume, progress=progress)
            except OSError as exc:
                if out is None or exc.filename is None or Path(exc.filename) != out:
                    raise
                raise ConfigError(f"cannot write --out {out}: {exc.strerror}") from None
    if out is not None:
        state = (
            "already complete" if report.complete_already else ("resumed" if report.resumed else "written")
        )
        click.echo(f"{out}: {report.objects} objects, {report.links} entries ({state})", err=True)


@click.command("import")
@config_option
@click.argument("file", type=click.File("rb"))
@click.option("--batch", default=1000, show_default=True, help="Lines checked, then written, at a time.")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
def import_(config_path: Path | None, file: Any, batch: int, as_json: bool) -> None:
    """Add what an export FILE holds (- reads stdin), IDs kept; run again, it adds nothing.

    Each batch of lines is checked whole before anything of it is written: a
    bad line refuses its batch, naming every bad line's number.
    """
    import os

    try:
        length: int | None = os.fstat(file.fileno()).st_size or None
    except (OSError, ValueError, AttributeError):  # stdin from a pipe, or a test runner's stream
        length = None
    with open_admin(config_path) as store, progress_bar(length, "import") as step:
        report = store.import_records(file, batch=batch, progress=step)
    if as_json:
        echo_json({k: v for k, v in vars(report).items() if k != "shards"})
    else:
        click.echo(
            f"{report.objects_added} objects added ({report.objects_present} there already), "
            f"{report.links_added} entries added ({report.links_present} there already)"
            + (f", {report.unique_added} unique key rows" if report.unique_added else "")
        )
    if not report.complete:
        click.echo(
            "error: the file has an export's header but no end line: the export was cut short", err=True
        )
        sys.exit(1)
