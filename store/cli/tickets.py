"""`store tickets init` and `store tickets next`: Flickr-style ticket servers (`store.tickets`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from store.cli.common import config_option, echo_json
from store.exceptions import ConfigError

__all__ = ["tickets"]


@click.group()
def tickets() -> None:
    """Flickr-style ticket servers: dense unique IDs from two MariaDB servers."""


def _ticket_allocator(path: Path | None) -> Any:
    import yaml

    from store.config import TicketsConfig
    from store.tickets import TicketAllocator

    if path is None:
        raise ConfigError("store tickets needs --config (or $STORE_CONFIG) with a tickets: section")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(raw, dict) or "tickets" not in raw:
        raise ConfigError(f"{path} has no tickets: section (servers: [URL, URL], counters: [...])")
    from store.naming import Names

    names = Names(raw.get("namespace"))
    return TicketAllocator(TicketsConfig.from_dict(raw["tickets"], path.resolve().parent, names=names))


@tickets.command("init")
@config_option
def tickets_init(config_path: Path | None) -> None:
    """Set up the tickets database: each server's place, a counter row per counter; switch REPLACE tables."""
    allocator = _ticket_allocator(config_path)
    try:
        allocator.init()
    finally:
        allocator.close()
    cfg = allocator.config
    click.echo(
        f"{len(cfg.servers)} ticket server(s) ready: counters {', '.join(cfg.counters)}, block {cfg.block}"
    )


@tickets.command("next")
@click.argument("counter", required=False, default=None)
@config_option
@click.option("-n", "count", default=1, show_default=True, help="How many IDs.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
def tickets_next(counter: str | None, config_path: Path | None, count: int, as_json: bool) -> None:
    """Print new IDs from COUNTER (default: the first configured counter)."""
    allocator = _ticket_allocator(config_path)
    try:
        ids = allocator.next_many(counter or allocator.config.counters[0], count)
    finally:
        allocator.close()
    if as_json:
        echo_json(ids)
    else:
        for i in ids:
            click.echo(i)
