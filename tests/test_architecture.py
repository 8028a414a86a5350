"""The layout's promises: no import cycle among the modules of ``eventstore`` and
``workflow``, no module over 500 lines, and ``eventstore`` never importing ``workflow``.

Imports are read from the source (``ast``), counting those under ``TYPE_CHECKING`` and those
inside functions: a cycle closed only by a deferred import is still a cycle of the design.
While the engine floor is being split (issue 13), the modules still too long and the edges
still cyclic are listed below as of the last merge of main; each test fails both when a new
violation appears and when a listed one is gone, so the lists only shrink.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eventstore", "workflow")
MAX_LINES = 500

# Modules over MAX_LINES as of the last merge of main (remove a line once its module is split).
STILL_TOO_LONG: frozenset[str] = frozenset()

# Import edges inside a cycle as of the last merge of main, "importer -> imported" (remove
# one once the import is gone or no longer closes a cycle).
STILL_CYCLIC: frozenset[str] = frozenset()


def _modules() -> dict[str, Path]:
    """Every module of the packages by its dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that the module ``name`` imports, wherever the import is.

    ``from . import x`` imports the submodule ``x`` when there is one (not the package);
    ``from .pkg import name`` imports ``pkg`` itself when ``name`` is not a submodule of it.
    """
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            subs = [f"{source}.{alias.name}" for alias in node.names]
            found = [sub for sub in subs if sub in modules]
            targets = found if len(found) == len(subs) else [source, *found]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        out.update(t for t in targets if t in modules and t != name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cyclic_edges(graph: dict[str, set[str]]) -> set[str]:
    """Every edge whose two ends are in one strongly connected component (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    component: dict[str, int] = {}

    def visit(root: str) -> None:
        # Iterative, so that a long chain of imports cannot hit the recursion limit.
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = index[node]
                    if member == node:
                        break

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return {
        f"{source} -> {target}"
        for source, targets in graph.items()
        for target in targets
        if component[source] == component[target]
    }


def test_the_cycle_finder_finds_a_cycle_and_only_it() -> None:
    """A two-module cycle is found, with its edges, and an edge out of it is not."""
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set()}
    assert _cyclic_edges(graph) == {"a -> b", "b -> a"}


def test_imports_are_read_wherever_they_are(tmp_path: Path) -> None:
    """Imports under TYPE_CHECKING and inside functions count; ``from . import x`` names x."""
    source = tmp_path / "mod.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from . import sub\n"
        "if TYPE_CHECKING:\n"
        "    from .other import Thing\n"
        "def late():\n"
        "    from pkg.third import f\n"
    )
    modules = dict.fromkeys(("pkg", "pkg.mod", "pkg.sub", "pkg.other", "pkg.third"), source)
    assert _imports("pkg.mod", source, modules) == {"pkg.sub", "pkg.other", "pkg.third"}


def test_no_new_import_cycle() -> None:
    """No import edge closes a cycle, except those still listed (which must still exist)."""
    cyclic = _cyclic_edges(_graph())
    assert sorted(cyclic - STILL_CYCLIC) == [], "new import cycle; split the modules instead"
    assert sorted(STILL_CYCLIC - cyclic) == [], "no longer cyclic: remove from STILL_CYCLIC"


def test_eventstore_never_imports_workflow() -> None:
    """The ground floor knows nothing of workflows."""
    graph = _graph()
    upward = sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        if source.split(".")[0] == "eventstore"
        for target in targets
        if target.split(".")[0] == "workflow"
    )
    assert upward == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_new_module_over_the_limit(package: str) -> None:
    """No module is over 500 lines, except those still listed (which must still be)."""
    long = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / package).rglob("*.py")
        if len(path.read_text(encoding="utf-8").splitlines()) > MAX_LINES
    }
    listed = {name for name in STILL_TOO_LONG if name.startswith(package + "/")}
    assert sorted(long - listed) == [], f"over {MAX_LINES} lines: split by responsibility"
    assert sorted(listed - long) == [], "now within the limit: remove from STILL_TOO_LONG"
