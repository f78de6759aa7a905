"""What the `store` command's modules share: the --config option, opening a store, parsing IDs
and shard ranges, JSON output, progress.

`store.cli` holds the `store` group; its modules declare the commands. Each
command is thin: it opens the store, calls one method and formats the result.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

import click

from store.config import StoreConfig
from store.defaults import embedded_config
from store.exceptions import ConfigError, IdError, brief
from store.store import Store

__all__ = [
    "config_option",
    "echo_json",
    "load_config",
    "move_output",
    "one_line",
    "open_admin",
    "open_store",
    "parse_id",
    "parse_shards",
    "progress_bar",
    "read_ids",
    "require_type",
    "type_option",
]

config_option = click.option(
    "--config",
    "config_path",
    envvar="STORE_CONFIG",
    type=click.Path(dir_okay=False, path_type=Path),
    help="YAML config file (default: $STORE_CONFIG, else the embedded SQLite default).",
)

type_option = click.option(
    "--type",
    "type_name",
    metavar="TYPE",
    help="The object's type (needed with Instagram IDs, which do not carry it; checked with Pinterest IDs).",
)


def load_config(path: Path | None) -> StoreConfig:
    """The config at ``path``, or the embedded default."""
    if path is None:
        return embedded_config()
    try:
        return StoreConfig.from_file(path)
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {exc.start}): save it as UTF-8 YAML"
        ) from None


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line: a driver's multi-line message (PostgreSQL's hints, YAML's
    marks) joined with ``; ``."""
    return "; ".join(part.strip() for part in str(exc).splitlines() if part.strip())


def open_store(path: Path | None) -> Store:
    """A store on the request path's accounts."""
    return Store(load_config(path))


def open_admin(path: Path | None) -> Store:
    """A store on the hosts' admin URLs, for init, check, move, promote and repair."""
    return Store(load_config(path).for_admin())


def parse_id(text: str) -> int:
    """An integer ID from the command line (decimal, or 0x... hexadecimal)."""
    try:
        return int(text, 0)
    except ValueError:
        raise IdError(f"{brief(text)} is not an integer ID") from None


def read_ids(texts: Iterable[str], stdin: TextIO | None = None) -> list[int]:
    """IDs from arguments, where ``-`` stands for every ID on stdin (whitespace separated)."""
    out: list[int] = []
    for text in texts:
        if text == "-":
            out += [parse_id(word) for word in (stdin or sys.stdin).read().split()]
        else:
            out.append(parse_id(text))
    return out


def require_type(config: StoreConfig, type_name: str | None, id_: int) -> None:
    """`IdError` saying to pass --type when ``id_`` is an Instagram ID and no type is given."""
    if type_name is None and config.ids == "instagram":
        raise IdError(f"Instagram ID {id_} carries no type: pass --type (one of {', '.join(config.types)})")


def parse_shards(text: str | None, shards: int) -> range | None:
    """``--shards A-B`` (or ``N``) as a range within 0..shards-1; None when not given."""
    if text is None:
        return None
    low, sep, high = text.partition("-")
    try:
        a = int(low)
        b = int(high) if sep else a
    except ValueError:
        raise IdError(f"--shards takes A-B or N (e.g. 0-511), got {text!r}") from None
    if not 0 <= a <= b < shards:
        raise IdError(f"--shards {text} must lie within 0-{shards - 1}, low before high")
    return range(a, b + 1)


def echo_json(value: Any) -> None:
    """``value`` as indented JSON with sorted keys."""
    click.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


@contextmanager
def progress_bar(length: int | None, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr when it is a terminal (else nothing); yields its ``update``."""
    if not sys.stderr.isatty():
        yield lambda _n: None
        return
    bar: Any
    with click.progressbar(length=length, label=label, file=sys.stderr) as bar:
        yield bar.update


@contextmanager
def move_output() -> Iterator[tuple[Callable[[str], None], Callable[[dict[str, Any]], None] | None]]:
    """How a move talks: its lines, and on a terminal a live bar per phase under them (else no bar)."""
    if not sys.stdout.isatty():
        yield click.echo, None
        return
    from store.admin.move import TerminalProgress

    bar = TerminalProgress(sys.stdout)
    try:
        yield bar.say, bar.update
    finally:
        bar.close()
