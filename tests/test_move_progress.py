"""`store move`'s progress: a bar per phase on a terminal, the plain lines elsewhere.

The renderer (`progress_line`) is checked on figures of the shape
`MoveProgress` writes, then `store move` runs under a pseudo-terminal
against two MariaDB servers of the test's own and must draw the copy's,
the catch-up's and the fence's bars between its usual lines.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from store import Store, StoreConfig
from store.admin import init_shards
from store.admin.move import TerminalProgress, progress_line
from tests.conftest import base_config
from tests.servers import binlog_pair


def test_each_phase_has_its_bar() -> None:
    load = {"step": "load", "rows_copied": 50, "rows_total": 100, "tables_copied": 3, "tables_total": 9,
            "disk_copied": 1_000_000, "disk_total": 2_000_000}  # fmt: skip
    assert progress_line(load, width=10) == "copy     [#####-----]  50%  50/100 rows  3/9 tables  1.0/2.0 MB"
    assert progress_line({**load, "step": "loaded"}, width=10) == (
        "copy     [##########] 100%  100/100 rows  9/9 tables  2.0/2.0 MB"
    )
    # InnoDB's estimate on the target can pass the source's: the bar stops at full.
    assert progress_line({**load, "rows_copied": 130}, width=4).startswith(
        "copy     [####] 100%  100/100 rows"
    )
    lag = {"step": "catch_up", "lag_s": 1.0, "lag_max_s": 5.0}
    assert progress_line(lag, width=10) == "catch up [########--] lag 1 s (at most 5 s)"
    assert progress_line({"step": "catch_up", "lag_s": None}, width=4) == "catch up [----] lag -"
    fence = {"step": "verify", "fence_started": 100.0, "fence_ended": None}
    assert progress_line(fence, width=10, now=100.3) == "fence    [###-------] writers held 0.30 s (verify)"
    assert progress_line({**fence, "fence_ended": 100.7}, width=10, now=200.0) == (
        "fence    [#######---] writers held 0.70 s (verify)"
    )
    assert progress_line({"step": "done"}) == ""


class _Screen:
    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass


def test_the_terminal_bar_stays_under_the_lines_said() -> None:
    screen = _Screen()
    bar = TerminalProgress(screen, every_s=0)
    bar.say("copy: dumping 8 shard database(s) from A")
    bar.update({"step": "load", "rows_copied": 1, "rows_total": 2, "tables_total": 2})
    bar.say("catch up: B replicating from A")
    bar.update({"step": "catch_up", "lag_s": 0.0, "lag_max_s": 0.0})
    bar.close()
    shown = screen.text.split("\n")
    assert shown[0] == "copy: dumping 8 shard database(s) from A"
    assert shown[1].startswith("\rcopy     [")  # drawn in place ...
    assert shown[1].endswith("\rcatch up: B replicating from A")  # ... and cleared for the line said
    assert "\rcatch up [" in shown[2]
    assert shown[2].endswith("\r")  # taken away at the end


def _read_all(fd: int, proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    out = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _w, _x = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out


@pytest.mark.moves
def test_store_move_on_a_terminal_draws_a_bar_per_phase(tmp_path: Path) -> None:
    with binlog_pair() as (source, target):
        raw = base_config(
            shards=16,
            hosts={"A": source.url, "B": target.url},
            map=[{"range": [0, 15], "master": "A"}],
            map_source={"file": str(tmp_path / "map.yaml"), "poll_s": 0.2},
        )
        config_file = tmp_path / "store.yaml"
        config_file.write_text(yaml.safe_dump(raw))
        config = StoreConfig.from_dict(raw)
        init_shards(config)
        with Store(config) as store:
            for i in range(400):
                store.create("pin", {"n": i}, shard=i % 16)
        main, child = pty.openpty()
        proc = subprocess.Popen(
            [sys.executable, "-m", "store.cli", "move", "--shards", "8-15", "--to", "B", "--yes",
             "--config", str(config_file), "--journal", str(tmp_path / "move.json")],
            stdin=subprocess.DEVNULL,
            stdout=child,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        os.close(child)
        try:
            text = _read_all(main, proc, 120).decode(errors="replace")
            assert proc.wait(30) == 0, text + proc.stderr.read().decode() if proc.stderr else text
        finally:
            os.close(main)
            if proc.poll() is None:
                proc.kill()
            if proc.stderr is not None:
                proc.stderr.close()
    assert "\r" in text
    assert re.search(
        r"\rcopy     \[[#-]{24}\] +\d+%  [\d,]+/[\d,]+ rows  \d+/72 tables  [\d.]+/[\d.]+ MB", text
    ), text
    assert re.search(r"\rcatch up \[[#-]{24}\] lag ", text), text
    assert re.search(r"\rfence    \[[#-]{24}\] writers held \d+\.\d\d s \((fence|verify|switch)\)", text), (
        text
    )
    # The plain lines are all there, each on a line of its own after the bar was cleared.
    said = [line.split("\r")[-1] for line in text.replace("\r\n", "\n").split("\n")]
    for prefix in ("copy: dumping", "catch up:", "fence: 72 tables locked", "verify:", "switch:", "done:"):
        assert [s for s in said if s.startswith(prefix)], (prefix, said)


def test_not_on_a_terminal_the_move_says_plain_lines(tmp_path: Path) -> None:
    from store.cli import _move_output

    with _move_output() as (say, watch):  # pytest's captured stdout is no terminal
        assert watch is None
        say("copy: plain")
