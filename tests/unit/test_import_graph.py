"""The runtime's import graph has no cycle: no module below the facade reaches back up to it.

The graph is read from the source with ``ast``: every import counts — at module level, inside a
function, and under ``if TYPE_CHECKING:`` (a type-only back-pointer is a back-pointer too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import effectflow

SRC = Path(effectflow.__file__).parent.parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports, anywhere in the file."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                if f"{module}.{alias.name}" in known:
                    found.add(f"{module}.{alias.name}")
                elif module in known:
                    found.add(module)
    found.discard(name)
    return found


def _graph(*packages: str) -> dict[str, set[str]]:
    paths = [p for package in packages for p in (SRC / package.replace(".", "/")).rglob("*.py")]
    known = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, known) for p in paths}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the path that closes it, or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        path.append(node)
        for target in sorted(graph.get(node, ())):
            found = visit(target)
            if found is not None:
                return found
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        found = visit(start)
        if found is not None:
            return found
    return None


def test_the_runtime_import_graph_has_no_cycle() -> None:
    """No chain of imports inside ``effectflow.runtime`` leads back to where it started."""
    graph = _graph("effectflow.runtime")
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_scan_sees_type_only_and_function_level_imports() -> None:
    """The scan counts a ``TYPE_CHECKING`` import (the worker's of the facade) and finds a cycle
    where there is one."""
    graph = _graph("effectflow.runtime")
    assert "effectflow.runtime.runtime" in graph["effectflow.runtime.worker"]
    assert "effectflow.runtime.executor" in graph["effectflow.runtime.runtime"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_only_the_facade_and_its_clients_import_the_runtime() -> None:
    """Below the facade nothing imports ``runtime.runtime``: the step machine, the settling paths
    and the ending of a run get a ``port.Port``, not the ``Runtime`` (the worker drives runs
    through the facade, from above it)."""
    graph = _graph("effectflow.runtime")
    importers = {m for m, targets in graph.items() if "effectflow.runtime.runtime" in targets}
    assert importers == {"effectflow.runtime.worker"}


def test_policies_are_pure() -> None:
    """The decision policies import nothing of the runtime or the ledger's backends."""
    forbidden = ("effectflow.runtime", "effectflow.ledger.sqlite", "effectflow.ledger.postgres")
    for path in (SRC / "effectflow" / "policies").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert not name.startswith(forbidden), f"{path.name} imports {name}"
