"""The `store` command: a thin layer over the library.

Each command builds the library object, calls one method and formats the
result. A `StoreError` becomes one line on stderr and exit code 1.

This module holds the `store` group and its global options; the commands
live in the package's modules: `ids`, `admin` (init, check, schema, map,
rebalance, promote, grants), `move`, `serve`, `objects`, `relations`,
`reads` (get, page, ping), `tickets`, `demo`, `bench`, `invalidate` and
`exchange` (export, import), with what they share in `common` and `logs`.
Whatever a command needs beyond them is imported when it runs, so that
`store --help` stays fast.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import click

from store.cli import (
    admin,
    bench,
    demo,
    exchange,
    ids,
    invalidate,
    move,
    objects,
    reads,
    relations,
    serve,
    tickets,
)
from store.cli.common import move_output, one_line
from store.cli.logs import ADMIN_LOGGER as ADMIN_LOGGER
from store.cli.logs import setup_logging
from store.exceptions import StoreError

__all__ = ["main"]


class _Group(click.Group):
    """A group that turns library errors into one clean line and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except StoreError as exc:
            click.echo(f"error: {one_line(exc)}", err=True)
            sys.exit(1)


@click.group(cls=_Group)
@click.version_option(package_name="store")
@click.option("--log-json", is_flag=True, help="Admin commands log one JSON object per line on stderr.")
def main(log_json: bool) -> None:
    """Sharded object/relation store over MariaDB: IDs, shard map, objects."""
    setup_logging(json_lines=log_json, level=logging.INFO)


for _command in (
    ids.ids,
    admin.init,
    admin.check,
    admin.schema,
    admin.map_,
    move.move,
    admin.rebalance,
    admin.promote,
    admin.grants,
    serve.serve,
    objects.lookup,
    objects.create,
    objects.update,
    objects.delete,
    relations.links,
    relations.has_link,
    relations.count,
    relations.link,
    relations.unlink,
    relations.relations,
    tickets.tickets,
    demo.demo,
    bench.bench,
    invalidate.invalidate,
    exchange.export,
    exchange.import_,
    reads.get,
    reads.page,
    reads.ping,
):
    main.add_command(_command)

#: The name `store.cli` gave the move's output before it was a package.
_move_output = move_output
