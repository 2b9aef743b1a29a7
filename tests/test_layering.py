"""Imports point down the layer stack, never up, and never in a cycle.

Every module under ``hybridflow/`` is parsed with ``ast`` (nothing is imported), each
``import`` / ``from ... import`` that names a project module becomes an edge, and:

* an edge from a lower layer to a higher one fails (same-layer edges are allowed);
* a cycle among modules fails;
* ``hybridflow.algorithms`` may import only ``hybridflow.utils`` (plus itself) from the project,
  and only torch and the standard library from outside;
* no module imports names from the top-level ``hybridflow`` package (it may become a facade);
* a new top-level module or package must be given a layer in ``LAYERS`` below.

Imports inside functions and ``if TYPE_CHECKING:`` blocks count too: a type-only upward import is
still an upward dependency.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "hybridflow"

# top-level name under hybridflow → layer (ARCHITECTURE.md "Layers")
LAYERS: dict[str, int] = {
    "utils": 0,
    "fields": 0,
    "algorithms": 1,
    "protocol": 1,
    "config": 2,
    "data": 3,
    "controller": 3,
    "models": 4,
    "engine": 4,
    "inference": 4,
    "weight_sync": 5,
    "sandbox": 3,
    "agent": 5,
    "tools": 5,
    "reward": 5,  # controller-side scoring: managers, scorers, scorer processes, judge client
    "workers": 6,
    "trainer": 7,
    "server": 7,
    "tracking": 7,
    "export": 7,  # checkpoint → Hugging Face folder; reads trainer/checkpoint.py's manifests
    "view": 7,  # looking at runs: curves (reads tracking's metrics.jsonl), later the run viewer
    "entrypoints": 8,  # the command-line recipes, one per `hybridflow` subcommand
    "cli": 9,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _all_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


MODULES = _all_modules()


def _resolve(name: str) -> str | None:
    """The longest known project module that ``name`` refers to (a.b.c → a.b if c is an attribute)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    is_package = MODULES[module].name == "__init__.py"
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> list[tuple[str, int, list[str]]]:
    """(imported dotted name, line, names imported from it) for every import in ``module``."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"), filename=str(MODULES[module]))
    found: list[tuple[str, int, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno, []) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((_absolute(module, node), node.lineno, [alias.name for alias in node.names]))
    return found


def _project_edges(module: str) -> list[tuple[str, int]]:
    """Project modules that ``module`` imports; ``from pkg import sub`` resolves to ``pkg.sub``."""
    edges = []
    for target, line, names in _imports(module):
        if target != "hybridflow" and not target.startswith("hybridflow."):
            continue
        submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in MODULES]
        if submodules:
            edges.extend((s, line) for s in submodules)
        if not submodules or len(submodules) < len(names):
            resolved = _resolve(target)
            if resolved is not None:
                edges.append((resolved, line))
    return edges


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


GRAPH = {m: sorted({t for t, _ in _project_edges(m) if t != m}) for m in MODULES}


def test_every_top_level_module_has_a_layer():
    unknown = sorted({_top(m) for m in MODULES if _top(m) and _top(m) not in LAYERS})
    assert not unknown, f"assign a layer in tests/test_layering.py LAYERS to: {unknown}"


def test_no_upward_imports():
    problems = []
    for module in MODULES:
        if not _top(module) or _top(module) not in LAYERS:
            continue
        for target, line in _project_edges(module):
            if _top(target) in LAYERS and LAYERS[_top(target)] > LAYERS[_top(module)]:
                problems.append(
                    f"{module}:{line} (layer {LAYERS[_top(module)]}) imports {target} "
                    f"(layer {LAYERS[_top(target)]})"
                )
    assert not problems, "upward imports:\n" + "\n".join(problems)


def test_nothing_imports_from_the_top_level_package():
    problems = [
        f"{module}:{line} imports from 'hybridflow' itself; import the defining module"
        for module in MODULES
        if module != "hybridflow"
        for target, line in _project_edges(module)
        if target == "hybridflow"
    ]
    assert not problems, "\n".join(problems)


def _find_cycle() -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in GRAPH[node]:
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(GRAPH):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_no_import_cycles():
    cycle = _find_cycle()
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


ALGORITHM_MODULES = [m for m in MODULES if _top(m) == "algorithms"]


@pytest.mark.parametrize("module", ALGORITHM_MODULES)
def test_algorithms_import_only_utils_torch_and_stdlib(module):
    for target, line, _ in _imports(module):
        root = target.split(".")[0]
        if root == "hybridflow":
            allowed = target.startswith(("hybridflow.utils", "hybridflow.algorithms"))
            assert allowed, f"{module}:{line} imports {target}; algorithms may only use hybridflow.utils"
        else:
            assert root == "torch" or root in sys.stdlib_module_names or root == "__future__", (
                f"{module}:{line} imports {target}; algorithms use torch and the standard library only"
            )


def test_the_walker_sees_the_project():
    # guards against a silently empty scan (e.g. a moved package)
    assert "hybridflow.algorithms.advantages.registry" in MODULES
    assert "hybridflow.utils.registry" in GRAPH["hybridflow.algorithms.advantages.registry"]
    assert "hybridflow.algorithms.utils" in GRAPH["hybridflow.algorithms.aggregation"]
