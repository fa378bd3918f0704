"""The line of a replica's stderr that goes into the reason it exited (fleetkeeper/local/stderr_tail.py)."""

from __future__ import annotations

import pytest

from fleetkeeper.local.stderr_tail import LIMIT, summary

PYTHON = b"""Traceback (most recent call last):
  File "/srv/app.py", line 1, in <module>
    import torch
ModuleNotFoundError: No module named 'torch'
"""
NODE = b"""node:internal/modules/cjs/loader:1080
  throw err;
  ^

Error: Cannot find module 'express'
Require stack:
- /srv/index.js
    at Module._resolveFilename (node:internal/modules/cjs/loader:1077:15) {
  code: 'MODULE_NOT_FOUND',
}

Node.js v18.19.0
"""


@pytest.mark.parametrize(
    ("said", "shown"),
    [
        (PYTHON, "ModuleNotFoundError: No module named 'torch'"),
        (NODE, "Error: Cannot find module 'express'"),
        (b"bash: line 1: uvicorn: command not found\n", "bash: line 1: uvicorn: command not found"),
        (b"goroutine 1 [running]:\npanic: listen tcp :8080: bind\n\nexit status 2\n", "panic: listen tcp :8080: bind"),
        (b"just a last line\n\n", "just a last line"),
        (b"\x1b[31mError:\x1b[0m bad\tthing\x07 here\r\n", "Error: bad thing here"),
        (b"\n  \n", None),
        (b"", None),
    ],
)
def test_the_last_error_line_else_the_last_line_printable(said: bytes, shown: str | None) -> None:
    assert summary(said) == shown


def test_secrets_are_masked_and_a_cut_first_line_is_dropped() -> None:
    assert summary(b"error: bad key sk-12345 (sk-123)\n", ["sk-123", "sk-12345", ""]) == "error: bad key *** (***)"
    # The buffer's start may cut a secret in two: its first line is never shown.
    assert summary(b"2345 error\nlast\n", ["sk-12345"], truncated=True) == "last"


def test_a_long_line_is_bounded() -> None:
    shown = summary(b"error: " + b"x" * 1000)
    assert shown is not None and len(shown) == LIMIT and shown.endswith("\u2026")
