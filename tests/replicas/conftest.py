"""Fixtures the replicas' tests share: an in-memory AWS and a fake instance metadata service."""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator


class FakeImds(BaseHTTPRequestHandler):
    """IMDSv2: a token first, then the region and the role's credentials with it."""

    def do_PUT(self) -> None:
        self._send(b"imds-token" if self.path == "/latest/api/token" else None)

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") != "imds-token":
            self._send(None, 401)
            return
        answers = {
            "/latest/meta-data/placement/region": b"us-east-1",
            "/latest/meta-data/iam/security-credentials/": b"fleetkeeper-replica",
            "/latest/meta-data/iam/security-credentials/fleetkeeper-replica": json.dumps(
                {"AccessKeyId": "local", "SecretAccessKey": "local", "Token": "local"}
            ).encode(),
        }
        self._send(answers.get(self.path))

    def _send(self, body: bytes | None, status: int = 200) -> None:
        self.send_response(status if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"")

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def endpoints() -> Iterator[tuple[str, str]]:
    """(in-memory AWS, fake IMDS) on 127.0.0.1."""
    from moto.server import ThreadedMotoServer

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    imds = ThreadingHTTPServer(("127.0.0.1", 0), FakeImds)
    threading.Thread(target=imds.serve_forever, daemon=True).start()
    host, port = moto.get_host_and_port()
    # moto's backends belong to the process, not to the server: start each test from an empty AWS.
    reset = urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")
    urllib.request.urlopen(reset, timeout=10).close()
    try:
        yield f"http://{host}:{port}", f"http://127.0.0.1:{imds.server_address[1]}"
    finally:
        imds.shutdown()
        moto.stop()
