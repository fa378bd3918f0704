"""EC2 as AWS runs it, over moto's EC2.

Always on (EC2's own rules; moto lacks them):

- `RunInstances` `ClientToken` idempotency: the same token with the same parameters returns the
  original response (the same instances; moto launches nothing), the same token with other
  parameters is `IdempotentParameterMismatch`. Only a request that succeeded claims its token.
- `ImageId: resolve:ssm:<parameter>[:version|:label]` is resolved by EC2 from the parameter in
  moto's SSM backend (moto would launch an instance whose image id is that literal string); a
  parameter that does not exist refuses the launch.

Configured by the test:

- eventual consistency of a launch: for `describe_lag` seconds on the layer's clock, a launched
  instance is invisible to DescribeInstances, however it is asked for (filters, tags, instance
  ids: then `InvalidInstanceID.NotFound`, from moto itself). The instance is hidden from moto for
  the duration of that one request, under the lock, so pagination and filters stay moto's;
- `InsufficientInstanceCapacity` (HTTP 500: botocore retries it, as it does on AWS) and
  `Unsupported` (HTTP 400) per subnet and/or instance type, and/or for one market: spot requests
  alone can also be refused with `MaxSpotInstanceCountExceeded` (the account's spot limit) or
  `SpotMaxPriceTooLow` (HTTP 400), as EC2 refuses a one-time spot RunInstances;
- `RequestLimitExceeded` bursts (through `StrictAws.throttle`; HTTP 503, retried by botocore);
- terminations by AWS with real `StateReason` codes (`terminate_by_aws`).

Also always on: a Describe call's filters may carry at most 200 values in all
(`FilterLimitExceeded`, HTTP 400); moto takes any number. And DescribeInstances lists a terminated
instance for an hour after its termination, then never again (`set_terminated_visibility`; moto
lists it for ever); the other EC2 calls still know it, as moto does.
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from tests.strict_aws.wire import Call, Response, ec2_error

if TYPE_CHECKING:
    from collections.abc import Iterable

    from tests.strict_aws.core import StrictAws

# StateReason codes AWS sets when it ends an instance, and the message DescribeInstances shows
# ("<code>: <text>"; the codes and their meaning: EC2 API reference, StateReason).
STATE_REASONS = {
    "Server.SpotInstanceTermination": "Spot instance termination",
    "Server.InsufficientInstanceCapacity": "Insufficient capacity to satisfy launch request",
    "Server.InternalError": "Internal error on launch",
    "Client.InternalError": "Client error on launch",
    "Client.UserInitiatedShutdown": "User initiated shutdown",
    "Client.InstanceInitiatedShutdown": "Instance initiated shutdown",
    "Client.VolumeLimitExceeded": "Volume limit exceeded",
}
MISMATCH = "Arguments on this idempotent request are inconsistent with arguments used in previous request(s)."
FILTER_VALUES_LIMIT = 200


SPOT_REFUSALS = {
    "InsufficientInstanceCapacity": "",  # the message is the on-demand one, naming the zone
    "MaxSpotInstanceCountExceeded": "Max spot instance count exceeded",
    "SpotMaxPriceTooLow": "Your Spot request price is lower than the minimum required Spot request fulfillment price.",
    # An account's first spot launch: EC2 creates its spot service-linked role with the caller's
    # permissions, and a caller without iam:CreateServiceLinkedRole for spot.amazonaws.com gets this
    # (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/service-linked-roles-spot-instance-requests.html).
    "AuthFailure.ServiceLinkedRoleCreationNotPermitted": (
        "The provided credentials do not have permission to create the service-linked role for EC2 Spot Instances."
    ),
}


@dataclass
class CapacityRule:
    """RunInstances refused for a subnet, an instance type and/or a market ("spot", "on-demand"; None:
    any), `remaining` times (None: until cleared)."""

    code: str  # InsufficientInstanceCapacity | Unsupported | a SPOT_REFUSALS code
    subnet_id: str | None = None
    instance_type: str | None = None
    remaining: int | None = None
    market: str | None = None

    def matches(self, subnet_id: str | None, instance_type: str, market: str) -> bool:
        return (
            (self.remaining is None or self.remaining > 0)
            and self.subnet_id in (None, subnet_id)
            and self.instance_type in (None, instance_type)
            and self.market in (None, market)
        )

    def clear(self) -> None:
        self.remaining = 0


@dataclass
class _Token:
    params: list[tuple[str, str]]
    response: Response
    instance_ids: tuple[str, ...]


# "Recently terminated instances might appear in the returned results. This interval is usually less
# than one hour." (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstances.html).
# moto lists them for ever; the layer drops a terminated instance from DescribeInstances one hour
# after it first saw it terminated (its id is then InvalidInstanceID.NotFound, as for any unknown id).
TERMINATED_VISIBLE_SECONDS = 3600.0

# RunInstances' ClientToken: "Constraints: Maximum 64 ASCII characters"
# (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_RunInstances.html).
MAX_CLIENT_TOKEN = 64


class Ec2Layer:
    """The EC2 half of `StrictAws` (reach it as `strict_aws.ec2`)."""

    def __init__(self, strict: StrictAws) -> None:
        self._strict = strict
        # Serialises the requests moto handles: a token's check and its launch are one step, and a
        # lagging instance is hidden from moto's backend for the duration of one request.
        self.lock = threading.RLock()
        self.describe_lag = 0.0
        self.lag_operations: frozenset[str] = frozenset({"DescribeInstances"})
        self.launched_at: dict[str, float] = {}  # instance id -> the layer's clock when launched
        self.client_tokens: dict[tuple[str, str], _Token] = {}  # (region, token): a token is per Region
        self.capacity_rules: list[CapacityRule] = []
        self.terminated_visible_for: float | None = TERMINATED_VISIBLE_SECONDS
        self.terminated_seen: dict[str, float] = {}  # instance id -> the layer's clock when first seen terminated

    # -- what the test configures --

    def set_describe_lag(self, seconds: float, *, operations: Iterable[str] = ("DescribeInstances",)) -> None:
        """Launched instances stay invisible to `operations` for `seconds` on the layer's clock.

        Applies to every instance the layer saw launched, by its launch time: setting 0 makes all
        of them visible at once. Add e.g. "TerminateInstances" to `operations` to model that call's
        `InvalidInstanceID.NotFound` during the same window.
        """
        with self.lock:
            self.describe_lag = float(seconds)
            self.lag_operations = frozenset(operations)

    def insufficient_capacity(
        self, *, subnet_id: str | None = None, instance_type: str | None = None, times: int | None = None
    ) -> CapacityRule:
        return self._rule("InsufficientInstanceCapacity", subnet_id, instance_type, times)

    def unsupported(
        self, *, subnet_id: str | None = None, instance_type: str | None = None, times: int | None = None
    ) -> CapacityRule:
        return self._rule("Unsupported", subnet_id, instance_type, times)

    def spot_refused(
        self,
        code: str = "InsufficientInstanceCapacity",
        *,
        subnet_id: str | None = None,
        instance_type: str | None = None,
        times: int | None = None,
    ) -> CapacityRule:
        """Spot requests refused (on-demand ones go through): `code` is one EC2 answers spot with."""
        if code not in SPOT_REFUSALS:
            raise ValueError(f"not a spot refusal: {code!r}; one of {sorted(SPOT_REFUSALS)}")
        return self._rule(code, subnet_id, instance_type, times, market="spot")

    def _rule(
        self, code: str, subnet_id: str | None, instance_type: str | None, times: int | None, market: str | None = None
    ) -> CapacityRule:
        rule = CapacityRule(code, subnet_id, instance_type, times, market)
        with self.lock:
            self.capacity_rules.append(rule)
        return rule

    def throttle(self, operation: str | None = None, *, times: int) -> None:
        """`RequestLimitExceeded` on the next `times` attempts of `operation` (any, when None)."""
        self._strict.throttle("ec2", operation, times=times, code="RequestLimitExceeded")

    def terminate_by_aws(self, instance_id: str, code: str, *, region: str = "us-east-1") -> None:
        """AWS ends the instance: terminated, with StateReason {Code: code, Message: "<code>: ..."}."""
        if code not in STATE_REASONS:
            raise ValueError(f"not a termination StateReason code: {code!r}; one of {sorted(STATE_REASONS)}")
        from moto.ec2.models.instances import StateReason

        with self.lock:
            backend = self._backend(region)
            instance = backend.get_instance_by_id(instance_id)
            if instance is None:
                raise KeyError(f"no instance {instance_id}")
            if code == "Server.SpotInstanceTermination" and instance.lifecycle != "spot":
                raise ValueError(f"{instance_id} is not a spot instance: AWS reclaims only spot instances")
            backend.terminate_instances([instance_id])
            self.terminated_seen.setdefault(instance_id, self._strict.clock.time())
            instance.state_reason = StateReason(f"{code}: {STATE_REASONS[code]}", code)
            initiated = "User" if code == "Client.UserInitiatedShutdown" else "Service"
            instance._reason = f"{initiated} initiated ({datetime.now(UTC):%Y-%m-%d %H:%M:%S} GMT)"

    def set_terminated_visibility(self, seconds: float | None) -> None:
        """How long DescribeInstances still lists a terminated instance (None: for ever, as moto does)."""
        with self.lock:
            self.terminated_visible_for = seconds

    def visible(self, instance_id: str) -> bool:
        launched = self.launched_at.get(instance_id)
        return launched is None or self._strict.clock.time() >= launched + self.describe_lag

    def _forgotten(self, region: str) -> set[str]:
        """The terminated instances DescribeInstances no longer lists. A termination is stamped when
        it happens (TerminateInstances through the layer, `terminate_by_aws`); the scan stamps the
        ones moto made by itself (a spot reclaim the test made in moto's backend) when first seen."""
        if self.terminated_visible_for is None:
            return set()
        now = self._strict.clock.time()
        for reservation in self._backend(region).reservations.values():
            for instance in reservation.instances:
                if instance.id not in self.terminated_seen and instance.state == "terminated":
                    self.terminated_seen[instance.id] = now
        return {i for i, seen in self.terminated_seen.items() if now >= seen + self.terminated_visible_for}

    # -- the request path --

    @staticmethod
    def _backend(region: str) -> Any:
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends

        return ec2_backends[DEFAULT_ACCOUNT_ID][region]

    def send(self, call: Call) -> Response:
        with self.lock:
            values = sum(1 for key, _ in call.form() if key.startswith("Filter.") and ".Value." in key)
            if call.operation.startswith("Describe") and values > FILTER_VALUES_LIMIT:
                return ec2_error(
                    "FilterLimitExceeded",
                    f"The maximum number of filter values specified on a single call is {FILTER_VALUES_LIMIT}",
                )
            if call.operation == "RunInstances":
                return self._run_instances(call)
            hidden: set[str] = set()
            if call.operation in self.lag_operations and self.describe_lag > 0:
                hidden = {i for i in self.launched_at if not self.visible(i)}
            if call.operation == "DescribeInstances":
                hidden |= self._forgotten(call.region)
            response = self._hiding(call, hidden) if hidden else call.send()
            if call.operation == "TerminateInstances" and response[0] == 200:
                now = self._strict.clock.time()
                for key, instance_id in call.form():
                    if key.startswith("InstanceId."):
                        self.terminated_seen.setdefault(instance_id, now)
            return response

    def _run_instances(self, call: Call) -> Response:
        token = call.param("ClientToken")
        params = sorted((k, v) for k, v in call.form() if k != "ClientToken")
        if token and (len(token) > MAX_CLIENT_TOKEN or not token.isascii()):
            # "Constraints: Maximum 64 ASCII characters" (API_RunInstances.html); moto takes any.
            return ec2_error("InvalidParameterValue", f"Value ({token}) for parameter clientToken is invalid.")
        if token:
            known = self.client_tokens.get((call.region, token))
            if known is not None:
                if known.params != params:
                    return ec2_error("IdempotentParameterMismatch", MISMATCH)
                return known.response
        refusal = self._capacity_refusal(call)
        if refusal is not None:
            return refusal
        # IAM is eventually consistent: a profile made seconds ago is "invalid" to EC2 (tests/strict_aws/iam.py).
        profile = call.param("IamInstanceProfile.Name") or call.param("IamInstanceProfile.Arn")
        if profile and not self._strict.iam.usable(profile):
            kind = "name" if call.param("IamInstanceProfile.Name") else "arn"
            return ec2_error(
                "InvalidParameterValue",
                f"Value ({profile}) for parameter iamInstanceProfile.{kind} is invalid. "
                f"Invalid IAM Instance Profile {kind}",
            )
        request = call.request
        image = call.param("ImageId") or ""
        if image.startswith("resolve:ssm:"):
            ami = self._resolve_image(call.region, image.removeprefix("resolve:ssm:"))
            if ami is None:
                return ec2_error(
                    "InvalidParameterValue",
                    f"Invalid value '{image}' for parameter ImageId: the Systems Manager parameter "
                    f"{image.removeprefix('resolve:ssm:')} does not exist or you may not use it",
                )
            request = call.with_form([(k, ami if k == "ImageId" else v) for k, v in call.form()])
        backend = self._backend(call.region)
        existing = self._instance_ids(backend)
        response = call.send(request)
        if response[0] == 200:
            now = self._strict.clock.time()
            launched = tuple(sorted(self._instance_ids(backend) - existing))
            for instance_id in launched:
                self.launched_at[instance_id] = now
            if token:
                self.client_tokens[(call.region, token)] = _Token(params, response, launched)
        return response

    @staticmethod
    def _instance_ids(backend: Any) -> set[str]:
        return {i.id for r in backend.reservations.values() for i in r.instances}

    @staticmethod
    def _resolve_image(region: str, parameter: str) -> str | None:
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.ssm.models import ssm_backends

        try:
            found = ssm_backends[DEFAULT_ACCOUNT_ID][region].get_parameter(parameter)
        except Exception:
            return None
        return None if found is None else str(found.value)

    def _capacity_refusal(self, call: Call) -> Response | None:
        subnet_id = call.param("SubnetId") or call.param("NetworkInterface.1.SubnetId")
        instance_type = call.param("InstanceType") or "m1.small"
        market = "spot" if call.param("InstanceMarketOptions.MarketType") == "spot" else "on-demand"
        rule = next((r for r in self.capacity_rules if r.matches(subnet_id, instance_type, market)), None)
        if rule is None:
            return None
        if rule.remaining is not None:
            rule.remaining -= 1
        zone, others = self._zones(call.region, subnet_id)
        self._strict.record_fault("ec2", "RunInstances", rule.code)
        if rule.code in SPOT_REFUSALS and rule.code != "InsufficientInstanceCapacity":
            return ec2_error(rule.code, SPOT_REFUSALS[rule.code])
        if rule.code == "InsufficientInstanceCapacity":
            return ec2_error(
                rule.code,
                f"We currently do not have sufficient {instance_type} capacity in the Availability Zone you "
                f"requested ({zone}). Our system will be working on provisioning additional capacity. You can "
                f"currently get {instance_type} capacity by not specifying an Availability Zone in your request "
                f"or choosing {others}.",
                status=500,
            )
        return ec2_error(
            rule.code,
            f"Your requested instance type ({instance_type}) is not supported in your requested Availability "
            f"Zone ({zone}). Please retry your request by not specifying an Availability Zone or choosing {others}.",
        )

    def _zones(self, region: str, subnet_id: str | None) -> tuple[str, str]:
        backend = self._backend(region)
        try:
            names = sorted(z.name for z in backend.describe_availability_zones())
        except Exception:
            names = [f"{region}{letter}" for letter in "abcdef"]
        zone = names[0]
        if subnet_id:
            try:
                zone = backend.get_subnet(subnet_id).availability_zone
            except Exception:
                zone = names[0]
        return zone, ", ".join(n for n in names if n != zone)

    def _hiding(self, call: Call, hidden: set[str]) -> Response:
        """The call, answered by moto as if the `hidden` instances did not exist."""
        backend = self._backend(call.region)
        original = backend.reservations
        shown: OrderedDict[str, Any] = OrderedDict()
        for reservation_id, reservation in original.items():
            instances = [i for i in reservation.instances if i.id not in hidden]
            if len(instances) == len(reservation.instances):
                shown[reservation_id] = reservation
            elif instances:
                partial = copy.copy(reservation)
                partial.instances = instances
                shown[reservation_id] = partial
        backend.reservations = shown
        try:
            return call.send()
        finally:
            backend.reservations = original
