"""Running code when a thread ends: for the lock-free per-thread counters.

`store.cache.stats.CacheStats` and `store.metrics.Metrics` count into a
table per thread, with no lock on the request path, and sum the tables when
read. An application that starts a thread per request would otherwise
leave one table behind per thread it ever ran: each thread's table is
folded into a total of the ended threads and dropped when the thread ends.

A thread's `threading.local` attributes are released when it ends; an
`on_thread_end` marker kept there runs its function then (in the ending
thread). Not in a child of ``os.fork()``, where the parent's other threads'
locals are released at the fork, before the locks the function takes are
made again (`store.forks`): those threads did not end, and their counts stay
among the live ones.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from contextlib import suppress

__all__ = ["on_thread_end"]


class _AtEnd:
    __slots__ = ("fn", "pid")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.pid = os.getpid()

    def __del__(self) -> None:
        if self.pid != os.getpid():
            return  # released by a fork (see the module's text), not by the thread's end
        # A finaliser must not raise; on an error the counts are at worst left with the live ones.
        with suppress(Exception):
            self.fn()


def on_thread_end(local: threading.local, name: str, fn: Callable[[], None]) -> None:
    """Run ``fn`` once the current thread has ended (kept as ``local.<name>`` until then)."""
    setattr(local, name, _AtEnd(fn))
