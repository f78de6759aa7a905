"""gunicorn with ``--preload`` over a warm store: every answer right, each worker on connections of its own.

The app (`tests.wsgi_app`) opens and warms the store at import, in
gunicorn's master, before the workers are forked: the case where a pool
that does not notice the fork hands the master's sockets to every worker.
Clients on a pool of threads ask for known pins and pages over loopback
and check every answer (`tests.forkload`).
"""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from store import Store, StoreConfig
from tests.conftest import cached_mariadb_config, mariadb_config
from tests.forkload import Known, seed
from tests.servers import free_port, wait_port

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parent.parent
#: Requests per run: four runs (sync and gthread workers, caches off and on) make 20,000.
REQUESTS = 5000
CLIENT_THREADS = 16


@pytest.fixture(scope="module")
def known_file(mariadb_ready: StoreConfig, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Boards and pins written once for the module, and the file that lists them for the app."""
    with Store(StoreConfig.from_dict(mariadb_config())) as store:
        known = seed(store, boards=10, pins_per_board=24)
    path = tmp_path_factory.mktemp("deploy") / "known.json"
    known.save(path)
    return path


@pytest.fixture
def gunicorn_app(request: pytest.FixtureRequest, known_file: Path, tmp_path: Path) -> Iterator[int]:
    """gunicorn --preload serving `tests.wsgi_app` on a free port: (worker class, caches) from the
    test's parameters; the port."""
    worker_class, caches = request.param
    if caches:
        raw = cached_mariadb_config(
            request.getfixturevalue("memcached_pair"), request.getfixturevalue("redis_ready")
        )
        raw["cache"]["follow"] = True
    else:
        raw = mariadb_config()
    raw["query_timeout_s"] = 5  # a worker reading from a socket another one emptied fails, not hangs
    config_file = tmp_path / "store.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    port = free_port()
    workers = ["-w", "4", "-k", worker_class] + (["--threads", "4"] if worker_class == "gthread" else [])
    env = dict(
        os.environ, STORE_TEST_CONFIG=str(config_file), STORE_TEST_KNOWN=str(known_file), PYTHONPATH=str(ROOT)
    )
    env["HOME"] = str(tmp_path)  # recent gunicorns keep a control socket under HOME: one per instance
    log = (tmp_path / "gunicorn.log").open("w")
    argv = [
        sys.executable,
        "-m",
        "gunicorn",
        "--preload",
        *workers,
        "-b",
        f"127.0.0.1:{port}",
        "--timeout",
        "30",
    ]
    proc = subprocess.Popen(
        [*argv, "tests.wsgi_app:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        if not wait_port(port, 30):
            pytest.fail(f"gunicorn did not start: {(tmp_path / 'gunicorn.log').read_text()[-2000:]}")
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def fetch(port: int, path: str) -> tuple[int, Any]:
    """GET ``path``: (status, the JSON answer or the error's text)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        body = reply.read()
    finally:
        conn.close()
    return reply.status, (json.loads(body) if reply.status == 200 else body.decode(errors="replace"))


def hammer(port: int, known: Known, n: int) -> tuple[int, int, list[str]]:
    """``n`` checked requests from `CLIENT_THREADS` threads: (wrong answers, errors, a few of them)."""

    def one(i: int) -> str | None:
        path, want = known.request(random.Random(i))
        try:
            status, got = fetch(port, path)
        except Exception as exc:
            return f"error: {path}: {type(exc).__name__}: {exc}"
        if status != 200:
            return f"error: {path}: {status} {got}"[:300]
        return None if got == want else f"wrong: {path}"

    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        bad = [b for b in pool.map(one, range(n)) if b is not None]
    errors = sum(1 for b in bad if b.startswith("error"))
    return len(bad) - errors, errors, bad[:5]


RUNS = [("sync", False), ("sync", True), ("gthread", False), ("gthread", True)]


@pytest.mark.parametrize(
    "gunicorn_app", RUNS, ids=[f"{w}-{'cached' if c else 'uncached'}" for w, c in RUNS], indirect=True
)
def test_gunicorn_preload_workers_answer_right(gunicorn_app: int, known_file: Path) -> None:
    known = Known.load(known_file)
    wrong, errors, seen = hammer(gunicorn_app, known, REQUESTS)
    assert (wrong, errors) == (0, 0), (
        f"{wrong} wrong answers and {errors} errors in {REQUESTS} requests: {seen}"
    )

    # Each worker on connections of its own: no connection id answers for two processes.
    owners: dict[int, set[int]] = {}
    with ThreadPoolExecutor(CLIENT_THREADS) as pool:
        for status, got in pool.map(lambda _i: fetch(gunicorn_app, "/whoami"), range(200)):
            assert status == 200, got
            owners.setdefault(got["connection"], set()).add(got["pid"])
    shared = {c: p for c, p in owners.items() if len(p) > 1}
    assert not shared, f"connections used by more than one worker: {shared}"
    assert len({p for ps in owners.values() for p in ps}) > 1, "the requests reached several workers"
