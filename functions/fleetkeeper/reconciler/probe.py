"""Readiness probes: every replica at once, each bounded by its timeout, the phase bounded too.

A probe is a GET of the spec's readiness path (a POST with a JSON body when `post_data` is set)
with the spec's headers; only HTTP 200 counts as ready. Results carry deterministic `detail` text
("HTTP 503", "connection refused", "timed out after 5s") because it ends up in status messages,
and a message that changed with every run would turn a steady state into a write per run.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleetkeeper.reconciler.plan import ProbeResult

if TYPE_CHECKING:
    from collections.abc import Hashable, Sequence

    from fleetkeeper.spec import ReadinessProbe

_MAX_WORKERS = 32


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer other than 200, not a hop: only HTTP 200 counts as ready, and the
    reconciler never follows a replica to an address of its choosing."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


# Proxies never apply: replicas are reached on their private address (127.0.0.1 in tests).
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


@dataclass(frozen=True)
class ProbeTarget:
    key: Hashable
    base_url: str
    probe: ReadinessProbe


def probe_one(target: ProbeTarget) -> ProbeResult:
    probe = target.probe
    headers = dict(probe.headers)
    data: bytes | None = None
    if probe.post_data is not None:
        data = json.dumps(probe.post_data).encode()
        if not any(key.lower() == "content-type" for key in headers):
            headers["Content-Type"] = "application/json"
    request = urllib.request.Request(
        target.base_url + probe.path, data=data, headers=headers, method="POST" if data is not None else "GET"
    )
    try:
        with _OPENER.open(request, timeout=probe.timeout_seconds) as response:
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except TimeoutError:
        return ProbeResult(target.base_url, False, f"timed out after {probe.timeout_seconds}s")
    except urllib.error.URLError as exc:
        return ProbeResult(target.base_url, False, _reason(exc.reason, probe.timeout_seconds))
    except Exception as exc:  # reset mid-response, a bad status line (http.client.HTTPException)...
        # Whatever a replica answers, it is this replica's failed probe, never the run's crash.
        return ProbeResult(target.base_url, False, type(exc).__name__)
    if status == 200:
        return ProbeResult(target.base_url, True, "HTTP 200")
    return ProbeResult(target.base_url, False, f"HTTP {status}")


def _reason(reason: object, timeout: int) -> str:
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, TimeoutError):
        return f"timed out after {timeout}s"
    if isinstance(reason, OSError):
        return type(reason).__name__
    return str(reason)


def probe_all(targets: Sequence[ProbeTarget], budget_seconds: float) -> dict[Hashable, ProbeResult]:
    """Probe in parallel; a probe still running when the budget is spent gives no result (no verdict)."""
    if not targets:
        return {}
    pool = ThreadPoolExecutor(max_workers=min(_MAX_WORKERS, len(targets)), thread_name_prefix="probe")
    try:
        futures = {pool.submit(probe_one, target): target.key for target in targets}
        done, _ = wait(futures, timeout=budget_seconds)
        # probe_one turns every error into a failed result, so result() does not raise.
        return {futures[future]: future.result() for future in done}
    finally:
        # Stragglers are bounded by their own timeout; the run does not wait for them.
        pool.shutdown(wait=False, cancel_futures=True)
