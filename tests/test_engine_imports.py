"""The engine package stands alone, and the whole package reads as layers whose imports point one way.

Each module of ``storyforge/engine`` is imported in a fresh interpreter (without running
``storyforge/__init__.py``) and must load nothing from storyforge outside the engine; read
with ``ast``, every import in the engine (top level, ``TYPE_CHECKING`` blocks and inside
functions alike) stays inside the engine, and the graph of those imports has no cycle.

Then the whole of ``storyforge``, read the same way: every part (top-level module or
subpackage) sits in one of :data:`LAYERS`, no module imports from a layer above its own, the
module graph has no cycle, and no ``_private`` name is imported from another part.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parent.parent / "storyforge" / "engine"
MODULES = sorted(p.stem for p in ENGINE.glob("*.py") if p.stem != "__init__")


def _module_name(stem: str) -> str:
    return "storyforge.engine" if stem == "__init__" else f"storyforge.engine.{stem}"


def _imports(path: Path) -> set[str]:
    """Every storyforge module ``path`` imports, wherever the import statement sits."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("storyforge"))
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: relative import"
            base = node.module or ""
            if not base.startswith("storyforge"):
                continue
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                # `from storyforge.engine import nodes` names a module; anything else is the package
                found.add(
                    candidate
                    if (ENGINE / f"{alias.name}.py").exists() and base == "storyforge.engine"
                    else base
                )
    return found


def _graph() -> dict[str, set[str]]:
    return {_module_name(p.stem): _imports(p) for p in sorted(ENGINE.glob("*.py"))}


def test_engine_imports_nothing_from_the_rest_of_storyforge() -> None:
    """No engine module names a storyforge module outside storyforge.engine."""
    outside = {
        module: sorted(
            i for i in imports if not (i == "storyforge.engine" or i.startswith("storyforge.engine."))
        )
        for module, imports in _graph().items()
    }
    assert {m: i for m, i in outside.items() if i} == {}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_engine_import_graph_has_no_cycles() -> None:
    """Inside the engine, imports point one way (down the pipeline); no module reaches back up."""
    graph = _graph()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
    assert len(graph) == len(MODULES) + 1


def test_cycle_finder_finds_a_cycle() -> None:
    """The checker itself reports a cycle when there is one."""
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


_PROBE = """
import importlib, json, sys, types
package = types.ModuleType("storyforge")
package.__path__ = [sys.argv[2]]
sys.modules["storyforge"] = package
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(m for m in sys.modules if m.startswith("storyforge"))))
"""


@pytest.mark.parametrize("stem", MODULES)
def test_module_imports_alone_in_a_fresh_interpreter(stem: str) -> None:
    """Importing one engine module first, in a new process, works and loads only engine modules."""
    name = _module_name(stem)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, name, str(ENGINE.parent)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert name in loaded
    assert [m for m in loaded if m != "storyforge" and not m.startswith("storyforge.engine")] == []


# --- the whole package ------------------------------------------------------------------------

PACKAGE = ENGINE.parent

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"engine"}),
    frozenset(
        {
            "__init__",
            "errors",
            "extras",
            "atomic",
            "ids",
            "jsontext",
            "positions",
            "progress",
            "redaction",
            "run_lock",
            "runfiles",
            "sealed",
            "snapshot",
            "tables",
        }
    ),
    frozenset({"quality"}),
    frozenset({"tasks"}),
    frozenset({"config"}),
    frozenset({"providers", "store", "template_files", "drift"}),
    frozenset({"jobs"}),
    frozenset({"executors"}),
    frozenset({"pipeline", "api", "tinystories", "card", "cli", "studio", "sweep", "sweep_report"}),
)
"""storyforge's parts, lowest first (docs/architecture.md draws them): a module may import
from its own layer's parts or from any layer below, never from one above."""


