"""The documentation holds together: a one-page architecture, no project history, no dead links.

docs/ARCHITECTURE.md is the overview (at most ~200 lines and 900 words: two printed pages); the
subsystems are documented under docs/architecture/. The docs say why, not when: "issue 23", "the
round before" or a commit hash mean nothing to the next maintainer; history is git log's. Every
relative link in docs/ and README.md reaches a file (and, with a `#fragment`, one of its headings, as
GitHub names them); every docs/*.md path a comment in the code names exists; and every repository
path, document name and `make` target that the docs, README.md, the comments of functions/ and the
Makefiles name exists in the repository (nothing outside it is cited as if it were part of it).
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
OVERVIEW_MAX_WORDS = 900

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


def test_the_architecture_fits_two_printed_pages() -> None:
    words = len(OVERVIEW.read_text(encoding="utf-8").split())
    assert words <= OVERVIEW_MAX_WORDS, (
        f"docs/ARCHITECTURE.md has {words} words (at most {OVERVIEW_MAX_WORDS}): it is the entry page; "
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


# The docs describe the code as it is: no history in their prose, no path or `make` target that is
# not in the repository. The same reference check runs on the comments and docstrings of functions/
# and on the Makefiles' comments, where a renamed module or target goes stale without a test noticing.

HISTORY_PHRASES = re.compile(
    r"before \(main at|\bthe (?:round|session|run) before\b|\bthis round\b|\blast (?:round|session)\b"
    r"|\bwe used to\b|\bpreviously\b|\bused to be\b|\bnow (?:compares|counts)\b"
    r"|\b(?:main|commit|merge) at\b|\b(?:found|measured) (?:by|in) (?:the )?(?:review|last)\b",
    re.IGNORECASE,
)
# A commit hash in prose: 7 to 40 hex digits with a letter and a digit in them, not part of a longer
# token (an instance id `i-0abc...`, an ARN, a URL) and not in code.
COMMIT = re.compile(r"(?<![\w./:#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
INLINE_CODE = re.compile(r"`[^`\n]*`")
# A path of the repository: a folder of its top level (or a folder of the package), then more parts.
TOP_FOLDERS = ("functions", "tests", "docs", "bench", "infra", "examples", "events")
REPO_PATH = re.compile(
    r"(?<![\w./~:$@{-])((?:[A-Za-z_][\w.-]*/)+(?:[\w-][\w.-]*\.(?:py|md|ya?ml|json|toml|txt|sh)\b|(?=[\s`'\"),;:]|$)))"
)
# A document named by its file name alone (`DESIGN.md`, PERFORMANCE.md), or a path that climbs out of
# its folder (`../shared/DESIGN.md`): it must be one of the repository's, never a file beside it.
BARE_DOC = re.compile(r"(?<![\w./~:$@{-])([A-Za-z][\w-]*\.md)\b")
# A module named by its file name alone (`alb.py`): some file of the repository's code has that name.
BARE_MODULE = re.compile(r"(?<![\w./~:$@{-])([A-Za-z_][\w-]*\.py)\b")
# SkyPilot's modules, which the spec's docs cite as the behaviour they follow.
SKYPILOTS = frozenset({"service_spec.py", "load_balancing_policies.py", "replica_managers.py", "autoscalers.py"})
CLIMBING = re.compile(r"(?<![\w./])((?:\.\./)+[\w./-]*\w)")
# `make TARGET` (in backticks, or at the start of a line of a code block); options and VAR=value skipped.
MAKE_OPTIONS = r"((?:\s+(?:-C\s+\S+|-\w+|\w+=\S*))*)\s+([A-Za-z0-9_./<>%-]+)"
MAKE_QUOTED = re.compile(r"`make" + MAKE_OPTIONS)
MAKE_LINE = re.compile(r"^\s*(?:\$\s+)?make" + MAKE_OPTIONS, re.MULTILINE)
MAKE_RULE = re.compile(r"^([^\s#:=][^:=\n]*?)\s*::?(?!=)", re.MULTILINE)
MAKE_VARIABLE = re.compile(r"^(\w+)\s*[:?]?=\s*(\S+)\s*$", re.MULTILINE)
# Paths named on purpose that are not the repository's: made at run time, in a replica, or another
# project's (a third-party package's module, SkyPilot's examples).
NOT_OURS = (
    ".venv/",
    ".venv-tools/",
    ".fleetkeeper/",
    "sky_workdir/",
    "moto/",
    "botocore/",
    "boto3/",
    "samtranslator/",
    "aws_lambda_powertools/",
    "mutants/",
    "sky/",
    "getmoto/",
    "llm/",
    "examples/serve/",
)


def history_phrases(page: Path, root: Path = ROOT, text: str | None = None) -> list[str]:
    """Lines of a document's prose (code blanked), or of `text` (a file's comments), that tell the
    project's history, not the code."""
    found = []
    lines = prose(page.read_text(encoding="utf-8")) if text is None else text  # a file's comments
    for number, line in enumerate(lines.split("\n"), start=1):
        text = INLINE_CODE.sub("", line)
        if HISTORY_PHRASES.search(text) or COMMIT.search(text):
            found.append(f"{page.relative_to(root)}:{number}: {line.strip()}")
    return found


