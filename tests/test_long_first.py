"""tests/conftest.py's marks name what exists: LONG_FIRST (the `slow` tests, scheduled first) names
tests that exist, once each (a renamed module or test would otherwise silently lose its place at the
front, and its `slow` mark), and INTEGRATION_FIXTURES names fixtures the suite defines."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import INTEGRATION_FIXTURES, LONG_FIRST

ROOT = Path(__file__).resolve().parents[1]


def test_every_long_first_entry_names_a_test_module_and_function_that_exist() -> None:
    missing = []
    for entry in LONG_FIRST:
        path, _, test = entry.partition("::")
        module = ROOT / path
        if not module.is_file():
            missing.append(f"{entry}: no module {path}")
            continue
        name = re.split(r"[\[]", test)[0]
        if name and not re.search(rf"^def {re.escape(name)}\(", module.read_text(encoding="utf-8"), re.M):
            missing.append(f"{entry}: no test {name} in {path}")
    assert missing == []


def test_long_first_names_each_test_once() -> None:
    assert sorted(entry for entry in set(LONG_FIRST) if LONG_FIRST.count(entry) > 1) == []


def test_every_integration_fixture_is_one_the_suite_defines() -> None:
    sources = "\n".join(path.read_text(encoding="utf-8") for path in (ROOT / "tests").rglob("*.py"))
    defined = set(re.findall(r"^@pytest\.fixture[^\n]*\n(?:@[^\n]*\n)*(?:async )?def (\w+)\(", sources, re.M))
    assert sorted(INTEGRATION_FIXTURES - defined) == []