def _package_module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _part(module: str) -> str:
    """``storyforge.jobs.tinystories`` -> ``jobs``; ``storyforge`` itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _package_imports(path: Path) -> tuple[set[str], list[tuple[str, str]]]:
    """The storyforge modules ``path`` imports (anywhere in it), and the names it imports."""
    found: set[str] = set()
    names: list[tuple[str, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "storyforge")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "storyforge":
            assert node.level == 0, f"{path}: relative import"
            base = node.module or ""
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if _is_module(candidate) else base)
                names.append((base, alias.name))
    return found, names


def _package_graph() -> dict[str, set[str]]:
    return {
        _package_module(p): _package_imports(p)[0] - {_package_module(p)}
        for p in sorted(PACKAGE.rglob("*.py"))
    }


def _layer(part: str) -> int:
    for index, members in enumerate(LAYERS):
        if part in members:
            return index
    raise AssertionError(f"{part!r} is in no layer: place it in LAYERS and docs/architecture.md")


def _against_the_layers(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if _layer(_part(target)) > _layer(_part(module))
    )


def test_every_part_of_the_package_has_a_layer() -> None:
    """A new top-level module or subpackage must be placed in a layer before it can land."""
    parts = {_part(module) for module in _package_graph()}
    assert sorted(part for part in parts if not any(part in layer for layer in LAYERS)) == []
    assert parts == set().union(*LAYERS), "LAYERS names a part that does not exist"


def test_the_package_import_graph_has_no_cycles() -> None:
    """Across the whole package, module imports (top level, TYPE_CHECKING and inside functions
    alike) point one way."""
    graph = _package_graph()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_no_import_against_the_layer_order() -> None:
    """engine <- base modules <- quality <- tasks <- config <- providers, store, drift <- jobs <-
    executors <- pipeline, cli, studio, sweeps: nothing imports from a layer above its own."""
    assert _against_the_layers(_package_graph()) == []


def test_no_private_name_is_imported_across_parts() -> None:
    """``from storyforge.x import _name`` only inside the part that owns ``_name``."""
    crossing = sorted(
        f"{_package_module(path)} imports {base}.{name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for base, name in _package_imports(path)[1]
        if name.startswith("_") and not name.startswith("__") and _part(base) != _part(_package_module(path))
    )
    assert crossing == []


def _checkout_imports(source: str) -> list[str]:
    """The modules of the checkout but not of the package (``tests``, ``bench``) that
    ``source`` imports, wherever the import statement sits."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        found += [name for name in names if name.split(".")[0] in ("tests", "bench")]
    return found


def test_the_package_imports_nothing_from_tests_or_bench() -> None:
    """``tests/`` (with its support package: the fake server, the test set-up) and ``bench/``
    are not installed, so no module of the package may import from them."""
    imports = {
        _package_module(path): _checkout_imports(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    assert {module: found for module, found in imports.items() if found} == {}


def test_the_checkout_import_finder_sees_test_support() -> None:
    """The finder itself: each spelling of an import from the tests' support is found."""
    source = (
        "import tests.support.fake_server\n"
        "from tests.support import setup\n"
        "def f():\n    from bench.render_bench import main\n"
        "import testsuite, benchmarks\n"
    )
    assert _checkout_imports(source) == ["tests.support.fake_server", "tests.support", "bench.render_bench"]


def test_the_layer_checker_sees_an_upward_import() -> None:
    """The checker itself: a task importing a job, or the engine importing config, is reported."""
    graph = {
        "storyforge.tasks.x": {"storyforge.jobs.y"},
        "storyforge.engine.a": {"storyforge.config"},
        "storyforge.jobs.y": {"storyforge.tasks.x", "storyforge.errors"},
        "storyforge.cli": {"storyforge.studio.api"},
    }
    assert _against_the_layers(graph) == [
        "storyforge.engine.a -> storyforge.config",
        "storyforge.tasks.x -> storyforge.jobs.y",
    ]
    assert _part("storyforge") == "__init__" and _part("storyforge.jobs.tinystories") == "jobs"
