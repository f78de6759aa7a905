"""The old home of the PostgreSQL move: `PgMover` and friends, kept for their importers.

A move of PostgreSQL schema shards is a `store.admin.move.Mover` whose
engine is `store.admin.move.postgres.PostgresEngine`; `Mover` chooses it
from the source host on its own.
"""

from __future__ import annotations

import os
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from store.admin.move import Journal, MovePlan, Mover
from store.admin.move.engine import POSTGRES
from store.admin.move.postgres import ID_MARGIN, PostgresEngine
from store.backends import backend_for
from store.exceptions import MoveError
from store.store import Store

__all__ = ["ID_MARGIN", "PgMovePlan", "PgMover", "PostgresEngine", "is_postgres", "moves_postgres"]


def is_postgres(store: Store, host: str) -> bool:
    """True if ``host`` (a name under hosts) is a PostgreSQL server."""
    url = store.config.hosts.get(host)
    return url is not None and backend_for(url).move_kind == POSTGRES


def moves_postgres(store: Store, journal: str | os.PathLike[str]) -> bool:
    """True if a `Mover` on ``journal`` moves PostgreSQL schema shards.

    The journal's source says so when there is a journal; else the map: every
    master a PostgreSQL host.
    """
    hosts = store.config.hosts
    path = Path(journal)
    if path.exists():
        with suppress(MoveError):
            source = Journal.load(path).source
            if source in hosts:
                return is_postgres(store, source)
    masters = {r.master for r in store.shard_map}
    return bool(masters) and all(is_postgres(store, h) for h in masters)


@dataclass
class PgMovePlan(MovePlan):
    """A `MovePlan` of PostgreSQL schema shards: its namespaces are schemas (``shard0042``)."""

    def databases(self) -> list[str]:
        """The shard schemas that move."""
        return [self.names.schema_name(s) for s in range(self.low, self.high + 1)]


class PgMover(Mover):
    """A `Mover` of PostgreSQL schema shards, whatever the hosts: its engine is always `PostgresEngine`."""

    engine_kind = POSTGRES
