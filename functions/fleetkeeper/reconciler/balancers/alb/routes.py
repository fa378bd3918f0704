"""The services' routes on their pool: listener rules and their priorities, or listeners and ports.

With a domain name, a service's route is a host rule `NAME.<domain>` on its pool's host listener
(the next free priority); without one, a listener of its own on the next free port of the stack's
range, so paths reach the replicas unchanged. Routes are found by what they forward to (the target
group), never by a name we would have to remember: `ensure` reuses what a crashed run created, and
`remove` deletes every route that uses the target group before the target group itself. Listeners
and rules are only ever looked for on the stack's own load balancers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper.reconciler.balancer import EndpointRefused
from fleetkeeper.reconciler.balancers.alb.elb import (
    CONFLICT_ATTEMPTS,
    QUOTA_MESSAGES,
    TLS_POLICY,
    code,
    forward,
    forward_weights,
    forwards_to,
)
from fleetkeeper.reconciler.balancers.alb.pools import AlbPool, PoolFull, Pools

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from mypy_boto3_elbv2.type_defs import ActionTypeDef, RuleConditionTypeDef, TagTypeDef

    from fleetkeeper.model import EndpointRecord


class NoListenerPort(EndpointRefused):
    """Every port of the stack's listener range is taken: the ALB carries as many services as it can."""


