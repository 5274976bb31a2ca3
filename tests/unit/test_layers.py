"""The harness in layers: every import of fashion_mnist_dp/ points down a floor, with no cycle, counting imports inside
functions and the package faces (``__init__.py``) an import loads on the way; docs/architecture.md draws the floors
as they are ("The harness in layers")."""

import ast
import graphlib
import re
from typing import Dict, Set, Tuple

import pytest

from tests.conftest import REPO

PACKAGES = ("fashion_mnist_dp", "callbacks", "datamodules", "lightning_modules")  # the project's import roots


def project_modules() -> Dict[str, str]:
    """Dotted name (a package face as ``pkg.__init__``) -> source, for every module of the project's packages."""
    return {".".join(path.relative_to(REPO).with_suffix("").parts): path.read_text()
            for package in PACKAGES for path in (REPO / package).rglob("*.py")}


def loaded(name: str, modules: Dict[str, str]) -> list:
    """The project's modules ``import name`` loads: each package face on the way, then the module itself."""
    parts, chain = name.split("."), []
    for i in range(1, len(parts) + 1):
        dotted = ".".join(parts[:i])
        chain += [m for m in (f"{dotted}.__init__", dotted) if m in modules][:1]
    return chain


def import_edges(modules: Dict[str, str]) -> Set[Tuple[str, str]]:
    """(importer, imported) for every absolute import anywhere in a module, function-local ones included; a face of
    the importer's own package is already loading when it runs, so it is not an edge."""
    edges = set()
    for module, source in modules.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in (n for n in names if n.split(".")[0] in PACKAGES):
                for target in loaded(name, modules):
                    package = target.removesuffix(".__init__")
                    own_face = target.endswith(".__init__") and module.startswith(f"{package}.")
                    if target != module and not own_face:
                        edges.add((module, target))
    return edges


def floors(edges: Set[Tuple[str, str]], modules) -> Dict[str, int]:
    """Each fashion_mnist_dp module's floor: 1 for a module that imports none of the package, else one above the
    highest it imports (graphlib raises CycleError, naming the circle, if there is one)."""
    order = graphlib.TopologicalSorter({m: {t for s, t in edges if s == m} for m in modules}).static_order()
    floor: Dict[str, int] = {}
    for module in (m for m in order if m.startswith("fashion_mnist_dp.")):
        floor[module] = 1 + max((floor[t] for s, t in edges if s == module and t in floor), default=0)
    return floor


def drawn_floors() -> Dict[str, int]:
    """docs/architecture.md's drawing: ``floor N  file file ...`` lines, paths relative to fashion_mnist_dp/."""
    section = (REPO / "docs" / "architecture.md").read_text().split("## The harness in layers", 1)[1].split("\n## ")[0]
    drawn = {}
    for number, files in re.findall(r"^floor +(\d+) +(.+)$", section, flags=re.MULTILINE):
        for path in files.split():
            drawn["fashion_mnist_dp." + path.removesuffix(".py").replace("/", ".")] = int(number)
    return drawn


def test_no_import_cycle_in_the_project_even_through_functions_and_package_faces():
    modules = project_modules()
    floors(import_edges(modules), modules)  # raises CycleError naming the circle


def test_the_architecture_page_draws_the_floors_the_imports_make():
    modules = project_modules()
    assert drawn_floors() == floors(import_edges(modules), modules)


def test_a_function_local_import_back_up_is_a_cycle():
    """The check sees what the old fsdp.py did: a function-local import of the runtime, whose face imports it."""
    modules = project_modules()
    modules["fashion_mnist_dp.strategies.fsdp"] += "\n\ndef late():\n    from fashion_mnist_dp.runtime import compat\n"
    with pytest.raises(graphlib.CycleError):
        floors(import_edges(modules), modules)


# The project's packages in one direction (docs/architecture.md, "Where things live"): the model and the data at the
# bottom, importing none of the others; the callbacks above them; the harness that assembles a run on top.
PACKAGE_FLOORS = {"lightning_modules": 1, "datamodules": 1, "callbacks": 2, "fashion_mnist_dp": 3}


def test_the_packages_import_in_one_direction_only_down():
    modules = project_modules()
    up = sorted({f"{s} -> {t}" for s, t in import_edges(modules)
                 if s.split(".")[0] != t.split(".")[0]
                 and PACKAGE_FLOORS[s.split(".")[0]] <= PACKAGE_FLOORS[t.split(".")[0]]})
    assert up == []


def test_the_architecture_page_draws_the_packages_floors():
    page = (REPO / "docs" / "architecture.md").read_text()
    drawn = {name: int(floor) for floor, names in re.findall(r"^package floor (\d) +(.+)$", page, flags=re.MULTILINE)
             for name in names.split()}
    assert drawn == PACKAGE_FLOORS
