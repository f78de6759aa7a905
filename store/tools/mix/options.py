"""What `store bench mix` is asked for: `MixOptions`, the systems it knows by name, the config of each.

The run (`store.tools.mix.bench`), its worker processes (`store.tools.mix.procs`) and the
processes that hold a system open at rest (`store.tools.mix.invalidation`) all read these; none
of them imports another to find them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from store.config import StoreConfig
from store.exceptions import ConfigError
from store.tools.mix.dataset_db import default_config
from store.tools.mix.pg import default_pg_config
from store.tools.mix.workload import Shape

__all__ = [
    "ASYNC_SYSTEM",
    "CACHE_KNOBS",
    "DEFAULT_SYSTEMS",
    "OTHER_SYSTEMS",
    "QUICK_SHAPE",
    "SYSTEMS",
    "MixOptions",
    "mix_config",
    "system_config",
]

#: ``--quick``: a data set small enough that the whole run takes well under a minute.
QUICK_SHAPE = Shape(users=200, boards_per_user=2, pins=3000, likes_per_user=5)
SYSTEMS = ("floor", "horizontal_shard", "store")
#: Systems that run when named: the floor with the store's write promises, by hand.
OTHER_SYSTEMS = ("floor:promised", "store-mysqldb")
#: `store.aio.AsyncStore`, its phases run by tasks on one event loop (`--async`, `--concurrency`).
ASYNC_SYSTEM = "store:async"
#: What `store bench mix` runs unless told: the peers, and the store with its defaults and with the
#: invalidation log (its faster setting: entries trusted at any age while the log is followed).
DEFAULT_SYSTEMS = (*SYSTEMS, "store:follow=true")

#: Cache settings a ``store:KEY=VALUE`` system may change, and their types.
CACHE_KNOBS: dict[str, Callable[[str], Any]] = {
    "max_stale_s": float,
    "list_entries": int,
    "ttl_s": int,
    "follow": lambda text: {"true": True, "false": False}[text.lower()],
    "follow_poll_s": float,
    # A `store invalidate` daemon for the system's hosts (the run starts one per system).
    "invalidation": lambda text: {"window": "window", "log": "log", "binlog": "binlog", "wal": "wal"}[
        text.lower()
    ],
}


@dataclass
class MixOptions:
    """What `store bench mix` was asked for."""

    config: StoreConfig | None = None
    shards: int = 64
    shape: Shape = field(default_factory=Shape)
    threads: list[int] = field(default_factory=lambda: [1, 4, 16])
    seconds: float = 10.0
    requests: int | None = None
    systems: tuple[str, ...] = DEFAULT_SYSTEMS
    #: A ``mysql+mysqldb://`` URL: the store also runs on mysqlclient, on the same server(s).
    mysqldb_url: str | None = None
    seed: int = 7
    #: Each phase runs in this many slices, the systems taking turns, so that a burst
    #: of machine noise (or its drift) lands on all of them alike; a cold slice starts
    #: from empty caches.
    rounds: int = 3
    trips: int = 400
    out: Path = Path("mix-results")
    keep: bool = False
    #: Worker processes each phase runs in (each with the phase's threads); 1: in this process.
    processes: int = 1
    #: Seconds each system is held open idle after the run, its database queries counted (0: not).
    idle_s: float = 4.0
    #: Tasks on one event loop for each phase of ``store:async`` (empty: the thread counts).
    concurrency: list[int] = field(default_factory=list)
    #: ``store:async``'s ``max_workers`` (None: `store.aio.default_max_workers`).
    async_workers: int | None = None
    #: How ``store:async`` runs its calls: `store.aio.IO_MODES` (``native``: greenlets on the loop).
    async_io: str = "native"
    #: ``store:async``'s event loop: ``asyncio`` (the standard library's) or ``uvloop``.
    async_loop: str = "asyncio"
    #: ``store:async``'s ``pool_size`` (None: the threaded store's).
    async_pool: int | None = None
    #: ``store:async``'s ``pool_overflow`` (None: as many again as its ``pool_size``).
    async_overflow: int | None = None


def mix_config(options: MixOptions) -> StoreConfig:
    """The run's config: ``options.config``, else local servers (``STORE_MIX_URL``, ``_A``, ``_B``)."""
    if options.config is not None:
        return options.config
    url = os.environ.get("STORE_MIX_URL", "mysql+pymysql://root@127.0.0.1:3306")
    # A postgresql:// URL: Instagram IDs, a schema per shard (the URL names the database).
    make = default_pg_config if url.startswith("postgresql") else default_config
    return StoreConfig.from_dict(
        make(
            os.environ.get("STORE_MIX_URL_A", url),
            os.environ.get("STORE_MIX_URL_B", url),
            shards=options.shards,
        )
    )


def system_config(name: str, config: StoreConfig, options: MixOptions) -> StoreConfig | None:
    """The config a store system ``name`` runs on (its cache knobs applied); None for the floor and
    the peer, which are not the store."""
    if name in ("floor", "floor:promised", "horizontal_shard"):
        return None
    if name == ASYNC_SYSTEM:
        return config
    base, _, knobs = name.partition(":")
    if base == "store":
        cfg = config
    elif base == "store-mysqldb":
        if options.config is not None or options.mysqldb_url is None:
            raise ConfigError("--mysqldb URL runs on the mix's own config: leave out --config")
        url = options.mysqldb_url
        cfg = StoreConfig.from_dict(default_config(url, url, shards=options.shards))
    else:
        raise ConfigError(
            f"unknown system {name!r}; choose from {', '.join((*SYSTEMS, *OTHER_SYSTEMS, ASYNC_SYSTEM))}"
        )
    if knobs:
        # A variant of the store's cache settings, e.g. store:max_stale_s=3600 (named as given).
        changes: dict[str, Any] = {}
        for item in knobs.split(","):
            key, _, value = item.partition("=")
            if key not in CACHE_KNOBS or not value:
                raise ConfigError(
                    f"system {name!r}: give {base}:KEY=VALUE with KEY one of {', '.join(CACHE_KNOBS)}"
                )
            try:
                changes[key] = CACHE_KNOBS[key](value)
            except (KeyError, ValueError):
                raise ConfigError(f"system {name!r}: {value!r} is not a value of {key}") from None
        if "invalidation" in changes:
            changes["invalidation_hosts"] = ()
        cfg = replace(cfg, cache=replace(cfg.cache, **changes))
        if cfg.cache.follow and cfg.cache.daemon_hosts(sorted(cfg.hosts)):
            raise ConfigError(f"system {name!r}: follow and invalidation are two ways of one thing: give one")
    return cfg