@functools.cache
def make_targets(makefile: Path) -> frozenset[str]:
    """The targets a Makefile defines, its variables expanded (`$(STAMP):` is `.venv/.installed`)."""
    text = makefile.read_text(encoding="utf-8")
    variables: dict[str, str] = dict(MAKE_VARIABLE.findall(text))

    def expand(word: str) -> str:
        for _ in range(5):  # a variable made of variables: $(VENV)/.installed
            word = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), m.group(0)), word)
        return word

    return frozenset(expand(word) for match in MAKE_RULE.finditer(text) for word in match.group(1).split())


@functools.cache
def module_names(root: Path) -> frozenset[str]:
    """The file names of the repository's Python code."""
    folders = ("functions", "tests", "bench")
    return frozenset(p.name for f in folders for p in (root / f).rglob("*.py") if ".venv" not in p.parts)


def _path_exists(name: str, source: Path, root: Path) -> bool:
    if name.startswith(NOT_OURS) or "*" in name or "<" in name:
        return True
    package = root / "functions" / "fleetkeeper"
    bases = [root, root / "functions", package, package / "reconciler", root / "tests", root / "docs", source.parent]
    return any((base / name).exists() for base in bases)


def missing_references(source: Path, text: str, root: Path = ROOT) -> list[str]:
    """Repository paths and `make` targets named in `text` (from `source`) that do not exist."""
    problems = []
    for match in REPO_PATH.finditer(text):
        name = match.group(1)
        is_folder = name.endswith("/")
        if is_folder and name.split("/", 1)[0] not in (*TOP_FOLDERS, "fleetkeeper"):
            continue  # a folder named alone, outside the repository's top level: too often not ours
        if not _path_exists(name.removeprefix("fleetkeeper/"), source, root) and not _path_exists(name, source, root):
            problems.append(f"{source.relative_to(root)}: {name}")
    for match in BARE_DOC.finditer(text):
        name = match.group(1)
        folders = [root, root / "docs", root / "docs" / "architecture", source.parent]
        if name != "README.md" and not any((folder / name).exists() for folder in folders):
            problems.append(f"{source.relative_to(root)}: {name}")
    for match in BARE_MODULE.finditer(text):
        name = match.group(1)
        if name not in SKYPILOTS and name not in module_names(root):
            problems.append(f"{source.relative_to(root)}: {name}")
    for match in CLIMBING.finditer(text):
        if re.sub(r"^(?:\.\./)+", "", match.group(1)).startswith(NOT_OURS):
            continue  # `cd .mutmut && ../.venv/bin/mutmut`: made at run time
        target = (source.parent / match.group(1)).resolve()
        if not target.is_relative_to(root.resolve()) or not target.exists():
            problems.append(f"{source.relative_to(root)}: {match.group(1)}")
    code = "\n".join(line if fenced else "" for line, fenced in zip(text.split("\n"), _fenced_lines(text), strict=True))
    for match in [*MAKE_QUOTED.finditer(text), *MAKE_LINE.finditer(code)]:
        options, target = match.group(1), match.group(2)
        if target.startswith("-") or "<" in target:
            continue  # `make -n` alone; `make build-<LogicalId>`: a placeholder
        folder = re.search(r"-C\s+(\S+)", options)
        makefile = root / (folder.group(1) if folder else ".") / "Makefile"
        if makefile.exists() and target not in make_targets(makefile):
            problems.append(f"{source.relative_to(root)}: make {target}")
    return sorted(set(problems))


def _fenced_lines(text: str) -> list[bool]:
    """For each line of `text`, whether it is inside a fenced code block."""
    out, fenced = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fenced = not fenced
            out.append(False)
        else:
            out.append(fenced)
    return out


