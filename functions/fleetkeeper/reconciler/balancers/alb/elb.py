"""What every part of the alb balancer shares: its settings, ELB's client and reads, ELB's errors and
the shape of a forward action.

The parts build on each other, each module one concern (as Kubernetes' deployment controller spreads
its controller's methods over sync.go, rolling.go, progress.go): `ElbParts` here, target groups
(target_groups.py), the pools of load balancers (pools.py), routes (routes.py) and DNS records
(dns.py); balancer.py puts them together as `AlbBalancer` and places the endpoints.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper.reconciler.balancer import MANAGED_TAG, MANAGED_VALUE, SERVICE_TAG, STACK_TAG, UID_TAG, EndpointRefused

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from mypy_boto3_elbv2 import ElasticLoadBalancingv2Client
    from mypy_boto3_elbv2.type_defs import ActionTypeDef, TagTypeDef

    from fleetkeeper.settings import AlbSettings

TLS_POLICY = "ELBSecurityPolicy-TLS13-1-2-2021-06"
_NOT_FOUND = {"TargetGroupNotFound", "ListenerNotFound", "RuleNotFound"}

# A describe and the create after it are not atomic: a concurrent worker (another shard of the
# dispatcher's, a kick and the schedule) may take the same free rule priority or listener port in
# between. AWS then answers PriorityInUse / DuplicateListener, and the next free value is tried,
# this many times in all.
CONFLICT_ATTEMPTS = 5

# The quota errors of ELB and what they mean for the service (docs/DEPLOY.md, "Quotas"): shown in
# its status, never a run error (EndpointRefused).
QUOTA_MESSAGES = {
    "TooManyTargetGroups": (
        "the account's target groups in this Region are at their quota (3,000 by default, shared with "
        "Network Load Balancers): raise it in Service Quotas or delete unused target groups"
    ),
    "TooManyListeners": (
        "the stack's load balancer has as many listeners as its quota allows (50 by default): give the stack "
        "a domain name (one host rule per service instead of one listener) or raise the quota"
    ),
    "TooManyRules": (
        "the stack's load balancer has as many rules as its quota allows (100 by default, default rules not "
        "counted): raise the quota or deploy the service in another stack"
    ),
    "TooManyLoadBalancers": (
        "the account's Application Load Balancers in this Region are at their quota (50 by default): the "
        "stack makes one more per 50 services without a domain, per 99 with one; raise it in Service Quotas"
    ),
    "TooManyUniqueTargetGroupsPerLoadBalancer": (
        "the stack's load balancer routes to as many target groups as its quota allows (100 by default)"
    ),
    "TooManyTargets": (
        "the stack's load balancer has as many targets as its quota allows (1,000 by default): the service's "
        "new replicas run but get no requests until the quota is raised or other replicas go"
    ),
}


@dataclass
class ElbParts:
    """The settings of the stack's ALB (template.yaml's, through the environment) and ELB's reads
    that every part uses. `forget` is extended by each part that keeps what it learnt in a run."""

    settings: AlbSettings

    @property
    def elbv2(self) -> ElasticLoadBalancingv2Client:
        return aws.elbv2()

    def forget(self) -> None:
        """A new run begins: nothing is kept here."""

    def _listeners(self, balancer: str) -> Iterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {"LoadBalancerArn": balancer}
        while True:
            page = self.elbv2.describe_listeners(**kwargs)
            yield from (dict(listener) for listener in page.get("Listeners", []))
            marker = page.get("NextMarker")
            if not marker:
                return
            kwargs["Marker"] = marker

    def _rules(self, listener: str | None) -> Iterator[dict[str, Any]]:
        if not listener:
            return
        kwargs: dict[str, Any] = {"ListenerArn": listener}
        while True:
            page = self.elbv2.describe_rules(**kwargs)
            yield from (dict(rule) for rule in page.get("Rules", []))
            marker = page.get("NextMarker")
            if not marker:
                return
            kwargs["Marker"] = marker

    def _tags_of(self, arn: str) -> dict[str, str]:
        described = self.elbv2.describe_tags(ResourceArns=[arn]).get("TagDescriptions", [])
        return {str(t.get("Key")): str(t.get("Value", "")) for d in described for t in d.get("Tags", [])}

    @staticmethod
    def _delete(call: Any, **kwargs: Any) -> None:
        try:
            call(**kwargs)
        except ClientError as exc:
            if code(exc) not in _NOT_FOUND:
                raise


@contextmanager
def quota_refusals() -> Iterator[None]:
    """ELB's quota errors as EndpointRefused, with what they mean for the service."""
    try:
        yield
    except ClientError as exc:
        error = code(exc)
        if error in QUOTA_MESSAGES:
            raise EndpointRefused(f"{error}: {QUOTA_MESSAGES[error]}") from exc
        raise


def service_tags(service: str, uid: str, stack: str) -> list[TagTypeDef]:
    """The tags of what a service incarnation's endpoint is made of (target group, listener, rule)."""
    return [
        {"Key": MANAGED_TAG, "Value": MANAGED_VALUE},
        {"Key": STACK_TAG, "Value": stack},
        {"Key": SERVICE_TAG, "Value": service},
        {"Key": UID_TAG, "Value": uid},
    ]


def forward(group: str) -> ActionTypeDef:
    return {"Type": "forward", "TargetGroupArn": group}


def forward_weights(actions: Sequence[Any]) -> dict[str, int]:
    """The target groups a route's forward sends to, with their weights (a plain forward is weight 1;
    ELB describes one with both `TargetGroupArn` and a one-group `ForwardConfig`)."""
    for action in actions:
        if action.get("Type") != "forward":
            continue
        groups = (action.get("ForwardConfig") or {}).get("TargetGroups") or []
        if groups:
            return {str(g.get("TargetGroupArn")): int(g.get("Weight", 1)) for g in groups}
        if action.get("TargetGroupArn"):
            return {str(action["TargetGroupArn"]): 1}
    return {}


def forwards_to(actions: Sequence[Any], group: str) -> bool:
    for action in actions:
        if action.get("Type") != "forward":
            continue
        if action.get("TargetGroupArn") == group:
            return True
        groups = (action.get("ForwardConfig") or {}).get("TargetGroups") or []
        if any(g.get("TargetGroupArn") == group for g in groups):
            return True
    return False


def code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
