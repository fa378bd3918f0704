"""Readiness probes follow redirects as SkyPilot's probe (python-requests) does, within the replica only.

Against real servers on 127.0.0.1: a 307 `/health` -> `/health/` is followed with its method and
body, a 302 after a POST becomes a GET without a body, a redirect to another port, host or scheme is
a failed probe that says why (and nothing is sent there), a loop ends after MAX_REDIRECTS hops, and
the whole chain keeps the probe's one deadline.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fleetkeeper.reconciler.probe import MAX_REDIRECTS, ProbeTarget, probe_one
from fleetkeeper.spec.service import ReadinessProbe

Seen = list[tuple[str, str, bytes, str | None]]
Route = Callable[[str], tuple[int, str | None]]


def _server(route: Route) -> tuple[ThreadingHTTPServer, Seen]:
    seen: Seen = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            seen.append((self.command, self.path, body, self.headers.get("Content-Type")))
            status, location = route(self.path)
            self.send_response(status)
            if location is not None:
                self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            return None

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, seen


@pytest.fixture
def serve() -> Iterator[Callable[[Route], tuple[str, Seen]]]:
    servers: list[ThreadingHTTPServer] = []

    def start(route: Route) -> tuple[str, Seen]:
        httpd, seen = _server(route)
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}", seen

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


def _probe(base: str, **fields: object) -> ReadinessProbe:
    return ReadinessProbe.model_validate({"path": "/health", "timeout_seconds": 3, **fields})


def test_a_307_to_the_trailing_slash_is_followed_with_its_body(serve) -> None:  # type: ignore[no-untyped-def]
    base, seen = serve(lambda path: (307, "/health/") if path == "/health" else (200, None))
    got = probe_one(ProbeTarget("k", base, _probe(base, post_data='{"model_name": "my_model"}')))
    assert (got.ok, got.detail) == (True, "HTTP 200")
    body = json.dumps({"model_name": "my_model"}).encode()
    assert seen == [("POST", "/health", body, "application/json"), ("POST", "/health/", body, "application/json")]


def test_a_302_after_a_post_becomes_a_get_without_the_body(serve) -> None:  # type: ignore[no-untyped-def]
    base, seen = serve(lambda path: (302, "/ready?x=1") if path == "/health" else (200, None))
    got = probe_one(ProbeTarget("k", base, _probe(base, post_data={"a": 1})))
    assert got.ok
    assert seen[1] == ("GET", "/ready?x=1", b"", None)


def test_an_absolute_location_on_the_same_host_and_port_is_followed(serve) -> None:  # type: ignore[no-untyped-def]
    holder: dict[str, str] = {}
    base, seen = serve(lambda path: (301, holder["base"] + "/up") if path == "/health" else (200, None))
    holder["base"] = base
    assert probe_one(ProbeTarget("k", base, _probe(base))).ok
    assert [path for _, path, _, _ in seen] == ["/health", "/up"]


@pytest.mark.parametrize(
    ("where", "shown"),
    [
        ("other-port", None),
        ("http://localhost:{port}/health", "http://localhost:{port}"),
        ("https://127.0.0.1:{port}/health", "https://127.0.0.1:{port}"),
    ],
)
def test_a_redirect_off_the_replica_is_a_failed_probe_that_says_so(serve, where: str, shown: str | None) -> None:  # type: ignore[no-untyped-def]
    other, elsewhere = serve(lambda path: (200, None))
    other_port = other.rsplit(":", 1)[1]
    holder: dict[str, str] = {}
    base, seen = serve(lambda path: (307, holder["location"]))
    port = base.rsplit(":", 1)[1]
    holder["location"] = other + "/health" if where == "other-port" else where.format(port=port)
    got = probe_one(ProbeTarget("k", base, _probe(base)))
    target = other if shown is None else shown.format(port=port)
    assert (got.ok, got.detail) == (False, f"HTTP 307 redirect to {target}, not followed: off the replica")
    assert len(seen) == 1 and elsewhere == []  # nothing went to the other address
    assert other_port != port


def test_a_redirect_loop_ends_after_the_bound(serve) -> None:  # type: ignore[no-untyped-def]
    base, seen = serve(lambda path: (302, "/a" if path != "/a" else "/b"))
    got = probe_one(ProbeTarget("k", base, _probe(base)))
    assert (got.ok, got.detail) == (False, f"more than {MAX_REDIRECTS} redirects")
    assert len(seen) == MAX_REDIRECTS + 1


def test_a_redirect_without_a_location_fails(serve) -> None:  # type: ignore[no-untyped-def]
    base, _ = serve(lambda path: (302, None))
    got = probe_one(ProbeTarget("k", base, _probe(base)))
    assert (got.ok, got.detail) == (False, "HTTP 302 without a Location")


def test_the_chain_keeps_one_deadline(serve) -> None:  # type: ignore[no-untyped-def]
    def slow(path: str) -> tuple[int, str | None]:
        time.sleep(0.4)
        return 302, "/again" if path != "/again" else "/health"

    base, _ = serve(slow)
    started = time.monotonic()
    got = probe_one(ProbeTarget("k", base, ReadinessProbe(path="/health", timeout_seconds=1)))
    assert (got.ok, got.detail) == (False, "timed out after 1s")
    assert time.monotonic() - started < 1.5
