"""`store demo`: users, boards and pins, created and read back with timings (`store.tools.demo`)."""

from __future__ import annotations

from pathlib import Path

import click

from store.cli.common import config_option, open_store

__all__ = ["demo"]


@click.command()
@config_option
def demo(config_path: Path | None) -> None:
    """Create users, boards and pins, read them back, time each step."""
    from store.tools.demo import run_demo

    with open_store(config_path) as store:
        run_demo(store, say=click.echo)
