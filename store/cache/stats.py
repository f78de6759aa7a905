"""Cache counters and the circuit breaker that keeps a failing server out of the way."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["Breaker", "CacheStats"]


@dataclass
class CacheStats:
    """What one cache did since the store opened. Read with `Store.stats()`."""

    name: str
    hits: int = 0
    misses: int = 0
    fills: int = 0
    invalidations: int = 0
    errors: int = 0
    skipped: int = 0  # calls not made because the server was cooling down
    expired: int = 0  # entries older than max_stale_s: read again (counted in misses too)
    #: What the latest error was (the server and the exception), for operators; "" if none yet.
    last_error: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add to several counters at once (thread-safe)."""
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def error(self, where: str, exc: BaseException) -> None:
        """Count one error and remember it as the latest."""
        with self._lock:
            self.errors += 1
            self.last_error = f"{where}: {type(exc).__name__}: {exc}"[:300]

    def as_dict(self) -> dict[str, int]:
        """The counters as a plain dict."""
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "fills": self.fills,
                "invalidations": self.invalidations,
                "errors": self.errors,
                "skipped": self.skipped,
                "expired": self.expired,
            }


class Breaker:
    """Opens after ``failures_to_trip`` failures in a row; closed again after ``cooldown_s``.

    ``dirty`` is set when an invalidation could not be delivered: the server
    may hold a value the database no longer has, so the owner must empty it
    (or the keys it owns) before trusting it again.
    """

    def __init__(
        self,
        *,
        failures_to_trip: int = 3,
        cooldown_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._trip = failures_to_trip
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0
        self._open_until = 0.0
        self.dirty = False

    def allow(self) -> bool:
        """True if a call may go to the server now."""
        return self._open_until == 0.0 or self._clock() >= self._open_until

    def success(self) -> None:
        """Record a call that worked."""
        if self._failures or self._open_until:
            with self._lock:
                self._failures = 0
                self._open_until = 0.0

    def failure(self) -> None:
        """Record a failed call; open the breaker after enough of them."""
        with self._lock:
            self._failures += 1
            if self._failures >= self._trip:
                self._open_until = self._clock() + self._cooldown_s

    def trip(self) -> None:
        """Open at once (the server is known to be unusable)."""
        with self._lock:
            self._failures = self._trip
            self._open_until = self._clock() + self._cooldown_s
