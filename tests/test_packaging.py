"""What pyproject.toml declares is the truth: the imports, the packages, their types, their path."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from importlib.metadata import Distribution, packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("eventstore", "workflow")
# Extras that only tools and benchmarks use: the packages never import them.
TOOL_EXTRAS = frozenset({"dev", "bench"})
_NOT_SOURCES = (".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache", "*.db*")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return _norm(match.group(0))


def _is_import_guard(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(
        isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError") for n in names
    )


def _imports(tree: ast.AST) -> Iterator[tuple[str, bool]]:
    """(module, imported under ``try: ... except ImportError``) of each import."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_is_import_guard(h) for h in node.handlers):
            guarded.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, id(node) in guarded
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module, id(node) in guarded


def _third_party_imports() -> dict[str, bool]:
    """Each third-party module the packages import -> whether every import of it is guarded."""
    found: dict[str, bool] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for module, is_guarded in _imports(ast.parse(path.read_bytes(), str(path))):
                top = module.partition(".")[0]
                if top in sys.stdlib_module_names or top in PACKAGES or top == "__future__":
                    continue
                found[module] = found.get(module, True) and is_guarded
    return found


def _distribution(module: str) -> str:
    """The distribution that provides ``module``: in a namespace package that several
    provide (``opentelemetry``), the one whose files hold the deepest part of its path."""
    top = module.partition(".")[0]
    dists = packages_distributions().get(top)
    assert dists, f"{top!r} is imported but no installed distribution provides it"
    if len(set(dists)) == 1:
        return _norm(dists[0])
    parts = module.split(".")
    best, depth = dists[0], 0
    for dist in dict.fromkeys(dists):
        files = {str(f) for f in Distribution.from_name(dist).files or ()}
        for n in range(len(parts), depth, -1):
            stem = "/".join(parts[:n])
            if f"{stem}.py" in files or any(f.startswith(stem + "/") for f in files):
                best, depth = dist, n
                break
    return _norm(best)


def test_declared_dependencies_are_what_the_packages_import() -> None:
    """Every imported third-party module is declared, optional ones in an extra; none unused."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    required = {_req_name(r) for r in project["dependencies"]}
    extras = {
        name: {_req_name(r) for r in reqs}
        for name, reqs in project["optional-dependencies"].items()
        if name not in TOOL_EXTRAS
    }
    imported: dict[str, bool] = {}
    for module, guarded in _third_party_imports().items():
        dist = _distribution(module)
        imported[dist] = imported.get(dist, True) and guarded
    problems = []
    for dist, guarded in sorted(imported.items()):
        in_extra = [name for name, reqs in extras.items() if dist in reqs]
        if guarded and not in_extra and dist not in required:
            problems.append(f"{dist}: imported optionally, declared in no extra")
        if not guarded and dist not in required:
            problems.append(f"{dist}: imported unguarded, not in [project] dependencies")
    problems += [
        f"{dist}: declared in [project] dependencies, never imported"
        for dist in sorted(required - imported.keys())
    ]
    problems += [
        f"{dist}: declared in extra {name!r}, never imported"
        for name, reqs in sorted(extras.items())
        for dist in sorted(reqs - imported.keys())
    ]
    assert problems == []
    assert imported.get("psycopg") is True  # the PostgreSQL driver stays optional


def test_import_walk_sees_guarded_and_plain_imports() -> None:
    """The AST walk tells an optional (guarded) import from a plain one."""
    tree = ast.parse(
        "import a.b\nfrom c import d\ntry:\n    import e\nexcept ImportError:\n    e = None\n"
        "try:\n    import f\nexcept (KeyError, ModuleNotFoundError):\n    pass\n"
        "try:\n    import g\nexcept KeyError:\n    pass\nfrom . import h\n"
    )
    assert sorted(_imports(tree)) == [
        ("a.b", False),
        ("c", False),
        ("e", True),
        ("f", True),
        ("g", False),
    ]


@pytest.mark.long  # builds a wheel: make test-long (CI runs it)
def test_wheel_ships_both_packages_with_py_typed(tmp_path: Path) -> None:
    """The built wheel holds eventstore and workflow with their py.typed markers, nothing else."""
    # Built from a copy: setuptools writes build/ and egg-info next to the sources.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*_NOT_SOURCES))
    out = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = out.glob("durable_workflows-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"eventstore/py.typed", "workflow/py.typed", "workflow/cli/__init__.py"} <= set(names)
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == set(PACKAGES)


def test_editable_install_is_a_plain_path_entry() -> None:
    """``pip install -e .`` put the root on sys.path with a .pth, not an import hook."""
    # Looked up in site-packages: the root's own durable_workflows.egg-info is on sys.path too.
    site = sysconfig.get_paths()["purelib"]
    (dist,) = Distribution.discover(name="durable-workflows", path=[site])
    assert json.loads(dist.read_text("direct_url.json") or "{}")["dir_info"]["editable"]
    files = [Path(str(dist.locate_file(f))) for f in dist.files or ()]
    assert not [f.name for f in files if f.name.endswith("_finder.py")]  # setuptools' hook
    (pth,) = [f for f in files if f.suffix == ".pth"]
    assert pth.read_text(encoding="utf-8").split() == [str(ROOT)]


def _modules_after_a_run(store: Path) -> list[str]:
    """The top-level modules a fresh process has loaded after importing the packages (the
    command line's too) and running a workflow on the file store ``store``."""
    script = (
        "import asyncio, sys\n"
        "import workflow, workflow.cli\n"
        "from tests.test_engine import Linear\n"
        "async def main() -> str:\n"
        f"    wf = Linear(store={str(store)!r}, timeout=10)\n"
        "    return await wf.run(topic='files')\n"
        "assert asyncio.run(main()) == 'hello files!'\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_psycopg_is_imported_only_for_a_postgresql_store(tmp_path: Path) -> None:
    """Running a workflow on a file store imports no PostgreSQL driver: a fifth of
    ``import workflow``'s time."""
    assert [m for m in _modules_after_a_run(tmp_path / "s.db") if m.startswith("psycopg")] == []


def test_sqlite_utils_is_imported_only_to_create_or_migrate(tmp_path: Path) -> None:
    """sqlite-utils (and what it imports: click, dateutil, pluggy) is loaded to create a
    store, not to open and run on one that exists: a seventh of ``import workflow``'s
    time, in every command and worker process."""
    store = tmp_path / "s.db"
    assert "sqlite_utils" in _modules_after_a_run(store)  # created it
    assert "sqlite_utils" not in _modules_after_a_run(store)  # opened it
