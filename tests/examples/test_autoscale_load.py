"""The autoscale example's load command sends what its comment says (issue 36: a `curl; sleep 0.1`
loop promised ~10 req/s and reached 5 to 7). The rate itself is a figure of bench/example_load.py;
here: the command runs as written, against a real HTTP server on 127.0.0.1, one request per URL of
its range, paced by curl (`--rate`)."""

from __future__ import annotations

import http.server
import shutil
import subprocess
import threading
from collections.abc import Iterator

import pytest

from tests.examples.load_command import bounded, load_command


class _Counting(http.server.BaseHTTPRequestHandler):
    paths: list[str] = []

    def do_GET(self) -> None:
        _Counting.paths.append(self.path)
        body = b"hello\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Counting)
    _Counting.paths = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl on this machine")
def test_the_load_command_sends_one_request_per_url_at_the_rate_it_names(endpoint: str) -> None:
    command, rate = load_command()
    assert rate == 10 and "--rate 10/s" in command  # the comment's rate is the one curl is given
    done = subprocess.run(
        ["sh", "-c", bounded(command, 12)], env={"E": endpoint, "PATH": "/usr/bin:/bin"}, timeout=60, check=False
    )
    assert done.returncode == 0
    assert _Counting.paths == [f"/?n={n}" for n in range(1, 13)]
