"""The distribution as a user gets it: built from a clone, installed into an empty venv.

The wheel is built from a fresh ``git clone`` of this repository (the
committed HEAD: only tracked files reach it), installed with its runtime
dependencies into a new venv that has nothing else, and run from a folder
outside the repository with ``PYTHONPATH`` cleared, so nothing of the
checkout can stand in for what the wheel lacks. The dependencies come from
the package index through pip (its cache makes a second run fast).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[1]
DIST = "shardstore"


@dataclass(frozen=True)
class Installed:
    """A wheel built from a clone and the empty venv it was installed into."""

    wheel: Path
    venv: Path
    elsewhere: Path  # a folder outside the repository, to run from

    def bin(self, name: str) -> str:
        """The path of ``name`` in the venv's scripts folder."""
        return str(self.venv / "bin" / name)

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``args`` from ``elsewhere`` with none of the checkout on the path; fail on non-zero."""
        proc = subprocess.run(
            args, cwd=self.elsewhere, env=_clean_env(), capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        return proc


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"}}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _check(*args: str | Path, cwd: Path) -> str:
    proc = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """Clone, build the wheel, make an empty venv, install the wheel and its dependencies."""
    tmp = tmp_path_factory.mktemp("packaging")
    head = _check("git", "rev-parse", "HEAD", cwd=ROOT).strip()
    src = tmp / "src"
    _check("git", "clone", "--quiet", ROOT, src, cwd=tmp)
    _check("git", "checkout", "--quiet", head, cwd=src)
    dist = tmp / "dist"
    _check(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", dist, src, cwd=tmp)
    (wheel,) = dist.glob("*.whl")
    venv = tmp / "venv"
    # The standard library's venv: an interpreter and pip, no site-packages of ours.
    _check(sys.executable, "-m", "venv", venv, cwd=tmp)
    _check(venv / "bin" / "python", "-m", "pip", "install", "--quiet", wheel, cwd=tmp)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    return Installed(wheel=wheel, venv=venv, elsewhere=elsewhere)


def test_the_wheel_holds_the_store_package_alone(installed: Installed) -> None:
    """One top-level package, `store`, beside the dist-info named for the distribution."""
    assert installed.wheel.name.startswith(f"{DIST}-")
    with zipfile.ZipFile(installed.wheel) as whl:
        tops = {name.split("/", 1)[0] for name in whl.namelist()}
        entry_points = next(n for n in whl.namelist() if n.endswith(".dist-info/entry_points.txt"))
        scripts = whl.read(entry_points).decode()
    assert tops == {"store", f"{DIST}-0.1.0.dist-info"}
    assert re.search(r"^store = store\.cli:main$", scripts, re.MULTILINE)


def test_store_demo_runs_from_another_folder(installed: Installed) -> None:
    """`store demo` works from the installed wheel alone, on the embedded default."""
    out = installed.run(installed.bin("store"), "demo").stdout
    assert "soft-deleted one pin" in out
    assert (installed.elsewhere / "store-data").is_dir()  # the embedded default's SQLite shards


def test_the_distribution_is_named_and_the_import_is_store(installed: Installed) -> None:
    """pip and importlib.metadata know `shardstore`; the import is `store`, from the venv."""
    show = installed.run(installed.bin("python"), "-m", "pip", "show", DIST).stdout
    assert re.search(rf"^Name: {DIST}$", show, re.MULTILINE)
    probe = (
        "import importlib.metadata as m, importlib.util as u, sys, store\n"
        f"print(m.distribution({DIST!r}).metadata['Name'])\n"
        "print(store.__file__)\n"
        "print(u.find_spec('store_tools') is None)\n"
        "print(any(k.startswith('store.tools') for k in sys.modules))\n"
        "import store.tools.bench, store.tools.demo, store.tools.mix.bench\n"
        "print('tools ok')\n"
    )
    name, path, no_store_tools, tools_loaded, tools_ok = installed.run(
        installed.bin("python"), "-c", probe
    ).stdout.split("\n")[:5]
    assert name == DIST
    assert Path(path).is_relative_to(installed.venv)  # not the checkout's store
    assert no_store_tools == "True"  # no top-level store_tools any more
    assert tools_loaded == "False"  # `import store` leaves the bench and demo code alone
    assert tools_ok == "tools ok"


def test_readme_installs_the_distribution_by_its_name() -> None:
    """Every `pip install` line of the README names the distribution pyproject.toml builds."""
    name = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"]
    assert name == DIST
    readme = (ROOT / "README.md").read_text()
    installs = re.findall(r"pip install ['\"]?([A-Za-z0-9_.-]+)", readme)
    assert f"pip install {DIST}" in readme
    assert installs
    assert set(installs) == {DIST}, installs
