"""Readiness probes: every replica at once, each over within its timeout, the phase bounded too.

A probe is a GET of the spec's readiness path (a POST with a JSON body when `post_data` is set)
with the spec's headers; only HTTP 200 counts as ready. Redirects are followed as SkyPilot's probe
(python-requests) follows them, within the replica only: at most MAX_REDIRECTS hops, each to the
same host and port over http (a redirect anywhere else is a failed probe that says so), a 307 or 308
repeating the request with its body, a 301, 302 or 303 becoming a GET without one (requests'
`rebuild_method` and its purge of the body's headers). The whole chain keeps the probe's ONE deadline.
Results carry deterministic `detail` text ("HTTP 503", "connection refused", "timed out after 5s")
because it ends up in status messages, and a message that changed with every run would turn a steady
state into a write per run.
A 503 carrying a boot's failure code (`Fleetkeeper-Boot-Failure`, reconciler/replica_boot.py) gives
the result its typed `boot_failure`.
"""

from __future__ import annotations

import http.client
import socket
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetkeeper.reconciler.plan import ProbeResult
from fleetkeeper.reconciler.plan.failures import BOOT_FAILURES
from fleetkeeper.settings import MAX_READINESS_TIMEOUT_SECONDS

if TYPE_CHECKING:
    from collections.abc import Hashable, Sequence
    from datetime import datetime

    from _typeshed import ReadableBuffer, WriteableBuffer

    from fleetkeeper.spec.service import ReadinessProbe

_MAX_WORKERS = 32
# A replica whose boot failed for the environment answers 503 with its failure code in this header
# (reconciler/replica_boot.py, REPORT_HEADER): the only header a probe reads, and only on a 503.
_BOOT_FAILURE_HEADER = b"fleetkeeper-boot-failure:"
# Hops a probe follows: enough for a framework's `/health` -> `/health/` and a login-free rewrite or
# two; a loop ends here (python-requests, SkyPilot's client, stops at 30).
MAX_REDIRECTS = 10
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# A redirect that keeps the method and the body (RFC 9110 15.4.8, 15.4.9); the others become a GET.
_KEEPS_BODY = frozenset({307, 308})
_BODY_HEADERS = frozenset({"content-type", "content-length", "transfer-encoding"})


@dataclass(frozen=True)
class ProbeTarget:
    key: Hashable
    base_url: str
    probe: ReadinessProbe


