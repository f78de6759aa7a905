"""The fault suite's pytest wiring: owned by tests/faults.

- registers the ``faults`` marker (the project runs with --strict-markers) and
  puts it on every test under tests/faults/, so ``-m faults`` and
  ``-m "not faults"`` select or skip the suite;
- the session fixture ``fault_report``: scenarios ``add()`` a ScenarioResult;
- after the session, the results are printed as a Markdown table in the
  terminal summary and, if STORE_FAULT_REPORT names a file, written there as
  JSON (under pytest-xdist, each worker hands its rows to the controller,
  which prints and writes them all).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.faults.history import ScenarioResult, format_table

FAULTS_DIR = Path(__file__).resolve().parent
REPORT_ENV = "STORE_FAULT_REPORT"


class FaultReport:
    """The session's scenario results, in the order they were added (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._results: list[ScenarioResult] = []

    def add(self, result: ScenarioResult) -> None:
        """Record one scenario's row."""
        if not isinstance(result, ScenarioResult):
            raise TypeError(f"fault_report.add() takes a ScenarioResult, not {type(result).__name__}")
        with self._lock:
            self._results.append(result)

    @property
    def results(self) -> list[ScenarioResult]:
        """A copy of the results so far."""
        with self._lock:
            return list(self._results)

    def table(self) -> str:
        """The results as a Markdown table."""
        return format_table(self.results)

    def to_json(self) -> str:
        """The results as a JSON document: {"results": [row, ...]}."""
        return json.dumps({"results": [r.as_dict() for r in self.results]}, indent=2)


REPORT_KEY = pytest.StashKey[FaultReport]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "faults: fault-injection tests under tests/faults (proxy, history, report)"
    )
    config.stash[REPORT_KEY] = FaultReport()


# First, so that -m (deselection, a later hook of the same name) sees the marker.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Conftest hooks see the whole session's items, not only this folder's.
    for item in items:
        if item.path.resolve().is_relative_to(FAULTS_DIR):
            item.add_marker(pytest.mark.faults)


@pytest.fixture(scope="session")
def fault_report(pytestconfig: pytest.Config) -> FaultReport:
    """Where scenarios record their ScenarioResult: ``fault_report.add(result)``."""
    return pytestconfig.stash[REPORT_KEY]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker: its rows go to the controller's report
        workeroutput["fault_results"] = session.config.stash[REPORT_KEY].to_json()
        return
    path = os.environ.get(REPORT_ENV)
    if path:
        Path(path).write_text(session.config.stash[REPORT_KEY].to_json() + "\n")


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: called on the controller as a worker ends
def pytest_testnodedown(node: Any, error: object) -> None:
    text = getattr(node, "workeroutput", {}).get("fault_results")
    if text:
        report = node.config.stash[REPORT_KEY]
        for row in json.loads(text)["results"]:
            row.pop("passed", None)
            report.add(ScenarioResult(**row))


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    report = config.stash[REPORT_KEY]
    if report.results:
        terminalreporter.write_sep("=", "fault scenarios")
        terminalreporter.write_line(report.table())
