"""The embedded default config: SQLite shard files, in-process caches, no servers.

`store demo`, and `Store.from_config()` with no argument, use it so that a
fresh machine needs nothing running. ``config/embedded.yaml`` is the same
config as a file (a test keeps the two in step).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from store.config import StoreConfig

__all__ = ["EMBEDDED", "default_data_dir", "embedded_config"]

#: The embedded default, as a config dict. ``hosts.local`` is filled in by
#: `embedded_config` with the data directory.
EMBEDDED: dict[str, Any] = {
    "ids": "pinterest",
    "shards": 16,
    "hosts": {"local": "sqlite:///store-data"},
    "map": [{"range": [0, 15], "master": "local"}],
    "types": {
        "pin": {"id": 1, "table": "pins"},
        "board": {"id": 2, "table": "boards"},
        "user": {"id": 3, "table": "users"},
    },
    "relations": {
        "board_has_pins": {"from": "board", "to": "pin", "inverse": "pin_owned_by_board"},
        "users_likes_pins": {"from": "user", "to": "pin", "inverse": "pin_liked_by_user"},
        "users_has_pins": {"from": "user", "to": "pin"},
    },
    # In-process caches: the same rules as memcached and Redis, one process only.
    "cache": {"memory": True},
}


def default_data_dir() -> Path:
    """Where the embedded default keeps its files: ``$STORE_DATA_DIR``, else ``./store-data``."""
    return Path(os.environ.get("STORE_DATA_DIR", "store-data")).resolve()


def embedded_config(data_dir: str | os.PathLike[str] | None = None) -> StoreConfig:
    """The embedded default config with its shard files under ``data_dir``."""
    folder = Path(data_dir).resolve() if data_dir is not None else default_data_dir()
    raw = {**EMBEDDED, "hosts": {"local": f"sqlite:///{folder}"}}
    return StoreConfig.from_dict(raw)
