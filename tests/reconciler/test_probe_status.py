"""A probe reads a response's status and headers without parsing the headers: its verdict on every
kind of answer, well-formed or not, is the one http.client's own response gives."""

from __future__ import annotations

import http.client
import socket
import threading
from typing import TYPE_CHECKING

import pytest

from fleetkeeper.reconciler import probe
from fleetkeeper.reconciler.plan import ProbeResult
from fleetkeeper.reconciler.probe import ProbeTarget, probe_one
from fleetkeeper.spec.service import ReadinessProbe

if TYPE_CHECKING:
    from collections.abc import Iterator

_HEADERS_ONLY = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: y\r\n" % n for n in range(101)) + b"\r\n"

ANSWERS = {
    "ok": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok",
    "http 1.0": b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\n",
    "unavailable": b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n",
    "continue, then ok": b"HTTP/1.1 100 Continue\r\nX: y\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
    "headers cut short": b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n",
    "header folded": b"HTTP/1.1 200 OK\r\nX: a\r\n  b\r\nbroken header line\r\n\r\n",
    "too many headers": _HEADERS_ONLY,
    "header too long": b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000 + b"\r\n\r\n",
    "status too long": b"HTTP/1.1 200 " + b"O" * 70_000 + b"\r\n\r\n",
    "bad status line": b"garbage\r\n\r\n",
    "bad status code": b"HTTP/1.1 2x0 OK\r\n\r\n",
    "unknown protocol": b"HTTP/2.0 200 OK\r\n\r\n",
    "no answer": b"",
}


class CannedReplica:
    """Answers every connection with `answer`, then closes it (or, `hang`, keeps it open)."""

    def __init__(self, answer: bytes, *, hang: bool = False) -> None:
        self.answer, self.hang = answer, hang
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.open: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = connection.recv(65536)
                if not chunk:
                    break
                request += chunk
            connection.sendall(self.answer)
            if self.hang:
                self.open.append(connection)
            else:
                connection.close()

    def close(self) -> None:
        self.listener.close()
        for connection in self.open:
            connection.close()


def _verdicts(replica: CannedReplica, monkeypatch: pytest.MonkeyPatch, timeout: int = 2) -> tuple[ProbeResult, ...]:
    """The probe's verdict, then http.client's own response's verdict, on the same answer."""
    target = ProbeTarget("r", replica.url, ReadinessProbe(path="/health", timeout_seconds=timeout))
    ours = probe_one(target)
    with monkeypatch.context() as patch:
        patch.setattr(probe._DeadlineConnection, "response_class", http.client.HTTPResponse)
        theirs = probe_one(target)
    return ours, theirs


@pytest.fixture(params=sorted(ANSWERS))
def replica(request: pytest.FixtureRequest) -> Iterator[CannedReplica]:
    answering = CannedReplica(ANSWERS[request.param])
    yield answering
    answering.close()


def test_every_answer_gets_the_verdict_http_client_gives(
    replica: CannedReplica, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours, theirs = _verdicts(replica, monkeypatch)
    assert ours == theirs


def test_the_verdicts_are_the_expected_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """A few spelled out, so that the comparison above is not between two wrong answers."""
    expected = {
        "ok": (True, "HTTP 200"),
        "continue, then ok": (True, "HTTP 200"),
        "unavailable": (False, "HTTP 503"),
        "too many headers": (False, "HTTPException"),
        "header too long": (False, "LineTooLong"),
        "bad status line": (False, "BadStatusLine"),
        "no answer": (False, "connection closed before an answer"),
        "unknown protocol": (False, "UnknownProtocol"),
    }
    for name, (ok, detail) in expected.items():
        replica = CannedReplica(ANSWERS[name])
        try:
            ours, _ = _verdicts(replica, monkeypatch)
        finally:
            replica.close()
        assert (ours.ok, ours.detail) == (ok, detail), name


def test_a_replica_that_never_ends_its_headers_times_out_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """The status line alone is not an answer: the headers are read to their end, within the deadline."""
    replica = CannedReplica(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n", hang=True)
    try:
        ours, theirs = _verdicts(replica, monkeypatch, timeout=1)
    finally:
        replica.close()
    assert ours == theirs == ProbeResult(replica.url, False, "timed out after 1s")
