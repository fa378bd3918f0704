"""The load command examples/autoscale/service.yaml tells a reader to run, as a shell line."""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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


class _Hello(http.server.BaseHTTPRequestHandler):
    """Answers as the example's app does, keeping the connection (curl reuses one), and notes each path."""

    protocol_version = "HTTP/1.1"
    paths: list[str]

    def do_GET(self) -> None:
        self.paths.append(self.path)
        body = b"hello, autoscaled world\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def hello_server() -> Iterator[tuple[str, list[str]]]:
    """(its URL on 127.0.0.1, the paths it was asked for, in order) while the block runs."""
    paths: list[str] = []
    handler = type("Hello", (_Hello,), {"paths": paths})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", paths
    finally:
        server.shutdown()
        server.server_close()
