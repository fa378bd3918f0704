"""The documentation holds together: a one-page architecture, no project history, no dead links.

docs/ARCHITECTURE.md is the overview (at most ~200 lines); the subsystems are documented under
docs/architecture/. The docs say why, not when: "issue 23" means nothing to the next maintainer.
Every relative link in docs/ and README.md reaches a file (and, with a `#fragment`, one of its
headings, as GitHub names them), and every docs/*.md path a comment in the code names exists.
Each check is also run on a planted violation, so none of them passes by finding nothing.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path

from tests import REPO_ROOT

ROOT = REPO_ROOT
DOCS = ROOT / "docs"
OVERVIEW = DOCS / "ARCHITECTURE.md"
OVERVIEW_MAX_LINES = 220

# Written on another branch at the same time as the links to it; a link to a file listed here is
# accepted while the file is missing and checked like any other once it exists. Remove the entry
# when the file has landed.
LANDING_ELSEWHERE: set[Path] = set()

HISTORY = re.compile(r"\bissues?\s+\d+", re.IGNORECASE)
LINK = re.compile(r"(?<!!)\[(?:[^\]\n]|\n(?!\n))*?\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
DOC_PATH = re.compile(r"\bdocs/[A-Za-z0-9_./-]+\.md\b")
# A comment naming a part of a document: docs/X.md, "Part" (or docs/X.md ("Part")).
DOC_PART = re.compile(r"\b(docs/[A-Za-z0-9_./-]+\.md),? \(?\"([^\"\n]+)\"")


def doc_files() -> list[Path]:
    return sorted([*DOCS.glob("*.md"), *(DOCS / "architecture").glob("*.md")])


def prose(text: str) -> str:
    """The text with fenced code blocks blanked (lines kept, so line numbers still hold)."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            out.append("")
        else:
            out.append("" if fenced else line)
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path.read_text(encoding="utf-8")).split("\n"):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def broken_links(page: Path, root: Path = ROOT, landing: Iterable[Path] = ()) -> list[str]:
    """Relative links of `page` that reach no file, or no heading of the file they name."""
    problems = []
    text = prose(page.read_text(encoding="utf-8"))
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # https:, mailto:, ...
            continue
        line = text.count("\n", 0, match.start()) + 1
        path_part, _, fragment = target.partition("#")
        resolved = (page.parent / path_part).resolve() if path_part else page
        if not resolved.exists():
            if resolved not in set(landing):
                problems.append(f"{page.relative_to(root)}:{line}: {target} (no such file)")
            continue
        if fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{page.relative_to(root)}:{line}: {target} (no such heading)")
    return problems


def history(page: Path, root: Path = ROOT) -> list[str]:
    return [
        f"{page.relative_to(root)}:{number}: {line.strip()}"
        for number, line in enumerate(page.read_text(encoding="utf-8").split("\n"), start=1)
        if HISTORY.search(line)
    ]


def missing_doc_paths(source: Path, root: Path = ROOT, landing: Iterable[Path] = LANDING_ELSEWHERE) -> list[str]:
    """docs/*.md paths that a file of the code or the build names, and that do not exist."""
    text = source.read_text(encoding="utf-8")
    return [
        f"{source.relative_to(root)}: {name}"
        for name in sorted(set(DOC_PATH.findall(text)))
        if not (root / name).exists() and (root / name) not in set(landing)
    ]


def missing_doc_parts(source: Path, root: Path = ROOT) -> list[str]:
    """Quoted parts of documents ("Placement") that a file names and the document no longer has."""
    problems = []
    for name, part in sorted(set(DOC_PART.findall(source.read_text(encoding="utf-8")))):
        document = root / name
        if document.exists() and part.lower() not in document.read_text(encoding="utf-8").lower():
            problems.append(f'{source.relative_to(root)}: {name}, "{part}"')
    return problems


def code_and_build_files() -> list[Path]:
    files = [ROOT / name for name in ("README.md", "Makefile", "pyproject.toml", "template.yaml")]
    for folder, pattern in (
        ("functions/fleetkeeper", "*.py"),
        ("tests", "*.py"),
        ("bench", "*.py"),
        ("infra", "*.yaml"),
    ):
        files += sorted((ROOT / folder).rglob(pattern))
    this = Path(__file__).resolve()  # its planted paths are meant to be missing
    return [path for path in files if path.is_file() and ".venv" not in path.parts and path != this]


