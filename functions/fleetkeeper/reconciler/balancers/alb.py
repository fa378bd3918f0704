"""The alb load balancer: the stack's Application Load Balancers, shared by its services.

The template's ALB is shard 0; once it is full the adapter makes more like it (`fk-<stack id>-<n>`,
with a wake group each) and places each new service on the lowest shard with room, recorded in its
endpoint (`EndpointRecord.load_balancer`) and never moved while it has one; with a domain it
publishes `NAME.<domain>` for services past shard 0 in the stack's hosted zone; the dispatcher
retires a shard no service uses (`retire_shards`). docs/architecture/load-balancer-shards.md.

Per service incarnation, created by the reconciler and tagged like its instances:

- a target group named `fk-<uid>` (deterministic, so a retried create finds its own earlier one):
  instance targets, each registered on its own version's port; the spec's policy as its
  `load_balancing.algorithm.type` (least_load -> least_outstanding_requests, round_robin ->
  round_robin), `drain_seconds` as its deregistration delay, a health check derived from the readiness probe
  (fleetkeeper.reconciler.health_check: the probe's path when the ALB can send it, the versions it
  holds agreeing on it);
- a route to it: with a domain name, a host rule `NAME.<domain>` on the stack's shared listener;
  without one, a listener of its own on the next free port of the stack's range, so paths reach
  the replicas unchanged.

Routes are found by what they forward to (the target group), never by a name we would have to
remember: `ensure` reuses what a crashed run created, and `remove` deletes every route that uses
the target group before the target group itself.

Stacks sharing an account (docs/architecture/stacks-and-security.md): a target group is named
`fk-<stack id>-<uid>` and everything is tagged `fleetkeeper:stack`; listeners and rules are only ever
looked for on the stack's own load balancer and listener. A target group named before stacks had ids
(`fk-<uid>`) is still its service's: found by that name for one of this stack's own uids, checked to
carry no other stack's tag, and tagged with this stack's id before anything changes it (the IAM
policy changes only target groups tagged with the stack's id).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper.choices import LoadBalancingPolicy
from fleetkeeper.model import EndpointRecord, from_iso, to_iso
from fleetkeeper.reconciler.balancer import (
    MANAGED_TAG,
    MANAGED_VALUE,
    SERVICE_TAG,
    SHARD_TAG,
    STACK_TAG,
    UID_TAG,
    DrainState,
    EndpointRefused,
    Target,
    load_balancer_name,
    shard_name,
    shard_number,
    target_group_name,
    wake_group_name,
)
from fleetkeeper.settings import ALB_SECURITY_GROUP_ENV, DEFAULT_LISTENER_PORTS, DEFAULT_STACK_ID

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from datetime import datetime

    from mypy_boto3_elbv2 import ElasticLoadBalancingv2Client
    from mypy_boto3_elbv2.type_defs import (
        ActionTypeDef,
        RuleConditionTypeDef,
        TagTypeDef,
        TargetDescriptionTypeDef,
    )

    from fleetkeeper.model import EndpointConfig
    from fleetkeeper.settings import AlbSettings

logger = logging.getLogger(__name__)

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
TLS_POLICY = "ELBSecurityPolicy-TLS13-1-2-2021-06"
_NOT_FOUND = {"TargetGroupNotFound", "ListenerNotFound", "RuleNotFound"}
_REGISTRATIONS_PER_CALL = 20


# A describe and the create after it are not atomic: a concurrent worker (another shard, a kick and
# the schedule) may take the same free rule priority or listener port in between. AWS then answers
# PriorityInUse / DuplicateListener, and the next free value is tried, this many times in all.
_CONFLICT_ATTEMPTS = 5

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


class NoListenerPort(EndpointRefused):
    """Every port of the stack's listener range is taken: the ALB carries as many services as it can."""


