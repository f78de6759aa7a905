"""`store.relations` is layered one way, keeps its modules small, and answers at its old import paths."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import store.relations

PACKAGE = Path(store.relations.__file__).parent
#: Each module's layer: a module imports only modules of lower layers (bulk and reads are siblings).
LAYERS = {
    "inputs": 0,
    "repository": 0,
    "writer": 1,
    "counted_rows": 1,
    "listcache": 2,
    "rows": 2,
    "service": 3,
    "bulk": 4,
    "reads": 4,
}

#: The modules' old places (and the package's face): the package itself never imports them.
OLD_PATHS = (
    "store.relations",
    "store.pairs",
    "store.relation_reads",
    "store.object_pages",
    "store.bulk_pairs",
)


def _imported(path: Path) -> set[str]:
    """The ``store.*`` modules ``path`` imports, anywhere in it (a function's body, ``TYPE_CHECKING`` too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m == "store" or m.startswith("store.")}


def test_every_module_has_a_layer() -> None:
    assert {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"} == set(LAYERS)


def test_a_module_imports_only_lower_layers_and_never_the_old_paths() -> None:
    for name, layer in LAYERS.items():
        for module in _imported(PACKAGE / f"{name}.py"):
            assert module not in OLD_PATHS, f"store.relations.{name} imports {module}"
            if module.startswith("store.relations."):
                other = module.split(".")[2]
                assert LAYERS[other] < layer, f"store.relations.{name} imports {module}"


def test_no_module_over_800_lines() -> None:
    for path in PACKAGE.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 800, path.name


def test_the_old_import_paths_name_the_same_objects() -> None:
    moved = {
        "store.relations": {
            "Page": "repository",
            "Plan": "repository",
            "RelationRepository": "repository",
            "RelationService": "service",
            "REMOVE_CHUNK": "service",
            "MIN_FILL": "listcache",
            "fill_size": "listcache",
        },
        "store.pairs": {
            "ADD": "repository",
            "MOVE": "repository",
            "REMOVE": "repository",
            "Guard": "repository",
            "Side": "repository",
            "Change": "writer",
            "PairWriter": "writer",
            "make_side": "repository",
            "make_guard": "repository",
        },
        "store.relation_reads": {
            "RelationReads": "reads",
            "check_to_ids": "reads",
            "MAX_PARAMS": "reads",
            "id_list": "inputs",
            "pair_list": "inputs",
        },
        "store.object_pages": {"ObjectPages": "reads", "Loader": "reads"},
        "store.bulk_pairs": {"BulkPairs": "bulk", "CHUNK": "bulk"},
    }
    for old, names in moved.items():
        module = importlib.import_module(old)
        for name, new in names.items():
            assert getattr(module, name) is getattr(importlib.import_module(f"store.relations.{new}"), name)
            assert name in module.__all__, (old, name)
