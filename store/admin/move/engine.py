"""The steps a kind of server implements for a move (`MoveEngine`), and what it may ask of the workflow.

`store.admin.move.workflow.Mover` alone knows the phases, the journal, the
map write, resume and abort; it drives an engine through these steps, in
this order:

    plan      check_hosts, survey          (``--dry-run`` stops here)
    checks    check_source                 (when the move starts)
    copy      copy
    catch up  catch_up
    switch    shards_locked: serving? then stream, verify_before_fence,
              fence_and_switch (fence, wait, verify, archive); else
              finish_switch; the map; leave_tombstones; forget_replication
    abort     abort
    cleanup   cleanup

An engine gets the workflow as a `MoveContext` (its store, names, journal
and progress) when it is made, and names the ``kind`` its journals carry.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from store.admin.move.journal import Journal, MovePlan
    from store.naming import Names
    from store.store import Store

__all__ = ["MARIADB", "POSTGRES", "MoveContext", "MoveEngine"]

#: The engines' kinds, as journals and backends (`store.backends.Backend.move_kind`) name them.
MARIADB = "mariadb"
POSTGRES = "postgres"


class MoveContext(Protocol):
    """What an engine may ask of the move it serves (`store.admin.move.workflow.Mover`)."""

    store: Store
    journal_path: Path
    #: The running move's progress (`store.admin.move.progress.MoveProgress`), None between runs.
    progress: Any

    @property
    def names(self) -> Names:
        """The names of the store's namespace."""
        ...

    def say(self, msg: str) -> None:
        """Tell the operator ``msg``."""
        ...

    def step(self, **changes: Any) -> None:
        """Record progress figures (`store.admin.move.progress.MoveProgress.set`), if a move runs."""
        ...

    def phase(self, j: Journal, phase: str, started: float, timing: str) -> None:
        """Journal that the move entered ``phase``, the last one having taken since ``started``."""
        ...

    def map_switched(self, j: Journal) -> bool:
        """True if the live map gives every moving shard to the target."""
        ...

    def write_map(self, j: Journal) -> None:
        """Publish the map that gives the moving shards to the target."""
        ...


class MoveEngine(Protocol):
    """One kind of server's steps of a move (see the module's docstring for their order)."""

    #: What the journal's ``kind`` says for a move of this engine.
    kind: str

    def units(self, low: int, high: int) -> list[str]:
        """What is copied, one per shard (a database, a schema)."""
        ...

    # -- plan and checks -------------------------------------------------------

    def check_hosts(self, source: str, target: str, slave: str | None) -> None:
        """`MoveError` unless the hosts are of this engine's kind and two distinct servers."""
        ...

    def survey(self, plan: MovePlan, map_version: int) -> None:
        """Measure the moving tables into ``plan``; `MoveError` for what the move could not finish."""
        ...

    def check_source(self, source: str) -> None:
        """`MoveError` for a source the move cannot catch up from."""
        ...

    # -- copy and catch up -----------------------------------------------------

    def copy(self, j: Journal, units: list[str]) -> None:
        """Copy the shards to the target and start streaming changes; the journal moves to catch_up."""
        ...

    def catch_up(self, j: Journal, units: list[str]) -> None:
        """Let the target catch up with the source; the journal moves to switch."""
        ...

    # -- fence and switch ------------------------------------------------------

    def shards_locked(self, j: Journal) -> AbstractContextManager[Any]:
        """Hold the moving shards' admin locks on the source; yields the session that holds them."""
        ...

    def serving(self, j: Journal, units: list[str], session: Any) -> bool:
        """True while the source still serves the shards (else a switch committed there already)."""
        ...

    def stream(self, j: Journal, units: list[str]) -> None:
        """Make sure the target streams from the source again (a crash stopped it), and is level."""
        ...

    def verify_before_fence(self, j: Journal, units: list[str]) -> str:
        """Compare both sides before the fence, while the source serves; what the fence's own check
        can start from ("" when nothing was compared: the fence compares everything)."""
        ...

    def fence_and_switch(self, j: Journal, units: list[str], session: Any, verified: str) -> None:
        """Fence the source's moving tables, wait for the target, verify, and move the source's
        tables out of reach (archive); the map may be written here (`MoveContext.write_map`)."""
        ...

    def finish_switch(self, j: Journal, units: list[str]) -> None:
        """What a switch that committed on the source still owes the target (run again on resume)."""
        ...

    def leave_tombstones(self, j: Journal, units: list[str], session: Any) -> int:
        """Leave each moved shard's tombstone on the source (idempotent); how many there are."""
        ...

    def forget_replication(self, j: Journal) -> None:
        """Remove what streamed the changes (idempotent)."""
        ...

    # -- abort and cleanup -----------------------------------------------------

    def abort(self, j: Journal, units: list[str]) -> None:
        """Drop the target's copy and what streams to it; put back anything a switch had fenced."""
        ...

    def cleanup(self, j: Journal, units: list[str]) -> list[str]:
        """Drop the source's archived copies of a finished move; their names."""
        ...

    # -- progress --------------------------------------------------------------

    def sampler(self, target: str) -> Any:
        """A connection to ``target`` for the progress sampler."""
        ...

    def sample(self, conn: Any, step: str, low: int, high: int) -> dict[str, Any]:
        """Where the target stands at ``step``: the progress figures to record (may be empty)."""
        ...
