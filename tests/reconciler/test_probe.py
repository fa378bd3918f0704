"""Readiness probes (fleetkeeper.reconciler.probe): their details, the run's bounded probe phase, and a
replica answering garbage."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleetkeeper.model import ServiceStatus
from fleetkeeper.reconciler.plan import ProbeResult
from fleetkeeper.reconciler.probe import ProbeTarget, probe_all, probe_one
from fleetkeeper.spec.service import ReadinessProbe, ServiceSpec
from tests.support.reconciler_world import World, spec_dict


class _Slow(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        delay = 3 if self.path == "/slow" else 0
        time.sleep(delay)
        self.send_response(503 if self.path == "/down" else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture(scope="module")
def http() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _target(base: str, path: str, timeout: int = 5) -> ProbeTarget:
    return ProbeTarget(path, base, ReadinessProbe(path=path, timeout_seconds=timeout))


def test_probe_details_are_deterministic(http: str) -> None:
    assert probe_one(_target(http, "/health")).ok
    assert probe_one(_target(http, "/down")).detail == "HTTP 503"
    assert probe_one(_target(http, "/slow", timeout=1)).detail == "timed out after 1s"
    closed = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    port = closed.server_address[1]
    closed.server_close()
    assert probe_one(_target(f"http://127.0.0.1:{port}", "/health")).detail == "connection refused"


def test_the_probe_phase_is_bounded_and_a_late_probe_is_a_failed_one(http: str) -> None:
    started = time.monotonic()
    results = probe_all([_target(http, "/health"), _target(http, "/slow", timeout=10)], budget_seconds=1)
    assert time.monotonic() - started < 2.5
    assert results["/health"].ok
    # No verdict: the run's own phase counts it a failed probe, the long probes' phase leaves it to a
    # run of its own when it could not give the probe its timeout (reconciler.run).
    assert results["/slow"] == ProbeResult(http, False, "no verdict within the run's 1s probe budget", answered=False)


# Guards a regression found by review (commit 5faa8d0): a replica answering garbage failed the whole run,
# not its own probe (test_one_replica_answering_garbage_fails_its_probe_not_the_run).
class _GarbageServer:
    """Answers every request with a line that is not HTTP (a broken replica)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"garbage\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


def test_one_replica_answering_garbage_fails_its_probe_not_the_run(world: World) -> None:
    garbage = _GarbageServer()
    try:
        world.create("good")
        bad = ServiceSpec.model_validate(spec_dict(garbage.port))
        world.commands.create("bad", bad)
        for _ in range(3):
            report = world.run()
        assert world.store.require("good").service.status is ServiceStatus.READY
        assert report.errors == []
        assert world.store.require("bad").service.status is not ServiceStatus.READY
    finally:
        garbage.close()
