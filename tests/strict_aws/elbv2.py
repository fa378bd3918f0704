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

Requests through the load balancer (`request`), which moto does not model at all: the listener on the
port, its rules by priority (host-header conditions), the forward action's target group; then

- a target group of instances: a registered target that is not draining answers (200) and the
  request is counted in `AWS/ApplicationELB` `RequestCount` with the dimensions LoadBalancer and
  TargetGroup, as the ALB publishes it; with no such target the ALB answers 503 itself and counts
  NOTHING. *CloudWatch metrics for your Application Load Balancer*, RequestCount: "The number of
  requests processed over IPv4 and IPv6. This metric is only incremented for requests where the load
  balancer node was able to choose a target"
  (https://docs.aws.amazon.com/elasticloadbalancing/latest/application/load-balancer-cloudwatch-metrics.html);
- a target group of type `lambda`: the registered function (`register_lambda`: its handler, run in
  process) is invoked with the ALB's event (method, path, headers with the ALB's `x-forwarded-*`),
  and its answer is the response (*Lambda functions as targets*,
  https://docs.aws.amazon.com/elasticloadbalancing/latest/application/lambda-functions.html).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tests.strict_aws.wire import Call, Response

if TYPE_CHECKING:
    from collections.abc import Callable
    from datetime import datetime

    from tests.strict_aws.core import StrictAws


@dataclass(frozen=True)
class AlbAnswer:
    """What a client got from the load balancer, and what the load balancer counted."""

    status: int
    body: str
    headers: dict[str, str] = field(default_factory=dict)
    target_group: str | None = None  # the target group the request was forwarded to
    counted: bool = False  # RequestCount +1 for (LoadBalancer, TargetGroup)


_TARGET_ID = re.compile(r"^Targets\.member\.(\d+)\.Id$")
_EMPTY_DEREGISTER = (
    b'<DeregisterTargetsResponse xmlns="http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/">'
    b"<DeregisterTargetsResult/><ResponseMetadata><RequestId>strict-aws</RequestId></ResponseMetadata>"
    b"</DeregisterTargetsResponse>"
)


class Elbv2Layer:
    def __init__(self, strict: StrictAws) -> None:
        self.strict = strict
        # (target group arn, target id) -> layer-clock time its drain ends
        self.draining: dict[tuple[str, str], float] = {}
        self.lock = threading.RLock()
        # Lambda targets' handlers, by function ARN (`register_lambda`).
        self.lambdas: dict[str, Callable[[dict[str, Any], Any], dict[str, Any]]] = {}

    @staticmethod
    def _backend(region: str) -> Any:
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.elbv2.models import elbv2_backends

        return elbv2_backends[DEFAULT_ACCOUNT_ID][region]

    def send(self, call: Call) -> Response:
        with self.lock:
            backend = self._backend(call.region)
            self._finish_drains(backend)
            if call.operation == "DeregisterTargets":
                return self._deregister(call, backend)
            if call.operation == "RegisterTargets":
                group = backend.target_groups.get(call.param("TargetGroupArn"))
                for target_id in _target_ids(call):
                    self.draining.pop((call.param("TargetGroupArn") or "", target_id), None)
                    if group is not None:
                        group.terminated_targets.pop(target_id, None)
            return call.send()

    # -- requests through the load balancer -------------------------------------------------------------

    def register_lambda(self, function_arn: str, handler: Callable[[dict[str, Any], Any], dict[str, Any]]) -> None:
        """What runs when the load balancer invokes `function_arn` (a lambda target group's target)."""
        self.lambdas[function_arn] = handler

    def request(
        self, load_balancer_arn: str, port: int, at: datetime, *, host: str | None = None, path: str = "/"
    ) -> AlbAnswer:
        """One GET through the load balancer's listener on `port` at `at` (the datapoint's time)."""
        import boto3

        elbv2 = boto3.client("elbv2", region_name=load_balancer_arn.split(":")[3])
        listener = next(
            (
                item
                for item in elbv2.describe_listeners(LoadBalancerArn=load_balancer_arn)["Listeners"]
                if int(item["Port"]) == port
            ),
            None,
        )
        if listener is None:
            raise ConnectionRefusedError(f"no listener on port {port}")
        actions = listener["DefaultActions"]
        rules = [r for r in elbv2.describe_rules(ListenerArn=listener["ListenerArn"])["Rules"] if not r["IsDefault"]]
        for rule in sorted(rules, key=lambda r: int(r["Priority"])):
            hosts = [
                value
                for condition in rule.get("Conditions", [])
                if condition.get("Field") == "host-header"
                for value in (condition.get("HostHeaderConfig") or {}).get("Values") or condition.get("Values") or []
            ]
            if host is not None and host.lower() in (h.lower() for h in hosts):
                actions = rule["Actions"]
                break
        forward = next((a for a in actions if a["Type"] == "forward"), None)
        if forward is None:
            fixed = next((a["FixedResponseConfig"] for a in actions if a["Type"] == "fixed-response"), {})
            return AlbAnswer(int(fixed.get("StatusCode", 503)), fixed.get("MessageBody", ""))
        group_arn = forward.get("TargetGroupArn") or forward["ForwardConfig"]["TargetGroups"][0]["TargetGroupArn"]
        group = elbv2.describe_target_groups(TargetGroupArns=[group_arn])["TargetGroups"][0]
        health = elbv2.describe_target_health(TargetGroupArn=group_arn)["TargetHealthDescriptions"]
        targets = [
            entry["Target"]["Id"]
            for entry in health
            if entry["TargetHealth"]["State"] not in ("draining", "unused", "unavailable")
        ]
        if not targets:
            # The load balancer's own answer: no target was chosen, so nothing is counted.
            return AlbAnswer(503, "503 Service Temporarily Unavailable", target_group=group_arn)
        self._count(load_balancer_arn, group_arn, at)
        if group.get("TargetType") != "lambda":
            return AlbAnswer(200, f"served by {targets[0]}", target_group=group_arn, counted=True)
        handler = self.lambdas.get(targets[0])
        if handler is None:
            return AlbAnswer(502, "502 Bad Gateway", target_group=group_arn, counted=True)
        event = {
            "requestContext": {"elb": {"targetGroupArn": group_arn}},
            "httpMethod": "GET",
            "path": path,
            "queryStringParameters": {},
            "headers": {
                "host": host or f"alb.example:{port}",
                "x-forwarded-for": "10.0.0.1",
                "x-forwarded-port": str(port),
                "x-forwarded-proto": "http",
            },
            "body": "",
            "isBase64Encoded": False,
        }
        answer = handler(event, None)
        return AlbAnswer(
            int(answer["statusCode"]),
            str(answer.get("body", "")),
            {str(k): str(v) for k, v in (answer.get("headers") or {}).items()},
            target_group=group_arn,
            counted=True,
        )

    @staticmethod
    def _count(load_balancer_arn: str, group_arn: str, at: datetime) -> None:
        import boto3

        boto3.client("cloudwatch", region_name=load_balancer_arn.split(":")[3]).put_metric_data(
            Namespace="AWS/ApplicationELB",
            MetricData=[
                {
                    "MetricName": "RequestCount",
                    "Dimensions": [
                        {"Name": "LoadBalancer", "Value": load_balancer_arn.split(":loadbalancer/", 1)[1]},
                        {"Name": "TargetGroup", "Value": group_arn.rsplit(":", 1)[1]},
                    ],
                    "Timestamp": at,
                    "Value": 1.0,
                    "Unit": "Count",
                }
            ],
        )

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


def _target_ids(call: Call) -> list[str]:
    found = sorted((int(m.group(1)), value) for key, value in call.form() if (m := _TARGET_ID.match(key)))
    return [value for _, value in found]
