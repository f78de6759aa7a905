"""Small checks every part of the config's validation shares: ints, seconds, names, keys."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from store.exceptions import ConfigError, brief

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
_COUNTER = re.compile(r"^[a-z_][a-z0-9_]{0,50}$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_HOST_PORT = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$")


def _host_port(text: object) -> bool:
    """Whether ``text`` is ``host:port`` with a port from 1 to 65535."""
    return (
        isinstance(text, str)
        and bool(_HOST_PORT.fullmatch(text))
        and 1 <= int(text.rsplit(":", 1)[1]) <= 65535
    )


def _key(key: object) -> str:
    """A key for a message: as it is if it is a short printable str, else quoted and cut short."""
    if isinstance(key, str) and len(key) <= 64 and key.isprintable():
        return key
    return brief(key)


def _int(raw: Mapping[str, Any], key: str, default: int | None, low: int, high: int, where: str = "") -> int:
    """``raw[key]``, an int in low..high; messages name it ``where`` + ``key`` (``where``: its
    section, e.g. ``cache.``)."""
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"{where}{key} is required: an int in {low}..{high}")
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigError(f"{where}{key} must be an int in {low}..{high}, got {brief(value)}")
    return value


def _keys(keys: Iterable[object]) -> str:
    """Keys for a message, sorted and separated by commas (each as `_key` shows it)."""
    return ", ".join(sorted(map(_key, keys)))


def _seconds(raw: Mapping[str, Any], key: str, default: float, high: float = 3600.0) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= high:
        raise ConfigError(f"{key} must be a number of seconds in (0, {high:g}], got {brief(value)}")
    return float(value)
