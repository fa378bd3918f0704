"""Elastic Load Balancing (v2) as AWS runs it, over moto's elbv2.

Always on:

- connection draining: a deregistered target stays `draining` (Reason
  `Target.DeregistrationInProgress`) for its target group's `deregistration_delay.timeout_seconds`
  on the layer's clock, then `unused` / `Target.NotRegistered`. moto forgets it at once, which would
  make every drain look finished before it started. (On AWS a target leaves `draining` early once
  it has no request in flight; the layer has no requests, so it drains for the whole delay.)
- `DeregisterTargets` of a target that is not registered succeeds and does nothing (AWS answers
  200; moto raises `InvalidTarget`), so a repeated deregistration is idempotent as on AWS.

Both through moto's own state: a draining target sits in the target group's `terminated_targets`,
which moto reports as `draining`, until the layer moves it to `deregistered_targets`.

Also always on, each where moto is kinder than AWS:

- health checks: `HealthCheckIntervalSeconds` must be greater than `HealthCheckTimeoutSeconds`
  (AWS: ValidationError "Health check interval must be greater than the timeout"), and an ALB's
  `Matcher.HttpCode` lies within 200-499 (the ranges of each are the model's, model_validation);
- quotas ("Quotas for your Application Load Balancers"): rules per load balancer, not counting
  default rules (100: TooManyRules), listeners per load balancer (50: TooManyListeners), target
  groups per Region (3,000: TooManyTargetGroups), targets per load balancer (1,000: TooManyTargets,
  each registration of a target in a target group the load balancer routes to counts). A test may
  lower them (`layer.quotas = ElbQuotas(...)`) to reach them quickly;
- Availability Zones: a registered instance in a zone none of the load balancer's subnets covers
  is `unused` / `Target.NotInUse` (the ALB never sends it a request), as is every target of a
  target group no listener or rule forwards to;
- DescribeTargetHealth naming an instance EC2 does not know fails whole with `InvalidTarget`
  (moto reports it `unused`);
- CreateListener on a port the load balancer already listens on is `DuplicateListener` (moto
  compares the port with the listeners' ARNs, so never refuses one).

Races, scheduled: `layer.before(operation, action)` runs `action()` once, just before the next
`operation` reaches moto: another worker's CreateRule between a run's DescribeRules and its own.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

from tests.strict_aws.wire import Call, Response, request_id

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.strict_aws.core import StrictAws

_TARGET_ID = re.compile(r"^Targets\.member\.(\d+)\.Id$")
_EMPTY_DEREGISTER = (
    b'<DeregisterTargetsResponse xmlns="http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/">'
    b"<DeregisterTargetsResult/><ResponseMetadata><RequestId>strict-aws</RequestId></ResponseMetadata>"
    b"</DeregisterTargetsResponse>"
)


@dataclass(frozen=True)
class ElbQuotas:
    """AWS's default quotas for Application Load Balancers (docs: load-balancer-limits.html)."""

    rules_per_load_balancer: int = 100  # not counting default rules
    listeners_per_load_balancer: int = 50
    target_groups_per_region: int = 3000
    targets_per_load_balancer: int = 1000