@dataclass
class Routes(Pools):
    """Each service's route on its pool, found or made, and pointed at its target group or, while it
    wakes, at the pool's wake target."""

    # A pool's listeners (no domain) or its host listener's rules (a domain), as placements this run
    # saw and changed them: placing many services reads each pool's once. A conflict (another
    # worker's route: DuplicateListener, PriorityInUse) reads it again.
    _listings: dict[str, list[dict[str, Any]]] = field(default_factory=dict, init=False, repr=False)

    @property
    def protocol(self) -> str:
        """The endpoint URLs' `http` or `https` (https with a certificate); not the ALBs' `scheme`, which is
        internal or internet-facing (docs/ARCHITECTURE.md, glossary)."""
        return "https" if self.settings.certificate_arn else "http"

    def forget(self) -> None:
        self._listings.clear()
        super().forget()

    def route(self, endpoint: EndpointRecord, *, waking: bool) -> None:
        """Point the service's route (its host rule, or its own listener's default action) at the
        wake target or at its target group. One Modify call; the same twice changes nothing."""
        pool = self._pool_of(endpoint.load_balancer or self.settings.arn)
        action = [self._route_action(endpoint.target_group, waking=waking, pool=pool)]
        if self.settings.domain_name:
            self.elbv2.modify_rule(RuleArn=endpoint.route, Actions=action)
        else:
            self.elbv2.modify_listener(ListenerArn=endpoint.route, DefaultActions=action)

    def _route_action(self, group: str, *, waking: bool, pool: AlbPool) -> ActionTypeDef:
        """What the service's route does: forward to its target group, or, while it wakes, to the
        pool's wake target with the service's own group kept in the same forward at weight 0. An ALB
        health checks only the target groups a listener or rule forwards to (a group it does not
        route to has its targets `unused`, `Target.NotInUse`): kept in the forward, the new replica is
        health checked while the wake target still answers, so `serves` can see it become healthy."""
        wake = self._wake_group(pool, make=waking) if waking else None
        if wake is None:
            return forward(group)
        return {
            "Type": "forward",
            "ForwardConfig": {
                "TargetGroups": [
                    {"TargetGroupArn": wake, "Weight": 1},
                    {"TargetGroupArn": group, "Weight": 0},
                ]
            },
        }

    def _route_on(
        self,
        pool: AlbPool,
        service: str,
        group: str,
        tags: list[TagTypeDef],
        recorded: str | None,
        waking: bool,
        *,
        placing: bool = False,
    ) -> tuple[str, str]:
        """The service's route on `pool` (found, else made) and its URL. PoolFull: no room there.
        `placing`: a new placement, which may use what this run already read of the pool."""
        if not placing:
            self._listings.clear()
        action = self._route_action(group, waking=waking, pool=pool)
        domain = self.settings.domain_name
        if domain:
            return self._host_rule(pool, service, group, action, tags), f"{self.protocol}://{service}.{domain}"
        route, port = self._service_listener(pool, group, tags, recorded)
        return route, f"{self.protocol}://{pool.dns_name}:{port}"

    def _remove_rules(self, pool: AlbPool, group: str, recorded: str | None) -> None:
        """Every host rule on `pool` that forwards to `group` (or is the recorded one: a route on the
        wake target no longer names the group)."""
        for rule in self._rules(self._host_listener(pool)):
            ours = forwards_to(rule.get("Actions", []), group) or rule.get("RuleArn") == recorded
            if ours and not rule.get("IsDefault"):
                self._delete(self.elbv2.delete_rule, RuleArn=rule["RuleArn"])

    def _remove_listeners(self, pool: AlbPool, group: str, recorded: str | None) -> None:
        """Every listener of `pool` that forwards to `group` (or is the recorded one)."""
        for listener in self._listeners(pool.arn):
            if forwards_to(listener.get("DefaultActions", []), group) or listener.get("ListenerArn") == recorded:
                self._delete(self.elbv2.delete_listener, ListenerArn=listener["ListenerArn"])

    def _listing(self, key: str, read: Callable[[], Iterator[dict[str, Any]]]) -> list[dict[str, Any]]:
        listing = self._listings.get(key)
        if listing is None:
            listing = self._listings[key] = list(read())
        return listing

    # -- a listener of its own (no domain) -------------------------------------------------------------

    def _service_listener(
        self, pool: AlbPool, group: str, tags: list[TagTypeDef], recorded: str | None
    ) -> tuple[str, int]:
        """The service's own listener (its ARN and port): found by the target group it forwards to
        (or, while it forwards to the wake target, as `recorded`), else created on the lowest free
        port of the range; a port a concurrent worker took between the describe and the create is
        given up for the next free one."""
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                return self._find_or_create_listener(pool, group, tags, recorded)
            except ClientError as exc:
                self._listings.pop(pool.arn, None)
                if code(exc) != "DuplicateListener" or attempt == CONFLICT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _find_or_create_listener(
        self, pool: AlbPool, group: str, tags: list[TagTypeDef], recorded: str | None
    ) -> tuple[str, int]:
        listeners = self._listing(pool.arn, lambda: self._listeners(pool.arn))
        mine = sorted(
            (
                listener
                for listener in listeners
                if forwards_to(listener.get("DefaultActions", []), group) or listener.get("ListenerArn") == recorded
            ),
            key=lambda listener: (listener.get("ListenerArn") != recorded, int(listener.get("Port", 0))),
        )
        if mine:
            # Two runs that raced may each have made one: keep the lowest port, drop the others.
            for extra in mine[1:]:
                self._delete(self.elbv2.delete_listener, ListenerArn=extra["ListenerArn"])
            return str(mine[0]["ListenerArn"]), int(mine[0]["Port"])
        taken = {int(listener.get("Port", 0)) for listener in listeners}
        first, last = self.settings.listener_ports
        port = next((p for p in range(first, last + 1) if p not in taken), None)
        if port is None or len(listeners) >= self.quotas.listeners:
            message = (
                f"every listener port {first}-{last} of the stack's load balancer is taken: it carries "
                "as many services as it can (docs/DEPLOY.md: more services need a domain name or another stack)"
            )
            if not self.pools_enabled:
                raise NoListenerPort(message)
            raise PoolFull(f"pool {pool.number}: {message}")
        args: dict[str, Any] = {
            "LoadBalancerArn": pool.arn,
            "Protocol": "HTTP",
            "Port": port,
            "DefaultActions": [forward(group)],
            "Tags": tags,
        }
        certificate = self.settings.certificate_arn
        if certificate:
            args.update(Protocol="HTTPS", Certificates=[{"CertificateArn": certificate}], SslPolicy=TLS_POLICY)
        created = self.elbv2.create_listener(**args)["Listeners"][0]
        listeners.append(
            {"ListenerArn": created["ListenerArn"], "Port": port, "DefaultActions": args["DefaultActions"]}
        )
        return str(created["ListenerArn"]), port

    # -- a host rule (a domain) ------------------------------------------------------------------------

    def _host_rule(self, pool: AlbPool, service: str, group: str, action: ActionTypeDef, tags: list[TagTypeDef]) -> str:
        """The service's host rule NAME.<domain> on the pool's listener, created or given `action`;
        a priority a concurrent worker took between the describe and the create is given up for the
        next free one."""
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                return self._find_or_create_rule(pool, service, group, action, tags)
            except ClientError as exc:
                self._listings.clear()
                if code(exc) != "PriorityInUse":
                    raise
                if attempt == CONFLICT_ATTEMPTS:
                    if self.pools_enabled:
                        raise PoolFull(f"pool {pool.number}: PriorityInUse {attempt} times") from None
                    raise
        raise AssertionError("unreachable")

    def _find_or_create_rule(
        self, pool: AlbPool, service: str, group: str, action: ActionTypeDef, tags: list[TagTypeDef]
    ) -> str:
        host = f"{service}.{self.settings.domain_name}"
        listener = self._host_listener(pool)
        if listener is None:
            self._prepare(pool)  # a new pool: its listener first
            listener = self._host_listener(pool)
        rules = self._listing(str(listener), lambda: self._rules(listener))
        mine = [rule for rule in rules if not rule.get("IsDefault") and _hosts(rule) == [host]]
        for rule in mine[1:]:
            self._delete(self.elbv2.delete_rule, RuleArn=rule["RuleArn"])
        if mine:
            rule = mine[0]
            if forward_weights(rule.get("Actions", [])) != forward_weights([action]):
                self.elbv2.modify_rule(RuleArn=rule["RuleArn"], Actions=[action])
            return str(rule["RuleArn"])
        self._check_room(pool, rules, group)
        taken = {int(rule["Priority"]) for rule in rules if str(rule.get("Priority", "")).isdigit()}
        priority = next(p for p in range(1, 50_001) if p not in taken)
        conditions: list[RuleConditionTypeDef] = [{"Field": "host-header", "HostHeaderConfig": {"Values": [host]}}]
        created = self.elbv2.create_rule(
            ListenerArn=str(listener), Priority=priority, Conditions=conditions, Actions=[action], Tags=tags
        )["Rules"][0]
        # This run's listing of the pool's rules, as ELB now has them (the next placement reads it).
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

    def _check_room(self, pool: AlbPool, rules: list[dict[str, Any]], group: str) -> None:
        """PoolFull when one more host rule (and its target group) would go past the pool's quotas."""
        service_rules = [rule for rule in rules if not rule.get("IsDefault")]
        groups = {g for rule in service_rules for g in forward_weights(rule.get("Actions", []))}
        wake = 1 if self.settings.wake_target_group else 0
        if self.pools_enabled and (
            len(service_rules) >= self.quotas.rules or len(groups | {group}) + wake > self.quotas.target_groups
        ):
            raise PoolFull(f"pool {pool.number}: TooManyRules: {QUOTA_MESSAGES['TooManyRules']}")


def _hosts(rule: dict[str, Any]) -> list[str]:
    hosts: list[str] = []
    for condition in rule.get("Conditions", []):
        if condition.get("Field") == "host-header":
            hosts.extend((condition.get("HostHeaderConfig") or {}).get("Values") or condition.get("Values") or [])
    return hosts
