"""`store.backends.mysql` and `store.backends.postgres` are packages layered one way, import nothing above
`store.backends`, keep their modules small, and answer at their old import paths."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import store.backends

BACKENDS = Path(store.backends.__file__).parent
#: Each package's modules and their layers: a module imports only modules of lower layers of its package.
LAYERS = {
    "mysql": {"admin": 0, "pymysql_fast": 0, "driver": 1, "dialect": 2},
    "postgres": {"admin": 0, "driver": 0, "dialect": 1},
}
#: What a module of these packages may import from outside its own package: the backends' base and what
#: lies below it.
BELOW = frozenset(
    {
        "store.backends",
        "store.backends.inventory",
        "store.backends.tables",
        "store.exceptions",
        "store.green",
        "store.naming",
        "store.specs",
        "store.tls",
    }
)


def _imported(path: Path, package: str) -> set[str]:
    """The ``store.*`` modules ``path`` imports, anywhere in it (a function's body, ``TYPE_CHECKING`` too);
    ``from store.backends.mysql import pymysql_fast`` imports the submodule, not the package's face."""
    modules = {f"{package}.{m}" for m in LAYERS[package.rsplit(".", 1)[1]]}
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            named = {f"{node.module}.{a.name}" for a in node.names}
            if named <= modules:
                out |= named
            else:
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m == "store" or m.startswith("store.")}


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_every_module_has_a_layer(package: str) -> None:
    assert {p.stem for p in (BACKENDS / package).glob("*.py")} - {"__init__"} == set(LAYERS[package])


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_a_module_imports_only_lower_layers_and_nothing_above_the_backends(package: str) -> None:
    dotted = f"store.backends.{package}"
    for name, layer in LAYERS[package].items():
        for module in _imported(BACKENDS / package / f"{name}.py", dotted):
            if module.startswith(f"{dotted}."):
                other = module.rsplit(".", 1)[1]
                assert LAYERS[package][other] < layer, f"{dotted}.{name} imports {module}"
            else:
                assert module in BELOW, f"{dotted}.{name} imports {module}"


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_module_over_800_lines(package: str) -> None:
    for path in (BACKENDS / package).glob("*.py"):
        assert len(path.read_text().splitlines()) <= 800, path.name


#: The old modules, and where each of their names lives now.
MOVED = {
    "store.backends.mysql": {
        "CONNECT_TIMEOUT_S": "store.backends.mysql.driver",
        "READ_TIMEOUT_S": "store.backends.mysql.driver",
        "mysql_connector": "store.backends.mysql.driver",
        "mysql_driver_error": "store.backends.mysql.driver",
        "MySQLBackend": "store.backends.mysql.dialect",
        "ROW_PRIVILEGES": "store.backends.mysql.dialect",
        "TOMBSTONE_ERRNO": "store.backends.mysql.admin",
        "STASH_SUFFIX": "store.backends.mysql.admin",
        "dump_databases": "store.backends.mysql.admin",
        "id_trigger": "store.backends.mysql.admin",
        "load_dump": "store.backends.mysql.admin",
        "leave_tombstones": "store.backends.mysql.admin",
        "parse_tombstone": "store.backends.mysql.admin",
        "table_triggers": "store.backends.mysql.admin",
        "tombstone_statements": "store.backends.mysql.admin",
    },
    "store.backends.mysql_driver": {
        name: "store.backends.mysql.driver"
        for name in ("CONNECT_TIMEOUT_S", "READ_TIMEOUT_S", "mysql_connector", "mysql_driver_error")
    },
    "store.backends.pymysql_fast": {
        name: "store.backends.mysql.pymysql_fast"
        for name in importlib.import_module("store.backends.mysql.pymysql_fast").__all__
    },
    "store.backends.postgres": {
        "PostgresBackend": "store.backends.postgres.dialect",
        "ROW_PRIVILEGES": "store.backends.postgres.dialect",
        "PG_LOCK_BASE": "store.backends.postgres.admin",
        "TOMBSTONE_SQLSTATE": "store.backends.postgres.admin",
        "parse_tombstone": "store.backends.postgres.admin",
        "DOLLAR_CACHE_SIZE": "store.backends.postgres.driver",
        "dollar_params": "store.backends.postgres.driver",
        "postgres_connector": "store.backends.postgres.driver",
    },
}
#: Public names the old modules had outside their ``__all__``: still importable, not star-exported.
NOT_IN_ALL = {"ROW_PRIVILEGES", "DOLLAR_CACHE_SIZE"}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_the_old_import_paths_name_the_same_objects(old: str) -> None:
    module = importlib.import_module(old)
    for name, new in MOVED[old].items():
        assert getattr(module, name) is getattr(importlib.import_module(new), name), (old, name)
        assert (name in module.__all__) is (name not in NOT_IN_ALL), (old, name)
    assert set(module.__all__) <= set(MOVED[old]), old


def test_the_store_imports_each_name_from_its_home() -> None:
    """Inside the store, no module imports the old modules or the packages' faces: each names the
    module a name lives in (the old modules themselves aside)."""
    faces = {"store.backends.mysql", "store.backends.postgres"}
    old = {"store.backends.mysql_driver", "store.backends.pymysql_fast"}
    root = BACKENDS.parent
    for path in root.rglob("*.py"):
        if path.parent == BACKENDS and path.stem in {"mysql_driver", "pymysql_fast"}:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = {a.name for a in node.names}
                if node.module in faces:  # only modules of the package: ``from ...mysql import pymysql_fast``
                    assert names <= set(LAYERS[node.module.rsplit(".", 1)[1]]), (path, node.module, names)
                else:
                    named = {node.module} | {f"{node.module}.{n}" for n in names}
                    assert not named & (old | faces), (path, named & (old | faces))
            elif isinstance(node, ast.Import):
                assert not {a.name for a in node.names} & (old | faces), path


def test_pymysql_fast_logs_under_its_old_name() -> None:
    assert (
        importlib.import_module("store.backends.mysql.pymysql_fast").log.name == "store.backends.pymysql_fast"
    )
