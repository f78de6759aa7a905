"""`store ids decode` and `store ids encode`: 64-bit IDs and their fields (pure; no database)."""

from __future__ import annotations

import json
from typing import Any

import click

from store.cli.common import echo_json, parse_id
from store.exceptions import IdError
from store.ids import (
    INSTAGRAM_EPOCH_MS,
    decode_instagram,
    decode_pinterest,
    encode_instagram,
    encode_pinterest,
)

__all__ = ["ids"]


@click.group()
def ids() -> None:
    """Encode and decode 64-bit IDs (pure; no database)."""


@ids.command("decode")
@click.argument("id_text", metavar="ID")
@click.option(
    "--scheme", type=click.Choice(["pinterest", "instagram"]), default="pinterest", show_default=True
)
@click.option("--epoch-ms", type=int, default=INSTAGRAM_EPOCH_MS, show_default=True, help="Instagram epoch.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ids_decode(id_text: str, scheme: str, epoch_ms: int, as_json: bool) -> None:
    """Split ID into its fields."""
    value = parse_id(id_text)
    out: dict[str, Any]
    if scheme == "pinterest":
        out = {"id": value, **decode_pinterest(value)._asdict()}
    else:
        d = decode_instagram(value)
        out = {"id": value, **d._asdict(), "time": d.datetime(epoch_ms).isoformat()}
    if as_json:
        echo_json(out)
    else:
        click.echo(" ".join(f"{k}={v}" for k, v in out.items()))


@ids.command("encode")
@click.option(
    "--scheme", type=click.Choice(["pinterest", "instagram"]), default="pinterest", show_default=True
)
@click.option("--shard", type=int, required=True, help="Shard id.")
@click.option("--type", "type_id", type=int, help="Type id (pinterest).")
@click.option("--local", "local_id", type=int, help="Local id (pinterest).")
@click.option("--ms", type=int, help="Milliseconds since the epoch (instagram).")
@click.option("--sequence", type=int, help="Sequence (instagram).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ids_encode(
    scheme: str,
    shard: int,
    type_id: int | None,
    local_id: int | None,
    ms: int | None,
    sequence: int | None,
    as_json: bool,
) -> None:
    """Build an ID from its fields."""
    if scheme == "pinterest":
        if type_id is None or local_id is None:
            raise IdError("a pinterest ID needs --shard, --type and --local")
        value = encode_pinterest(shard, type_id, local_id)
    else:
        if ms is None or sequence is None:
            raise IdError("an instagram ID needs --ms, --shard and --sequence")
        value = encode_instagram(ms, shard, sequence)
    click.echo(json.dumps({"id": value}) if as_json else str(value))