class ShardFull(Exception):
    """This shard has no room for one more service route (counted, or ELB's quota error)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ELB's answers that mean "this load balancer has no room for one more route": the next shard is tried.
# TooManyUniqueTargetGroupsPerLoadBalancer: 100 target groups per ALB (the wake group counted).
_SHARD_FULL = {"TooManyRules", "TooManyListeners", "TooManyUniqueTargetGroupsPerLoadBalancer"}
# Shards a placement may try: the per-Region quota of ALBs is 50 by default, the template's counted.
MAX_SHARDS = 50
# The idle timeout of a shard (as the template sets its ALB's): LoadBalancerIdleTimeout.
_IDLE_TIMEOUT = "idle_timeout.timeout_seconds"
# A shard found with no service route is tagged with when; deleted once it stayed empty this long
# (longer than a Lambda invocation may run, 900 s: no worker still holds an older view of it).
EMPTY_SINCE_TAG = "fleetkeeper:empty-since"
RETIRE_AFTER_SECONDS = 960
# How long a balancer trusts what it learnt of the shards (a run's placements share it).
CACHE_SECONDS = 30.0
NOT_FOUND_RESPONSE: ActionTypeDef = {
    "Type": "fixed-response",
    "FixedResponseConfig": {
        "StatusCode": "404",
        "ContentType": "application/json",
        "MessageBody": (
            '{"error": {"code": "no_such_service", "message": "no service has this host name", "details": []}}'
        ),
    },
}


@dataclass(frozen=True)
class ShardQuotas:
    """ELB's per-ALB quotas the placement counts against (AWS's defaults,
    https://docs.aws.amazon.com/elasticloadbalancing/latest/application/load-balancer-limits.html).
    A raised quota is still met: the count only skips shards that are surely full, and a shard ELB
    refuses (TooManyRules, ...) is passed over the same way."""

    listeners: int = 50
    rules: int = 100  # not counting default rules
    target_groups: int = 100  # the shard's wake group included


@dataclass(frozen=True)
class Shard:
    """One of the stack's load balancers: 0 is the template's, n >= 1 one the reconciler made."""

    number: int
    arn: str
    dns_name: str
    zone_id: str = ""  # its CanonicalHostedZoneId: the alias target of a record naming it
    # When the dispatcher found it with no service route (its EMPTY_SINCE_TAG); None: it has routes.
    empty_since: str | None = None

    @property
    def retiring(self) -> bool:
        """Found with no service route: placements pass it over (the dispatcher deletes it soon)."""
        return self.empty_since is not None


@dataclass
class AlbBalancer:
    arn: str
    dns_name: str
    vpc_id: str
    listener_arn: str | None = None
    domain_name: str | None = None
    certificate_arn: str | None = None
    listener_ports: tuple[int, int] = DEFAULT_LISTENER_PORTS
    stack_id: str = DEFAULT_STACK_ID
    # The stack's wake target (a lambda target group, fleetkeeper.wake.demand); None: routes never leave
    # the services' target groups.
    wake_target_group: str | None = None
    # Shards: made like the template's ALB (its subnets, security group, scheme, idle timeout) once
    # it is full. No security group: no shard is made, a full ALB refuses the next service.
    subnet_ids: tuple[str, ...] = ()
    security_group_id: str | None = None
    scheme_name: str = "internal"
    idle_timeout: int = 300
    wake_function_arn: str | None = None
    hosted_zone_id: str | None = None
    quotas: ShardQuotas = field(default_factory=ShardQuotas)
    # What this balancer learnt of the shards, for CACHE_SECONDS (a run's placements share it; a
    # balancer kept longer, as the tests' is, looks again): shards by number, those found full (and
    # why), each shard's host-rule listener, wake group and readiness, by its ARN.
    _shards: dict[int, Shard] = field(default_factory=dict, repr=False)
    _discovered: float | None = field(default=None, repr=False)
    _full: dict[int, tuple[float, str]] = field(default_factory=dict, repr=False)
    _host_listeners: dict[str, str | None] = field(default_factory=dict, repr=False)
    _wake_groups: dict[str, str | None] = field(default_factory=dict, repr=False)
    _prepared: set[str] = field(default_factory=set, repr=False)
    _attached: dict[str, list[str]] = field(default_factory=dict, repr=False)  # target group -> its ALBs
    # A shard's listeners (no domain) or its host listener's rules (a domain), as placements this run
    # saw and changed them: placing many services reads each shard's once. A conflict (another
    # worker's route: DuplicateListener, PriorityInUse) reads it again.
    _listings: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)

    @classmethod
    def from_settings(cls, settings: AlbSettings) -> AlbBalancer:
        return cls(
            arn=settings.arn,
            dns_name=settings.dns_name,
            vpc_id=settings.vpc_id,
            listener_arn=settings.listener_arn,
            domain_name=settings.domain_name,
            certificate_arn=settings.certificate_arn,
            listener_ports=settings.listener_ports,
            stack_id=settings.stack_id,
            wake_target_group=settings.wake_target_group,
            subnet_ids=settings.subnet_ids,
            security_group_id=settings.security_group_id,
            scheme_name=settings.scheme,
            idle_timeout=settings.idle_timeout,
            wake_function_arn=settings.wake_function_arn,
            hosted_zone_id=settings.hosted_zone_id,
        )

    @property
    def elbv2(self) -> ElasticLoadBalancingv2Client:
        return aws.elbv2()

    @property
    def scheme(self) -> str:
        return "https" if self.certificate_arn else "http"

    @property
    def shards_enabled(self) -> bool:
        return bool(self.security_group_id and self.subnet_ids)

    # -- the LoadBalancer protocol ---------------------------------------------------------------------

    def ensure(self, service: str, uid: str, config: EndpointConfig, known: EndpointRecord | None) -> EndpointRecord:
        with _quota_refusals():
            return self._ensure(service, uid, config, known)

    def _ensure(self, service: str, uid: str, config: EndpointConfig, known: EndpointRecord | None) -> EndpointRecord:
        # With a hosted zone, the name's record as this ensure found it (None: none yet).
        record = self._claim_name(service) if self.domain_name and self.hosted_zone_id else None
        tags = _tags(service, uid, self.stack_id)
        group, attached = self._target_group(uid, config, tags, known)
        # A waking route stays on the wake target: only `route` moves it.
        waking = known is not None and known.waking
        recorded = known.route if known is not None and known.target_group == group else None
        shard = self._placed(known, group, attached)
        if shard is not None:
            # Placed: it stays on its shard, whatever room another has (never moved while serving).
            self._prepare(shard)
            try:
                route, url = self._route_on(shard, service, group, tags, recorded, waking)
            except ShardFull as full:
                raise EndpointRefused(full.reason) from None
        else:
            shard, route, url = self._place(service, group, tags, waking)
        if self.domain_name and shard.number > 0 and not _names(record, shard):
            self._publish(service, shard)
        dimensions = (
            ("LoadBalancer", shard.arn.split(":loadbalancer/", 1)[-1]),
            ("TargetGroup", group.rsplit(":", 1)[-1]),
        )
        return EndpointRecord(
            url=url,
            config=config,
            target_group=group,
            route=route,
            dimensions=dimensions,
            load_balancer=shard.arn,
        )

    def _placed(self, known: EndpointRecord | None, group: str, attached: Sequence[str]) -> Shard | None:
        """The shard the service's endpoint is on: the recorded one (re-made under its name if it went),
        else the one its target group is attached to (a run that died before recording its route),
        else None: not placed yet."""
        if known is not None and known.target_group == group:
            return self._shard_of(known.load_balancer or self.arn)
        for arn in attached:
            return self._shard_of(arn)
        return None

    def _shard_of(self, arn: str) -> Shard:
        if arn == self.arn:
            return Shard(0, self.arn, self.dns_name)
        number = shard_number(load_balancer_name(arn), self.stack_id)
        if number is None:
            raise EndpointRefused(f"the endpoint's load balancer {arn} is not one of this stack's")
        if not self.shards_enabled:
            raise EndpointRefused(
                f"the endpoint is on load balancer shard {number}, and the stack is given no "
                f"{ALB_SECURITY_GROUP_ENV} to keep shards with"
            )
        found = self._shard(number, make=True)
        assert found is not None
        return found

    def _place(self, service: str, group: str, tags: list[TagTypeDef], waking: bool) -> tuple[Shard, str, str]:
        """A new endpoint on the lowest shard with room, making the next one when all are full. A
        shard that filled up meanwhile (another worker's route: ELB's quota error) is passed over."""
        reason = ""
        for number in range(MAX_SHARDS):
            full = self._full.get(number)
            if full is not None and time.monotonic() - full[0] < CACHE_SECONDS:
                reason = full[1]
                continue
            if number > 0:
                self._may_make_shards(reason)
            shard = self._shard(number, make=True)
            assert shard is not None
            if shard.retiring:
                continue  # going: the dispatcher deletes it once it stayed empty
            try:
                route, url = self._route_on(shard, service, group, tags, None, waking, placing=True)
            except ShardFull as refused:
                reason = refused.reason
                self._full[number] = (time.monotonic(), reason)
                continue
            except ClientError as exc:
                if _code(exc) == "TargetGroupAssociationLimit":
                    # Another worker put the group on a shard meanwhile: that is its shard.
                    _, attached = self._describe_group(group)
                    placed = self._placed(None, group, attached)
                    if placed is None:
                        raise
                    route, url = self._route_on(placed, service, group, tags, None, waking)
                    return placed, route, url
                if _code(exc) not in _SHARD_FULL:
                    raise
                reason = f"{_code(exc)}: {QUOTA_MESSAGES.get(_code(exc), 'the load balancer is full')}"
                self._full[number] = (time.monotonic(), reason)
                continue
            # Only the shard that takes the service: a run that dies before this is completed by
            # the next `ensure` (the service's group is attached to the shard, which is prepared then).
            self._prepare(shard)
            return shard, route, url
        raise EndpointRefused(
            f"every one of the {MAX_SHARDS} load balancers a stack may have is full ({reason}): "
            "raise the quotas (docs/DEPLOY.md, Quotas)"
        )

    def _may_make_shards(self, reason: str) -> None:
        """Shard 0 is full: may a shard carry the next service?"""
        if not self.shards_enabled:
            raise EndpointRefused(reason)
        if self.domain_name and not self.hosted_zone_id:
            raise EndpointRefused(
                f"{reason}; the stack's load balancer is full, and more load balancers need DNS records "
                "the stack can only publish with a hosted zone: set the stack's HostedZoneId parameter "
                "(docs/DEPLOY.md, Quotas)"
            )

    def register(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> dict[str, str]:
        described = _described(targets)
        self._adopt_recorded(endpoint.target_group)
        with _quota_refusals():
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
            code = _code(exc)
            if code == "TargetGroupNotFound":
                return
            if code != "InvalidTarget":
                raise
            # One of them is not registered (or its instance is gone): the others still go.
            for target in described:
                try:
                    self.elbv2.deregister_targets(TargetGroupArn=endpoint.target_group, Targets=[target])
                except ClientError as one:
                    if _code(one) not in ("InvalidTarget", "TargetGroupNotFound"):
                        raise

    def drain_states(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> dict[str, DrainState]:
        described = _described(targets)
        if not described:
            return {}
        group = endpoint.target_group
        try:
            return self._drain_states(group, described)
        except ClientError as exc:
            if _code(exc) == "TargetGroupNotFound":
                # No target group: nothing can be in flight to its targets.
                return {t.instance_id: DrainState.DRAINED for t in targets}
            if _code(exc) != "InvalidTarget":
                raise
        # One target AWS does not know (its instance is gone) fails the whole call: ask per target,
        # so that it does not hide the others' states (a serving replica taken for drained would be
        # terminated under its requests).
        states: dict[str, DrainState] = {}
        for target in described:
            try:
                states.update(self._drain_states(group, [target]))
            except ClientError as exc:
                if _code(exc) not in ("InvalidTarget", "TargetGroupNotFound"):
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
            if _code(exc) not in ("TargetGroupNotFound", "InvalidTarget"):
                raise
            return False
        states = [entry.get("TargetHealth", {}).get("State") for entry in health.get("TargetHealthDescriptions", [])]
        return "healthy" in states or (bool(states) and all(state == "unhealthy" for state in states))

    def route(self, endpoint: EndpointRecord, *, waking: bool) -> None:
        """Point the service's route (its host rule, or its own listener's default action) at the
        wake target or at its target group. One Modify call; the same twice changes nothing."""
        shard = self._shard_of(endpoint.load_balancer or self.arn)
        action = [self._route_action(endpoint.target_group, waking=waking, shard=shard)]
        if self.domain_name:
            self.elbv2.modify_rule(RuleArn=endpoint.route, Actions=action)
        else:
            self.elbv2.modify_listener(ListenerArn=endpoint.route, DefaultActions=action)

    def remove(self, service: str, uid: str, known: EndpointRecord | None) -> None:
        group = self._find_target_group(uid, known)
        if group is None:
            return  # never created, or removed by an earlier run
        # A route on the wake target no longer names the group: the recorded one is it (a route is
        # moved to the wake target only once recorded, so an unrecorded one forwards to the group).
        recorded = known.route if known is not None and known.target_group == group else None
        attached = self._attached.pop(group, None)
        if attached is None:
            _, attached = self._describe_group(group)
        arns = dict.fromkeys([*attached, (known.load_balancer or self.arn) if known is not None else self.arn])
        for arn in arns:
            shard = self._existing_shard(arn)
            if shard is None:
                continue  # gone: so are its routes
            if self.domain_name:
                host = self._host_listener(shard)
                for rule in self._rules(host):
                    ours = _forwards_to(rule.get("Actions", []), group) or rule.get("RuleArn") == recorded
                    if ours and not rule.get("IsDefault"):
                        self._delete(self.elbv2.delete_rule, RuleArn=rule["RuleArn"])
                if shard.number > 0:
                    self._unpublish(service, shard)
            for listener in self._listeners(shard.arn):
                if _forwards_to(listener.get("DefaultActions", []), group) or listener.get("ListenerArn") == recorded:
                    self._delete(self.elbv2.delete_listener, ListenerArn=listener["ListenerArn"])
        self._delete(self.elbv2.delete_target_group, TargetGroupArn=group)

    def forget(self) -> None:
        self._shards.clear()
        self._discovered = None
        self._full.clear()
        self._host_listeners.clear()
        self._wake_groups.clear()
        self._prepared.clear()
        self._attached.clear()
        self._listings.clear()

    def retire_shards(self, now: datetime) -> list[str]:
        """The dispatcher's sweep of the stack's extra shards (n >= 1): one with no service route is
        tagged `fleetkeeper:empty-since`, one that still has none RETIRE_AFTER_SECONDS later is
        deleted (its wake group, then the load balancer with its listeners), one that got a route
        again loses the tag. Only load balancers named `fk-<stack>-<n>` AND tagged with this stack's
        id are touched. The names deleted."""
        if not self.shards_enabled:
            return []
        self._discovered = None
        self._discover()
        deleted: list[str] = []
        for number, shard in sorted(self._shards.items()):
            if number == 0:
                continue
            routes = self._service_routes(shard)
            since = shard.empty_since  # its tags, read by the discovery above
            if routes:
                if since is not None:
                    self.elbv2.remove_tags(ResourceArns=[shard.arn], TagKeys=[EMPTY_SINCE_TAG])
                continue
            if since is None:
                self.elbv2.add_tags(ResourceArns=[shard.arn], Tags=[{"Key": EMPTY_SINCE_TAG, "Value": to_iso(now)}])
                continue
            if (now - from_iso(since)).total_seconds() < RETIRE_AFTER_SECONDS:
                continue
            wake = self._wake_group(shard, make=False)
            if wake is not None:
                self._delete(self.elbv2.delete_target_group, TargetGroupArn=wake)
            self._delete(self.elbv2.delete_load_balancer, LoadBalancerArn=shard.arn)
            del self._shards[number]
            deleted.append(shard_name(self.stack_id, number))
        return deleted

    def _route_action(self, group: str, *, waking: bool, shard: Shard) -> ActionTypeDef:
        """What the service's route does: forward to its target group, or, while it wakes, to the
        shard's wake target with the service's own group kept in the same forward at weight 0. An ALB
        health checks only the target groups a listener or rule forwards to (a group it does not
        route to has its targets `unused`, `Target.NotInUse`): kept in the forward, the new replica is
        health checked while the wake target still answers, so `serves` can see it become healthy."""
        wake = self._wake_group(shard, make=waking) if waking else None
        if wake is None:
            return _forward(group)
        return {
            "Type": "forward",
            "ForwardConfig": {
                "TargetGroups": [
                    {"TargetGroupArn": wake, "Weight": 1},
                    {"TargetGroupArn": group, "Weight": 0},
                ]
            },
        }

    # -- shards ----------------------------------------------------------------------------------------

    def _discover(self) -> None:
        """The stack's shards, once per invocation: one DescribeLoadBalancers of the Region (the
        per-Region quota is 50: one page) and DescribeTags of those named `fk-<stack>-<n>`; only
        those tagged with this stack's id are its shards."""
        if self._discovered is not None and time.monotonic() - self._discovered < CACHE_SECONDS:
            return
        self._discovered = time.monotonic()
        self._shards.clear()
        named: dict[int, dict[str, Any]] = {}
        kwargs: dict[str, Any] = {"PageSize": 400}
        while True:
            page = self.elbv2.describe_load_balancers(**kwargs)
            for balancer in page.get("LoadBalancers", []):
                number = shard_number(str(balancer.get("LoadBalancerName", "")), self.stack_id)
                if number is not None:
                    named[number] = dict(balancer)
            marker = page.get("NextMarker")
            if not marker:
                break
            kwargs["Marker"] = marker
        numbers = sorted(named)
        for start in range(0, len(numbers), 20):
            chunk = numbers[start : start + 20]
            described = self.elbv2.describe_tags(ResourceArns=[named[n]["LoadBalancerArn"] for n in chunk])
            by_arn = {
                str(d.get("ResourceArn")): {str(t.get("Key")): str(t.get("Value", "")) for t in d.get("Tags", [])}
                for d in described.get("TagDescriptions", [])
            }
            for number in chunk:
                tags = by_arn.get(str(named[number]["LoadBalancerArn"]), {})
                if self._ours(tags):
                    self._shards[number] = _shard(number, named[number], tags)

    def _ours(self, tags: dict[str, str]) -> bool:
        return tags.get(MANAGED_TAG) == MANAGED_VALUE and tags.get(STACK_TAG) == self.stack_id

    def _shard(self, number: int, *, make: bool = False) -> Shard | None:
        """Shard `number` (0: the template's ALB); made under its deterministic name when `make` and
        missing (a retried or concurrent make finds the same one)."""
        if number == 0:
            return Shard(0, self.arn, self.dns_name)
        found = self._shards.get(number)
        if found is not None:
            return found
        self._discover()
        found = self._shards.get(number)
        if found is None and make:
            found = self._make_shard(number)
            self._shards[number] = found
        return found

    def _existing_shard(self, arn: str) -> Shard | None:
        if arn == self.arn:
            return self._shard(0)
        number = shard_number(load_balancer_name(arn), self.stack_id)
        if number is None or not self.shards_enabled:
            return None
        return self._shard(number)

    def _make_shard(self, number: int) -> Shard:
        """CreateLoadBalancer for shard `number`, like the template's ALB. The call is idempotent for
        identical settings (*CreateLoadBalancer*, "If you attempt to create multiple load balancers
        with the same settings, each call succeeds"); DuplicateLoadBalancerName means one of that name
        exists with other settings: it is used if it is this stack's, else refused."""
        name = shard_name(self.stack_id, number)
        tags: list[TagTypeDef] = [
            {"Key": MANAGED_TAG, "Value": MANAGED_VALUE},
            {"Key": STACK_TAG, "Value": self.stack_id},
            {"Key": SHARD_TAG, "Value": str(number)},
        ]
        try:
            created = self.elbv2.create_load_balancer(
                Name=name,
                Subnets=list(self.subnet_ids),
                SecurityGroups=[str(self.security_group_id)],
                Scheme=self.scheme_name,  # type: ignore[arg-type]
                Type="application",
                IpAddressType="ipv4",
                Tags=tags,
            )["LoadBalancers"][0]
        except ClientError as exc:
            code = _code(exc)
            if code == "TooManyLoadBalancers":
                raise EndpointRefused(f"{code}: {QUOTA_MESSAGES[code]}") from None
            if code != "DuplicateLoadBalancerName":
                raise
            found = self.elbv2.describe_load_balancers(Names=[name])["LoadBalancers"][0]
            if not self._ours(self._tags_of(found["LoadBalancerArn"])):
                raise EndpointRefused(f"a load balancer named {name} exists and is not this stack's") from None
            logger.warning("load balancer %s exists with other settings than the stack's: used as it is", name)
            created = found
        shard = _shard(number, dict(created), {})
        logger.info("load balancer shard %s made: %s", number, name)
        return shard

    def _prepare(self, shard: Shard) -> None:
        """What a shard needs besides its routes, checked once per run that routes a service there:
        the template ALB's attributes (idle timeout, invalid headers dropped, desync mitigation), the
        wake group with the wake function in it, and with a domain the listeners the template gives
        its ALB. Each step finds what an earlier, crashed one made, and changes only what is missing
        or differs (RegisterTargets of the function is idempotent)."""
        if shard.number == 0 or shard.arn in self._prepared:
            return
        self._prepared.add(shard.arn)
        wanted = {
            _IDLE_TIMEOUT: str(self.idle_timeout),
            # As the template's ALB: a request with a header field name HTTP does not allow never
            # reaches a replica.
            "routing.http.drop_invalid_header_fields.enabled": "true",
            "routing.http.desync_mitigation_mode": "defensive",
        }
        attributes = self.elbv2.describe_load_balancer_attributes(LoadBalancerArn=shard.arn)["Attributes"]
        have = {a.get("Key"): a.get("Value") for a in attributes}
        if any(have.get(key) != value for key, value in wanted.items()):
            self.elbv2.modify_load_balancer_attributes(
                LoadBalancerArn=shard.arn, Attributes=[{"Key": k, "Value": v} for k, v in wanted.items()]
            )
        self._wake_group(shard, make=True)
        if self.domain_name:
            self._host_listener(shard, make=True)

    def _wake_group(self, shard: Shard, *, make: bool) -> str | None:
        """The shard's wake target group (a lambda target group with the wake function registered):
        a target group is attached to one load balancer only, so each shard has its own. Invoking the
        function is allowed for `fkwake-<stack>-*` by the template (WakeShardsInvokePermission)."""
        if not self.wake_target_group:
            return None
        number = shard.number
        if number == 0:
            return self.wake_target_group
        if self._wake_groups.get(shard.arn) is not None:
            return self._wake_groups[shard.arn]
        name = wake_group_name(self.stack_id, number)
        group = self._named(name)
        if group is None and make:
            tags: list[TagTypeDef] = [
                {"Key": MANAGED_TAG, "Value": MANAGED_VALUE},
                {"Key": STACK_TAG, "Value": self.stack_id},
                {"Key": SHARD_TAG, "Value": str(number)},
            ]
            group = self.elbv2.create_target_group(Name=name, TargetType="lambda", Tags=tags)["TargetGroups"][0][
                "TargetGroupArn"
            ]
        if group is not None and make and self.wake_function_arn:
            self.elbv2.register_targets(TargetGroupArn=group, Targets=[{"Id": self.wake_function_arn}])
        self._wake_groups[shard.arn] = group
        return group

    def _host_listener(self, shard: Shard, *, make: bool = False) -> str | None:
        """With a domain: the shard's listener that carries the host rules (shard 0: the template's),
        HTTPS on 443 with the certificate (and 80 redirecting to it) or HTTP on 80, its default
        action a 404 in fleetkeeper's error shape, as the template makes them."""
        if shard.number == 0:
            return self.listener_arn
        if self._host_listeners.get(shard.arn) is not None:
            return self._host_listeners[shard.arn]
        port = 443 if self.certificate_arn else 80
        listeners = {int(item.get("Port", 0)): str(item["ListenerArn"]) for item in self._listeners(shard.arn)}
        found = listeners.get(port)
        if make:
            tags: list[TagTypeDef] = [
                {"Key": MANAGED_TAG, "Value": MANAGED_VALUE},
                {"Key": STACK_TAG, "Value": self.stack_id},
            ]
            if found is None:
                args: dict[str, Any] = {
                    "LoadBalancerArn": shard.arn,
                    "Protocol": "HTTP",
                    "Port": port,
                    "DefaultActions": [NOT_FOUND_RESPONSE],
                    "Tags": tags,
                }
                if self.certificate_arn:
                    args.update(
                        Protocol="HTTPS", Certificates=[{"CertificateArn": self.certificate_arn}], SslPolicy=TLS_POLICY
                    )
                found = self._create_listener(args, shard.arn, port)
            if self.certificate_arn and 80 not in listeners:
                redirect: ActionTypeDef = {
                    "Type": "redirect",
                    "RedirectConfig": {"Protocol": "HTTPS", "Port": "443", "StatusCode": "HTTP_301"},
                }
                self._create_listener(
                    {
                        "LoadBalancerArn": shard.arn,
                        "Protocol": "HTTP",
                        "Port": 80,
                        "DefaultActions": [redirect],
                        "Tags": tags,
                    },
                    shard.arn,
                    80,
                )
        self._host_listeners[shard.arn] = found
        return found

    def _create_listener(self, args: dict[str, Any], balancer: str, port: int) -> str:
        try:
            return str(self.elbv2.create_listener(**args)["Listeners"][0]["ListenerArn"])
        except ClientError as exc:
            if _code(exc) != "DuplicateListener":
                raise
            # A concurrent worker made it: that one.
            return next(str(item["ListenerArn"]) for item in self._listeners(balancer) if int(item["Port"]) == port)

    def _service_routes(self, shard: Shard) -> int:
        """How many service routes a shard carries (its listeners' non-default rules with a domain,
        else its listeners)."""
        if self.domain_name:
            return sum(
                1
                for listener in self._listeners(shard.arn)
                for rule in self._rules(str(listener["ListenerArn"]))
                if not rule.get("IsDefault")
            )
        return sum(1 for _ in self._listeners(shard.arn))

    # -- DNS (a domain, shards >= 1) ---------------------------------------------------------------------

    def _record_name(self, service: str) -> str:
        return f"{service}.{self.domain_name}".lower()

    def _claim_name(self, service: str) -> dict[str, Any] | None:
        """NAME.<domain> must be free in the hosted zone, or this stack's own record (an alias to one
        of its load balancers). A record of another system shadows the wildcard that serves shard 0,
        and UPSERT would overwrite it for a shard past it: a service is not allowed to take over a
        name the zone already gives to something else. Refused before anything is made; else the
        record found (None: the name is free)."""
        record = self._record(service)
        if record is not None and not self._ours_record(record):
            raise EndpointRefused(
                f"the hosted zone {self.hosted_zone_id} already has a record {self._record_name(service)} "
                f"({record.get('Type')}) that is not this stack's: give the service another name, or delete "
                "that record"
            )
        return record

    def _record(self, service: str) -> dict[str, Any] | None:
        """The hosted zone's record named NAME.<domain> (the first of its types), or None."""
        name = self._record_name(service)
        found = (
            aws.route53()
            .list_resource_record_sets(HostedZoneId=self.hosted_zone_id, StartRecordName=name, MaxItems="1")
            .get("ResourceRecordSets", [])
        )
        if found and str(found[0].get("Name", "")).rstrip(".").lower() == name:
            return dict(found[0])
        return None

    def _ours_record(self, record: dict[str, Any]) -> bool:
        """An A alias to one of this stack's load balancers (the template's or a shard)."""
        if record.get("Type") != "A":
            return False
        self._discover()
        ours = {self.dns_name.lower(), *(shard.dns_name.lower() for shard in self._shards.values())}
        return _alias_target(record) in ours - {""}

    def _publish(self, service: str, shard: Shard) -> None:
        """NAME.<domain> as an alias A record to the shard (the user's wildcard points at shard 0
        only): UPSERT, so a retry changes nothing (*ChangeResourceRecordSets*). Not called when the
        claim's read found the record naming the shard already: Route 53's request rate is the
        account's, shared with every other caller in it (docs/architecture/load-balancer-shards.md)."""
        aws.route53().change_resource_record_sets(
            HostedZoneId=self.hosted_zone_id,
            ChangeBatch={
                "Comment": f"fleetkeeper {self.stack_id}: service {service} on load balancer shard {shard.number}",
                "Changes": [{"Action": "UPSERT", "ResourceRecordSet": self._alias(service, shard)}],
            },
        )

    def _alias(self, service: str, shard: Shard) -> dict[str, Any]:
        return {
            "Name": self._record_name(service),
            "Type": "A",
            "AliasTarget": {
                "HostedZoneId": shard.zone_id,
                "DNSName": f"dualstack.{shard.dns_name}" if self.scheme_name == "internet-facing" else shard.dns_name,
                "EvaluateTargetHealth": False,
            },
        }

    def _unpublish(self, service: str, shard: Shard) -> None:
        """The service's record, if it still names this shard (a DELETE must give the record as it is)."""
        if not self.hosted_zone_id:
            return
        record = self._record(service)
        if not _names(record, shard):
            return  # none, or another's (a later incarnation's, on another shard): not this one's to delete
        try:
            aws.route53().change_resource_record_sets(
                HostedZoneId=self.hosted_zone_id,
                ChangeBatch={"Changes": [{"Action": "DELETE", "ResourceRecordSet": record}]},
            )
        except ClientError as exc:
            if _code(exc) != "InvalidChangeBatch":  # deleted meanwhile
                raise

    # -- target group ----------------------------------------------------------------------------------

    def _find_target_group(self, uid: str, known: EndpointRecord | None) -> str | None:
        """The incarnation's target group: by this stack's name for it, else, when the service's
        recorded endpoint has one named before stacks had ids, that one (tagged with this stack's id:
        adopted: its tags must say it is this incarnation's, and nobody's or this stack's)."""
        legacy_name = target_group_name(uid)
        if known is not None and _name_of(known.target_group) == legacy_name:
            return self._legacy(uid, legacy_name)
        # The name is this stack's alone: its IAM policy lets only it create `fk-<its id>-*`, tagged.
        return self._named(target_group_name(uid, self.stack_id))

    def _legacy(self, uid: str, name: str) -> str | None:
        legacy = self._named(name)
        if legacy is None:
            return None
        tags = self._tags_of(legacy)
        if not self._is_mine(tags, uid) or tags.get(STACK_TAG, self.stack_id) != self.stack_id:
            return None  # another stack's (or nobody's): never touched
        if STACK_TAG not in tags:
            self._tag_stack(legacy)
        return legacy

    def _named(self, name: str) -> str | None:
        try:
            groups = self.elbv2.describe_target_groups(Names=[name])["TargetGroups"]
        except ClientError as exc:
            if _code(exc) == "TargetGroupNotFound":
                return None
            raise
        if not groups:
            return None
        arn = str(groups[0]["TargetGroupArn"])
        self._attached[arn] = [str(lb) for lb in groups[0].get("LoadBalancerArns") or []]
        return arn

    def _tags_of(self, arn: str) -> dict[str, str]:
        described = self.elbv2.describe_tags(ResourceArns=[arn]).get("TagDescriptions", [])
        return {str(t.get("Key")): str(t.get("Value", "")) for d in described for t in d.get("Tags", [])}

    @staticmethod
    def _is_mine(tags: dict[str, str], uid: str) -> bool:
        return tags.get(MANAGED_TAG) == MANAGED_VALUE and tags.get(UID_TAG) == uid

    def _tag_stack(self, arn: str) -> None:
        self.elbv2.add_tags(ResourceArns=[arn], Tags=[{"Key": STACK_TAG, "Value": self.stack_id}])

    def _adopt_recorded(self, arn: str) -> None:
        """A target group this stack's table records, named before stacks had ids: tag it with this
        stack's id before changing it (idempotent; the IAM policy changes only tagged ones, and lets
        the tag be added only where there is none). One named with this stack's id carries it already."""
        if _name_of(arn).startswith(f"fk-{self.stack_id}-"):
            return
        self._tag_stack(arn)

    def _target_group(
        self, uid: str, config: EndpointConfig, tags: list[TagTypeDef], known: EndpointRecord | None
    ) -> tuple[str, list[str]]:
        """The incarnation's target group, created or brought to `config`, and the load balancers it
        is attached to (DescribeTargetGroups' LoadBalancerArns: at most one for an ALB's group)."""
        group = self._find_target_group(uid, known)
        attached: list[str] = []
        if group is None:
            group = self.elbv2.create_target_group(
                Name=target_group_name(uid, self.stack_id),
                Protocol="HTTP",
                Port=config.port,
                VpcId=self.vpc_id,
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
            if _code(exc) == "TargetGroupNotFound":
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

    # -- routes ----------------------------------------------------------------------------------------

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

    def _route_on(
        self,
        shard: Shard,
        service: str,
        group: str,
        tags: list[TagTypeDef],
        recorded: str | None,
        waking: bool,
        *,
        placing: bool = False,
    ) -> tuple[str, str]:
        """The service's route on `shard` (found, else made) and its URL. ShardFull: no room there.
        `placing`: a new placement, which may use what this run already read of the shard."""
        if not placing:
            self._listings.clear()
        action = self._route_action(group, waking=waking, shard=shard)
        if self.domain_name:
            return self._host_rule(shard, service, group, action, tags), f"{self.scheme}://{service}.{self.domain_name}"
        route, port = self._service_listener(shard, group, tags, recorded)
        return route, f"{self.scheme}://{shard.dns_name}:{port}"

    def _service_listener(
        self, shard: Shard, group: str, tags: list[TagTypeDef], recorded: str | None
    ) -> tuple[str, int]:
        """The service's own listener (its ARN and port): found by the target group it forwards to
        (or, while it forwards to the wake target, as `recorded`), else created on the lowest free
        port of the range; a port a concurrent worker took between the describe and the create is
        given up for the next free one."""
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            try:
                return self._find_or_create_listener(shard, group, tags, recorded)
            except ClientError as exc:
                self._listings.pop(shard.arn, None)
                if _code(exc) != "DuplicateListener" or attempt == _CONFLICT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _find_or_create_listener(
        self, shard: Shard, group: str, tags: list[TagTypeDef], recorded: str | None
    ) -> tuple[str, int]:
        listeners = self._listing(shard.arn, lambda: self._listeners(shard.arn))
        mine = sorted(
            (
                listener
                for listener in listeners
                if _forwards_to(listener.get("DefaultActions", []), group) or listener.get("ListenerArn") == recorded
            ),
            key=lambda listener: (listener.get("ListenerArn") != recorded, int(listener.get("Port", 0))),
        )
        if mine:
            # Two runs that raced may each have made one: keep the lowest port, drop the others.
            for extra in mine[1:]:
                self._delete(self.elbv2.delete_listener, ListenerArn=extra["ListenerArn"])
            return str(mine[0]["ListenerArn"]), int(mine[0]["Port"])
        taken = {int(listener.get("Port", 0)) for listener in listeners}
        first, last = self.listener_ports
        port = next((p for p in range(first, last + 1) if p not in taken), None)
        if port is None or len(listeners) >= self.quotas.listeners:
            message = (
                f"every listener port {first}-{last} of the stack's load balancer is taken: it carries "
                "as many services as it can (docs/DEPLOY.md: more services need a domain name or another stack)"
            )
            if not self.shards_enabled:
                raise NoListenerPort(message)
            raise ShardFull(f"shard {shard.number}: {message}")
        args: dict[str, Any] = {
            "LoadBalancerArn": shard.arn,
            "Protocol": "HTTP",
            "Port": port,
            "DefaultActions": [_forward(group)],
            "Tags": tags,
        }
        if self.certificate_arn:
            args.update(Protocol="HTTPS", Certificates=[{"CertificateArn": self.certificate_arn}], SslPolicy=TLS_POLICY)
        created = self.elbv2.create_listener(**args)["Listeners"][0]
        listeners.append(
            {"ListenerArn": created["ListenerArn"], "Port": port, "DefaultActions": args["DefaultActions"]}
        )
        return str(created["ListenerArn"]), port

    def _listing(self, key: str, read: Callable[[], Iterator[dict[str, Any]]]) -> list[dict[str, Any]]:
        listing = self._listings.get(key)
        if listing is None:
            listing = self._listings[key] = list(read())
        return listing

    def _host_rule(self, shard: Shard, service: str, group: str, action: ActionTypeDef, tags: list[TagTypeDef]) -> str:
        """The service's host rule NAME.<domain> on the shard's listener, created or given `action`;
        a priority a concurrent worker took between the describe and the create is given up for the
        next free one."""
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            try:
                return self._find_or_create_rule(shard, service, group, action, tags)
            except ClientError as exc:
                self._listings.clear()
                if _code(exc) != "PriorityInUse":
                    raise
                if attempt == _CONFLICT_ATTEMPTS:
                    if self.shards_enabled:
                        raise ShardFull(f"shard {shard.number}: PriorityInUse {attempt} times") from None
                    raise
        raise AssertionError("unreachable")

    def _find_or_create_rule(
        self, shard: Shard, service: str, group: str, action: ActionTypeDef, tags: list[TagTypeDef]
    ) -> str:
        host = f"{service}.{self.domain_name}"
        listener = self._host_listener(shard)
        if listener is None:
            self._prepare(shard)  # a new shard: its listener first
            listener = self._host_listener(shard)
        rules = self._listing(str(listener), lambda: self._rules(listener))
        mine = [rule for rule in rules if not rule.get("IsDefault") and _hosts(rule) == [host]]
        for rule in mine[1:]:
            self._delete(self.elbv2.delete_rule, RuleArn=rule["RuleArn"])
        if mine:
            rule = mine[0]
            if _forward_weights(rule.get("Actions", [])) != _forward_weights([action]):
                self.elbv2.modify_rule(RuleArn=rule["RuleArn"], Actions=[action])
            return str(rule["RuleArn"])
        service_rules = [rule for rule in rules if not rule.get("IsDefault")]
        groups = {g for rule in service_rules for g in _forward_weights(rule.get("Actions", []))}
        wake = 1 if self.wake_target_group else 0
        if self.shards_enabled and (
            len(service_rules) >= self.quotas.rules or len(groups | {group}) + wake > self.quotas.target_groups
        ):
            raise ShardFull(f"shard {shard.number}: TooManyRules: {QUOTA_MESSAGES['TooManyRules']}")
        taken = {int(rule["Priority"]) for rule in rules if str(rule.get("Priority", "")).isdigit()}
        priority = next(p for p in range(1, 50_001) if p not in taken)
        conditions: list[RuleConditionTypeDef] = [{"Field": "host-header", "HostHeaderConfig": {"Values": [host]}}]
        created = self.elbv2.create_rule(
            ListenerArn=str(listener), Priority=priority, Conditions=conditions, Actions=[action], Tags=tags
        )["Rules"][0]
        # This run's listing of the shard's rules, as ELB now has them (the next placement reads it).
        rules.append(
            {
                "RuleArn": created["RuleArn"],
                "Priority": str(priority),
                "IsDefault": False,
                "Conditions": conditions,
                "Actions": [action],
            }
        )
        return str(created["RuleArn"])

    @staticmethod
    def _delete(call: Any, **kwargs: Any) -> None:
        try:
            call(**kwargs)
        except ClientError as exc:
            if _code(exc) not in _NOT_FOUND:
                raise


@contextmanager
def _quota_refusals() -> Iterator[None]:
    """ELB's quota errors as EndpointRefused, with what they mean for the service."""
    try:
        yield
    except ClientError as exc:
        code = _code(exc)
        if code in QUOTA_MESSAGES:
            raise EndpointRefused(f"{code}: {QUOTA_MESSAGES[code]}") from exc
        raise


def _names(record: dict[str, Any] | None, shard: Shard) -> bool:
    """Whether a record is the alias A record to this shard."""
    return record is not None and record.get("Type") == "A" and _alias_target(record) == shard.dns_name.lower()


def _alias_target(record: dict[str, Any]) -> str:
    """The load balancer DNS name an alias record points at ("" for a record that is no alias)."""
    target = str((record.get("AliasTarget") or {}).get("DNSName", "")).rstrip(".").lower()
    return target.removeprefix("dualstack.")


def _shard(number: int, balancer: dict[str, Any], tags: dict[str, str]) -> Shard:
    return Shard(
        number=number,
        arn=str(balancer["LoadBalancerArn"]),
        dns_name=str(balancer.get("DNSName", "")),
        zone_id=str(balancer.get("CanonicalHostedZoneId", "")),
        empty_since=tags.get(EMPTY_SINCE_TAG),
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


def _tags(service: str, uid: str, stack: str) -> list[TagTypeDef]:
    return [
        {"Key": MANAGED_TAG, "Value": MANAGED_VALUE},
        {"Key": STACK_TAG, "Value": stack},
        {"Key": SERVICE_TAG, "Value": service},
        {"Key": UID_TAG, "Value": uid},
    ]


def _name_of(target_group_arn: str) -> str:
    """A target group's name from its ARN (`...:targetgroup/<name>/<id>`)."""
    return target_group_arn.split(":targetgroup/", 1)[-1].split("/", 1)[0]


def _forward(group: str) -> ActionTypeDef:
    return {"Type": "forward", "TargetGroupArn": group}


def _forward_weights(actions: Sequence[Any]) -> dict[str, int]:
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


def _forwards_to(actions: Sequence[Any], group: str) -> bool:
    for action in actions:
        if action.get("Type") != "forward":
            continue
        if action.get("TargetGroupArn") == group:
            return True
        groups = (action.get("ForwardConfig") or {}).get("TargetGroups") or []
        if any(g.get("TargetGroupArn") == group for g in groups):
            return True
    return False


def _hosts(rule: dict[str, Any]) -> list[str]:
    hosts: list[str] = []
    for condition in rule.get("Conditions", []):
        if condition.get("Field") == "host-header":
            hosts.extend((condition.get("HostHeaderConfig") or {}).get("Values") or condition.get("Values") or [])
    return hosts


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


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
