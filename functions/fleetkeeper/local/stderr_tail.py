"""What a replica said last on stderr, for the reason its process exited.

A `run` that dies with `ModuleNotFoundError` exits with code 1; "exited with code 1" alone sends the
user to its log. The driver passes each replica's stderr through `StderrTee`, which writes it to
the replica's log as it comes (stdout goes there directly) and keeps its last `KEEP` bytes; when the
process has exited, `summary` picks the line to show beside the exit code:

- the last line that reads as an error (Python's `ModuleNotFoundError: ...`, Node's `Error: Cannot
  find module`, Go's `panic: ...`, bash's `x: command not found`...), else the last line;
- escape sequences and control characters stripped (it is shown in a terminal), whitespace folded;
- every value of the replica's secrets replaced by `***` (the first, possibly cut, line of a full
  buffer is dropped, so no part of a secret survives at its start);
- at most `LIMIT` characters.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

KEEP = 8192
LIMIT = 240
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
_CONTROLS = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_ERROR = re.compile(
    r"error|exception|panic|fatal|not found|no such file|permission denied|cannot|can't|failed|refused|killed",
    re.IGNORECASE,
)
# Python's header line names no error of its own.
_NOT_THE_ERROR = re.compile(r"^Traceback \(most recent call last\)")


def summary(data: bytes, secrets: Iterable[str] = (), *, truncated: bool = False) -> str | None:
    """The line of `data` (a stderr's end) to show in a reason, or None when it said nothing."""
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    if truncated:
        text = text.partition("\n")[2]
    for value in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(value, "***")
    lines = [" ".join(_CONTROLS.sub(" ", _ESCAPES.sub("", line)).split()) for line in text.split("\n")]
    lines = [line for line in lines if line]
    if not lines:
        return None
    errors = [line for line in lines if _ERROR.search(line) and not _NOT_THE_ERROR.match(line)]
    chosen = errors[-1] if errors else lines[-1]
    return chosen if len(chosen) <= LIMIT else chosen[: LIMIT - 1] + "…"


class StderrTee:
    """Copies a pipe (a replica's stderr) into `log` as it comes, keeping its last KEEP bytes."""

    def __init__(self, source: IO[bytes], log: IO[bytes], name: str) -> None:
        self._source = source
        self._log = log
        self._tail = bytearray()
        self._truncated = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._copy, name=name, daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        descriptor = self._source.fileno()
        try:
            while chunk := os.read(descriptor, 65536):
                with contextlib.suppress(ValueError, OSError):  # the log closed under a killed replica
                    self._log.write(chunk)
                    self._log.flush()
                with self._lock:
                    self._tail += chunk
                    if len(self._tail) > KEEP:
                        del self._tail[:-KEEP]
                        self._truncated = True
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                self._source.close()

    def finish(self, timeout: float) -> None:
        """Wait (at most `timeout` seconds) until the pipe is read to its end: every writer exited."""
        self._thread.join(timeout)

    def summary(self, secrets: Iterable[str] = ()) -> str | None:
        with self._lock:
            data, truncated = bytes(self._tail), self._truncated
        return summary(data, secrets, truncated=truncated)
