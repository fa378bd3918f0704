"""No function of the package is longer than MAX_LINES without saying why: a function that long is
several steps, and each step is easier to read, test and change as a function of its own. A long one
may stay when its docstring says "Long because" and why (one sequence that reads best in one place).

The length counted is the body's, from its first statement after the docstring to its last line
(comments and blank lines inside included: they are read too)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "functions" / "fleetkeeper"
MAX_LINES = 80
REASON = "Long because"


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = function.body
    if ast.get_docstring(function) is not None:
        body = body[1:]
    if not body:
        return 0
    end = function.end_lineno or body[-1].lineno
    return end - body[0].lineno + 1


def too_long(source: str, path: str) -> list[str]:
    """`path:line name (N lines)` for each function of `source` over MAX_LINES without a reason."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        lines = body_lines(node)
        if lines > MAX_LINES and REASON not in (ast.get_docstring(node) or ""):
            found.append(f"{path}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_of_the_package_is_over_80_lines_without_a_reason() -> None:
    found = [
        entry
        for path in sorted(PACKAGE.rglob("*.py"))
        for entry in too_long(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE.parent)))
    ]
    assert found == [], (
        f"functions over {MAX_LINES} lines: split each along its steps, or say in its docstring "
        f'"{REASON} ..." why it reads best in one piece:\n' + "\n".join(found)
    )


def _function(lines: int, docstring: str | None = None) -> str:
    doc = f'    """{docstring}"""\n' if docstring is not None else ""
    return "def planted():\n" + doc + "".join(f"    x{n} = {n}\n" for n in range(lines))


def test_the_check_finds_a_long_function_and_only_past_the_limit() -> None:
    assert too_long(_function(MAX_LINES + 1), "planted.py") == [f"planted.py:1 planted ({MAX_LINES + 1} lines)"]
    assert too_long(_function(MAX_LINES), "planted.py") == []
    # The docstring is not counted; a reason in it lets the function stay.
    assert too_long(_function(MAX_LINES, "a docstring\n" * 20), "planted.py") == []
    assert too_long(_function(MAX_LINES + 1, f"{REASON} it is one sequence."), "planted.py") == []
    nested = "class C:\n    " + _function(MAX_LINES + 5).replace("\n", "\n    ")
    assert [entry.split()[1] for entry in too_long(nested, "planted.py")] == ["planted"]
