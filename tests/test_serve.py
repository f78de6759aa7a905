"""The operator page in headless Chromium, against real MariaDB servers during a real `store move`.

Two private MariaDB servers with binlogs; shards 8-15 (with enough rows that
the copy takes a few seconds) move from A to B in a subprocess while
`store serve` runs in another and Chromium watches the page: the map bars and
both hosts are there, the move's progress bar advances, then the map's
version changes and B's bar appears. A screenshot is saved under
``test-artifacts/`` (ignored by git).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest
import yaml

from store import StoreConfig
from store.admin import init_shards
from tests.conftest import base_config
from tests.servers import MariaDBServer, binlog_pair, wait_port

pytestmark = [pytest.mark.browser, pytest.mark.moves]

SHARDS = 16
ROWS_PER_SHARD = 30_000
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def require_chromium() -> None:
    """Skip (or, with STORE_REQUIRE_SERVICES=1, fail) unless Chromium, its driver and Selenium are here."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e '.[dev]')")
    if missing:
        msg = f"the browser test needs {', '.join(missing)}: run scripts/browser.sh"
        if os.environ.get("STORE_REQUIRE_SERVICES") == "1":
            pytest.fail(msg)
        pytest.skip(msg)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def pair() -> Iterator[tuple[MariaDBServer, MariaDBServer]]:
    require_chromium()
    with binlog_pair() as servers:
        yield servers


@pytest.fixture
def browser() -> Iterator[Any]:
    require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def fill(server: MariaDBServer, shards: range) -> None:
    """ROWS_PER_SHARD pins in each shard, made by the server itself (fast)."""
    conn = pymysql.connect(host="127.0.0.1", port=server.port, user="root", autocommit=True)
    try:
        with conn.cursor() as cur:
            for s in shards:
                cur.execute(
                    f'INSERT INTO db{s:05d}.pins (data) SELECT CONCAT(\'{{"n": \', seq, \', "pad": "\', '
                    f"REPEAT('x', 160), '\"}}') FROM db{s:05d}.seq_1_to_{ROWS_PER_SHARD}"
                )
    finally:
        conn.close()


def read(driver: Any) -> dict[str, Any]:
    """What a person sees: the map version, its bars, the hosts, the move's progress (None if none)."""
    from selenium.webdriver.common.by import By

    for _ in range(5):  # the panels are swapped every second: read again if they were replaced mid-read
        try:
            bars = [(b.get_attribute("data-host"), b.get_attribute("data-range"), b.is_displayed())
                    for b in driver.find_elements(By.CSS_SELECTOR, "#map .bar")]  # fmt: skip
            hosts = [h.get_attribute("data-host") for h in driver.find_elements(By.CSS_SELECTOR, "tr.host")]
            version = int(driver.find_element(By.ID, "map-version").text)
            found = driver.find_elements(By.ID, "move-progress")
            progress = float(found[0].get_attribute("data-progress")) if found else None
            return {"version": version, "bars": bars, "hosts": hosts, "progress": progress}
        except Exception:
            time.sleep(0.1)
    raise AssertionError("the page could not be read")


def test_page_follows_a_move(pair: tuple[MariaDBServer, MariaDBServer], browser: Any, tmp_path: Path) -> None:
    source, target = pair
    raw = base_config(
        shards=SHARDS,
        hosts={"A": source.url, "B": target.url},
        map=[{"range": [0, SHARDS - 1], "master": "A"}],
        map_source={"file": str(tmp_path / "map.yaml"), "poll_s": 0.2},
    )
    config_file = tmp_path / "store.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    init_shards(StoreConfig.from_dict(raw))
    fill(source, range(8, SHARDS))
    journal = tmp_path / "store-move.json"
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    serve_log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    server = subprocess.Popen(
        [sys.executable, "-m", "store.cli", "serve", "--config", str(config_file), "--port", str(port),
         "--journal", str(journal)],
        stdout=serve_log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    mover: subprocess.Popen[bytes] | None = None
    try:
        assert wait_port(port, 30), (tmp_path / "serve.log").read_text()
        browser.get(f"http://127.0.0.1:{port}/")
        before = read(browser)
        assert before["bars"] == [("A", f"0-{SHARDS - 1}", True)]
        assert before["hosts"] == ["A", "B"]
        assert before["progress"] is None  # no move journaled yet

        mover = subprocess.Popen(
            [sys.executable, "-m", "store.cli", "--log-json", "move", "--config", str(config_file),
             "--shards", f"8-{SHARDS - 1}", "--to", "B", "--yes", "--journal", str(journal)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        seen: list[float] = []
        after = before
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            after = read(browser)
            if after["progress"] is not None and (not seen or seen[-1] != after["progress"]):
                seen.append(after["progress"])
            if after["version"] != before["version"]:
                break
            time.sleep(0.2)
        ARTIFACTS.mkdir(exist_ok=True)
        browser.save_screenshot(str(ARTIFACTS / "serve-move.png"))
        out, _ = mover.communicate(timeout=60)
        assert mover.returncode == 0, out.decode()
        assert after["version"] == before["version"] + 1, (after, seen)
        moving = [p for p in seen if 0 < p < 100]
        assert len(moving) >= 2, seen  # the bar was seen part way, at least twice
        assert seen == sorted(seen), seen  # and it only went forward
        # The page keeps refreshing: B's bar appears, and the move shows as done.
        for _ in range(30):
            final = read(browser)
            if final["progress"] == 100.0 and len(final["bars"]) == 2:
                break
            time.sleep(0.2)
        assert final["bars"] == [("A", "0-7", True), ("B", f"8-{SHARDS - 1}", True)], final
        assert final["hosts"] == ["A", "B"]
        assert final["progress"] == 100.0
        browser.save_screenshot(str(ARTIFACTS / "serve-done.png"))
        logged = [line for line in out.decode().splitlines() if line.startswith("{")]
        assert any('"logger": "store.admin.move"' in line and '"ts"' in line for line in logged), out
    finally:
        if mover is not None and mover.poll() is None:
            mover.kill()
            mover.wait()
        server.terminate()
        server.wait(10)
        serve_log.close()
