"""The records of a move: what it involves (`MovePlan`) and where it stands (`Journal`, a JSON file).

The journal is written after every phase, so that a crash or Ctrl-C can be
resumed or undone. Its ``kind`` names the engine that moves the shards
(`store.admin.move.mariadb`, `store.admin.move.postgres`); a journal
written before it had one gets it from the source host's backend, or from
the position it replicates from (`infer_kind`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from store.exceptions import MoveError
from store.naming import DEFAULT_NAMES, Names

__all__ = ["Journal", "MovePlan", "infer_kind"]

#: A MariaDB GTID position (``0-1-3671``, or several, comma-separated); a PostgreSQL LSN is ``0/1A2B3C``.
_GTID = re.compile(r"^\d+-\d+-\d+(,\s*\d+-\d+-\d+)*$")
_LSN = re.compile(r"^[0-9A-Fa-f]+/[0-9A-Fa-f]+$")


@dataclass
class MovePlan:
    """What a move of shards ``low..high`` from ``source`` to ``target`` involves."""

    low: int
    high: int
    source: str
    target: str
    slave: str | None
    tables: list[tuple[str, str, int, int]] = field(default_factory=list)  # db, table, rows, bytes
    #: The names of the config's namespace (``NAME_db00042``).
    names: Names = field(default=DEFAULT_NAMES, repr=False)
    #: What is copied, one per shard, as the move's engine names it (empty: the shard databases).
    units: list[str] = field(default_factory=list, repr=False)

    @property
    def rows(self) -> int:
        """Rows in all moving tables (InnoDB's estimate)."""
        return sum(t[2] for t in self.tables)

    @property
    def bytes(self) -> int:
        """Data and index bytes of all moving tables."""
        return sum(t[3] for t in self.tables)

    def databases(self) -> list[str]:
        """The shard databases (or schemas) that move."""
        if self.units:
            return list(self.units)
        return [self.names.database_name(s) for s in range(self.low, self.high + 1)]


@dataclass
class Journal:
    """Where a move stands; written after every phase."""

    low: int
    high: int
    source: str
    target: str
    slave: str | None
    phase: str = "copy"  # copy -> catch_up -> switch -> done (or aborted)
    gtid: str = ""
    replicating: bool = False
    map_version: int = 0
    #: The map version in which the target took the shards (set at the switch).
    switched_version: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    #: The config's namespace when the move began: only a store of the same namespace carries it on.
    namespace: str | None = None
    #: The engine that moves the shards (``mariadb``, ``postgres``); "" in a journal written before
    #: journals named it (`infer_kind`).
    kind: str = ""

    def save(self, path: Path) -> None:
        """Write the journal to ``path`` (whole: a temporary file renamed over it)."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> Journal:
        """The journal in ``path``; `MoveError` if it cannot be read."""
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            raise MoveError(f"cannot read the move journal {path}: {exc}") from exc


def infer_kind(j: Journal, source_kind: str | None) -> str | None:
    """The engine of the move journaled in ``j``: its ``kind``, else the source host's
    (``source_kind``, what its backend moves with), else what its replication position looks like
    (a MariaDB GTID or a PostgreSQL LSN); None if nothing tells."""
    if j.kind:
        return j.kind
    if source_kind:
        return source_kind
    if _GTID.match(j.gtid):
        return "mariadb"
    if _LSN.match(j.gtid):
        return "postgres"
    return None
