"""Fork safety: what a process forked from one that used the store drops, makes again and reopens.

A child of ``os.fork()`` (gunicorn or uWSGI with ``--preload``, Celery's
prefork pool, `multiprocessing`'s fork context) inherits its parent's open
sockets. Were both to use one, each would read replies meant for the other:
a get answered with another request's row. It also inherits every lock in
the state it was in, and none of the other threads: a lock another thread
held at the fork stays held for good in the child, and a thread the store
runs (the invalidation log's follower, a map check) is gone.

So each object of the store that keeps a connection, a lock or a thread
registers here (`at_fork`). In the child, right after the fork
(`os.register_at_fork`), each one starts over: it forgets the connections
it inherited without sending anything on them (`forget_connection`: a
goodbye from the child, PyMySQL's COM_QUIT or libpq's Terminate, would end
the parent's session), makes its locks again, and starts its threads again
when they are next needed. The pools also compare the process id at each
checkout, so a fork this hook does not see (one made outside Python's
``os.fork``) is caught too. The parent is never touched.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["at_fork", "forget_connection"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: id(owner) -> (a weak reference to it, what to call with it in a child).
_HOOKS: dict[int, tuple[weakref.ref[Any], Callable[[Any], None]]] = {}
#: Re-entrant: a weak reference's callback (`at_fork`'s ``gone``) may run on a thread that holds it.
_LOCK = threading.RLock()
#: Connections a child inherited and may not close (SQLite's, drivers this module does not
#: know): kept here so that no finaliser closes them either. A few per fork at most.
_KEPT: list[Any] = []


def at_fork(owner: T, reset: Callable[[T], None]) -> None:
    """Call ``reset(owner)`` in every child process forked while ``owner`` lives.

    ``reset`` runs in the child right after the fork, on its only thread: it
    must drop what the parent's connections and threads left behind, make
    its locks again and do no I/O (a thread it needs starts on next use).
    """
    key = id(owner)

    def gone(ref: weakref.ref[Any], key: int = key) -> None:
        with _LOCK:
            held = _HOOKS.get(key)
            if held is not None and held[0] is ref:
                del _HOOKS[key]

    ref = weakref.ref(owner, gone)
    with _LOCK:
        _HOOKS[key] = (ref, reset)


def _after_fork_in_child() -> None:
    """Reset every registered owner (see the module's text)."""
    global _LOCK
    _LOCK = threading.RLock()  # another thread may have held it at the fork
    for ref, reset in list(_HOOKS.values()):
        owner = ref()
        if owner is None:
            continue
        try:
            reset(owner)
        except Exception:  # one owner's failure must not leave the others shared
            log.exception("resetting %r after a fork failed", owner)


os.register_at_fork(after_in_child=_after_fork_in_child)


def forget_connection(raw: Any) -> None:
    """Let go of a database connection another process opened, sending nothing on it.

    PyMySQL's connection closes its socket locally (no COM_QUIT); psycopg's
    socket is first pointed at the null device, so that the Terminate
    message libpq sends on close goes nowhere, then closed; any other
    connection (SQLite's, whose close may checkpoint or unlock files the
    parent uses) is kept unused for the life of the process.
    """
    force_close = getattr(raw, "_force_close", None)
    if callable(force_close):  # PyMySQL (and the store's fast connection class)
        force_close()
        return
    pgconn = getattr(raw, "pgconn", None)
    if pgconn is not None:  # psycopg
        try:
            fd = pgconn.socket
        except Exception:  # already closed or broken: there is no socket to protect
            fd = -1
        if fd >= 0:
            null = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(null, fd)  # the child's descriptor now leads nowhere; the parent's is intact
            finally:
                os.close(null)
        try:
            raw.close()
        except Exception:
            _KEPT.append(raw)
        return
    _KEPT.append(raw)
