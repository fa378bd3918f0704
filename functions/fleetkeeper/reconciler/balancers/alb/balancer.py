"""The alb balancer: the LoadBalancer protocol on the stack's Application Load Balancers, and where
each service's endpoint is placed.

A new service goes on the lowest pool with room (pools.py), its pool recorded in its endpoint
(`EndpointRecord.load_balancer`) and never moved while it has one; with a domain, a service past
pool 0 gets its record `NAME.<domain>` (dns.py). Per service incarnation, created by the reconciler
and tagged like its instances: a target group (target_groups.py) and a route to it (routes.py).

Stacks sharing an account (docs/architecture/stacks-and-security.md): a target group is named
`fk-<stack id>-<uid>` and everything is tagged `fleetkeeper:stack`; listeners and rules are only
ever looked for on the stack's own load balancers and listeners.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from fleetkeeper.model import EndpointRecord
from fleetkeeper.reconciler.balancer import EndpointRefused
from fleetkeeper.reconciler.balancers.alb.dns import Dns, names_pool
from fleetkeeper.reconciler.balancers.alb.elb import QUOTA_MESSAGES, code, quota_refusals, service_tags
from fleetkeeper.reconciler.balancers.alb.pools import MAX_POOLS, POOL_FULL_ERRORS, AlbPool, PoolFull
from fleetkeeper.reconciler.balancers.alb.routes import Routes

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mypy_boto3_elbv2.type_defs import TagTypeDef

    from fleetkeeper.model import EndpointConfig


@dataclass
class AlbBalancer(Routes, Dns):
    """`AlbBalancer(settings.alb)`: the parts (target groups, pools, routes, DNS) as one balancer."""

    def ensure(self, service: str, uid: str, config: EndpointConfig, known: EndpointRecord | None) -> EndpointRecord:
        with quota_refusals():
            return self._ensure(service, uid, config, known)

    def _ensure(self, service: str, uid: str, config: EndpointConfig, known: EndpointRecord | None) -> EndpointRecord:
        settings = self.settings
        # With a hosted zone, the name's record as this ensure found it (None: none yet).
        record = self._claim_name(service) if settings.domain_name and settings.hosted_zone_id else None
        tags = service_tags(service, uid, settings.stack_id)
        group, attached = self._target_group(uid, config, tags, known)
        # A waking route stays on the wake target: only `route` moves it.
        waking = known is not None and known.waking
        recorded = known.route if known is not None and known.target_group == group else None
        pool = self._placed(known, group, attached)
        if pool is not None:
            # Placed: it stays on its pool, whatever room another has (never moved while serving).
            self._prepare(pool)
            try:
                route, url = self._route_on(pool, service, group, tags, recorded, waking)
            except PoolFull as full:
                raise EndpointRefused(full.reason) from None
        else:
            pool, route, url = self._place(service, group, tags, waking)
        if settings.domain_name and pool.number > 0 and not names_pool(record, pool):
            self._publish(service, pool)
        dimensions = (
            ("LoadBalancer", pool.arn.split(":loadbalancer/", 1)[-1]),
            ("TargetGroup", group.rsplit(":", 1)[-1]),
        )
        return EndpointRecord(
            url=url,
            config=config,
            target_group=group,
            route=route,
            dimensions=dimensions,
            load_balancer=pool.arn,
        )

    def _placed(self, known: EndpointRecord | None, group: str, attached: Sequence[str]) -> AlbPool | None:
        """The pool the service's endpoint is on: the recorded one (re-made under its name if it went),
        else the one its target group is attached to (a run that died before recording its route),
        else None: not placed yet."""
        if known is not None and known.target_group == group:
            return self._pool_of(known.load_balancer or self.settings.arn)
        for arn in attached:
            return self._pool_of(arn)
        return None

    def _place(self, service: str, group: str, tags: list[TagTypeDef], waking: bool) -> tuple[AlbPool, str, str]:
        """A new endpoint on the lowest pool with room, making the next one when all are full. A
        pool that filled up meanwhile (another worker's route: ELB's quota error) is passed over."""
        reason = ""
        for number in range(MAX_POOLS):
            known_full = self._known_full(number)
            if known_full is not None:
                reason = known_full
                continue
            if number > 0:
                self._may_make_pools(reason)
            pool = self._pool(number, make=True)
            assert pool is not None
            if pool.retiring:
                continue  # going: the dispatcher deletes it once it stayed empty
            try:
                route, url = self._route_on(pool, service, group, tags, None, waking, placing=True)
            except PoolFull as refused:
                reason = refused.reason
                self._mark_full(number, reason)
                continue
            except ClientError as exc:
                if code(exc) == "TargetGroupAssociationLimit":
                    # Another worker put the group on a pool meanwhile: that is its pool.
                    _, attached = self._describe_group(group)
                    placed = self._placed(None, group, attached)
                    if placed is None:
                        raise
                    route, url = self._route_on(placed, service, group, tags, None, waking)
                    return placed, route, url
                if code(exc) not in POOL_FULL_ERRORS:
                    raise
                reason = f"{code(exc)}: {QUOTA_MESSAGES.get(code(exc), 'the load balancer is full')}"
                self._mark_full(number, reason)
                continue
            # Only the pool that takes the service: a run that dies before this is completed by
            # the next `ensure` (the service's group is attached to the pool, which is prepared then).
            self._prepare(pool)
            return pool, route, url
        raise EndpointRefused(
            f"every one of the {MAX_POOLS} load balancers a stack may have is full ({reason}): "
            "raise the quotas (docs/DEPLOY.md, Quotas)"
        )

    def _may_make_pools(self, reason: str) -> None:
        """Pool 0 is full: may a pool carry the next service?"""
        if not self.pools_enabled:
            raise EndpointRefused(reason)
        if self.settings.domain_name and not self.settings.hosted_zone_id:
            raise EndpointRefused(
                f"{reason}; the stack's load balancer is full, and more load balancers need DNS records "
                "the stack can only publish with a hosted zone: set the stack's HostedZoneId parameter "
                "(docs/DEPLOY.md, Quotas)"
            )

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
        template = self.settings.arn
        arns = dict.fromkeys([*attached, (known.load_balancer or template) if known is not None else template])
        for arn in arns:
            pool = self._existing_pool(arn)
            if pool is None:
                continue  # gone: so are its routes
            if self.settings.domain_name:
                self._remove_rules(pool, group, recorded)
                if pool.number > 0:
                    self._unpublish(service, pool)
            self._remove_listeners(pool, group, recorded)
        self._delete(self.elbv2.delete_target_group, TargetGroupArn=group)
