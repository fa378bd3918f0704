"""The load balancer's own health check of a service's targets, derived from its readiness probe.

The reconciler's readiness probe decides when a replica is READY and registered; the ALB's health
check decides, once it is registered, whether the ALB sends it requests. An ALB health check can
express less than a SkyPilot probe (CreateTargetGroup / ModifyTargetGroup, Elastic Load Balancing
API reference):

- a GET of `HealthCheckPath`, at most 1,024 characters; no headers, no body (a probe's `headers`
  and `post_data` cannot be sent), nothing substituted (a `$NAME` would be sent as written);
- `HealthCheckTimeoutSeconds` 2-120 and `HealthCheckIntervalSeconds` 5-300, the interval greater
  than the timeout ("Health check interval must be greater than the timeout", a ValidationError);
- `Matcher.HttpCode` between 200 and 499 for an ALB, a list or a range.

So the check is the probe's own when the ALB can send it as the reconciler does: its path, with the
spec's `envs` filled in, fits 1,024 characters, names no other variable (a secret's value is never
put in the load balancer's configuration, which anyone allowed DescribeTargetGroups can read), and
the probe sends no headers and no body. Otherwise it is the fallback, "the app answers": a GET of
`/` that any status 200-499 passes. A replica only gets that far once the reconciler's own probe
(with its headers, body and secrets) said READY, so the fallback only has to notice an app that
stopped answering, and that it does (a refused connection, a timeout or a 5xx fail it).

Timing: the timeout is the probe's (clamped to 2-120 s: a probe may wait longer than an ALB check
can), the interval one second more (at least 5 s): a target is healthy two intervals after it
is registered, as early as the ALB allows, and a slow app never has two checks in flight.

During a rollout the target group holds two versions' targets, and its one health check applies to
all of them: a new version's path (which the old one may not serve) would turn the old replicas
unhealthy, and with every target unhealthy the ALB fails open. So the check of a target group is
`shared_check` of the versions registered in it: their own check when they all have the same one,
else the fallback, which any version passes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from fleetkeeper.spec.service import ReadinessProbe

PATH_MAX = 1024  # HealthCheckPath: 1-1,024 characters
TIMEOUT_RANGE = (2, 120)  # HealthCheckTimeoutSeconds
INTERVAL_RANGE = (5, 300)  # HealthCheckIntervalSeconds, and greater than the timeout
FALLBACK_PATH = "/"
FALLBACK_CODES = "200-499"  # every code an ALB matcher accepts: "the app answers"
PROBE_CODES = "200"  # SkyPilot's probe passes on 200 only


@dataclass(frozen=True)
class HealthCheck:
    path: str
    codes: str  # the target group's Matcher.HttpCode
    timeout_seconds: int
    interval_seconds: int

    @property
    def fallback(self) -> bool:
        return self.codes == FALLBACK_CODES


def timing(probe_timeout_seconds: int) -> tuple[int, int]:
    """(timeout, interval) of the ALB check for a probe with this timeout, within the ALB's ranges."""
    timeout = min(max(probe_timeout_seconds, TIMEOUT_RANGE[0]), TIMEOUT_RANGE[1])
    interval = min(max(timeout + 1, INTERVAL_RANGE[0]), INTERVAL_RANGE[1])
    return timeout, interval


def alb_check(probe: ReadinessProbe, envs: Mapping[str, str]) -> HealthCheck:
    """The ALB health check of one version: its probe's when the ALB can send that, else the fallback."""
    timeout, interval = timing(probe.timeout_seconds)
    resolved = probe.resolved(envs)
    sendable = (
        len(resolved.path) <= PATH_MAX
        and not resolved.variables()
        and not resolved.unsendable_by_alb()  # headers, post_data (spec.service.PROBE_OPTIONS)
    )
    if sendable:
        return HealthCheck(resolved.path, PROBE_CODES, timeout, interval)
    return HealthCheck(FALLBACK_PATH, FALLBACK_CODES, timeout, interval)


def shared_check(checks: Iterable[HealthCheck]) -> HealthCheck | None:
    """The one check every one of these versions' targets passes: theirs when they agree, else the
    fallback with the longest timing among them. None: no version given."""
    distinct = set(checks)
    if not distinct:
        return None
    if len(distinct) == 1:
        return next(iter(distinct))
    timeout = max(check.timeout_seconds for check in distinct)
    interval = max(check.interval_seconds for check in distinct)
    return HealthCheck(FALLBACK_PATH, FALLBACK_CODES, timeout, interval)