def comments_of(source: Path) -> str:
    """A Python file's comments and docstrings, or a Makefile's comment lines, one a line."""
    text = source.read_text(encoding="utf-8")
    if source.suffix != ".py":
        return "\n".join(line.split("#", 1)[1] for line in text.split("\n") if line.lstrip().startswith("#"))
    import ast
    import io
    import tokenize

    parts = [t.string[1:] for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                parts.append(docstring)
    return "\n".join(parts)


def referring_files() -> list[tuple[Path, str]]:
    """Each document with its prose (code blocks kept: their commands are the docs' too), and each
    code file of functions/ and each Makefile with its comments."""
    pages = [(page, page.read_text(encoding="utf-8")) for page in [*doc_files(), ROOT / "README.md"]]
    code = [*sorted((ROOT / "functions").rglob("*.py")), ROOT / "Makefile", ROOT / "functions" / "Makefile"]
    return pages + [(path, comments_of(path)) for path in code if path.is_file() and ".venv" not in path.parts]


def test_docs_tell_no_history() -> None:
    found = [problem for page in [*doc_files(), ROOT / "README.md"] for problem in history_phrases(page)]
    # In the code, the lines of its comments and docstrings (numbered among them, not in the file).
    found += [
        problem
        for source, text in referring_files()
        if source.suffix != ".md"
        for problem in history_phrases(source, text=text)
    ]
    assert found == [], "describe the code as it is; its history is git log's:\n" + "\n".join(found)


def test_files_and_make_targets_named_in_docs_and_comments_exist() -> None:
    found = [problem for source, text in referring_files() for problem in missing_references(source, text)]
    assert found == [], "\n".join(found)


def test_history_phrasing_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Before (main at 4190e87) it took 9 min.\nThe round before took 11 min 33 s.\nIt was previously slow.\n"
        "Fixed in commit 4190e87a.\nAn instance i-0abc1234def5 and `git show 4190e87` are fine.\n"
        "```\nthis round\n```\nSorted by the run's start.\n",
        encoding="utf-8",
    )
    assert history_phrases(page, tmp_path) == [
        "page.md:1: Before (main at 4190e87) it took 9 min.",
        "page.md:2: The round before took 11 min 33 s.",
        "page.md:3: It was previously slow.",
        "page.md:4: Fixed in commit 4190e87a.",
    ]


def test_a_missing_file_or_make_target_is_found(tmp_path: Path) -> None:
    (tmp_path / "functions" / "fleetkeeper" / "store").mkdir(parents=True)
    (tmp_path / "functions" / "fleetkeeper" / "store" / "keys.py").write_text("", encoding="utf-8")
    (tmp_path / "tests").mkdir()
    (tmp_path / "Makefile").write_text("STAMP := .venv/.installed\n$(STAMP): x\n\ttouch $@\ntest lint: $(STAMP)\n")
    source = tmp_path / "page.md"
    text = (
        "See `store/keys.py`, functions/fleetkeeper/store/keys.py and tests/ (`make test`, `make lint`,\n"
        "`make .venv/.installed`, `make TEST_JOBS=1 test`); https://example.com/docs/gone.md is not ours.\n"
        "Gone: `store/old.py`, bench/missing.py, tests/nothing/, `make check`, `make -j2 PORT=9 fast`.\n"
        "```\nmake sim\n```\nmake what it makes, `make -n`, `make build-<Name>`.\n"
        "Outside: DESIGN.md, `../shared/DESIGN.md`, ../../elsewhere; inside: README.md, ../page.md.\n"
        "Modules by name: keys.py is here, shell.py is not.\n"
    )
    (tmp_path / "page.md").write_text("", encoding="utf-8")
    source = tmp_path / "tests" / "page.md"
    assert missing_references(source, text, tmp_path) == [
        "tests/page.md: ../../elsewhere",
        "tests/page.md: ../shared/DESIGN.md",
        "tests/page.md: DESIGN.md",
        "tests/page.md: bench/missing.py",
        "tests/page.md: make check",
        "tests/page.md: make fast",
        "tests/page.md: make sim",
        "tests/page.md: shell.py",
        "tests/page.md: store/old.py",
        "tests/page.md: tests/nothing/",
    ]


def test_history_phrasing_in_comments_is_found(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text(
        '"""The parser."""\n# It used to be slow; this session\'s token is fine.\nx = 1  # previously 2\n'
    )
    assert history_phrases(module, tmp_path, comments_of(module)) == [
        "module.py:1: It used to be slow; this session's token is fine.",
        "module.py:2: previously 2",
    ]


def test_comments_of_code_and_makefiles(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text('"""Module: see a/b.py."""\nx = "c/d.py"  # see e/f.py\n', encoding="utf-8")
    makefile = tmp_path / "Makefile"
    makefile.write_text("# see g/h.py\nall: i/j.py\n", encoding="utf-8")
    assert sorted(comments_of(module).split("\n")) == [" see e/f.py", "Module: see a/b.py."]
    assert comments_of(makefile) == " see g/h.py"
