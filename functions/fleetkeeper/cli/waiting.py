"""`--wait`: poll a service until it is READY at the version we asked for, or gone.

A service's status only counts once the reconciler has acted on our write (observed_generation at
least the generation our write produced): right after an update the service still says READY, for
the old version. Done: READY with the target's replicas ready at the target version (or, for
`down`, the service no longer exists). Failed: FAILED, or the target moved away from our version
(the circuit breaker rolled it back, or someone else changed it), or the timeout passed.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import quote

from fleetkeeper.cli.http import RETRYABLE, ApiError, Unreachable
from fleetkeeper.model import ready_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from fleetkeeper.cli.http import ApiClient

EXIT_OK = 0
EXIT_FAILED = 1


@dataclass(frozen=True)
class Goal:
    name: str
    uid: str
    generation: int
    target_version: int | None  # None: wait for the service to be gone (`down`)


@dataclass(frozen=True)
class Outcome:
    code: int
    message: str
    view: dict[str, Any] | None


def desired_replicas(view: dict[str, Any]) -> int:
    """The replicas the target version runs: the (autoscaled) target plus `num_overprovision`, as the
    reconciler counts them (without the overprovisioned ones, a service running them read "2/1 ready")."""
    service = (view.get("spec") or {}).get("service") or {}
    policy = service.get("replica_policy") or {}
    extra = int(policy.get("num_overprovision") or 0)
    scaling = view.get("autoscaling")
    if isinstance(scaling, dict) and isinstance(scaling.get("target_replicas"), int):
        return int(scaling["target_replicas"]) + extra  # the autoscaled target (a GET's view)
    if service.get("replicas") is not None:
        return int(service["replicas"]) + extra
    return int(policy.get("min_replicas", 1)) + extra


def ready_at(view: dict[str, Any], version: int) -> int:
    return sum(1 for r in view.get("replicas", []) if r.get("status") == "READY" and r.get("version") == version)


def old_serving(view: dict[str, Any], version: int) -> int:
    """READY replicas of other versions than `version`: during an update, the old ones still serving."""
    return sum(1 for r in view.get("replicas", []) if r.get("status") == "READY" and r.get("version") != version)


def readiness(view: dict[str, Any], version: int) -> str:
    """ "2/3 ready", or during an update "0/2 new ready, 2 old serving" (an update in progress is not an
    outage): counted from the replicas, so it agrees with what they say."""
    wanted, ready, old = desired_replicas(view), ready_at(view, version), old_serving(view, version)
    return f"{ready}/{wanted} new ready, {old} old serving" if old else ready_of(ready, wanted)


# The reconciler's status messages open with its own count as of its last run ("0/2 ready; ...",
# "updating to version 2 (rolling): 0/2 new ready, 2 old replica(s) left; ..."); next to a count made
# from the replicas (fresher), only what follows it is shown.
_COUNT_PREFIX = re.compile(
    r"^(?:\d+/\d+ ready(?:, \d+ more being removed)?"
    r"|updating to version \d+ \([a-z_]+\): \d+/\d+ new ready, \d+ old replica\(s\) left)(?:; |$)"
)


def without_count(message: str) -> str:
    return _COUNT_PREFIX.sub("", message, count=1)


def _waiting_on(view: dict[str, Any], version: int) -> str:
    """What the target version's replicas that are not READY are doing, from their own records."""
    parts = []
    for replica in view.get("replicas", []):
        if replica.get("version") != version or replica.get("status") == "READY":
            continue
        said = replica.get("status_message") or ""
        parts.append(f"replica {replica.get('replica_id')} {replica.get('status')}" + (f": {said}" if said else ""))
    return "; ".join(parts)


