"""Readiness probes: every replica at once, each over within its timeout, the phase bounded too.

A probe is a GET of the spec's readiness path (a POST with a JSON body when `post_data` is set)
with the spec's headers; only HTTP 200 counts as ready. Results carry deterministic `detail` text
("HTTP 503", "connection refused", "timed out after 5s") because it ends up in status messages,
and a message that changed with every run would turn a steady state into a write per run.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetkeeper.reconciler.plan import ProbeResult
from fleetkeeper.settings import MAX_PROBE_TIMEOUT_SECONDS

if TYPE_CHECKING:
    from collections.abc import Hashable, Sequence
    from datetime import datetime

    from fleetkeeper.spec import ReadinessProbe

_MAX_WORKERS = 32


@dataclass(frozen=True)
class ProbeTarget:
    key: Hashable
    base_url: str
    probe: ReadinessProbe


class _DeadlineConnection(http.client.HTTPConnection):
    """An HTTP connection with ONE deadline for the whole exchange.

    A socket timeout bounds each read, not the exchange: a replica that accepts and trickles a byte
    a second would hold a probe (and a worker of the run) forever. At the deadline a timer shuts the
    socket down, which ends whatever read is blocked on it.
    """

    def __init__(self, host: str, port: int | None, seconds: float) -> None:
        super().__init__(host, port, timeout=seconds)
        self._lock = threading.Lock()
        self.expired = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def connect(self) -> None:
        super().connect()
        with self._lock:
            if self.expired:
                raise TimeoutError("deadline passed while connecting")

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sock = self.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._timer.cancel()
        super().close()


def probe_one(target: ProbeTarget) -> ProbeResult:
    """One probe, over within `timeout_seconds` (plus scheduling noise) whatever the replica does."""
    probe = target.probe
    headers = dict(probe.headers)
    data: bytes | None = None
    if probe.post_data is not None:
        data = json.dumps(probe.post_data).encode()
        if not any(key.lower() == "content-type" for key in headers):
            headers["Content-Type"] = "application/json"
    # A spec stored before the limit existed may ask for more: it gets the longest a probe may take.
    seconds = min(probe.timeout_seconds, MAX_PROBE_TIMEOUT_SECONDS)
    timed_out = ProbeResult(target.base_url, False, f"timed out after {seconds}s")
    url = urllib.parse.urlsplit(target.base_url + probe.path)
    if url.scheme != "http" or not url.hostname:
        return ProbeResult(target.base_url, False, f"not an http URL: {target.base_url}")
    path = url.path + (f"?{url.query}" if url.query else "")
    # No proxy, no redirect: only HTTP 200 counts as ready, and the reconciler never follows a
    # replica to an address of its choosing. The status line is all a probe reads.
    connection = _DeadlineConnection(url.hostname, url.port, seconds)
    try:
        connection.request("POST" if data is not None else "GET", path, body=data, headers=headers)
        status = int(connection.getresponse().status)
    except Exception as exc:  # refused, reset, timed out, a bad status line (http.client.HTTPException)...
        # Whatever a replica answers, it is this replica's failed probe, never the run's crash.
        if connection.expired or isinstance(exc, TimeoutError):
            return timed_out
        if isinstance(exc, ConnectionRefusedError):
            return ProbeResult(target.base_url, False, "connection refused")
        return ProbeResult(target.base_url, False, type(exc).__name__)
    finally:
        connection.close()
    if connection.expired:
        return timed_out
    if status == 200:
        return ProbeResult(target.base_url, True, "HTTP 200")
    return ProbeResult(target.base_url, False, f"HTTP {status}")


def rotated(targets: Sequence[ProbeTarget], now: datetime) -> list[ProbeTarget]:
    """`targets` in a stable order, rotated by the run's minute: when the budget does not let every
    probe finish, the ones left without a verdict change from run to run (deterministic, no state)."""
    ordered = sorted(targets, key=lambda target: repr(target.key))
    if not ordered:
        return ordered
    start = (int(now.timestamp()) // 60 * _MAX_WORKERS) % len(ordered)
    return ordered[start:] + ordered[:start]


def probe_all(targets: Sequence[ProbeTarget], budget_seconds: float) -> dict[Hashable, ProbeResult]:
    """Probe in parallel, in the given order; every target gets a result.

    A probe still queued or running when the budget is spent is a failed probe ("no verdict"): a
    READY replica that cannot answer in time is not ready, and it must not stay READY for ever
    because its probe never got to run. Each probe is over within its own timeout, which the spec
    keeps well inside the budget (`spec.MAX_PROBE_TIMEOUT_SECONDS`).
    """
    if not targets:
        return {}
    pool = ThreadPoolExecutor(max_workers=min(_MAX_WORKERS, len(targets)), thread_name_prefix="probe")
    try:
        futures = {pool.submit(probe_one, target): target for target in targets}
        done, _ = wait(futures, timeout=budget_seconds)
        verdicts = {futures[future].key: future.result() for future in done}
    finally:
        # Stragglers end at their own deadline; the run does not wait for them.
        pool.shutdown(wait=False, cancel_futures=True)
    for target in targets:
        if target.key not in verdicts:
            detail = f"no verdict within the run's {budget_seconds:g}s probe budget"
            verdicts[target.key] = ProbeResult(target.base_url, False, detail)
    return verdicts
