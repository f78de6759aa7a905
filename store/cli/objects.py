"""`store lookup`, `create`, `update` and `delete`: objects, thin over `Store` (`get` is in `reads`)."""

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
    require_type,
    type_option,
)
from store.exceptions import ConfigError

__all__ = ["create", "delete", "lookup", "update"]


@click.command()
@click.argument("name")
@click.argument("value")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON: the key, value and ID (null if free).")
def lookup(name: str, value: str, config_path: Path | None, as_json: bool) -> None:
    """Print the ID whose unique key NAME (config unique:) is VALUE (exit 1 if none holds it)."""
    with open_store(config_path) as store:
        found = store.lookup(name, value)
    if as_json:
        echo_json({"key": name, "value": value, "id": found})
    elif found is not None:
        click.echo(found)
    if found is None:
        if not as_json:
            click.echo(f"no live object holds {name} {value!r}", err=True)
        sys.exit(1)


@click.command()
@click.argument("type_name", metavar="TYPE")
@click.argument("data_text", metavar="JSON")
@config_option
@click.option("--near", "near_text", help="Put the object on this ID's shard.")
@click.option("--shard", type=int, help="Put the object on this shard.")
def create(
    type_name: str, data_text: str, config_path: Path | None, near_text: str | None, shard: int | None
) -> None:
    """Create an object of TYPE from a JSON object; print its ID."""
    data = _parse_json(data_text)
    if near_text is not None and shard is not None:
        raise ConfigError("give --near ID or --shard N, not both")
    with open_store(config_path) as store:
        near = None if near_text is None else parse_id(near_text)
        click.echo(store.create(type_name, data, near=near, shard=shard))


@click.command()
@click.argument("id_text", metavar="ID")
@click.argument("data_text", metavar="JSON")
@config_option
@type_option
def update(id_text: str, data_text: str, config_path: Path | None, type_name: str | None) -> None:
    """Merge a JSON object of changes into the object with ID; print the result."""
    changes = _parse_json(data_text)
    value = parse_id(id_text)
    with open_store(config_path) as store:
        require_type(store.config, type_name, value)
        click.echo(json.dumps(store.update(value, changes, type_name=type_name), ensure_ascii=False))


@click.command()
@click.argument("id_text", metavar="ID")
@config_option
@type_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def delete(id_text: str, config_path: Path | None, type_name: str | None, yes: bool) -> None:
    """Soft-delete the object with ID (the row stays, marked inactive)."""
    value = parse_id(id_text)
    require_type(load_config(config_path), type_name, value)  # before asking
    if not yes:
        click.confirm(f"soft-delete object {value}?", abort=True)
    with open_store(config_path) as store:
        click.echo("deleted" if store.delete(value, type_name=type_name) else "nothing to delete")


def _parse_json(text: str) -> dict[str, Any]:
    from store.exceptions import NotSerializableError

    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotSerializableError(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise NotSerializableError(
            "JSON nested too deeply to read; an object may nest limits.max_depth levels"
        ) from None
    except ValueError:  # an integer of more than 4,300 digits
        raise NotSerializableError(
            "JSON holds an integer too long to read; objects hold 64-bit integers "
            "(write big numbers as strings)"
        ) from None
    if not isinstance(data, dict):
        raise NotSerializableError(f"expected a JSON object, got {type(data).__name__}")
    return data
