"""A write as a plan of steps: each step is run again alone after a reroute, never the whole write.

A write that touches more than one shard (an object, then the rows of its
unique keys, then the lists that reach it) is a plan of steps. Each step is
one read, one transaction or one idempotent statement on one shard, routed
by the map current when it runs. A step refused because its shard moved
(a tombstone, or the tables absent during a switch) wrote nothing: it runs
again, alone, on the shard's new host (`store.livemap.LiveMap.step`). The
steps before it stay committed, once; the user's update function is not
called again for them.

Which steps a write has, and which of them are atomic or converge later, is
written beside each write (`store.objects`, `store.relations`). Tests see
the steps by name through `Steps.hook`, called before each one: the
interleaving checker pauses there, and the crash tests kill the writer
there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

__all__ = ["Rerouter", "Steps"]

R = TypeVar("R")


class Rerouter(Protocol):
    """Runs one step; after a routing refusal, again on the newer map (`LiveMap.step`)."""

    def __call__(self, call: Callable[[], R], /) -> R:
        """``call()``, again after a reroute."""
        ...


def _direct(call: Callable[[], R]) -> R:
    return call()


class Steps:
    """Runs the named steps of writes' plans through a `Rerouter`; tells ``hook`` each name first."""

    __slots__ = ("_reroute", "hook")

    def __init__(self, reroute: Rerouter | None = None) -> None:
        self._reroute: Rerouter = reroute or _direct
        #: Told each step's name before it runs (tests pause or stop the writer there); None: nobody.
        self.hook: Callable[[str], None] | None = None

    def __call__(self, name: str, call: Callable[[], R]) -> R:
        """Run step ``name`` (``call``: routed when it runs, writing nothing if refused)."""
        hook = self.hook
        if hook is not None:
            hook(name)
        return self._reroute(call)

    def mark(self, name: str) -> None:
        """A boundary between steps that runs nothing (e.g. "done"): only ``hook`` hears it."""
        hook = self.hook
        if hook is not None:
            hook(name)
