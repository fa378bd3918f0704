"""A YAML error as a person reads it: where it starts, PyYAML's own words, and the line itself.

PyYAML's MarkedYAMLError carries two marks: `context_mark`, where the construct it was reading began
("while scanning a quoted scalar" at the opening quote), and `problem_mark`, where it gave up ("found
unexpected end of stream", often lines later, at the end of the file). The error starts at the
context mark, so that is the line reported first; the problem's own position follows when it is
elsewhere, with PyYAML's context, problem and note texts kept whole.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import yaml

# Contexts whose end-of-stream problem means an opening never closed: said plainly.
_UNCLOSED = {
    "while scanning a quoted scalar": "the quote opened here is never closed",
    "while parsing a flow mapping": "the `{` opened here is never closed",
    "while parsing a flow sequence": "the `[` opened here is never closed",
}


def describe(exc: yaml.YAMLError, source: str, text: str) -> str:
    """`source, line L, column C: not valid YAML: <context>: <problem> (at line P, column Q)`, then the
    line the error starts on with a caret under the column. `text` is the document parsed."""
    context = getattr(exc, "context", None)
    context_mark = getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None)
    problem_mark = getattr(exc, "problem_mark", None)
    note = getattr(exc, "note", None)
    if problem is None and context is None:
        return f"{source}: not valid YAML: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    start = context_mark or problem_mark
    words = [w for w in (context, problem) if w]
    said = ": ".join(words)
    if (
        problem_mark is not None
        and start is not None
        and (problem_mark.line, problem_mark.column)
        != (
            start.line,
            start.column,
        )
    ):
        at_end = problem_mark.index >= len(text) or not text[problem_mark.index :].strip()
        place = "the end of the file" if at_end else f"line {problem_mark.line + 1}, column {problem_mark.column + 1}"
        said += f" (at {place})"
    plain = _UNCLOSED.get(context or "")
    if plain and problem and "end of stream" in problem:
        said += f"; {plain}"
    if note:
        said += f"; {note}"
    if start is None:
        return f"{source}: not valid YAML: {said}"
    excerpt = _excerpt(text, start)
    where = f"{source}, line {start.line + 1}, column {start.column + 1}"
    return f"{where}: not valid YAML: {said}" + (f"\n{excerpt}" if excerpt else "")


def _excerpt(text: str, mark: yaml.Mark) -> str:
    """The line a mark is on, numbered, with a caret under its column."""
    lines = text.splitlines()
    if not 0 <= mark.line < len(lines):
        return ""
    number = f"{mark.line + 1}"
    line = lines[mark.line].replace("\t", " ")
    return f"  {number} | {line}\n  {' ' * len(number)} | {' ' * mark.column}^"