class Elbv2Layer:
    def __init__(self, strict: StrictAws) -> None:
        self.strict = strict
        # (target group arn, target id) -> layer-clock time its drain ends
        self.draining: dict[tuple[str, str], float] = {}
        self.lock = threading.RLock()
        self.quotas = ElbQuotas()
        self._before: dict[str, list[Callable[[], object]]] = {}
        self._acting = False

    def before(self, operation: str, action: Callable[[], object]) -> None:
        """Run `action()` once, just before the next `operation` reaches moto (a concurrent worker's call)."""
        self._before.setdefault(operation, []).append(action)

    @staticmethod
    def _backend(region: str) -> Any:
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.elbv2.models import elbv2_backends

        return elbv2_backends[DEFAULT_ACCOUNT_ID][region]

    def send(self, call: Call) -> Response:
        pending = self._before.get(call.operation)
        if pending and not self._acting:
            # Outside the lock: the action's own calls pass through this layer (and trigger no action).
            self._acting = True
            try:
                pending.pop(0)()
            finally:
                self._acting = False
        with self.lock:
            backend = self._backend(call.region)
            self._finish_drains(backend)
            refused = self._refusal(call, backend)
            if refused is not None:
                return refused
            if call.operation == "DeregisterTargets":
                return self._deregister(call, backend)
            if call.operation == "DescribeTargetHealth":
                return self._describe_health(call, backend)
            if call.operation == "RegisterTargets":
                group = backend.target_groups.get(call.param("TargetGroupArn"))
                for target_id in _target_ids(call):
                    self.draining.pop((call.param("TargetGroupArn") or "", target_id), None)
                    if group is not None:
                        group.terminated_targets.pop(target_id, None)
            return call.send()

    def finish_all(self) -> None:
        """Every drain in progress ends now (as if its last request just finished)."""
        with self.lock:
            for key in self.draining:
                self.draining[key] = float("-inf")

    def _finish_drains(self, backend: Any) -> None:
        now = self.strict.clock.time()
        for (group_arn, target_id), ends in list(self.draining.items()):
            if ends > now:
                continue
            del self.draining[(group_arn, target_id)]
            group = backend.target_groups.get(group_arn)
            if group is not None and target_id in group.terminated_targets:
                group.deregistered_targets[target_id] = group.terminated_targets.pop(target_id)

    def _deregister(self, call: Call, backend: Any) -> Response:
        group_arn = call.param("TargetGroupArn") or ""
        group = backend.target_groups.get(group_arn)
        if group is None:
            return call.send()  # moto's TargetGroupNotFound
        asked = _target_ids(call)
        registered = [target_id for target_id in asked if target_id in group.targets]
        if not registered:
            return 200, {"Content-Type": "text/xml"}, _EMPTY_DEREGISTER
        if len(registered) < len(asked):
            keep = [(k, v) for k, v in call.form() if not k.startswith("Targets.member.")]
            for number, target_id in enumerate(registered, start=1):
                port = group.targets[target_id]["Port"]
                keep += [(f"Targets.member.{number}.Id", target_id), (f"Targets.member.{number}.Port", str(port))]
            answer = call.send(call.with_form(keep))
        else:
            answer = call.send()
        if answer[0] != 200:
            return answer
        delay = float(group.attributes.get("deregistration_delay.timeout_seconds", 300))
        for target_id in registered:
            target = group.deregistered_targets.pop(target_id, None)
            if target is not None and delay > 0:
                group.terminated_targets[target_id] = target  # moto reports these as draining
                self.draining[(group_arn, target_id)] = self.strict.clock.time() + delay
            elif target is not None:
                group.deregistered_targets[target_id] = target
        return answer

    # -- what AWS refuses and moto takes --------------------------------------------------------------

    def _refusal(self, call: Call, backend: Any) -> Response | None:
        operation = call.operation
        if operation in ("CreateTargetGroup", "ModifyTargetGroup"):
            refused = _health_check_refusal(call, backend)
            if refused is not None:
                return refused
        quotas = self.quotas
        if operation == "CreateTargetGroup" and len(backend.target_groups) >= quotas.target_groups_per_region:
            return elb_error(
                "TooManyTargetGroups", "You've reached the limit on the number of target groups for your AWS account."
            )
        if operation == "CreateListener":
            balancer = backend.load_balancers.get(call.param("LoadBalancerArn"))
            port = call.param("Port")
            if balancer is not None and any(str(lst.port) == port for lst in balancer.listeners.values()):
                # moto looks the port up among the listeners' ARNs, so it never refuses one.
                return elb_error("DuplicateListener", "A listener with the specified port already exists.")
            if balancer is not None and len(balancer.listeners) >= quotas.listeners_per_load_balancer:
                return elb_error(
                    "TooManyListeners", "You've reached the limit on the number of listeners per load balancer."
                )
        if operation == "CreateRule":
            balancer = _balancer_of_listener(backend, call.param("ListenerArn") or "")
            if balancer is not None and _rules(balancer) >= quotas.rules_per_load_balancer:
                return elb_error("TooManyRules", "You've reached the limit on the number of rules per load balancer.")
        if operation == "RegisterTargets":
            group_arn = call.param("TargetGroupArn") or ""
            group = backend.target_groups.get(group_arn)
            if group is None:
                return None
            new = [t for t in _target_ids(call) if t not in group.targets]
            for balancer in backend.load_balancers.values():
                if group_arn not in _routed_groups(balancer):
                    continue
                if _targets(backend, balancer) + len(new) > quotas.targets_per_load_balancer:
                    return elb_error(
                        "TooManyTargets", "You've reached the limit on the number of targets per load balancer."
                    )
        return None

    def _describe_health(self, call: Call, backend: Any) -> Response:
        """moto's answer, with what AWS says of an unknown instance and of a zone the ALB lacks."""
        group_arn = call.param("TargetGroupArn") or ""
        group = backend.target_groups.get(group_arn)
        if group is None:
            return call.send()
        ec2 = backend.ec2_backend
        for target_id in _target_ids(call):
            if target_id.startswith("i-") and _instance(ec2, target_id) is None:
                return elb_error(
                    "InvalidTarget",
                    "The specified target does not exist, is not in the same VPC as the target group, "
                    "or has an unsupported instance type.",
                )
        answer = call.send()
        if answer[0] != 200:
            return answer
        balancers = [b for b in backend.load_balancers.values() if group_arn in _routed_groups(b)]
        unused: dict[str, str] = {}
        for target_id in group.targets:
            instance = _instance(ec2, target_id)
            if instance is None:
                continue
            if not balancers:
                unused[target_id] = "Target group is not configured to receive traffic from the load balancer"
                continue
            zone = instance.placement.zone
            if all(zone not in {s.availability_zone for s in b.subnets} for b in balancers):
                unused[target_id] = (
                    f"Target is in an Availability Zone ({zone}) that is not enabled for the load balancer"
                )
        if not unused:
            return answer
        return answer[0], answer[1], _mark_unused(answer[2], unused)


