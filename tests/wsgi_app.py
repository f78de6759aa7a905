"""A small WSGI app over the store, for the gunicorn tests (`tests.test_deploy`).

At import (before gunicorn forks its workers, under ``--preload``) it opens
the store from the config file named by ``STORE_TEST_CONFIG`` and reads
everything `tests.forkload` wrote (the file named by ``STORE_TEST_KNOWN``)
once, so the workers inherit a warm store: pooled connections and cache
sockets opened by the master. Paths: see `Known.answer`; ``/whoami`` answers
the worker's process id and the ``CONNECTION_ID()`` of one of its pooled
connections.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from store import Store, StoreConfig
from tests.forkload import Known

KNOWN = Known.load(Path(os.environ["STORE_TEST_KNOWN"]))
STORE = Store(StoreConfig.from_file(os.environ["STORE_TEST_CONFIG"]))
KNOWN.warm(STORE)
KNOWN.warm(STORE)


def _whoami() -> dict[str, int]:
    pool = next(iter(STORE.admin_context().engines.pools().values()))
    conn, born = pool.checkout()
    try:
        cur = conn.cursor()
        cur.execute("SELECT CONNECTION_ID()")
        cid = int(cur.fetchone()[0])
    finally:
        pool.checkin(conn, born)
    return {"pid": os.getpid(), "connection": cid}


def application(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """Answer one request with JSON (500 and the error's text if the store raised)."""
    path = environ.get("PATH_INFO", "/")
    try:
        answer: Any = _whoami() if path == "/whoami" else KNOWN.answer(STORE, path)
        body, status = json.dumps(answer).encode(), "200 OK"
    except Exception as exc:
        body, status = f"{type(exc).__name__}: {exc}".encode(), "500 Internal Server Error"
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
    return [body]
