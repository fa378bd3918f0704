"""The alb load balancer: one Application Load Balancer per stack (template.yaml), shared by its services.

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

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper.model import EndpointRecord
from fleetkeeper.reconciler.balancer import (
    MANAGED_TAG,
    MANAGED_VALUE,
    SERVICE_TAG,
    STACK_TAG,
    UID_TAG,
    DrainState,
    EndpointRefused,
    Target,
    target_group_name,
)
from fleetkeeper.settings import DEFAULT_LISTENER_PORTS, DEFAULT_STACK_ID

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from mypy_boto3_elbv2 import ElasticLoadBalancingv2Client
    from mypy_boto3_elbv2.type_defs import ActionTypeDef, TagTypeDef, TargetDescriptionTypeDef

    from fleetkeeper.model import EndpointConfig
    from fleetkeeper.settings import AlbSettings

# SkyPilot's policy names -> the target group's load_balancing.algorithm.type.
ALGORITHMS = {"least_load": "least_outstanding_requests", "round_robin": "round_robin"}
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
    "TooManyTargets": (
        "the stack's load balancer has as many targets as its quota allows (1,000 by default): the service's "
        "new replicas run but get no requests until the quota is raised or other replicas go"
    ),
}


class NoListenerPort(EndpointRefused):
    """Every port of the stack's listener range is taken: the ALB carries as many services as it can."""


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
    # The stack's wake target (a lambda target group, fleetkeeper.wake); None: routes never leave
    # the services' target groups.
    wake_target_group: str | None = None

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
        )

    @property
    def elbv2(self) -> ElasticLoadBalancingv2Client:
        return aws.elbv2()

    @property
    def scheme(self) -> str:
        return "https" if self.certificate_arn else "http"

    # -- the LoadBalancer protocol ---------------------------------------------------------------------

    def ensure(self, service: str, uid: str, config: EndpointConfig, known: EndpointRecord | None) -> EndpointRecord:
        with _quota_refusals():
            return self._ensure(service, uid, config, known)

    def _ensure(self, service: str, uid: str, config: EndpointConfig, known: EndpointRecord | None) -> EndpointRecord:
        tags = _tags(service, uid, self.stack_id)
        group = self._target_group(uid, config, tags, known)
        # A waking route stays on the wake target: only `route` moves it.
        action = self._route_action(group, waking=known is not None and known.waking)
        if self.domain_name:
            route = self._host_rule(service, action, tags)
            url = f"{self.scheme}://{service}.{self.domain_name}"
        else:
            route, port = self._service_listener(group, tags, known.route if known is not None else None)
            url = f"{self.scheme}://{self.dns_name}:{port}"
        dimensions = (
            ("LoadBalancer", self.arn.split(":loadbalancer/", 1)[-1]),
            ("TargetGroup", group.rsplit(":", 1)[-1]),
        )
        return EndpointRecord(url=url, config=config, target_group=group, route=route, dimensions=dimensions)

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
        action = [self._route_action(endpoint.target_group, waking=waking)]
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
        if self.domain_name and self.listener_arn:
            for rule in self._rules():
                ours = _forwards_to(rule.get("Actions", []), group) or rule.get("RuleArn") == recorded
                if ours and not rule.get("IsDefault"):
                    self._delete(self.elbv2.delete_rule, RuleArn=rule["RuleArn"])
        for listener in self._listeners():
            if _forwards_to(listener.get("DefaultActions", []), group) or listener.get("ListenerArn") == recorded:
                self._delete(self.elbv2.delete_listener, ListenerArn=listener["ListenerArn"])
        self._delete(self.elbv2.delete_target_group, TargetGroupArn=group)

    def _route_action(self, group: str, *, waking: bool) -> ActionTypeDef:
        """What the service's route does: forward to its target group, or, while it wakes, to the
        wake target with the service's own group kept in the same forward at weight 0. An ALB health
        checks only the target groups a listener or rule forwards to (a group it does not route to
        has its targets `unused`, `Target.NotInUse`): kept in the forward, the new replica is health
        checked while the wake target still answers, so `serves` can see it become healthy."""
        if not (waking and self.wake_target_group):
            return _forward(group)
        return {
            "Type": "forward",
            "ForwardConfig": {
                "TargetGroups": [
                    {"TargetGroupArn": self.wake_target_group, "Weight": 1},
                    {"TargetGroupArn": group, "Weight": 0},
                ]
            },
        }

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
        return groups[0]["TargetGroupArn"] if groups else None

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
    ) -> str:
        """The incarnation's target group, created or brought to `config`."""
        group = self._find_target_group(uid, known)
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
            self._bring_to(group, config)
        return group

    def _bring_to(self, group: str, config: EndpointConfig) -> None:
        """An existing target group brought to `config`, changing only what differs: a service whose
        route cannot be made (a quota) retries every run, and costs reads only while it waits."""
        current = self.elbv2.describe_target_groups(TargetGroupArns=[group])["TargetGroups"][0]
        wanted = _health_check(config)
        if any(current.get(key) != value for key, value in wanted.items()):
            self.elbv2.modify_target_group(TargetGroupArn=group, **wanted)
        attributes = self.elbv2.describe_target_group_attributes(TargetGroupArn=group)["Attributes"]
        have = {a.get("Key"): a.get("Value") for a in attributes}
        if any(have.get(key) != value for key, value in _attributes(config).items()):
            self._set_attributes(group, config)

    def _set_attributes(self, group: str, config: EndpointConfig) -> None:
        self.elbv2.modify_target_group_attributes(
            TargetGroupArn=group, Attributes=[{"Key": k, "Value": v} for k, v in _attributes(config).items()]
        )

    # -- routes ----------------------------------------------------------------------------------------

    def _listeners(self) -> Iterator[dict[str, Any]]:
        kwargs: dict[str, Any] = {"LoadBalancerArn": self.arn}
        while True:
            page = self.elbv2.describe_listeners(**kwargs)
            yield from (dict(listener) for listener in page.get("Listeners", []))
            marker = page.get("NextMarker")
            if not marker:
                return
            kwargs["Marker"] = marker

    def _rules(self) -> Iterator[dict[str, Any]]:
        if not self.listener_arn:
            return
        kwargs: dict[str, Any] = {"ListenerArn": self.listener_arn}
        while True:
            page = self.elbv2.describe_rules(**kwargs)
            yield from (dict(rule) for rule in page.get("Rules", []))
            marker = page.get("NextMarker")
            if not marker:
                return
            kwargs["Marker"] = marker

    def _service_listener(self, group: str, tags: list[TagTypeDef], recorded: str | None) -> tuple[str, int]:
        """The service's own listener (its ARN and port): found by the target group it forwards to
        (or, while it forwards to the wake target, as `recorded`), else created on the lowest free
        port of the range; a port a concurrent worker took between the describe and the create is
        given up for the next free one."""
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            try:
                return self._find_or_create_listener(group, tags, recorded)
            except ClientError as exc:
                if _code(exc) != "DuplicateListener" or attempt == _CONFLICT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _find_or_create_listener(self, group: str, tags: list[TagTypeDef], recorded: str | None) -> tuple[str, int]:
        listeners = list(self._listeners())
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
        if port is None:
            raise NoListenerPort(
                f"every listener port {first}-{last} of the stack's load balancer is taken: it carries "
                "as many services as it can (docs/DEPLOY.md: more services need a domain name or another stack)"
            )
        args: dict[str, Any] = {
            "LoadBalancerArn": self.arn,
            "Protocol": "HTTP",
            "Port": port,
            "DefaultActions": [_forward(group)],
            "Tags": tags,
        }
        if self.certificate_arn:
            args.update(Protocol="HTTPS", Certificates=[{"CertificateArn": self.certificate_arn}], SslPolicy=TLS_POLICY)
        created = self.elbv2.create_listener(**args)["Listeners"][0]
        return str(created["ListenerArn"]), port

    def _host_rule(self, service: str, action: ActionTypeDef, tags: list[TagTypeDef]) -> str:
        """The service's host rule NAME.<domain> on the shared listener, created or given `action`;
        a priority a concurrent worker took between the describe and the create is given up for the
        next free one."""
        for attempt in range(1, _CONFLICT_ATTEMPTS + 1):
            try:
                return self._find_or_create_rule(service, action, tags)
            except ClientError as exc:
                if _code(exc) != "PriorityInUse" or attempt == _CONFLICT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _find_or_create_rule(self, service: str, action: ActionTypeDef, tags: list[TagTypeDef]) -> str:
        host = f"{service}.{self.domain_name}"
        rules = list(self._rules())
        mine = [rule for rule in rules if not rule.get("IsDefault") and _hosts(rule) == [host]]
        for rule in mine[1:]:
            self._delete(self.elbv2.delete_rule, RuleArn=rule["RuleArn"])
        if mine:
            rule = mine[0]
            if _forward_weights(rule.get("Actions", [])) != _forward_weights([action]):
                self.elbv2.modify_rule(RuleArn=rule["RuleArn"], Actions=[action])
            return str(rule["RuleArn"])
        taken = {int(rule["Priority"]) for rule in rules if str(rule.get("Priority", "")).isdigit()}
        priority = next(p for p in range(1, 50_001) if p not in taken)
        created = self.elbv2.create_rule(
            ListenerArn=str(self.listener_arn),
            Priority=priority,
            Conditions=[{"Field": "host-header", "HostHeaderConfig": {"Values": [host]}}],
            Actions=[action],
            Tags=tags,
        )["Rules"][0]
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
