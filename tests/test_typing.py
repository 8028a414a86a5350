"""Users' type checkers accept LlamaIndex-spelled code against the installed package.

mypy and pyright run in subprocesses from an empty directory with no configuration of
ours, so they see ``workflow`` only as installed (``pip install -e .`` in ``.venv``): this
also proves that the editable install is one type checkers can follow.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import llama_spelling
from workflow import Event, HumanResponseEvent, InputRequiredEvent, StartEvent, StopEvent

ROOT = Path(__file__).resolve().parent.parent


def _user_files(tmp_path: Path) -> list[str]:
    """Copies the typed user module and each python block of the README into ``tmp_path``.

    The first block is the quickstart; the others (a module to save, a replay test, the
    event store on its own) are user code too.
    """
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    assert blocks, "README.md has no ```python block"
    names = ["quickstart.py"] + [f"readme_block{i}.py" for i in range(1, len(blocks))]
    for name, code in zip(names, blocks, strict=True):
        (tmp_path / name).write_text(code, encoding="utf-8")
    shutil.copy(ROOT / "tests" / "support" / "llama_spelling.py", tmp_path / "llama_spelling.py")
    return [*names, "llama_spelling.py"]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    env["PYRIGHT_PYTHON_IGNORE_WARNINGS"] = "1"  # no check for a newer pyright online
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.long  # a mypy run of its own: make test-long (CI runs it)
def test_mypy_strict_accepts_llama_spelling_and_readme(tmp_path: Path) -> None:
    """``mypy --strict`` passes the README's examples and the LlamaIndex-spelled module."""
    files = _user_files(tmp_path)
    # In the same run, so the check is shown to be real: a misspelled declared field.
    (tmp_path / "bad.py").write_text(
        'from workflow import Event\n\n\nclass Draft(Event):\n    text: str\n\n\nDraft(txt="x")\n',
        encoding="utf-8",
    )
    (tmp_path / "mypy.ini").write_text("[mypy]\n", encoding="utf-8")  # none of ours, none found
    cache = str(tmp_path / "cache")
    proc = _run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", cache, *files, "bad.py"], tmp_path
    )
    errors = [line for line in proc.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1, proc.stdout + proc.stderr
    assert errors[0].startswith('bad.py:8: error: Unexpected keyword argument "txt" for "Draft"')
    assert f"Found 1 error in 1 file (checked {len(files) + 1} source files)" in proc.stdout


@pytest.mark.node  # pyright's PyPI package runs on Node.js: `make test-node`
def test_pyright_strict_accepts_llama_spelling_and_readme(tmp_path: Path) -> None:
    """Pyright in strict mode passes on the same files, resolving the installed package."""
    files = _user_files(tmp_path)
    (tmp_path / "pyrightconfig.json").write_text('{"typeCheckingMode": "strict"}\n')
    proc = _run([sys.executable, "-m", "pyright", "--pythonpath", sys.executable, *files], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^0 errors, 0 warnings", proc.stdout, re.MULTILINE), proc.stdout


async def test_llama_spelling_flows_run() -> None:
    """The type-checked module's flows also run as their LlamaIndex spelling intends."""
    assert await llama_spelling.main() == [
        "critique of 'a joke about pirates'",
        4,
        1,
        6,
        3,
        "hello ada",
        "done",
    ]


@pytest.mark.parametrize(
    "cls", [Event, StartEvent, StopEvent, InputRequiredEvent, HumanResponseEvent]
)
def test_typing_only_members_leave_runtime_alone(cls: type[Event]) -> None:
    """What type checkers see of extra fields is absent at run time: pydantic's own methods run."""
    assert "__getattr__" not in vars(cls)
    assert "__init__" not in vars(cls)
    ev = cls(topic="x")
    assert ev.topic == "x"
    with pytest.raises(AttributeError, match="tpic"):
        _ = ev.tpic
