"""The services' target groups: one per incarnation, its algorithm, health check and registrations.

A target group is named `fk-<stack id>-<uid>` (deterministic, so a retried create finds its own
earlier one): instance targets, each registered on its own version's port; the spec's policy as its
`load_balancing.algorithm.type` (ALGORITHMS), `drain_seconds` as its deregistration delay, a health
check derived from the readiness probe (fleetkeeper.reconciler.health_check: the probe's path when
the ALB can send it, the versions it holds agreeing on it).

A target group named before stacks had ids (`fk-<uid>`) is still its service's: found by that name
for one of this stack's own uids, checked to carry no other stack's tag, and tagged with this
stack's id before anything changes it (the IAM policy changes only target groups tagged with the
stack's id).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper.choices import LoadBalancingPolicy
from fleetkeeper.reconciler.balancer import (
    MANAGED_TAG,
    MANAGED_VALUE,
    STACK_TAG,
    UID_TAG,
    DrainState,
    target_group_name,
)
from fleetkeeper.reconciler.balancers.alb.elb import ElbParts, code, quota_refusals

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mypy_boto3_elbv2.type_defs import TagTypeDef, TargetDescriptionTypeDef

    from fleetkeeper.model import EndpointConfig, EndpointRecord
    from fleetkeeper.reconciler.balancer import Target

# Each policy a load balancer runs (LoadBalancingPolicy.balanced) -> the target group's
# load_balancing.algorithm.type (tests/test_choices.py holds it to one per policy).
ALGORITHMS = {
    LoadBalancingPolicy.LEAST_LOAD: "least_outstanding_requests",
    LoadBalancingPolicy.ROUND_ROBIN: "round_robin",
}
# The ALB's own health check, on top of the reconciler's readiness probes: its path, matcher and
# timing come from the endpoint's config (fleetkeeper.reconciler.health_check); a new target is
# healthy after 2 checks (ALB's minimum), so it serves two intervals after registration.
HEALTH_CHECK = {
    "HealthCheckProtocol": "HTTP",
    "HealthCheckPort": "traffic-port",
    "HealthyThresholdCount": 2,
    "UnhealthyThresholdCount": 2,
}
_REGISTRATIONS_PER_CALL = 20


@dataclass
class TargetGroups(ElbParts):
    """Target groups: found or made, brought to the endpoint's config, their targets registered and
    asked after (the LoadBalancer protocol's register, deregister, drain_states and serves)."""

    # The load balancers each target group found this run is attached to, by its ARN.
    _attached: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)
    # The target groups named before stacks had ids that this run knows carry this stack's id.
    _adopted: set[str] = field(default_factory=set, init=False, repr=False)

    def forget(self) -> None:
        self._attached.clear()
        self._adopted.clear()
        super().forget()

    # -- registrations ---------------------------------------------------------------------------------

    def register(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> dict[str, str]:
        described = _described(targets)
        self._adopt_recorded(endpoint.target_group)
        with quota_refusals():
            for start in range(0, len(described), _REGISTRATIONS_PER_CALL):
                self.elbv2.register_targets(
                    TargetGroupArn=endpoint.target_group, Targets=described[start : start + _REGISTRATIONS_PER_CALL]
                )
        return self._not_in_use(endpoint.target_group, described)

    def _not_in_use(self, group: str, described: list[TargetDescriptionTypeDef]) -> dict[str, str]:
        """The just-registered targets the ALB will not send requests to (`unused` / `Target.NotInUse`:
        an instance in an Availability Zone the load balancer is not enabled in), with AWS's words.
        One DescribeTargetHealth per registration, none while steady."""
        if not described:
            return {}
        health = self.elbv2.describe_target_health(TargetGroupArn=group, Targets=described)
        unused: dict[str, str] = {}
        for entry in health.get("TargetHealthDescriptions", []):
            target_health = entry.get("TargetHealth", {})
            if target_health.get("Reason") == "Target.NotInUse":
                unused[entry.get("Target", {}).get("Id", "")] = str(
                    target_health.get("Description") or "the load balancer is not enabled in its Availability Zone"
                )
        return unused

    def deregister(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> None:
        described = _described(targets)
        try:
            if described:
                self._adopt_recorded(endpoint.target_group)
                self.elbv2.deregister_targets(TargetGroupArn=endpoint.target_group, Targets=described)
        except ClientError as exc:
            error = code(exc)
            if error == "TargetGroupNotFound":
                return
            if error != "InvalidTarget":
                raise
            # One of them is not registered (or its instance is gone): the others still go.
            for target in described:
                try:
                    self.elbv2.deregister_targets(TargetGroupArn=endpoint.target_group, Targets=[target])
                except ClientError as one:
                    if code(one) not in ("InvalidTarget", "TargetGroupNotFound"):
                        raise

    def drain_states(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> dict[str, DrainState]:
        described = _described(targets)
        if not described:
            return {}
        group = endpoint.target_group
        try:
            return self._drain_states(group, described)
        except ClientError as exc:
            if code(exc) == "TargetGroupNotFound":
                # No target group: nothing can be in flight to its targets.
                return {t.instance_id: DrainState.DRAINED for t in targets}
            if code(exc) != "InvalidTarget":
                raise
        # One target AWS does not know (its instance is gone) fails the whole call: ask per target,
        # so that it does not hide the others' states (a serving replica taken for drained would be
        # terminated under its requests).
        states: dict[str, DrainState] = {}
        for target in described:
            try:
                states.update(self._drain_states(group, [target]))
            except ClientError as exc:
                if code(exc) not in ("InvalidTarget", "TargetGroupNotFound"):
                    raise
                states[target["Id"]] = DrainState.DRAINED  # no instance, nothing in flight
        return states

    def _drain_states(self, group: str, described: list[TargetDescriptionTypeDef]) -> dict[str, DrainState]:
        health = self.elbv2.describe_target_health(TargetGroupArn=group, Targets=described)
        return {
            entry.get("Target", {}).get("Id", ""): _drain_state(dict(entry.get("TargetHealth", {})))
            for entry in health.get("TargetHealthDescriptions", [])
        }

    def serves(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> bool:
        """One of them is `healthy`, or all are `unhealthy` (the ALB then fails open and routes to all
        of them: *Health checks for Application Load Balancer target groups*). A target still in its
        first health checks (`initial`) is not served."""
        described = _described(targets)
        if not described:
            return False
        try:
            health = self.elbv2.describe_target_health(TargetGroupArn=endpoint.target_group, Targets=described)
        except ClientError as exc:
            if code(exc) not in ("TargetGroupNotFound", "InvalidTarget"):
                raise
            return False
        states = [entry.get("TargetHealth", {}).get("State") for entry in health.get("TargetHealthDescriptions", [])]
        return "healthy" in states or (bool(states) and all(state == "unhealthy" for state in states))

    # -- the incarnation's target group ----------------------------------------------------------------

    def _find_target_group(self, uid: str, known: EndpointRecord | None) -> str | None:
        """The incarnation's target group: by this stack's name for it, else, when the service's
        recorded endpoint has one named before stacks had ids, that one (tagged with this stack's id:
        adopted: its tags must say it is this incarnation's, and nobody's or this stack's)."""
        legacy_name = target_group_name(uid)
        if known is not None and _name_of(known.target_group) == legacy_name:
            return self._legacy(uid, legacy_name)
        # The name is this stack's alone: its IAM policy lets only it create `fk-<its id>-*`, tagged.
        return self._named(target_group_name(uid, self.settings.stack_id))

    def _legacy(self, uid: str, name: str) -> str | None:
        legacy = self._named(name)
        if legacy is None:
            return None
        tags = self._tags_of(legacy)
        stack_id = self.settings.stack_id
        if not self._is_mine(tags, uid) or tags.get(STACK_TAG, stack_id) != stack_id:
            return None  # another stack's (or nobody's): never touched
        if STACK_TAG not in tags:
            self._tag_stack(legacy)
        return legacy

    def _named(self, name: str) -> str | None:
        try:
            groups = self.elbv2.describe_target_groups(Names=[name])["TargetGroups"]
        except ClientError as exc:
            if code(exc) == "TargetGroupNotFound":
                return None
            raise
        if not groups:
            return None
        arn = str(groups[0]["TargetGroupArn"])
        self._attached[arn] = [str(lb) for lb in groups[0].get("LoadBalancerArns") or []]
        return arn

    @staticmethod
    def _is_mine(tags: dict[str, str], uid: str) -> bool:
        return tags.get(MANAGED_TAG) == MANAGED_VALUE and tags.get(UID_TAG) == uid

    def _tag_stack(self, arn: str) -> None:
        self.elbv2.add_tags(ResourceArns=[arn], Tags=[{"Key": STACK_TAG, "Value": self.settings.stack_id}])

    def _adopt_recorded(self, arn: str) -> None:
        """A target group this stack's table records, named before stacks had ids: tag it with this
        stack's id before changing it (the IAM policy changes only tagged ones). One named with this
        stack's id carries it already. The tag is added only where there is none: the grant's `Null`
        condition on `aws:ResourceTag/fleetkeeper:stack` denies AddTags on a group that has it, so an
        adopted group is asked about once a run (DescribeTags), not tagged again."""
        if _name_of(arn).startswith(f"fk-{self.settings.stack_id}-") or arn in self._adopted:
            return
        if self._tags_of(arn).get(STACK_TAG) != self.settings.stack_id:
            self._tag_stack(arn)
        self._adopted.add(arn)

    def _target_group(
        self, uid: str, config: EndpointConfig, tags: list[TagTypeDef], known: EndpointRecord | None
    ) -> tuple[str, list[str]]:
        """The incarnation's target group, created or brought to `config`, and the load balancers it
        is attached to (DescribeTargetGroups' LoadBalancerArns: at most one for an ALB's group)."""
        group = self._find_target_group(uid, known)
        attached: list[str] = []
        if group is None:
            group = self.elbv2.create_target_group(
                Name=target_group_name(uid, self.settings.stack_id),
                Protocol="HTTP",
                Port=config.port,
                VpcId=self.settings.vpc_id,
                TargetType="instance",
                Tags=tags,
                **_health_check(config),
            )["TargetGroups"][0]["TargetGroupArn"]
            self._set_attributes(group, config)
        else:
            attached = self._bring_to(group, config)
        return group, attached

    def _describe_group(self, group: str) -> tuple[dict[str, Any], list[str]]:
        try:
            current = dict(self.elbv2.describe_target_groups(TargetGroupArns=[group])["TargetGroups"][0])
        except ClientError as exc:
            if code(exc) == "TargetGroupNotFound":
                return {}, []
            raise
        attached: Any = current.get("LoadBalancerArns") or []
        return current, [str(arn) for arn in attached]

    def _bring_to(self, group: str, config: EndpointConfig) -> list[str]:
        """An existing target group brought to `config`, changing only what differs: a service whose
        route cannot be made (a quota) retries every run, and costs reads only while it waits."""
        current, attached = self._describe_group(group)
        wanted = _health_check(config)
        if any(current.get(key) != value for key, value in wanted.items()):
            self.elbv2.modify_target_group(TargetGroupArn=group, **wanted)
        attributes = self.elbv2.describe_target_group_attributes(TargetGroupArn=group)["Attributes"]
        have = {a.get("Key"): a.get("Value") for a in attributes}
        if any(have.get(key) != value for key, value in _attributes(config).items()):
            self._set_attributes(group, config)
        return attached

    def _set_attributes(self, group: str, config: EndpointConfig) -> None:
        self.elbv2.modify_target_group_attributes(
            TargetGroupArn=group, Attributes=[{"Key": k, "Value": v} for k, v in _attributes(config).items()]
        )


def _attributes(config: EndpointConfig) -> dict[str, str]:
    return {
        "deregistration_delay.timeout_seconds": str(config.drain_seconds),
        "load_balancing.algorithm.type": ALGORITHMS[config.policy],
    }


def _health_check(config: EndpointConfig) -> dict[str, Any]:
    """The target group's health check settings (CreateTargetGroup and ModifyTargetGroup take the same)."""
    return {
        **HEALTH_CHECK,
        "HealthCheckPath": config.health_path,
        "Matcher": {"HttpCode": config.health_codes},
        "HealthCheckTimeoutSeconds": config.health_timeout_seconds,
        "HealthCheckIntervalSeconds": config.health_interval_seconds,
    }


def _name_of(target_group_arn: str) -> str:
    """A target group's name from its ARN (`...:targetgroup/<name>/<id>`)."""
    return target_group_arn.split(":targetgroup/", 1)[-1].split("/", 1)[0]


def _drain_state(health: dict[str, Any]) -> DrainState:
    """A target's drain, from its TargetHealth (Elastic Load Balancing: target health states)."""
    state, reason = health.get("State"), health.get("Reason")
    if state == "draining":
        return DrainState.DRAINING
    if reason in ("Target.NotRegistered", "Target.NotInUse") or state == "unavailable":
        # Not registered, or registered where the ALB sends it nothing (a zone it lacks, a group no
        # rule uses): no request can be in flight.
        return DrainState.DRAINED
    return DrainState.IN_SERVICE  # healthy, initial, unhealthy: still registered and routed to


def _described(targets: Sequence[Target]) -> list[TargetDescriptionTypeDef]:
    return [{"Id": t.instance_id, "Port": t.port} for t in targets if t.instance_id]
