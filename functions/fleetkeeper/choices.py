"""The extensible choices of fleetkeeper, each defined once: what a spec, the CLI and the embedded
mode may name, and what every consumer must have a behaviour for.

- `LoadBalancingPolicy`: `service.load_balancing_policy` (SkyPilot Serve's names).
- `UpdateMode`: `update.mode` and `fleetkeeper update --mode`.
- `Market`: how a replica's instance is bought (`resources.use_spot` and its on-demand fallback).
- `Isolation`: how the embedded mode's replicas get a host of their own (`fleetkeeper local --isolation`).

This module imports nothing of fleetkeeper's, so the planner (pure, pyproject.toml's pure-planner
contract), the Lambda handlers, the embedded mode and the CLI may all read it.

Adding a choice
---------------
Add one member to its enum here, then its behaviour in each consumer; tests/test_choices.py fails
until every consumer has one (it lists them). The spec's error messages and `fleetkeeper local
--isolation` list the members from the enum, in its order.

- a load-balancing policy: its entry in `_BALANCED_AS` here if it is balanced as another one;
  otherwise the ALB's algorithm (`ALGORITHMS`, fleetkeeper.reconciler.balancers.alb.target_groups)
  and the local balancer's picker (`PICKERS`, fleetkeeper.local.balancer), and its words in
  `_POLICY_NOTES` if it needs some in the spec's refusal;
- an update mode: how it rolls out (`ROLLOUTS`, fleetkeeper.reconciler.plan.replicas); the spec and
  the api read the enum, and `fleetkeeper update --mode` offers them (fleetkeeper.cli.args);
- a market: how the planner counts it (fleetkeeper.reconciler.plan.markets.wanted_by_market) and
  how each driver buys it (the EC2 driver's `MARKET_OPTIONS`, fleetkeeper.reconciler.drivers.ec2);
- an isolation: what the process driver resolves it to (`RESOLVED`, fleetkeeper.local.process_driver).

Removing or renaming a choice
-----------------------------
Don't: the table keeps the values of `LoadBalancingPolicy`, `UpdateMode` and `Market` (in stored
specs and replicas), and the store decodes them into these enums, so a stored value the running
code lacks fails every read of its service (after a rollback to a release before one was added,
too). tests/test_choices.py lists every released value and fails when one is gone. Retiring a
choice means first accepting it as an alias of another, for as long as a stored item may hold it.

A readiness-probe option is a field, not a choice: see `PROBE_OPTIONS` in fleetkeeper.spec.service.
"""

from __future__ import annotations

from enum import StrEnum


class LoadBalancingPolicy(StrEnum):
    """How the endpoint picks the replica a request goes to (SkyPilot Serve's policy names)."""

    # SkyPilot's default: the replica with the fewest requests in flight (the ALB's
    # least_outstanding_requests).
    LEAST_LOAD = "least_load"
    # Each replica in turn (the ALB's round_robin).
    ROUND_ROBIN = "round_robin"
    # SkyPilot's fewest in flight relative to each replica's per-accelerator target: balanced as
    # LEAST_LOAD here (an ALB target group has no per-target weights, and sending each request to the
    # replica with the fewest in flight already gives a faster replica more: it finishes sooner).
    INSTANCE_AWARE_LEAST_LOAD = "instance_aware_least_load"

    @property
    def balanced_as(self) -> LoadBalancingPolicy:
        """The policy the load balancers run for this one (what `EndpointConfig.policy` holds)."""
        return _BALANCED_AS.get(self, self)

    @classmethod
    def balanced(cls) -> list[LoadBalancingPolicy]:
        """The policies a load balancer may be configured with: each needs a behaviour in every adapter."""
        return [policy for policy in cls if policy.balanced_as is policy]

    @classmethod
    def in_words(cls) -> str:
        """The policies as the spec's refusal lists them: `least_load (...), round_robin or ...`."""
        words = [f"{policy}{_POLICY_NOTES.get(policy, '')}" for policy in cls]
        return f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else words[0]


DEFAULT_LOAD_BALANCING_POLICY = LoadBalancingPolicy.LEAST_LOAD
_BALANCED_AS = {LoadBalancingPolicy.INSTANCE_AWARE_LEAST_LOAD: LoadBalancingPolicy.LEAST_LOAD}
_POLICY_NOTES = {LoadBalancingPolicy.LEAST_LOAD: " (the default: the replica with the fewest requests in flight)"}


class UpdateMode(StrEnum):
    """How a service's replicas move to a new target version."""

    # Replace a few at a time: at most `max_surge` over and `max_unavailable` under the wanted count.
    ROLLING = "rolling"
    # SkyPilot's switch: the old version goes at once when the new one has min_replicas READY.
    BLUE_GREEN = "blue_green"


DEFAULT_UPDATE_MODE = UpdateMode.ROLLING


class Market(StrEnum):
    """How a replica's instance is bought: decided when the replica is claimed, never changed."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"


class Isolation(StrEnum):
    """How the embedded mode's replicas get a host of their own (fleetkeeper.local.process_driver)."""

    # The default: NETNS where the machine allows it, else SHARED.
    AUTO = "auto"
    # A network namespace each (loopback only): every replica binds its spec's port.
    NETNS = "netns"
    # This machine's loopback: each replica gets a free port as $PORT.
    SHARED = "shared"


def values(choice: type[StrEnum]) -> list[str]:
    """A choice's values, in order: what argparse's `choices=` and a message list (plain strings, so
    argparse's help and errors show `auto`, not `<Isolation.AUTO: 'auto'>`)."""
    return [member.value for member in choice]
