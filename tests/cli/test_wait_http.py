"""--wait against a stub API on 127.0.0.1 that throttles and fails transiently, over real HTTP.

docs/CLI.md promises that throttling (429) and 502-504 answers do not end a wait; only the timeout
does. A 429 is the API being busy, never the caller's mistake, so it never exits 2.
"""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.cli.http import ApiClient
from fleetkeeper.cli.main import run

if TYPE_CHECKING:
    from collections.abc import Iterator

VIEW = {"name": "web", "uid": "u1", "status": "SHUTTING_DOWN", "generation": 4, "target_version": 1, "replicas": []}


class StubApi(ThreadingHTTPServer):
    """Answers each (method, path) from a script of (status, body); the last answer repeats."""

    def __init__(self, script: dict[tuple[str, str], list[tuple[int, Any]]]) -> None:
        self.script = script
        self.seen: list[tuple[str, str, int]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                answers = stub.script[(self.command, self.path)]
                status, body = answers.pop(0) if len(answers) > 1 else answers[0]
                stub.seen.append((self.command, self.path, status))
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_DELETE = do_POST = _answer

            def log_message(self, *_args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def stub() -> Iterator[StubApi]:
    server = StubApi({})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def error(status: int, code: str) -> tuple[int, Any]:
    return status, {"error": {"code": code, "message": f"{code} ({status})", "details": {}}}


def cli(stub: StubApi, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    # The client's own retries without their back-off sleeps; the wait loop keeps its 1 s interval.
    factory = lambda url: ApiClient(url, sleep=lambda _s: None)  # noqa: E731
    # --local: a stub of our own on loopback, which has no `fleetkeeper local` credential.
    code = run([*argv, "--api-url", stub.url, "--local"], out=out, err=err, client_factory=factory)
    return code, out.getvalue(), err.getvalue()


def test_wait_keeps_polling_through_throttling_and_gateway_errors(stub: StubApi) -> None:
    stub.script = {
        ("DELETE", "/v1/services/web"): [(202, VIEW)],
        # More 429s than the client retries on its own, then 502-504, then gone.
        ("GET", "/v1/services/web"): [
            *[error(429, "throttled")] * 4,
            error(502, "bad_gateway"),
            error(503, "unavailable"),
            error(504, "gateway_timeout"),
            error(404, "not_found"),
        ],
    }
    code, _, err = cli(stub, "down", "web", "--wait", "--timeout", "60")
    assert code == 0, err
    assert "web is gone" in err + _
    assert [s for _m, _p, s in stub.seen if _m == "GET"] == [429, 429, 429, 429, 502, 503, 504, 404]
    assert "throttled (429)" in err  # the progress says why it is still waiting


def test_wait_that_is_throttled_until_the_timeout_exits_1(stub: StubApi) -> None:
    stub.script = {
        ("DELETE", "/v1/services/web"): [(202, VIEW)],
        ("GET", "/v1/services/web"): [error(429, "throttled")],
    }
    code, _, err = cli(stub, "down", "web", "--wait", "--timeout", "1")
    assert code == 1, err
    assert "timed out after 1s" in err


def test_a_throttled_write_exits_1_not_2(stub: StubApi) -> None:
    stub.script = {("DELETE", "/v1/services/web"): [error(429, "throttled")]}
    code, _, err = cli(stub, "down", "web")
    assert code == 1
    assert "throttled (429)" in err
