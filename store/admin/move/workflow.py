"""`store move`: the workflow of a move, whatever the servers: phases, journal, map write, resume, abort.

Phases, recorded in a journal file (`store.admin.move.journal.Journal`) so
that a crash or Ctrl-C can be resumed (``--resume``) or undone
(``--abort``):

1. plan: the shards, tables, rows and bytes that will move (``--dry-run`` stops here).
2. copy: the shards are copied to the target while the application writes,
   and the target starts streaming the source's changes.
3. catch up: the target applies the changes until it is level.
4. switch: holding the shards' admin locks on the source, the two sides are
   compared while the source serves; the source's moving tables are fenced
   (writers wait; other shards are untouched), the target applies the last
   changes, the two sides are checked under the fence, the source's tables
   go out of reach into an archive, and the new map is written (version +
   1). Each moved shard leaves a tombstone on the source that refuses
   every read and write: writers that waited, and processes still holding
   the old map, reload the map and retry on the target. A mismatch, before
   or under the fence, unfences and stops with the journal kept.
5. cleanup (``--cleanup``, later): drop the archives; tombstones stay.

How each step is done is the engine's (`store.admin.move.engine.MoveEngine`):
`store.admin.move.mariadb` for MariaDB shard databases,
`store.admin.move.postgres` for PostgreSQL schema shards. The engine is
chosen once: from the journal, or from the source host's backend.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from store.admin.move.engine import MARIADB, POSTGRES, MoveEngine
from store.admin.move.journal import Journal, MovePlan, infer_kind
from store.admin.move.mariadb import MariaDBEngine
from store.admin.move.postgres import PostgresEngine
from store.admin.move.progress import MoveProgress
from store.backends import backend_for
from store.exceptions import MoveError
from store.mapsource import require_changeable

if TYPE_CHECKING:
    from store.naming import Names
    from store.store import Store

__all__ = ["ENGINES", "Mover"]

log = logging.getLogger("store.admin.move")

#: The engine of each kind of move, by the kind journals name.
ENGINES: dict[str, Callable[[Mover], MoveEngine]] = {MARIADB: MariaDBEngine, POSTGRES: PostgresEngine}


class Mover:
    """Runs, resumes, aborts and cleans up one move, journaled in ``journal``."""

    #: The kind of engine every move of this class uses; None: the source host's (or the journal's).
    engine_kind: str | None = None

    def __init__(
        self, store: Store, journal: str | os.PathLike[str], *, say: Callable[[str], None] = print
    ) -> None:
        self.store = store
        self.journal_path = Path(journal)
        self._say = say
        self.progress: MoveProgress | None = None
        #: Called with a copy of the progress figures each time they change (`MoveProgress.set`).
        self.watch: Callable[[dict[str, Any]], None] | None = None
        self._engine: MoveEngine | None = None

    @property
    def names(self) -> Names:
        """The names of the store's namespace: which databases (or schemas) are the shards'."""
        return self.store.config.names

    # -- the engine ------------------------------------------------------------

    @property
    def engine(self) -> MoveEngine:
        """The engine of this move: chosen by `plan`, or from the journal of a move begun already."""
        if self._engine is None:
            self._choose(self.engine_kind or self._engine_kind(Journal.load(self.journal_path)))
        assert self._engine is not None
        return self._engine

    def _host_kind(self, host: str) -> str | None:
        """The kind of move ``host``'s backend makes (None for a host the config does not name)."""
        url = self.store.config.hosts.get(host)
        return None if url is None else backend_for(url).move_kind

    def _engine_kind(self, j: Journal) -> str:
        """The engine of the move journaled in ``j``: its kind, else the source host's."""
        kind = self.engine_kind or infer_kind(j, self._host_kind(j.source))
        if kind is None:
            raise MoveError(
                f"cannot tell what kind of move is journaled in {self.journal_path}: its source "
                f"{j.source} is not under hosts in the config"
            )
        return kind

    def _choose(self, kind: str | None) -> MoveEngine:
        """Make the engine of ``kind`` (once: a move keeps its engine)."""
        kind = self.engine_kind or kind or MARIADB
        if self._engine is not None:
            if self._engine.kind != kind:
                raise MoveError(f"this move is a {self._engine.kind} move, not a {kind} one")
            return self._engine
        make = ENGINES.get(kind)
        if make is None:
            raise MoveError(f"no move engine {kind!r}; there are {', '.join(sorted(ENGINES))}")
        self._engine = make(self)
        return self._engine

    # -- what engines ask of the move (`store.admin.move.engine.MoveContext`) -----

    def say(self, msg: str) -> None:
        """Tell the operator ``msg`` (the ``say`` given) and log it on ``store.admin.move``."""
        log.info(msg, extra={"fields": {"journal": str(self.journal_path)}})
        self._say(msg)

    def step(self, **changes: Any) -> None:
        """Record progress figures, if the move runs."""
        if self.progress is not None:
            self.progress.set(**changes)

    def phase(self, j: Journal, phase: str, started: float, timing: str) -> None:
        """Journal that the move entered ``phase``, the last one having taken since ``started``."""
        j.timings[timing] = round(time.monotonic() - started, 3)
        j.phase = phase
        j.save(self.journal_path)
        self.step(phase=phase)

    def map_switched(self, j: Journal) -> bool:
        """True if the live map gives every moving shard to the target."""
        return self._map_switched(j)

    def write_map(self, j: Journal) -> None:
        """Publish the map that gives the moving shards to the target."""
        self._write_map(j)

    # -- the journal -------------------------------------------------------------

    def _load(self) -> Journal:
        """The journal, refused if the move was begun by a store of another namespace."""
        j = Journal.load(self.journal_path)
        if j.namespace != self.names.namespace:
            raise MoveError(
                f"the move journaled in {self.journal_path} moves shards of namespace "
                f"{j.namespace or '(none)'}; this config's namespace is {self.names.namespace or '(none)'}: "
                "carry it on with the config that began it"
            )
        self._choose(self._engine_kind(j))
        return j

    # -- plan ------------------------------------------------------------------

    def _source_of(self, low: int, high: int, to: str) -> str:
        """The one live master of shards ``low``-``high``, checked to be a move to another host."""
        self.store.refresh_map(force=True)
        m = self.store.shard_map
        if not 0 <= low <= high < m.shards:
            raise MoveError(f"--shards {low}-{high} must lie within 0-{m.shards - 1}")
        sources = {m.master(s) for s in range(low, high + 1)}
        if len(sources) != 1:
            raise MoveError(
                f"shards {low}-{high} have several masters ({', '.join(sorted(sources))}): "
                "move one host's range at a time"
            )
        source = sources.pop()
        if source == to:
            raise MoveError(f"shards {low}-{high} are already on {to}")
        return source

    def plan(self, low: int, high: int, to: str, slave: str | None = None) -> MovePlan:
        """Check the request and measure what would move (the engine: the source host's)."""
        source = self._source_of(low, high, to)
        m = self.store.shard_map  # as refreshed just now
        engine = self._choose(self._host_kind(source))
        engine.check_hosts(source, to, slave)
        require_changeable(self.store.map_source, "a move")
        plan = MovePlan(low, high, source, to, slave, names=self.names, units=engine.units(low, high))
        engine.survey(plan, m.version)
        return plan

    # -- run -------------------------------------------------------------------

    def start(self, plan: MovePlan) -> Journal:
        """Begin the move described by ``plan`` (refused if a journal is open)."""
        if self.journal_path.exists():
            j = Journal.load(self.journal_path)
            if j.phase not in ("done", "aborted"):
                raise MoveError(
                    f"a move of shards {j.low}-{j.high} is in phase {j.phase}: "
                    "run store move --resume or --abort"
                )
        engine = self._choose(self._host_kind(plan.source))
        engine.check_source(plan.source)
        j = Journal(
            plan.low,
            plan.high,
            plan.source,
            plan.target,
            plan.slave,
            map_version=self.store.shard_map.version,
            namespace=self.names.namespace,
            kind=engine.kind,
        )
        j.save(self.journal_path)
        return self.resume()

    def resume(self) -> Journal:
        """Carry a journaled move on from where it stopped."""
        j = self._load()
        if j.phase in ("done", "aborted"):
            raise MoveError(f"the move of shards {j.low}-{j.high} is already {j.phase}")
        self.store.refresh_map(force=True)
        m = self.store.shard_map
        masters = {m.master(s) for s in range(j.low, j.high + 1)}
        if masters not in ({j.source}, {j.target}):
            raise MoveError(
                f"the live map (version {m.version}) gives shards {j.low}-{j.high} to "
                f"{', '.join(sorted(masters))}, not to {j.source} as when this move began: it is out of "
                "date; run store move --abort"
            )
        engine = self.engine
        units = engine.units(j.low, j.high)
        self.progress = MoveProgress(self, j)
        self.progress.start()
        try:
            if j.phase == "copy":
                engine.copy(j, units)
            if j.phase == "catch_up":
                engine.catch_up(j, units)
            if j.phase == "switch":
                self._switch(j, units)
        except BaseException as exc:
            self.progress.set(error=f"{type(exc).__name__}: {exc}"[:300])
            raise
        finally:
            self.progress.stop(phase=j.phase, **({"step": "done"} if j.phase == "done" else {}))
            self.progress = None
        return j

    def _switch(self, j: Journal, units: list[str]) -> None:
        """Fence, verify and switch, holding the shards' admin locks; a half-done switch finishes.

        Only what the source still serves is fenced: after a crash that
        committed the switch on the source, what it owes the target is done
        again, and the map is written if it was not.
        """
        engine = self.engine
        with engine.shards_locked(j) as session:
            if engine.serving(j, units, session):
                engine.stream(j, units)
                verified = engine.verify_before_fence(j, units)
                engine.fence_and_switch(j, units, session, verified)
            else:
                engine.finish_switch(j, units)
            if not self._map_switched(j):
                self._write_map(j)
            if not j.switched_version:  # a crash came between the map write and the journal
                j.switched_version = self.store.shard_map.version
                j.save(self.journal_path)
            left = engine.leave_tombstones(j, units, session)
        engine.forget_replication(j)
        self._done(j, left)

    def _done(self, j: Journal, tombstones: int) -> None:
        """Journal the move as done and say so."""
        j.phase = "done"
        j.save(self.journal_path)
        self.step(phase="done", step="done", map_version=j.switched_version)
        self.say(
            f"done: shards {j.low}-{j.high} are served by {j.target} (map version {j.switched_version}); "
            f"{tombstones} tombstone(s) on {j.source}"
        )

    # -- the map -----------------------------------------------------------------

    def _map_switched(self, j: Journal) -> bool:
        self.store.refresh_map(force=True)
        m = self.store.shard_map
        return all(m.master(s) == j.target for s in range(j.low, j.high + 1))

    def _write_map(self, j: Journal) -> None:
        current = self.store.map_source.load()
        assert current is not None
        new = current.with_move(j.low, j.high, j.target, j.slave)
        self.store.map_source.write(new, expected_version=current.version)
        self.store.refresh_map(force=True)
        self.say(f"switch: map version {new.version} names {j.target} for shards {j.low}-{j.high}")

    # -- abort and cleanup -------------------------------------------------------

    def abort(self) -> Journal:
        """Undo a move that has not switched the map: the source serves again, the target copy goes."""
        j = self._load()
        if j.phase == "done":
            raise MoveError("the move is done and the map switched: move the shards back instead")
        if self._map_switched(j):
            raise MoveError(
                "the map already names the target: finish with --resume, then move back if needed"
            )
        self.engine.abort(j, self.engine.units(j.low, j.high))
        j.phase = "aborted"
        j.save(self.journal_path)
        MoveProgress(self, j).stop(phase="aborted", step="aborted")
        self.say(f"aborted: shards {j.low}-{j.high} stay on {j.source}")
        return j

    def cleanup(self) -> list[str]:
        """After a finished move: drop the archived copies on the source; its tombstones stay."""
        return self.cleanup_journaled(self._load())

    def cleanup_journaled(self, j: Journal) -> list[str]:
        """`cleanup` for the move journaled in ``j`` (a rebalance keeps each of its moves' journals)."""
        if j.phase != "done":
            raise MoveError(f"the move is in phase {j.phase}: cleanup comes after it is done")
        engine = self._choose(self._engine_kind(j))
        return engine.cleanup(j, engine.units(j.low, j.high))
