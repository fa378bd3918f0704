"""The load command examples/autoscale/service.yaml tells a reader to run, as a shell line."""

from __future__ import annotations

import re
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "autoscale" / "service.yaml"
_LINE = re.compile(r"^#\s+(curl .*?)\s+# (\d+) req/s")


def load_command() -> tuple[str, int]:
    """(the command, the rate its comment promises) from the example's comment."""
    for line in EXAMPLE.read_text().splitlines():
        found = _LINE.match(line)
        if found:
            return found.group(1), int(found.group(2))
    raise AssertionError(f"{EXAMPLE}: no `curl ... # N req/s` line in its comment")


def bounded(command: str, requests: int) -> str:
    """The command with its URL range cut to `requests` (the example's runs until interrupted)."""
    cut, count = re.subn(r"\[1-\d+\]", f"[1-{requests}]", command)
    assert count == 1, f"the load command has no [1-N] URL range: {command}"
    return cut
