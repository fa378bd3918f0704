"""The load balancer interface: how the reconciler's shell gives each service one endpoint.

Two adapters implement it, as two drivers implement `ReplicaDriver`: `alb` (production: one
Application Load Balancer per stack, a target group and a listener or host rule per service) and
`local` (embedded mode: a real HTTP load balancer on 127.0.0.1, one port per service). The
reconciler never talks to either directly.

Every call is idempotent, and what the reconciler has done with the balancer is recorded in the
table (the service item's `endpoint`, each replica item's `balancer` state), so a steady service
costs no balancer call at all: the balancer is called only to change something, or to ask how far
a replica's drain has got.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime

    from fleetkeeper.model import EndpointConfig, EndpointRecord

# The tags of every load balancer resource fleetkeeper creates (the reconciler's IAM policy lets it
# change or delete only resources carrying the managed one); the same keys as the instances'.
MANAGED_TAG = "fleetkeeper:managed"
MANAGED_VALUE = "true"
SERVICE_TAG = "fleetkeeper:service"
UID_TAG = "fleetkeeper:uid"

# The CloudWatch metric both adapters publish for an endpoint (the ALB itself, the local balancer
# into the in-memory AWS): requests received per target group per minute. The autoscaler reads it
# with the endpoint's recorded dimensions (EndpointRecord.dimensions).
METRIC_NAMESPACE = "AWS/ApplicationELB"
METRIC_NAME = "RequestCount"


class DrainState(StrEnum):
    """How far a deregistered target has got, as the balancer reports it."""

    # The balancer still routes new requests to it: the deregistration was lost (a run died
    # between writing DRAINING and deregistering). Deregister it again.
    IN_SERVICE = "IN_SERVICE"
    # Out of the endpoint, finishing requests in flight.
    DRAINING = "DRAINING"
    # Out of the endpoint with nothing in flight (or unknown to it): safe to terminate.
    DRAINED = "DRAINED"


class EndpointRefused(Exception):
    """The balancer cannot make the service's endpoint, or take its new targets, for a reason the
    service's users must see and an operator can act on: a quota of the load balancer or the
    account is reached. The reconciler shows it in the service's status message (not a run error,
    which only the operator's logs show) and tries again every run, so the endpoint comes once
    the quota is raised or something else makes room. The message says what is full and what to do."""


@dataclass(frozen=True)
class Target:
    """One replica as the balancer sees it: the ALB registers `instance_id` on `port`; the local
    balancer proxies to `url` (its host is always 127.0.0.1 there)."""

    replica_id: int
    instance_id: str
    port: int
    url: str | None


# The stack's id on everything it creates (fleetkeeper.reconciler.ownership): the same key as instances'.
STACK_TAG = "fleetkeeper:stack"
# "This name must be unique per region per account, can have a maximum of 32 characters, must contain
# only alphanumeric characters or hyphens, and must not begin or end with a hyphen."
# (https://docs.aws.amazon.com/elasticloadbalancing/latest/APIReference/API_CreateTargetGroup.html)
MAX_TARGET_GROUP_NAME = 32


def served_subnets(
    replica_subnets: Sequence[str], balancer_subnets: Iterable[str], zone_of: Mapping[str, str]
) -> list[str]:
    """The replica subnets in a zone one of the load balancer's subnets is in, in their given order:
    a target elsewhere is `unused`, `Target.NotInUse` (the ec2 driver's launches and the deployment's
    check, fleetkeeper.deploy.zone_check, both keep to it)."""
    served = {zone_of[s] for s in balancer_subnets if s in zone_of}
    return [s for s in replica_subnets if zone_of.get(s) in served]


def target_group_name(uid: str, stack: str = "") -> str:
    """The deterministic name of an incarnation's target group: a retried create finds its own
    earlier one (names are unique per account and region, at most 32 characters).

    `fk-<stack>-<uid>` (3 + 12 + 1 + 16 = 32 characters at most): the stack's id in the name lets its
    IAM policy name only its own target groups. Without a stack, the name a target group got before
    stacks had ids (`fk-<uid>`), which an upgraded stack keeps using for its existing services.
    """
    name = f"fk-{stack}-{uid}" if stack else f"fk-{uid}"
    if len(name) > MAX_TARGET_GROUP_NAME:
        raise ValueError(f"target group name {name!r} is over ELB's {MAX_TARGET_GROUP_NAME} characters")
    return name


# Load-balancer pools (docs/architecture/load-balancer-pools.md): the load balancers that each host
# several services. Pool 0 is the template's ALB and its wake target group `fkwake-<stack>`; pool
# n >= 1 is the ALB `fk-<stack>-<n>` the reconciler made, with the wake target group
# `fkwake-<stack>-<n>`. Deterministic names: a retried or concurrent create finds the same one.
# ("This name must be unique per region per account, can have a maximum of 32 characters, must
# contain only alphanumeric characters or hyphens, must not begin or end with a hyphen, and must not
# begin with "internal-"", CreateLoadBalancer's Name in botocore's model; fk-<12>-<2 digits> is 18.)
# The tag's key says shard, as on the load balancers and wake groups deployed stacks already have:
# kept, so that theirs and the ones made next carry the same tag (a pool is not a dispatcher's shard).
POOL_TAG = "fleetkeeper:shard"
MAX_LOAD_BALANCER_NAME = 32


def pool_name(stack: str, number: int) -> str:
    """The ALB name of extra pool `number` (>= 1)."""
    if number < 1:
        raise ValueError("pool 0 is the template's load balancer")
    name = f"fk-{stack}-{number}"
    if len(name) > MAX_LOAD_BALANCER_NAME:
        raise ValueError(f"load balancer name {name!r} is over ELB's {MAX_LOAD_BALANCER_NAME} characters")
    return name


def wake_group_name(stack: str, number: int) -> str:
    """The wake target group of pool `number` (a target group is attached to one load balancer only)."""
    return f"fkwake-{stack}" if number == 0 else f"fkwake-{stack}-{number}"


def pool_number(name: str, stack: str) -> int | None:
    """The pool a load balancer name `fk-<stack>-<n>` is (None: not one of this stack's pools)."""
    return _numbered(name, f"fk-{stack}-")


def wake_group_pool(name: str, stack: str) -> int | None:
    """The pool a wake target group name serves (None: not this stack's)."""
    return 0 if name == f"fkwake-{stack}" else _numbered(name, f"fkwake-{stack}-")


def _numbered(name: str, prefix: str) -> int | None:
    """n of `<prefix><n>`, n >= 1 written as the names are made (ASCII digits, no leading zero)."""
    rest = name.removeprefix(prefix) if name.startswith(prefix) else ""
    if not (rest.isascii() and rest.isdigit()) or rest.startswith("0"):
        return None
    return int(rest)


def load_balancer_name(arn: str) -> str:
    """A load balancer's name from its ARN (`...:loadbalancer/app/<name>/<id>`)."""
    return arn.split(":loadbalancer/", 1)[-1].split("/")[1] if ":loadbalancer/" in arn else ""


class LoadBalancer(Protocol):
    def ensure(self, service: str, uid: str, config: EndpointConfig, known: EndpointRecord | None) -> EndpointRecord:
        """Create the service's endpoint, or bring it to `config`; returns it. Idempotent: what an
        earlier (maybe crashed) call created is found and reused, never duplicated."""
        ...

    def register(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> Mapping[str, str]:
        """Send the endpoint's requests to these targets too (already registered: no error).

        Returns the targets it took but will send no request to, by instance id, with why (the ALB:
        `Target.NotInUse`, an instance in an Availability Zone the load balancer is not enabled in);
        the reconciler says so on the replica instead of letting it look served."""
        ...

    def deregister(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> None:
        """Stop sending new requests to these targets; those in flight finish (not registered: no error)."""
        ...

    def drain_states(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> dict[str, DrainState]:
        """How far each target's drain has got, by instance id."""
        ...

    def serves(self, endpoint: EndpointRecord, targets: Sequence[Target]) -> bool:
        """Whether the balancer would send a request to one of these registered targets now (asked
        while the endpoint routes to the wake target, before routing it back)."""
        ...

    def route(self, endpoint: EndpointRecord, *, waking: bool) -> None:
        """Send the endpoint's requests to the stack's wake target (`waking`: the service has no
        replica in it; fleetkeeper.wake.demand) or to its target group. Idempotent."""
        ...

    def remove(self, service: str, uid: str, known: EndpointRecord | None) -> None:
        """Delete everything the incarnation's endpoint used (route, target group, local port),
        including what a crashed `ensure` created but never recorded. Nothing left: no error."""
        ...

    def forget(self) -> None:
        """A new run begins: forget what earlier runs learnt of the load balancers (level-triggered:
        each run observes again)."""
        ...

    def retire_pools(self, now: datetime) -> list[str]:
        """Delete the load balancers the stack made for more endpoints and no longer uses (the
        dispatcher's, once a period); the names of those deleted. A balancer without pools: []."""
        ...