def judge(goal: Goal, view: dict[str, Any] | None) -> Outcome | None:
    """The outcome this view settles, or None to keep waiting. `view` None: the service is gone."""
    if goal.target_version is None:
        if view is None or view.get("uid") != goal.uid:
            return Outcome(EXIT_OK, f"{goal.name} is gone", None)
        return None
    if view is None or view.get("uid") != goal.uid:
        return Outcome(EXIT_FAILED, f"{goal.name} was deleted while waiting for it", view)
    if int(view.get("observed_generation", 0)) < goal.generation:
        return None  # the reconciler has not acted on our write yet
    target = int(view.get("target_version", 0))
    message = view.get("status_message") or ""
    if target < goal.target_version:
        return Outcome(EXIT_FAILED, f"{goal.name} was rolled back to v{target}: {message}", view)
    if target > goal.target_version:
        return Outcome(EXIT_FAILED, f"{goal.name} moved on to v{target} (another change) while waiting", view)
    if view.get("status") == "FAILED":
        return Outcome(EXIT_FAILED, f"{goal.name} FAILED: {message}", view)
    wanted = desired_replicas(view)
    ready = ready_at(view, target)
    if view.get("status") == "READY" and ready >= wanted:
        endpoint = f" at {view['endpoint']}" if view.get("endpoint") else ""
        return Outcome(EXIT_OK, f"{goal.name} is READY{endpoint} at v{target} ({ready}/{wanted} replicas ready)", view)
    if wanted == 0 and view.get("status") in {"READY", "NO_REPLICA"}:
        return Outcome(EXIT_OK, f"{goal.name} is at v{target} with no replicas, as its spec asks", view)
    return None


def progress_line(goal: Goal, view: dict[str, Any] | None) -> str:
    if view is None:
        return f"{goal.name}: gone"
    target = int(view.get("target_version", 0))
    status = view.get("status", "?")
    message = view.get("status_message") or ""
    if goal.target_version is None:
        return f"{goal.name}: {status}, {len(view.get('replicas', []))} replica(s) left - {message}"
    if view.get("uid") == goal.uid and int(view.get("observed_generation", 0)) < goal.generation:
        # The status is still the one of before our write: never show it as the new version's.
        return f"{goal.name}: v{goal.target_version} submitted; waiting for the reconciler to act on it"
    moving = old_serving(view, target) > 0 or status == "UPDATING"
    head = f"{goal.name}: {status} {'to ' if moving else ''}v{target}: {readiness(view, target)}"
    # What is pending, from the replicas' own records (the status message may be a run older); the
    # message itself when it is about the service (FAILED, or no replica of the version yet).
    has_replicas = any(r.get("version") == target for r in view.get("replicas", []))
    detail = without_count(message) if status == "FAILED" or not has_replicas else _waiting_on(view, target)
    return f"{head} - {detail}" if detail else head


class Progress:
    """On a terminal: one line redrawn in place. Otherwise (CI logs): a plain line per change."""

    def __init__(self, stream: IO[str] | None = None, *, tty: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self._last = ""
        self._drawn = False

    def show(self, line: str, elapsed: float) -> None:
        if self.tty:
            self.stream.write(f"\r\x1b[K{line} [{elapsed:.0f}s]")
            self._drawn = True
        elif line != self._last:
            self.stream.write(f"[{elapsed:5.0f}s] {line}\n")
        self._last = line
        self.stream.flush()

    def done(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\n")
            self.stream.flush()
        self._drawn = False


def wait_for(
    client: ApiClient,
    goal: Goal,
    *,
    timeout: float,
    progress: Progress,
    interval: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    started = clock()
    view: dict[str, Any] | None = None
    try:
        while True:
            answered = True
            try:
                view = client.request("GET", f"/v1/services/{quote(goal.name, safe='')}").body
            except ApiError as exc:
                if exc.status in RETRYABLE:  # throttled or a transient gateway error: not a verdict either
                    answered = False
                    progress.show(f"{goal.name}: the API answered {exc.status}: {exc.message}", clock() - started)
                elif exc.status == 404:
                    view = None  # gone
                else:
                    raise
            except Unreachable as exc:  # a blip while waiting is not a verdict; the timeout is
                answered = False
                progress.show(f"{goal.name}: {exc}", clock() - started)
            if answered:
                progress.show(progress_line(goal, view), clock() - started)
                outcome = judge(goal, view)
                if outcome is not None:
                    return outcome
            if clock() - started >= timeout:
                what = "to be gone" if goal.target_version is None else f"to be READY at v{goal.target_version}"
                last = progress_line(goal, view) if view is not None else "no answer"
                return Outcome(
                    EXIT_FAILED, f"timed out after {timeout:g}s waiting for {goal.name} {what} ({last})", view
                )
            sleep(interval)
    finally:
        progress.done()