def elb_error(code: str, message: str, *, status: int = 400) -> Response:
    """An error of the ELBv2 query protocol."""
    body = (
        '<ErrorResponse xmlns="http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/">'
        f"<Error><Type>Sender</Type><Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
        f"<RequestId>{request_id()}</RequestId></ErrorResponse>"
    )
    return status, {"Content-Type": "text/xml"}, body.encode()


def _health_check_refusal(call: Call, backend: Any) -> Response | None:
    group = backend.target_groups.get(call.param("TargetGroupArn") or "")
    interval = call.param("HealthCheckIntervalSeconds")
    timeout = call.param("HealthCheckTimeoutSeconds")
    # Unset: the group's current value (ModifyTargetGroup) or the HTTP default (30 s, 5 s).
    interval_s = int(interval) if interval else int(getattr(group, "health_check_interval_seconds", None) or 30)
    timeout_s = int(timeout) if timeout else int(getattr(group, "health_check_timeout_seconds", None) or 5)
    if interval_s <= timeout_s:
        return elb_error("ValidationError", "Health check interval must be greater than the timeout.")
    codes = call.param("Matcher.HttpCode")
    if codes:
        for part in codes.split(","):
            bounds = part.split("-")
            if not all(b.isdigit() and 200 <= int(b) <= 499 for b in bounds) or len(bounds) > 2:
                return elb_error(
                    "ValidationError",
                    f"Health check matcher HTTP code '{codes}' must be within '200-499' for an Application Load Balancer",  # noqa: E501
                )
    return None


def _instance(ec2: Any, instance_id: str) -> Any:
    try:
        return ec2.get_instance(instance_id)
    except Exception:  # moto's InvalidInstanceIdError
        return None


def _balancer_of_listener(backend: Any, listener_arn: str) -> Any:
    for balancer in backend.load_balancers.values():
        if listener_arn in balancer.listeners:
            return balancer
    return None


def _rules(balancer: Any) -> int:
    return sum(len(listener._non_default_rules) for listener in balancer.listeners.values())


def _forwarded(actions: Any) -> set[str]:
    groups: set[str] = set()
    for action in actions or []:
        data = getattr(action, "data", action)
        if data.get("TargetGroupArn"):
            groups.add(data["TargetGroupArn"])
        for entry in (data.get("ForwardConfig") or {}).get("TargetGroups") or []:
            groups.add(entry["TargetGroupArn"])
    return groups


def _routed_groups(balancer: Any) -> set[str]:
    """The target groups a load balancer sends requests to: its listeners' and rules' forwards."""
    groups: set[str] = set()
    for listener in balancer.listeners.values():
        groups |= _forwarded(listener.default_actions)
        for rule in listener._non_default_rules.values():
            groups |= _forwarded(rule.actions)
    return groups


def _targets(backend: Any, balancer: Any) -> int:
    return sum(
        len(backend.target_groups[arn].targets) for arn in _routed_groups(balancer) if arn in backend.target_groups
    )


_HEALTH_MEMBER = re.compile(rb"<member>(.*?)</member>", re.S)


def _mark_unused(body: bytes, unused: dict[str, str]) -> bytes:
    """moto's DescribeTargetHealth answer with these targets `unused` / `Target.NotInUse`."""

    def mark(match: re.Match[bytes]) -> bytes:
        member = match.group(0)
        found = re.search(rb"<Id>(.*?)</Id>", member)
        if found is None or found.group(1).decode() not in unused:
            return member
        why = escape(unused[found.group(1).decode()]).encode()
        health = (
            b"<TargetHealth><State>unused</State><Reason>Target.NotInUse</Reason>"
            b"<Description>" + why + b"</Description></TargetHealth>"
        )
        return re.sub(rb"<TargetHealth>.*?</TargetHealth>", lambda _: health, member, flags=re.S)

    return _HEALTH_MEMBER.sub(mark, body)


def _target_ids(call: Call) -> list[str]:
    found = sorted((int(m.group(1)), value) for key, value in call.form() if (m := _TARGET_ID.match(key)))
    return [value for _, value in found]
