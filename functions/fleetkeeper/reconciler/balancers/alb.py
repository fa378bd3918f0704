"""The alb load balancer: one Application Load Balancer per stack (template.yaml), shared by its services.

Per service incarnation, created by the reconciler and tagged like its instances:

- a target group named `fk-<uid>` (deterministic, so a retried create finds its own earlier one):
  instance targets, each registered on its own version's port; the spec's policy as its
  `load_balancing.algorithm.type` (least_load -> least_outstanding_requests, round_robin ->
  round_robin), `drain_seconds` as its deregistration delay, the readiness probe's path as its
  health check;
- a route to it: with a domain name, a host rule `NAME.<domain>` on the stack's shared listener;
  without one, a listener of its own on the next free port of the stack's range, so paths reach
  the replicas unchanged.

Routes are found by what they forward to (the target group), never by a name we would have to
remember: `ensure` reuses what a crashed run created, and `remove` deletes every route that uses
the target group before the target group itself.

Stacks sharing an account (docs/ARCHITECTURE.md): a target group is named `fk-<stack id>-<uid>` and
everything is tagged `fleetkeeper:stack`; listeners and rules are only ever looked for on the stack's
own load balancer and listener. A target group named before stacks had ids (`fk-<uid>`) is still its
service's: found by that name for one of this stack's own uids, checked to carry no other stack's
tag, and tagged with this stack's id before anything changes it (the IAM policy changes only target
groups tagged with the stack's id).
"""

from __future__ import annotations

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
# The ALB's own health check, on top of the reconciler's readiness probes: a new target is healthy
# after 2 checks 5 s apart (ALB's minimums are 2 and 5 s), so it serves ~10 s after registration.
HEALTH_CHECK = {
    "HealthCheckProtocol": "HTTP",
    "HealthCheckPort": "traffic-port",
    "HealthCheckIntervalSeconds": 5,
    "HealthCheckTimeoutSeconds": 4,
    "HealthyThresholdCount": 2,
    "UnhealthyThresholdCount": 2,
}
TLS_POLICY = "ELBSecurityPolicy-TLS13-1-2-2021-06"
_NOT_FOUND = {"TargetGroupNotFound", "ListenerNotFound", "RuleNotFound"}
_REGISTRATIONS_PER_CALL = 20


class NoListenerPort(Exception):
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
        tags = _tags(service, uid, self.stack_id)
        group = self._target_group(uid, config, tags, known)
        # A waking route stays on the wake target: only `route` moves it.
        forward_to = self._forward_target(group, waking=known is not None and known.waking)
        if self.domain_name:
            route = self._host_rule(service, forward_to, tags)
            url = f"{self.scheme}://{service}.{self.domain_name}"
        else:
            route, port = self._service_listener(group, tags, known.route if known is not None else None)
            url = f"{self.scheme}://{self.dns_name}:{port}"
        dimensions = (
            ("LoadBalancer", self.arn.split(":loadbalancer/", 1)[-1]),
            ("TargetGroup", group.rsplit(":", 1)[-1]),
        )
        return EndpointRecord(url=url, config=config, target_group=group, route=route, dimensions=dimensions)

    def register(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> None:
        described = _described(targets)
        self._adopt_recorded(endpoint.target_group)
        for start in range(0, len(described), _REGISTRATIONS_PER_CALL):
            self.elbv2.register_targets(
                TargetGroupArn=endpoint.target_group, Targets=described[start : start + _REGISTRATIONS_PER_CALL]
            )

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
        try:
            health = self.elbv2.describe_target_health(TargetGroupArn=endpoint.target_group, Targets=described)
        except ClientError as exc:
            if _code(exc) not in ("TargetGroupNotFound", "InvalidTarget"):
                raise
            # No target group (or the instances are gone): nothing can be in flight to them.
            return {t.instance_id: DrainState.DRAINED for t in targets}
        states: dict[str, DrainState] = {}
        for entry in health.get("TargetHealthDescriptions", []):
            target_id = entry.get("Target", {}).get("Id", "")
            state = entry.get("TargetHealth", {}).get("State")
            reason = entry.get("TargetHealth", {}).get("Reason")
            if state == "draining":
                states[target_id] = DrainState.DRAINING
            elif reason == "Target.NotRegistered" or state == "unavailable":
                states[target_id] = DrainState.DRAINED
            else:  # healthy, initial, unhealthy, unused because the group is unused: still registered
                states[target_id] = DrainState.IN_SERVICE
        return states

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
        action = [_forward(self._forward_target(endpoint.target_group, waking=waking))]
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

    def _forward_target(self, group: str, *, waking: bool) -> str:
        return self.wake_target_group if waking and self.wake_target_group else group

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
                HealthCheckPath=config.health_path,
                Matcher={"HttpCode": "200"},
                Tags=tags,
                **HEALTH_CHECK,  # type: ignore[arg-type]
            )["TargetGroups"][0]["TargetGroupArn"]
        else:
            self.elbv2.modify_target_group(TargetGroupArn=group, HealthCheckPath=config.health_path)
        self.elbv2.modify_target_group_attributes(
            TargetGroupArn=group,
            Attributes=[
                {"Key": "deregistration_delay.timeout_seconds", "Value": str(config.drain_seconds)},
                {"Key": "load_balancing.algorithm.type", "Value": ALGORITHMS[config.policy]},
            ],
        )
        return group

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
        port of the range."""
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

    def _host_rule(self, service: str, group: str, tags: list[TagTypeDef]) -> str:
        """The service's host rule NAME.<domain> on the shared listener, created or pointed at `group`."""
        host = f"{service}.{self.domain_name}"
        rules = list(self._rules())
        mine = [rule for rule in rules if not rule.get("IsDefault") and _hosts(rule) == [host]]
        for rule in mine[1:]:
            self._delete(self.elbv2.delete_rule, RuleArn=rule["RuleArn"])
        if mine:
            rule = mine[0]
            if not _forwards_to(rule.get("Actions", []), group):
                self.elbv2.modify_rule(RuleArn=rule["RuleArn"], Actions=[_forward(group)])
            return str(rule["RuleArn"])
        taken = {int(rule["Priority"]) for rule in rules if str(rule.get("Priority", "")).isdigit()}
        priority = next(p for p in range(1, 50_001) if p not in taken)
        created = self.elbv2.create_rule(
            ListenerArn=str(self.listener_arn),
            Priority=priority,
            Conditions=[{"Field": "host-header", "HostHeaderConfig": {"Values": [host]}}],
            Actions=[_forward(group)],
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


def _described(targets: Sequence[Target]) -> list[TargetDescriptionTypeDef]:
    return [{"Id": t.instance_id, "Port": t.port} for t in targets if t.instance_id]


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))
