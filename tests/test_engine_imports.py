"""The engine package stands alone and its imports point one way.

Each module of ``storyforge/engine`` is imported in a fresh interpreter (without running
``storyforge/__init__.py``) and must load nothing from storyforge outside the engine; read
with ``ast``, every import in the engine (top level, ``TYPE_CHECKING`` blocks and inside
functions alike) stays inside the engine, and the graph of those imports has no cycle.
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
