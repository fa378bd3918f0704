"""What a plan can ask the shell to do: the action types, each applied as one step, in the order
`plan` returns them."""

from __future__ import annotations

from dataclasses import dataclass

from fleetkeeper.model import (
    AutoscalerState,
    EndpointConfig,
    Market,
    ReplicaRecord,
    ServiceStatus,
    VersionState,
)


@dataclass(frozen=True)
class RecordReplica:
    """Write `after` over `before` (conditioned on `before.rev`)."""

    before: ReplicaRecord
    after: ReplicaRecord


@dataclass(frozen=True)
class DeleteReplica:
    replica: ReplicaRecord


@dataclass(frozen=True)
class Terminate:
    """Terminate these instances; `reasons` pairs each instance id with why (for the log)."""

    reasons: tuple[tuple[str, str], ...]

    @property
    def instance_ids(self) -> tuple[str, ...]:
        return tuple(instance_id for instance_id, _ in self.reasons)


@dataclass(frozen=True)
class Claim:
    """Claim new replica ids for `version`: bump the service's replica_seq and put PENDING items.
    The ids in `spot` are bought as spot instances, the others on demand."""

    version: int
    replica_ids: tuple[int, ...]
    spot: tuple[int, ...] = ()

    def market(self, replica_id: int) -> Market:
        return Market.SPOT if replica_id in self.spot else Market.ON_DEMAND


@dataclass(frozen=True)
class Launch:
    """Start replica `replica_id`'s instance. `fresh`: claimed by this very plan, so never launched."""

    replica_id: int
    fresh: bool


@dataclass(frozen=True)
class MarkVersion:
    version: int
    expected: VersionState
    state: VersionState
    message: str = ""


@dataclass(frozen=True)
class TripBreaker:
    """Mark `version` FAILED and, when there is one, move the target back to `rollback_to`."""

    version: int
    message: str
    rollback_to: int | None

    @property
    def status_message(self) -> str:
        """What the rollback writes on the service at once, so a client waiting on the update sees why."""
        return f"rolling back to version {self.rollback_to}: {self.message}"


@dataclass(frozen=True)
class RecordStatus:
    status: ServiceStatus
    message: str
    observed_generation: int


@dataclass(frozen=True)
class DeleteService:
    """Every instance is gone: delete the DELETING service item (cleanup takes its children)."""


@dataclass(frozen=True)
class EnsureEndpoint:
    """Create the service's endpoint, or bring it to `config`, then record it on the service item.
    Planned before any replica is registered, and whenever the target version's spec changes it."""

    config: EndpointConfig


@dataclass(frozen=True)
class Register:
    """Put these replicas into the endpoint (their records say REGISTERING), then record each
    REGISTERED (`registered`)."""

    replica_ids: tuple[int, ...]


@dataclass(frozen=True)
class Deregister:
    """Take these replicas out of the endpoint. Their records say DRAINING already (written first),
    or their items are about to be deleted; their instances are terminated in a later run, once
    drained or past the drain deadline."""

    replica_ids: tuple[int, ...]


@dataclass(frozen=True)
class RecordAutoscale:
    """Write the service's autoscaler state `after` over `before` (conditioned on `before`'s revision).
    Planned first: the replicas the rest of the plan aims at are `after`'s target, so a run that
    dies before the write decides again from `before`, and one that dies after it goes on from
    `after`; either way the decision is the one the table's state and the rate give."""

    before: AutoscalerState | None
    after: AutoscalerState | None


@dataclass(frozen=True)
class RouteEndpoint:
    """Point the endpoint's route at the stack's wake target (`waking`: an autoscaled service with no
    replica in its endpoint, fleetkeeper.wake.demand) or back at its target group, then record which.
    Planned after the registrations and deregistrations: the route returns to the wake target only
    once the last replica is out, and leaves it only once the balancer serves a registered one."""

    waking: bool


@dataclass(frozen=True)
class RemoveEndpoint:
    """A deleted service's last instance is gone: delete its endpoint before the service item."""


Action = (
    RecordReplica
    | DeleteReplica
    | Terminate
    | Claim
    | Launch
    | MarkVersion
    | TripBreaker
    | RecordStatus
    | DeleteService
    | EnsureEndpoint
    | Register
    | Deregister
    | RouteEndpoint
    | RemoveEndpoint
    | RecordAutoscale
)
