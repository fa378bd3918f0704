"""The stack's pools: the load balancers that each host several services, made and retired here.

The template's ALB is pool 0; once it is full the adapter makes more like it (`fk-<stack id>-<n>`,
with a wake group each: fleetkeeper.reconciler.balancer.pool_name), counted against ELB's per-ALB
quotas (PoolQuotas). The dispatcher retires a pool no service uses (`retire_pools`): tagged when
found empty, deleted once it stayed empty. Only load balancers named `fk-<stack>-<n>` AND tagged
with this stack's id are the stack's. docs/architecture/load-balancer-pools.md.

(The dispatcher's shards, fleetkeeper.reconciler.fanout, are batches of services, not these.)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper.model import from_iso, to_iso
from fleetkeeper.reconciler.balancer import (
    MANAGED_TAG,
    MANAGED_VALUE,
    POOL_TAG,
    STACK_TAG,
    EndpointRefused,
    load_balancer_name,
    pool_name,
    pool_number,
    wake_group_name,
)
from fleetkeeper.reconciler.balancers.alb.elb import QUOTA_MESSAGES, TLS_POLICY, code
from fleetkeeper.reconciler.balancers.alb.target_groups import TargetGroups
from fleetkeeper.settings import ALB_SECURITY_GROUP_ENV

if TYPE_CHECKING:
    from datetime import datetime

    from mypy_boto3_elbv2.type_defs import ActionTypeDef, TagTypeDef

logger = logging.getLogger(__name__)


class PoolFull(Exception):
    """This pool has no room for one more service route (counted, or ELB's quota error)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ELB's answers that mean "this load balancer has no room for one more route": the next pool is tried.
# TooManyUniqueTargetGroupsPerLoadBalancer: 100 target groups per ALB (the wake group counted).
POOL_FULL_ERRORS = {"TooManyRules", "TooManyListeners", "TooManyUniqueTargetGroupsPerLoadBalancer"}
# Pools a placement may try: the per-Region quota of ALBs is 50 by default, the template's counted.
MAX_POOLS = 50
# The idle timeout of a pool (as the template sets its ALB's): LoadBalancerIdleTimeout.
_IDLE_TIMEOUT = "idle_timeout.timeout_seconds"
# A pool found with no service route is tagged with when; deleted once it stayed empty this long
# (longer than a Lambda invocation may run, 900 s: no worker still holds an older view of it).
EMPTY_SINCE_TAG = "fleetkeeper:empty-since"
RETIRE_AFTER_SECONDS = 960
# How long a balancer trusts what it learnt of the pools (a run's placements share it).
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
class PoolQuotas:
    """ELB's per-ALB quotas the placement counts against (AWS's defaults,
    https://docs.aws.amazon.com/elasticloadbalancing/latest/application/load-balancer-limits.html).
    A raised quota is still met: the count only skips pools that are surely full, and a pool ELB
    refuses (TooManyRules, ...) is passed over the same way."""

    listeners: int = 50
    rules: int = 100  # not counting default rules
    target_groups: int = 100  # the pool's wake group included


@dataclass(frozen=True)
class AlbPool:
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
class Pools(TargetGroups):
    """The stack's pools: found, made like the template's ALB (its subnets, security group, scheme,
    idle timeout) and prepared for routes, retired when empty. No security group: no pool is made,
    a full ALB refuses the next service."""

    quotas: PoolQuotas = field(default_factory=PoolQuotas)
    # What this balancer learnt of the pools, for CACHE_SECONDS (a run's placements share it; a
    # balancer kept longer, as the tests' is, looks again): pools by number, those found full (and
    # why), each pool's host-rule listener, wake group and readiness, by its ARN.
    _pools: dict[int, AlbPool] = field(default_factory=dict, init=False, repr=False)
    _discovered: float | None = field(default=None, init=False, repr=False)
    _full: dict[int, tuple[float, str]] = field(default_factory=dict, init=False, repr=False)
    _host_listeners: dict[str, str | None] = field(default_factory=dict, init=False, repr=False)
    _wake_groups: dict[str, str | None] = field(default_factory=dict, init=False, repr=False)
    _prepared: set[str] = field(default_factory=set, init=False, repr=False)

    @property
    def pools_enabled(self) -> bool:
        return bool(self.settings.security_group_id and self.settings.subnet_ids)

    def forget(self) -> None:
        self._pools.clear()
        self._discovered = None
        self._full.clear()
        self._host_listeners.clear()
        self._wake_groups.clear()
        self._prepared.clear()
        super().forget()

    def retire_pools(self, now: datetime) -> list[str]:
        """The dispatcher's sweep of the stack's extra pools (n >= 1): one with no service route is
        tagged `fleetkeeper:empty-since`, one that still has none RETIRE_AFTER_SECONDS later is
        deleted (its wake group, then the load balancer with its listeners), one that got a route
        again loses the tag. Only load balancers named `fk-<stack>-<n>` AND tagged with this stack's
        id are touched. The names deleted."""
        if not self.pools_enabled:
            return []
        self._discovered = None
        self._discover()
        deleted: list[str] = []
        for number, pool in sorted(self._pools.items()):
            if number == 0:
                continue
            routes = self._service_routes(pool)
            since = pool.empty_since  # its tags, read by the discovery above
            if routes:
                if since is not None:
                    self.elbv2.remove_tags(ResourceArns=[pool.arn], TagKeys=[EMPTY_SINCE_TAG])
                continue
            if since is None:
                self.elbv2.add_tags(ResourceArns=[pool.arn], Tags=[{"Key": EMPTY_SINCE_TAG, "Value": to_iso(now)}])
                continue
            if (now - from_iso(since)).total_seconds() < RETIRE_AFTER_SECONDS:
                continue
            wake = self._wake_group(pool, make=False)
            if wake is not None:
                self._delete(self.elbv2.delete_target_group, TargetGroupArn=wake)
            self._delete(self.elbv2.delete_load_balancer, LoadBalancerArn=pool.arn)
            del self._pools[number]
            deleted.append(pool_name(self.settings.stack_id, number))
        return deleted

    # -- which pool ------------------------------------------------------------------------------------

    def _discover(self) -> None:
        """The stack's pools, once per invocation: one DescribeLoadBalancers of the Region (the
        per-Region quota is 50: one page) and DescribeTags of those named `fk-<stack>-<n>`; only
        those tagged with this stack's id are its pools."""
        if self._discovered is not None and time.monotonic() - self._discovered < CACHE_SECONDS:
            return
        self._discovered = time.monotonic()
        self._pools.clear()
        named: dict[int, dict[str, Any]] = {}
        kwargs: dict[str, Any] = {"PageSize": 400}
        while True:
            page = self.elbv2.describe_load_balancers(**kwargs)
            for balancer in page.get("LoadBalancers", []):
                number = pool_number(str(balancer.get("LoadBalancerName", "")), self.settings.stack_id)
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
                    self._pools[number] = _pool_from(number, named[number], tags)

    def _ours(self, tags: dict[str, str]) -> bool:
        return tags.get(MANAGED_TAG) == MANAGED_VALUE and tags.get(STACK_TAG) == self.settings.stack_id

    def _template_pool(self) -> AlbPool:
        return AlbPool(0, self.settings.arn, self.settings.dns_name)

    def _pool(self, number: int, *, make: bool = False) -> AlbPool | None:
        """Pool `number` (0: the template's ALB); made under its deterministic name when `make` and
        missing (a retried or concurrent make finds the same one)."""
        if number == 0:
            return self._template_pool()
        found = self._pools.get(number)
        if found is not None:
            return found
        self._discover()
        found = self._pools.get(number)
        if found is None and make:
            found = self._make_pool(number)
            self._pools[number] = found
        return found

    def _pool_of(self, arn: str) -> AlbPool:
        """The pool an endpoint records (re-made under its name if it went)."""
        if arn == self.settings.arn:
            return self._template_pool()
        number = pool_number(load_balancer_name(arn), self.settings.stack_id)
        if number is None:
            raise EndpointRefused(f"the endpoint's load balancer {arn} is not one of this stack's")
        if not self.pools_enabled:
            raise EndpointRefused(
                f"the endpoint is on load balancer pool {number}, and the stack is given no "
                f"{ALB_SECURITY_GROUP_ENV} to keep pools with"
            )
        found = self._pool(number, make=True)
        assert found is not None
        return found

    def _existing_pool(self, arn: str) -> AlbPool | None:
        if arn == self.settings.arn:
            return self._pool(0)
        number = pool_number(load_balancer_name(arn), self.settings.stack_id)
        if number is None or not self.pools_enabled:
            return None
        return self._pool(number)

    def _known_full(self, number: int) -> str | None:
        """Why pool `number` was found full in the last CACHE_SECONDS (None: not known to be)."""
        full = self._full.get(number)
        if full is not None and time.monotonic() - full[0] < CACHE_SECONDS:
            return full[1]
        return None

    def _mark_full(self, number: int, reason: str) -> None:
        self._full[number] = (time.monotonic(), reason)

    # -- making one ------------------------------------------------------------------------------------

    def _make_pool(self, number: int) -> AlbPool:
        """CreateLoadBalancer for pool `number`, like the template's ALB. The call is idempotent for
        identical settings (*CreateLoadBalancer*, "If you attempt to create multiple load balancers
        with the same settings, each call succeeds"); DuplicateLoadBalancerName means one of that name
        exists with other settings: it is used if it is this stack's, else refused."""
        name = pool_name(self.settings.stack_id, number)
        tags: list[TagTypeDef] = [
            {"Key": MANAGED_TAG, "Value": MANAGED_VALUE},
            {"Key": STACK_TAG, "Value": self.settings.stack_id},
            {"Key": POOL_TAG, "Value": str(number)},
        ]
        try:
            created = self.elbv2.create_load_balancer(
                Name=name,
                Subnets=list(self.settings.subnet_ids),
                SecurityGroups=[str(self.settings.security_group_id)],
                Scheme=self.settings.scheme,  # type: ignore[arg-type]
                Type="application",
                IpAddressType="ipv4",
                Tags=tags,
            )["LoadBalancers"][0]
        except ClientError as exc:
            error = code(exc)
            if error == "TooManyLoadBalancers":
                raise EndpointRefused(f"{error}: {QUOTA_MESSAGES[error]}") from None
            if error != "DuplicateLoadBalancerName":
                raise
            found = self.elbv2.describe_load_balancers(Names=[name])["LoadBalancers"][0]
            if not self._ours(self._tags_of(found["LoadBalancerArn"])):
                raise EndpointRefused(f"a load balancer named {name} exists and is not this stack's") from None
            logger.warning("load balancer %s exists with other settings than the stack's: used as it is", name)
            created = found
        pool = _pool_from(number, dict(created), {})
        logger.info("load balancer pool %s made: %s", number, name)
        return pool

    def _prepare(self, pool: AlbPool) -> None:
        """What a pool needs besides its routes, checked once per run that routes a service there:
        the template ALB's attributes (idle timeout, invalid headers dropped, desync mitigation), the
        wake group with the wake function in it, and with a domain the listeners the template gives
        its ALB. Each step finds what an earlier, crashed one made, and changes only what is missing
        or differs (RegisterTargets of the function is idempotent)."""
        if pool.number == 0 or pool.arn in self._prepared:
            return
        self._prepared.add(pool.arn)
        wanted = {
            _IDLE_TIMEOUT: str(self.settings.idle_timeout),
            # As the template's ALB: a request with a header field name HTTP does not allow never
            # reaches a replica.
            "routing.http.drop_invalid_header_fields.enabled": "true",
            "routing.http.desync_mitigation_mode": "defensive",
        }
        attributes = self.elbv2.describe_load_balancer_attributes(LoadBalancerArn=pool.arn)["Attributes"]
        have = {a.get("Key"): a.get("Value") for a in attributes}
        if any(have.get(key) != value for key, value in wanted.items()):
            self.elbv2.modify_load_balancer_attributes(
                LoadBalancerArn=pool.arn, Attributes=[{"Key": k, "Value": v} for k, v in wanted.items()]
            )
        self._wake_group(pool, make=True)
        if self.settings.domain_name:
            self._host_listener(pool, make=True)

    def _wake_group(self, pool: AlbPool, *, make: bool) -> str | None:
        """The pool's wake target group (a lambda target group with the wake function registered):
        a target group is attached to one load balancer only, so each pool has its own. Invoking the
        function is allowed for `fkwake-<stack>-*` by the template (WakeShardsInvokePermission)."""
        if not self.settings.wake_target_group:
            return None
        number = pool.number
        if number == 0:
            return self.settings.wake_target_group
        if self._wake_groups.get(pool.arn) is not None:
            return self._wake_groups[pool.arn]
        name = wake_group_name(self.settings.stack_id, number)
        group = self._named(name)
        if group is None and make:
            tags: list[TagTypeDef] = [
                {"Key": MANAGED_TAG, "Value": MANAGED_VALUE},
                {"Key": STACK_TAG, "Value": self.settings.stack_id},
                {"Key": POOL_TAG, "Value": str(number)},
            ]
            group = self.elbv2.create_target_group(Name=name, TargetType="lambda", Tags=tags)["TargetGroups"][0][
                "TargetGroupArn"
            ]
        if group is not None and make and self.settings.wake_function_arn:
            self.elbv2.register_targets(TargetGroupArn=group, Targets=[{"Id": self.settings.wake_function_arn}])
        self._wake_groups[pool.arn] = group
        return group

    def _host_listener(self, pool: AlbPool, *, make: bool = False) -> str | None:
        """With a domain: the pool's listener that carries the host rules (pool 0: the template's),
        HTTPS on 443 with the certificate (and 80 redirecting to it) or HTTP on 80, its default
        action a 404 in fleetkeeper's error shape, as the template makes them."""
        if pool.number == 0:
            return self.settings.listener_arn
        if self._host_listeners.get(pool.arn) is not None:
            return self._host_listeners[pool.arn]
        certificate = self.settings.certificate_arn
        port = 443 if certificate else 80
        listeners = {int(item.get("Port", 0)): str(item["ListenerArn"]) for item in self._listeners(pool.arn)}
        found = listeners.get(port)
        if make:
            tags: list[TagTypeDef] = [
                {"Key": MANAGED_TAG, "Value": MANAGED_VALUE},
                {"Key": STACK_TAG, "Value": self.settings.stack_id},
            ]
            if found is None:
                args: dict[str, Any] = {
                    "LoadBalancerArn": pool.arn,
                    "Protocol": "HTTP",
                    "Port": port,
                    "DefaultActions": [NOT_FOUND_RESPONSE],
                    "Tags": tags,
                }
                if certificate:
                    args.update(Protocol="HTTPS", Certificates=[{"CertificateArn": certificate}], SslPolicy=TLS_POLICY)
                found = self._create_listener(args, pool.arn, port)
            if certificate and 80 not in listeners:
                redirect: ActionTypeDef = {
                    "Type": "redirect",
                    "RedirectConfig": {"Protocol": "HTTPS", "Port": "443", "StatusCode": "HTTP_301"},
                }
                self._create_listener(
                    {
                        "LoadBalancerArn": pool.arn,
                        "Protocol": "HTTP",
                        "Port": 80,
                        "DefaultActions": [redirect],
                        "Tags": tags,
                    },
                    pool.arn,
                    80,
                )
        self._host_listeners[pool.arn] = found
        return found

    def _create_listener(self, args: dict[str, Any], balancer: str, port: int) -> str:
        try:
            return str(self.elbv2.create_listener(**args)["Listeners"][0]["ListenerArn"])
        except ClientError as exc:
            if code(exc) != "DuplicateListener":
                raise
            # A concurrent worker made it: that one.
            return next(str(item["ListenerArn"]) for item in self._listeners(balancer) if int(item["Port"]) == port)

    def _service_routes(self, pool: AlbPool) -> int:
        """How many service routes a pool carries (its listeners' non-default rules with a domain,
        else its listeners)."""
        if self.settings.domain_name:
            return sum(
                1
                for listener in self._listeners(pool.arn)
                for rule in self._rules(str(listener["ListenerArn"]))
                if not rule.get("IsDefault")
            )
        return sum(1 for _ in self._listeners(pool.arn))


def _pool_from(number: int, balancer: dict[str, Any], tags: dict[str, str]) -> AlbPool:
    return AlbPool(
        number=number,
        arn=str(balancer["LoadBalancerArn"]),
        dns_name=str(balancer.get("DNSName", "")),
        zone_id=str(balancer.get("CanonicalHostedZoneId", "")),
        empty_since=tags.get(EMPTY_SINCE_TAG),
    )
