"""Runs one half of the context seed (``tests/seeds/seed_context.py``) in this process.

``python -m tests.support.seed_halves write FILE`` runs the seed's statements up to its
``json.dumps(ctx.to_dict(...))`` and writes that text to FILE; ``read FILE`` runs the seed's
first statement (the workflow) and its statements from ``Context.from_dict`` on, with ``ctx``
read from FILE. The statements are the seed's own, taken from its source, so the dict is
written by one process and restored by another exactly as the seed does it in one. A third
argument names a variant of the seed (``tests/test_seeds.py``'s ``VARIANTS``).
"""

from __future__ import annotations

import ast
import asyncio
import sys
from pathlib import Path
from typing import Any

SEEDS = Path(__file__).resolve().parent.parent / "seeds"


def seed_source(variant: str = "") -> str:
    """The context seed's text, or a variant of it (a replacement of its lines)."""
    from tests.test_seeds import VARIANTS

    text = (SEEDS / "seed_context.py").read_text(encoding="utf-8")
    for old, new in VARIANTS.get(variant, []):
        assert old in text, old
        text = text.replace(old, new)
    return text


def halves(source: str) -> tuple[ast.Module, list[ast.stmt], list[ast.stmt]]:
    """The seed's definitions, and the statements of each half of its ``main``."""
    tree = ast.parse(source)
    defs = [n for n in tree.body if not isinstance(n, ast.Expr)]  # all but asyncio.run(main())
    main = next(n for n in defs if isinstance(n, ast.AsyncFunctionDef) and n.name == "main")
    defs.remove(main)
    body = main.body
    cut = next(i for i, s in enumerate(body) if "from_dict" in ast.unparse(s))
    return ast.Module(body=defs, type_ignores=[]), body[:cut], [body[0], *body[cut:]]


def run_half(which: str, file: Path, variant: str = "") -> None:
    defs, first, second = halves(seed_source(variant))
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(defs, "seed_context.py", "exec"), ns)
    stmts = first if which == "write" else second
    fn = ast.AsyncFunctionDef(
        name="half",
        args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[*stmts, ast.Return(ast.Name("ctx", ast.Load()))],
        decorator_list=[],
        returns=None,
    )
    if which == "read":
        # ctx holds what the first half left in it: the dict's JSON text.
        fn.body.insert(
            1,
            ast.Assign([ast.Name("ctx", ast.Store())], ast.Constant(file.read_text("utf-8"))),
        )
    module = ast.fix_missing_locations(ast.Module(body=[fn], type_ignores=[]))
    exec(compile(module, "seed_context.py", "exec"), ns)
    ctx = asyncio.run(ns["half"]())
    if which == "write":
        file.write_text(ctx, encoding="utf-8")


if __name__ == "__main__":
    run_half(sys.argv[1], Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