class _DeadlineSocket(socket.socket):
    """A socket whose every send and receive ends by one deadline: each call may wait only for what
    is left of it, and none starts once it has passed."""

    deadline: float

    def _wait_at_most_what_is_left(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        self.settimeout(left)

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        self._wait_at_most_what_is_left()
        return super().recv_into(buffer, nbytes, flags)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._wait_at_most_what_is_left()
        return super().recv(bufsize, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        self._wait_at_most_what_is_left()
        super().sendall(data, flags)

    def send(self, data: ReadableBuffer, flags: int = 0) -> int:
        self._wait_at_most_what_is_left()
        return super().send(data, flags)


class _StatusResponse(http.client.HTTPResponse):
    location: str | None = None

    """A response read as http.client reads it, to the end of its headers (the same limits, the
    same errors, the same deadline), without making the headers an email message nobody reads:
    parsing them was a third of a probe's CPU. `begin` is http.client's own, less that parse (it
    uses http.client's `_read_status` and `_read_headers`, private but the same in 3.11 to 3.13);
    tests/reconciler/test_probe_status.py holds its verdicts to http.client's. On a 503 it keeps the
    boot-failure code a failed replica boot reports (`boot_failure`), if it is one it knows."""

    boot_failure: str | None = None

    def begin(self) -> None:
        if self.headers is not None:
            return
        while True:
            version, status, reason = self._read_status()
            if status != http.client.CONTINUE:
                break
            http.client._read_headers(self.fp)  # a 100 response's headers
        self.code = self.status = status
        self.reason = reason.strip()
        if version not in ("HTTP/1.0", "HTTP/0.9") and not version.startswith("HTTP/1."):
            raise http.client.UnknownProtocol(version)
        lines = http.client._read_headers(self.fp)
        if status == http.client.SERVICE_UNAVAILABLE:
            self.boot_failure = _boot_failure(lines)
        self.location = _location(lines) if status in _REDIRECTS else None
        self.headers = self.msg = http.client.HTTPMessage()
        self.will_close = True  # the probe closes the connection at once


def _boot_failure(lines: list[bytes]) -> str | None:
    for line in lines:
        if line[: len(_BOOT_FAILURE_HEADER)].lower() == _BOOT_FAILURE_HEADER:
            code = line[len(_BOOT_FAILURE_HEADER) :].strip().decode("ascii", "replace")
            return code if code in BOOT_FAILURES else None  # a closed set: nothing else becomes a code
    return None


def _location(lines: list[bytes]) -> str | None:
    """A redirect's Location header, the one header a probe reads."""
    for line in lines:
        name, _, value = line.decode("iso-8859-1").partition(":")
        if name.strip().lower() == "location":
            return value.strip()
    return None


class _DeadlineConnection(http.client.HTTPConnection):
    """An HTTP connection with ONE deadline for the whole exchange.

    A socket timeout bounds each read, not the exchange: a replica that accepts and trickles a byte
    a second would hold a probe (and a worker of the run) forever. So the connection's socket gives
    each read and write only what is left of the deadline; no timer thread per probe, which cost
    more CPU to start than the probe itself.
    """

    response_class = _StatusResponse

    def __init__(self, host: str, port: int | None, deadline: float) -> None:
        super().__init__(host, port, timeout=max(deadline - time.monotonic(), 0.001))
        self._deadline = deadline

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self._deadline

    def connect(self) -> None:
        # Connecting may take what is left too (a timeout of 0 would make the socket non-blocking).
        self.timeout = max(self._deadline - time.monotonic(), 0.001)
        super().connect()
        if self.expired:
            raise TimeoutError("deadline passed while connecting")
        plain = self.sock
        bounded = _DeadlineSocket(plain.family, plain.type, plain.proto, plain.detach())
        bounded.deadline = self._deadline
        self.sock = bounded


def probe_one(target: ProbeTarget) -> ProbeResult:
    """One probe, over within `timeout_seconds` (plus scheduling noise) whatever the replica does, its
    redirects within the replica included."""
    probe = target.probe
    method, headers, data = probe.request()
    # A spec stored before the limit existed may ask for more: it gets the longest a probe may take.
    seconds = min(probe.timeout_seconds, MAX_READINESS_TIMEOUT_SECONDS)
    url = urllib.parse.urlsplit(target.base_url + probe.path)
    if url.scheme != "http" or not url.hostname:
        return ProbeResult(target.base_url, False, f"not an http URL: {target.base_url}")
    replica = (url.hostname.lower(), url.port or 80)
    deadline = time.monotonic() + seconds
    for _ in range(MAX_REDIRECTS + 1):
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        answer = _exchange(target, url.hostname, url.port, method, path, data, headers, deadline, seconds)
        if isinstance(answer, ProbeResult):
            return answer
        status, location, boot_failure = answer
        if status == 200:
            return ProbeResult(target.base_url, True, "HTTP 200")
        if boot_failure is not None:
            return ProbeResult(target.base_url, False, f"HTTP {status} (boot failed: {boot_failure})", boot_failure)
        if status not in _REDIRECTS:
            return ProbeResult(target.base_url, False, f"HTTP {status}", http_status=status)
        if not location:
            return ProbeResult(target.base_url, False, f"HTTP {status} without a Location")
        url = urllib.parse.urlsplit(urllib.parse.urljoin(urllib.parse.urlunsplit(url), location))
        if url.scheme != "http" or not url.hostname or (url.hostname.lower(), url.port or 80) != replica:
            # Never to an address of the replica's choosing: the reconciler runs in the stack's VPC.
            where = f"{url.scheme}://{url.netloc}" if url.netloc else location
            return ProbeResult(
                target.base_url, False, f"HTTP {status} redirect to {where}, not followed: off the replica"
            )
        if status not in _KEEPS_BODY:
            method, data = "GET", None
            headers = {k: v for k, v in headers.items() if k.lower() not in _BODY_HEADERS}
    return ProbeResult(target.base_url, False, f"more than {MAX_REDIRECTS} redirects")


def _exchange(
    target: ProbeTarget,
    host: str,
    port: int | None,
    method: str,
    path: str,
    data: bytes | None,
    headers: dict[str, str],
    deadline: float,
    seconds: int,
) -> tuple[int, str | None, str | None] | ProbeResult:
    """One request and its status line (and Location, and a failed boot's code), or the failed probe it made."""
    timed_out = ProbeResult(target.base_url, False, f"timed out after {seconds}s")
    # No proxy; only the status line (and a redirect's Location) is read.
    connection = _DeadlineConnection(host, port, deadline)
    try:
        if connection.expired:
            return timed_out
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        status, location = int(response.status), getattr(response, "location", None)
        boot_failure = getattr(response, "boot_failure", None)
    except Exception as exc:  # refused, reset, timed out, a bad status line (http.client.HTTPException)...
        # Whatever a replica answers, it is this replica's failed probe, never the run's crash.
        if connection.expired or isinstance(exc, TimeoutError):
            return timed_out
        if isinstance(exc, ConnectionRefusedError):
            return ProbeResult(target.base_url, False, "connection refused")
        if isinstance(exc, ConnectionResetError):  # http.client's RemoteDisconnected is one too
            # Accepted, then closed with no status line: a proxy or relay in front of a port nothing
            # listens on yet (embedded mode's per-replica network namespaces), or an app that crashed.
            return ProbeResult(target.base_url, False, "connection closed before an answer")
        return ProbeResult(target.base_url, False, type(exc).__name__)
    finally:
        connection.close()
    if connection.expired:
        return timed_out
    return status, location, boot_failure


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

    A probe still queued or running when the budget is spent has `answered` False ("no verdict"). The
    run's own phase counts it a failed probe (a READY replica that cannot answer in time is not ready,
    and must not stay READY for ever because its probe never got to run); the long probes' phase, when
    it could not give a probe its whole timeout, leaves it to a run of its own (reconciler.run).
    Each probe is over within its own timeout, which the spec keeps inside an invocation
    (`settings.MAX_READINESS_TIMEOUT_SECONDS`); the shell gives the probes that do not fit the run's
    probe budget a phase of their own, off the run's critical path.
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
            verdicts[target.key] = ProbeResult(target.base_url, False, detail, answered=False)
    return verdicts
