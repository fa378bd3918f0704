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
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any

from tests.strict_aws.wire import Call, Response

if TYPE_CHECKING:
    from tests.strict_aws.core import StrictAws

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
