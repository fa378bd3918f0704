"""The wake target on AWS: a Lambda function behind the stack's ALB (template.yaml's WakeFunction and
WakeTargetGroup, a target group of type `lambda`). A service's route forwards to it while the service
has no replica in its endpoint (fleetkeeper.wake.demand); for each request it records the demand on the
service item, kicks the reconciler through the kick queue (both coalesced), and answers 503 with
Retry-After.

Which service a request is for, from what the ALB passes (its Lambda event: the request's headers,
with the ALB's own `x-forwarded-port`):
- with a domain (FLEETKEEPER_DOMAIN_NAME): the Host header, NAME.<domain>;
- without one: the listener port (`x-forwarded-port`) on the load balancer that invoked it: each
  service has a listener of its own, which the reconciler tagged with the service's name. The load
  balancer is the one whose wake group the event names (`requestContext.elb.targetGroupArn`): the
  template's `fkwake-<stack>` is the template's ALB, a pool's `fkwake-<stack>-<n>` the pool
  `fk-<stack>-<n>` (docs/architecture/load-balancer-pools.md). Looked up per (pool, port) and
  process (DescribeLoadBalancers for a pool, DescribeListeners + DescribeTags) and kept for
  `_PORT_CACHE_SECONDS`, the pool's ARN too: a retired pool made again has another ARN.

Small and quick to start: it imports boto3 and the store's one write, nothing of the api or the
reconciler; outside the VPC (it calls DynamoDB, SQS and ELB only).
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper.kick import ReconcilerKick
from fleetkeeper.reconciler.balancer import (
    MANAGED_TAG,
    MANAGED_VALUE,
    SERVICE_TAG,
    pool_name,
    wake_group_pool,
)
from fleetkeeper.settings import ALB_ARN_ENV, DOMAIN_NAME_ENV, Settings, stack_id_of
from fleetkeeper.store.table import Table
from fleetkeeper.wake.sources import SourceBound, source_of
from fleetkeeper.wake.target import DemandRecorder, waking_body, waking_headers

if TYPE_CHECKING:
    from collections.abc import Mapping

logger = logging.getLogger(__name__)
logger.setLevel(logging.INFO)

_PORT_CACHE_SECONDS = 60.0
_ports: dict[tuple[int, int], tuple[str | None, float]] = {}
# Pool number -> (its load balancer's ARN, until when that is trusted): a pool the dispatcher
# retired and the reconciler made again under the same name has another ARN, so the answer is kept
# no longer than a port's.
_pools: dict[int, tuple[str | None, float]] = {}
_recorder: DemandRecorder | None = None
# Requests one client may have recorded, per process (fleetkeeper.wake.sources).
_sources = SourceBound()


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    headers = {str(k).lower(): str(v) for k, v in (event.get("headers") or {}).items()}
    # Before any lookup or write: a client over its bound costs nothing but this answer.
    source = source_of(headers)
    if not _sources.admit(source):
        logger.warning("source %s: over its bound of requests to the wake target, answered 429", source)
        return _response(
            429,
            '{"error": {"code": "too_many_requests", "message": "too many requests from this client for '
            'services with no replica; retry after Retry-After", "details": []}}',
            {"Content-Type": "application/json", "Retry-After": str(_sources.retry_after(source))},
        )
    group = str(((event.get("requestContext") or {}).get("elb") or {}).get("targetGroupArn") or "")
    service = service_of(headers, os.environ, group)
    if service is None:
        return _response(
            404,
            '{"error": {"code": "no_such_service", "message": "no service has this endpoint", "details": []}}',
            {"Content-Type": "application/json"},
        )
    try:
        recorder()(service)
    except Exception:
        # The client still gets its 503 and Retry-After; its retry records the demand.
        logger.exception("service %s: could not record the demand", service)
    return _response(503, waking_body(service), waking_headers())


def recorder() -> DemandRecorder:
    """One per process (a warm Lambda instance keeps its memo of recent demands)."""
    global _recorder
    if _recorder is None:
        settings = Settings.from_env(os.environ)
        kick = ReconcilerKick.from_settings(settings)
        _recorder = DemandRecorder(Table(settings.table_name), lambda name: kick(name))
    return _recorder


def service_of(headers: Mapping[str, str], environ: Mapping[str, str], target_group: str = "") -> str | None:
    """The service a request is for (None: none of this stack's); `target_group`: the wake group the
    load balancer invoked the function for (its event's `requestContext.elb.targetGroupArn`)."""
    domain = (environ.get(DOMAIN_NAME_ENV) or "").strip(".").lower()
    if domain:
        host = headers.get("host", "").split(":", 1)[0].strip().rstrip(".").lower()
        suffix = "." + domain
        if not host.endswith(suffix):
            return None
        name = host[: -len(suffix)]
        return name if name and "." not in name else None
    try:
        port = int(headers.get("x-forwarded-port", ""))
    except ValueError:
        return None
    stack = stack_id_of(environ)
    group_name = target_group.split(":targetgroup/", 1)[-1].split("/", 1)[0] if target_group else ""
    # Only this stack's wake groups may invoke the function (its permissions' SourceArn): a group
    # that is not a pool's is the template's.
    pool = (wake_group_pool(group_name, stack) if group_name else None) or 0
    return _service_on_port(port, pool, stack, environ.get(ALB_ARN_ENV, ""))


def _service_on_port(port: int, pool: int, stack: str, alb_arn: str) -> str | None:
    cached = _ports.get((pool, port))
    now = time.monotonic()
    if cached is not None and cached[1] > now:
        return cached[0]
    balancer = alb_arn if pool == 0 else _pool_arn(pool, stack, now)
    try:
        name = _look_up_port(port, balancer) if balancer else None
    except ClientError as exc:
        if _code(exc) != "LoadBalancerNotFound" or pool == 0:
            raise
        # The pool went since its ARN was looked up (retired, perhaps made again): look again.
        _pools.pop(pool, None)
        balancer = _pool_arn(pool, stack, now)
        name = _look_up_port(port, balancer) if balancer else None
    _ports[(pool, port)] = (name, now + _PORT_CACHE_SECONDS)
    return name


def _pool_arn(pool: int, stack: str, now: float) -> str | None:
    """The ARN of the stack's load balancer pool `pool` (>= 1), by its deterministic name."""
    cached = _pools.get(pool)
    if cached is not None and cached[1] > now:
        return cached[0]
    try:
        found = aws.elbv2().describe_load_balancers(Names=[pool_name(stack, pool)])["LoadBalancers"]
    except ClientError as exc:
        if _code(exc) != "LoadBalancerNotFound":
            raise
        found = []
    arn = str(found[0]["LoadBalancerArn"]) if found else None
    _pools[pool] = (arn, now + _PORT_CACHE_SECONDS)
    return arn


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _look_up_port(port: int, alb_arn: str) -> str | None:
    """The service whose listener is on `port` of the stack's ALB: its fleetkeeper:service tag."""
    elbv2 = aws.elbv2()
    kwargs: dict[str, Any] = {"LoadBalancerArn": alb_arn}
    listener_arn: str | None = None
    while listener_arn is None:
        page = elbv2.describe_listeners(**kwargs)
        listener_arn = next(
            (str(item["ListenerArn"]) for item in page.get("Listeners", []) if int(item.get("Port", 0)) == port),
            None,
        )
        marker = page.get("NextMarker")
        if listener_arn is None and not marker:
            return None
        kwargs["Marker"] = marker
    descriptions = elbv2.describe_tags(ResourceArns=[listener_arn]).get("TagDescriptions", [])
    tags = {tag["Key"]: tag.get("Value", "") for d in descriptions for tag in d.get("Tags", [])}
    if tags.get(MANAGED_TAG) != MANAGED_VALUE:
        return None  # not a listener the reconciler made
    return tags.get(SERVICE_TAG) or None


def _response(status: int, body: str, headers: dict[str, str]) -> dict[str, Any]:
    """An ALB Lambda target's answer (single-value headers: the target group's default)."""
    reasons = {404: "Not Found", 429: "Too Many Requests", 503: "Service Unavailable"}
    return {
        "statusCode": status,
        "statusDescription": f"{status} {reasons.get(status, '')}".strip(),
        "isBase64Encoded": False,
        "headers": headers,
        "body": body,
    }


def reset() -> None:
    """Forget the process's caches (tests)."""
    global _recorder, _sources
    _recorder = None
    _sources = SourceBound()
    _ports.clear()
    _pools.clear()
