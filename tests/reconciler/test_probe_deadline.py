"""Readiness probes against replicas that misbehave at the socket: one deadline per probe, a verdict
for every replica each run, and an order that rotates so the same replicas are not starved.

Real servers on 127.0.0.1: one accepts and never answers, one trickles a byte at a time and never
finishes its status line. urllib's `timeout` bounds each socket read, not the request: against the
trickler a probe built on it never ends.
"""

from __future__ import annotations

import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.reconciler.plan import ProbeResult
from fleetkeeper.reconciler.probe import ProbeTarget, probe_all, probe_one, rotated
from fleetkeeper.settings import MAX_PROBE_TIMEOUT_SECONDS, MAX_READINESS_TIMEOUT_SECONDS
from fleetkeeper.spec.service import ReadinessProbe
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.support.handler_client import HandlerClient


class BadReplica:
    """Accepts every connection; then says nothing (`trickle=False`) or sends one byte of a status
    line that never ends every 0.1 s (`trickle=True`), until closed."""

    def __init__(self, *, trickle: bool) -> None:
        self.trickle = trickle
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.closed = threading.Event()
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections.append(connection)
            if self.trickle:
                threading.Thread(target=self._drip, args=(connection,), daemon=True).start()

    def _drip(self, connection: socket.socket) -> None:
        line = b"HTTP/1.1 200 OK" + b" " * 10_000
        for byte in line:
            if self.closed.wait(0.1):
                return
            try:
                connection.sendall(bytes([byte]))
            except OSError:
                return

    def close(self) -> None:
        self.closed.set()
        self.listener.close()
        for connection in self.connections:
            connection.close()


@pytest.fixture(params=[False, True], ids=["silent", "trickling"])
def bad_replica(request: pytest.FixtureRequest) -> Iterator[BadReplica]:
    replica = BadReplica(trickle=request.param)
    yield replica
    replica.close()


def _target(key: Any, base_url: str, timeout: int = 1) -> ProbeTarget:
    return ProbeTarget(key, base_url, ReadinessProbe(path="/health", timeout_seconds=timeout))


def _timed(target: ProbeTarget, limit: float) -> tuple[ProbeResult | None, float]:
    """probe_one in a thread, given at most `limit` seconds: (result or None if still running, seconds)."""
    out: list[ProbeResult] = []
    worker = threading.Thread(target=lambda: out.append(probe_one(target)), daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(limit)
    return (out[0] if out else None), time.monotonic() - started


def test_a_replica_that_never_finishes_answering_fails_its_probe_within_the_timeout(bad_replica: BadReplica) -> None:
    result, took = _timed(_target("r", bad_replica.url, timeout=1), limit=6)
    assert result == ProbeResult(bad_replica.url, False, "timed out after 1s"), f"still probing after {took:.1f}s"
    assert took < 1.8


def test_every_probe_gets_a_verdict_even_past_the_workers_and_the_budget(bad_replica: BadReplica) -> None:
    """More hanging replicas than probe workers: the phase ends at its budget and every replica has a
    (failed) verdict: a READY replica whose probe could not run must not stay READY."""
    targets = [_target(("u", i), bad_replica.url, timeout=2) for i in range(40)]
    started = time.monotonic()
    results = probe_all(targets, budget_seconds=1)
    assert time.monotonic() - started < 1.8
    assert set(results) == {target.key for target in targets}
    assert {r.ok for r in results.values()} == {False}
    assert {r.detail for r in results.values()} == {"no verdict within the run's 1s probe budget"}


def test_a_stored_spec_longer_than_the_limit_is_probed_within_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A version accepted before the limit existed is still bounded by it.

    The probe reads the limit from its module when it runs; lowered to 2 s here, so the test waits 2 s
    instead of the real 60 (what it shows is that a longer stored timeout is cut to the limit)."""
    from fleetkeeper.reconciler import probe
    from fleetkeeper.spec.service import stored_spec

    spec = stored_spec('{"service": {"readiness_probe": {"path": "/h", "timeout_seconds": 300}}, "run": "x"}')
    assert spec.service.readiness_probe.timeout_seconds == 300 > MAX_READINESS_TIMEOUT_SECONDS
    assert probe.MAX_READINESS_TIMEOUT_SECONDS == MAX_READINESS_TIMEOUT_SECONDS
    limit = 2
    monkeypatch.setattr(probe, "MAX_READINESS_TIMEOUT_SECONDS", limit)
    replica = BadReplica(trickle=False)
    try:
        target = ProbeTarget("r", replica.url, spec.service.readiness_probe)
        result, _ = _timed(target, limit=limit + 3)
        assert result == ProbeResult(replica.url, False, f"timed out after {limit}s")
    finally:
        replica.close()


def test_the_probe_order_rotates_from_run_to_run_and_is_deterministic() -> None:
    targets = [_target(("u", i), "http://127.0.0.1:9") for i in range(100)]
    run = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    first = [t.key for t in rotated(targets, run)]
    assert first == [t.key for t in rotated(list(reversed(targets)), run)]  # the input order does not matter
    assert sorted(first) == sorted(t.key for t in targets)
    starts = {rotated(targets, run + timedelta(minutes=m))[0].key for m in range(10)}
    assert len(starts) == 10  # ten runs, ten different replicas probed first
    # The replicas probed last in one run are among the first in a later one.
    last = {t.key for t in rotated(targets, run)[-32:]}
    assert any(last & {t.key for t in rotated(targets, run + timedelta(minutes=m))[:32]} for m in range(1, 4))


@pytest.mark.parametrize("timeout", [MAX_READINESS_TIMEOUT_SECONDS + 1, 300])
def test_a_probe_timeout_no_run_can_hold_is_a_400(api: HandlerClient, timeout: int) -> None:
    spec = hello_spec(service={"readiness_probe": {"path": "/health", "timeout_seconds": timeout}, "replicas": 1})
    answer = api.post("/v1/services", {"name": "slow", "spec": spec})
    assert answer.status == 400, answer.body
    assert "spec.service.readiness_probe.timeout_seconds" in str(answer.body), answer.body
    assert api.get("/v1/services/slow").status == 404
    for seconds in (MAX_PROBE_TIMEOUT_SECONDS, 20, MAX_READINESS_TIMEOUT_SECONDS):  # 20: a 400 before
        good = hello_spec(service={"readiness_probe": {"path": "/health", "timeout_seconds": seconds}, "replicas": 1})
        assert api.post("/v1/services", {"name": f"fine{seconds}", "spec": good}).status == 201


def test_a_probe_starts_no_thread_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The deadline is the socket's (each read and write waits only for what is left of it), not a
    timer thread per probe: starting one cost more CPU than the probe itself."""
    replica = BadReplica(trickle=False)
    started: list[threading.Thread] = []
    start = threading.Thread.start

    def counted(thread: threading.Thread) -> None:
        started.append(thread)
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", counted)
    try:
        assert probe_one(_target("r", replica.url, timeout=1)).detail == "timed out after 1s"
    finally:
        replica.close()
    assert started == []
