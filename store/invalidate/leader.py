"""Leadership: one active invalidator per database server, by a lock held on the daemon's own session.

MariaDB's named lock (``GET_LOCK``), like PostgreSQL's session advisory lock
(`store.backends.Backend.wait_for_lock`), belongs to the connection that took it:
when the daemon dies, the server closes its connection and the lock is free
at once, so a standby waiting in ``GET_LOCK`` takes over within its wait.
The leader runs every query of its work on that same connection, so if the
connection is lost (and the lock with it) its next query fails and it steps
down before another daemon can have been deleting for long.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from store.naming import Names

__all__ = ["LOCK_NAME", "WAIT_S", "Leadership", "lock_name"]

log = logging.getLogger(__name__)

#: The named lock on each server.
LOCK_NAME = "store_invalidate"


def lock_name(names: Names) -> str:
    """The leader's named lock for ``names``: one leader per server and namespace."""
    return LOCK_NAME if names.namespace is None else f"{names.namespace}_{LOCK_NAME}"


#: How long one ``GET_LOCK`` of a standby waits (its queries a second are 1 / WAIT_S).
WAIT_S = 1


class Leadership:
    """Takes the server's lock on a connection of its own, waiting as a standby until it is free."""

    def __init__(
        self,
        connect: Callable[[], Any],
        *,
        name: str = LOCK_NAME,
        wait_s: int = WAIT_S,
        wait_for_lock: Callable[[Any, str, int], bool] | None = None,
    ) -> None:
        self._connect = connect
        #: How the server's lock is taken (`Backend.wait_for_lock`; MariaDB's GET_LOCK by default).
        self._wait_for_lock = wait_for_lock or _get_lock
        self._name = name
        self._wait_s = wait_s
        #: Why the last attempt failed ("" if none did).
        self.last_error = ""

    def acquire(self, stop: threading.Event, on_wait: Callable[[], None] | None = None) -> Any | None:
        """A connection that holds the lock (the caller closes it to give the lock up); None once
        ``stop`` is set. ``on_wait`` runs after each wait that did not get it (a standby's status)."""
        conn: Any = None
        while not stop.is_set():
            if on_wait is not None and conn is not None:
                on_wait()
            try:
                if conn is None:
                    conn = self._connect()
                cur = conn.cursor()
                got = self._wait_for_lock(cur, self._name, self._wait_s)
                cur.close()
                if got:
                    return conn
            except Exception as exc:  # the server down: wait and try again on a new connection
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.debug("invalidator lock: %s", self.last_error)
                close_quietly(conn)
                conn = None
                stop.wait(0.5)
        close_quietly(conn)
        return None


def _get_lock(cur: Any, name: str, wait_s: int) -> bool:
    cur.execute("SELECT GET_LOCK(%s, %s)", (name, wait_s))
    got = cur.fetchone()
    return got is not None and got[0] == 1


def close_quietly(conn: Any) -> None:
    """Close ``conn`` if there is one, ignoring errors (it may be dead already)."""
    if conn is not None:
        with contextlib.suppress(Exception):  # a dead connection has nothing left to close
            conn.close()