def test_the_architecture_is_one_page() -> None:
    lines = OVERVIEW.read_text(encoding="utf-8").count("\n")
    assert lines <= OVERVIEW_MAX_LINES, (
        f"docs/ARCHITECTURE.md has {lines} lines (at most {OVERVIEW_MAX_LINES}): it is the overview; "
        "put the detail in the subsystem's document under docs/architecture/"
    )


def test_every_subsystem_document_is_linked_from_the_overview() -> None:
    linked = {m.group(1).partition("#")[0] for m in LINK.finditer(prose(OVERVIEW.read_text(encoding="utf-8")))}
    unlinked = [p.name for p in sorted((DOCS / "architecture").glob("*.md")) if f"architecture/{p.name}" not in linked]
    assert unlinked == [], f"docs/architecture/ documents the overview does not link: {unlinked}"


def test_docs_carry_no_issue_history() -> None:
    found = [problem for page in doc_files() for problem in history(page)]
    assert found == [], "say why, not which issue:\n" + "\n".join(found)


def test_relative_links_reach_files_and_headings() -> None:
    pages = [*doc_files(), ROOT / "README.md"]
    found = [problem for page in pages for problem in broken_links(page, landing=LANDING_ELSEWHERE)]
    assert found == [], "\n".join(found)


def test_docs_named_in_code_and_build_files_exist() -> None:
    found = [problem for source in code_and_build_files() for problem in missing_doc_paths(source)]
    assert found == [], "\n".join(found)


def test_parts_of_docs_named_in_code_and_build_files_exist() -> None:
    sources = [*code_and_build_files(), *doc_files()]
    found = [problem for source in sources for problem in missing_doc_parts(source)]
    assert found == [], "\n".join(found)


# The checks themselves, each on a planted violation.


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other\n\n## Its part (with: punctuation)\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[fine](other.md) [fine too](other.md#its-part-with-punctuation) [self](#page)\n"
        "[gone](missing.md) [no heading](other.md#elsewhere) [web](https://example.com/x.md)\n"
        "```\n[in code](ignored.md)\n```\n"
        "[soon](soon.md)\n",
        encoding="utf-8",
    )
    assert broken_links(page, tmp_path, landing={tmp_path / "soon.md"}) == [
        "page.md:4: missing.md (no such file)",
        "page.md:4: other.md#elsewhere (no such heading)",
    ]
    assert broken_links(page, tmp_path) == [
        "page.md:4: missing.md (no such file)",
        "page.md:4: other.md#elsewhere (no such heading)",
        "page.md:8: soon.md (no such file)",
    ]


def test_issue_history_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "## Owners (issue 23)\nSince Issue 7 it holds.\nSkyPilot issue #3962 is theirs.\n", encoding="utf-8"
    )
    assert history(page, tmp_path) == ["page.md:1: ## Owners (issue 23)", "page.md:2: Since Issue 7 it holds."]


def test_a_missing_doc_named_in_code_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# Here\n", encoding="utf-8")
    source = tmp_path / "module.py"
    source.write_text('"""See docs/here.md and docs/ARCHITECTURE.md, "Placement"."""\n', encoding="utf-8")
    assert missing_doc_paths(source, tmp_path) == ["module.py: docs/ARCHITECTURE.md"]


def test_a_missing_part_of_a_doc_is_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "here.md").write_text("# Here\n\n**Placement.** It is here.\n", encoding="utf-8")
    source = tmp_path / "module.py"
    source.write_text('# docs/here.md, "Placement"; docs/here.md ("placement"); docs/here.md, "Network"\n')
    assert missing_doc_parts(source, tmp_path) == ['module.py: docs/here.md, "Network"']


def test_github_anchors() -> None:
    assert slug("Fan-out: the scheduled run at 10,000 services") == "fan-out-the-scheduled-run-at-10000-services"
    assert slug("Follow-ups and EC2's state changes") == "follow-ups-and-ec2s-state-changes"
    assert slug("Images (GPU and Neuron)") == "images-gpu-and-neuron"
    assert slug("The strict-AWS test layer") == "the-strict-aws-test-layer"
