"""The replica driver interface: how the reconciler's shell starts, finds and stops replicas.

Two drivers implement it: `ec2` (production) and `process` (embedded mode: replicas are local
process groups that really serve HTTP). The reconciler never talks to EC2 or processes directly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

from fleetkeeper.model import Market

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fleetkeeper.spec import ServiceSpec

# Tags every instance fleetkeeper launches carries; the managed tag is what its IAM policy keys on.
MANAGED_TAG = "fleetkeeper:managed"
# The managed tag's value; the IAM policy lets the reconciler terminate only instances that carry it.
MANAGED_VALUE = "true"
SERVICE_TAG = "fleetkeeper:service"
UID_TAG = "fleetkeeper:uid"
VERSION_TAG = "fleetkeeper:version"
REPLICA_TAG = "fleetkeeper:replica-id"


class InstanceState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SHUTTING_DOWN = "shutting-down"
    TERMINATED = "terminated"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Instance:
    """One replica's machine as the driver sees it now."""

    instance_id: str
    state: InstanceState
    service: str
    uid: str
    version: int
    replica_id: int
    private_ip: str | None = None
    spot: bool = False
    # Why the instance stopped or terminated, when known: the code (EC2's StateReason code, such as
    # "Server.SpotInstanceTermination" or "Client.UserInitiatedShutdown", or a driver's own) is the
    # fact the reconciler decides on; the message is for people.
    state_reason_code: str | None = None
    state_reason: str | None = None
    launched_at: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    # The ClientToken it was launched with (DescribeInstances reports it; "" or None when launched
    # without one). Only a token fleetkeeper derives for the tagged replica makes the instance
    # fleetkeeper's: anyone allowed ec2:CreateTags can copy the tags (plan.launched_by_fleetkeeper).
    client_token: str | None = None
    instance_type: str | None = None


@dataclass(frozen=True)
class LaunchRequest:
    service: str
    uid: str
    version: int
    replica_id: int
    spec: ServiceSpec
    # Launches of this replica AWS refused so far. A retry after a refusal is a different launch (the
    # next capacity pool: another subnet or instance type), so it gets its own token; a retry after a
    # crash keeps the token, and the pool with it.
    attempt: int = 0
    market: Market = Market.ON_DEMAND
    # Where the version's secret values are (fleetkeeper.secret_store): the replica reads them at boot.
    secrets_ref: str | None = None
    # The service's owner (ServiceRecord.owner): its secrets, workdir copy and log stream are under the
    # owner's scope, and on AWS the replica runs with the owner's role (fleetkeeper.identity).
    owner: str = ""

    @property
    def client_token(self) -> str:
        """Idempotency token for the launch: unique per (incarnation, replica, refusal), <= 64 characters."""
        return client_token(self.uid, self.replica_id, self.attempt)


def client_token(uid: str, replica_id: int, attempt: int = 0) -> str:
    """The ClientToken of launch `attempt` of a replica: `fk-<uid>-<replica id>`, then `...-<attempt>`."""
    token = f"fk-{uid}-{replica_id}"
    return token if attempt == 0 else f"{token}-{attempt}"


class LaunchRefused(Exception):
    """The cloud refused the launch (capacity, quota, bad parameter); the message says what AWS said."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ReplicaDriver(Protocol):
    def list_instances(self, uids: Sequence[str] | None = None) -> list[Instance]:
        """Every managed instance (of these incarnations when `uids` is given), in as few calls as possible."""
        ...

    def find_instance(self, uid: str, replica_id: int) -> Instance | None:
        """The live instance launched for this replica, if any (looked up by tag before a launch)."""
        ...

    def instance(self, instance_id: str) -> Instance | None:
        """One managed instance by id (an interruption warning names only that), None if not managed."""
        ...

    def pool_count(self, request: LaunchRequest) -> int:
        """How many capacity pools (instance type x subnet) attempts of this launch walk in turn:
        attempt n goes to pool n modulo this."""
        ...

    def launch(self, request: LaunchRequest) -> Instance:
        """Start the replica's instance. Idempotent per `request.client_token`. Raises LaunchRefused."""
        ...

    def terminate(self, instance_ids: Sequence[str]) -> None:
        """Terminate these instances; already-terminated ones are not an error."""
        ...

    def base_url(self, instance: Instance, port: int) -> str | None:
        """`http://host:port` of the replica, None while it has no address.

        `port` is the spec's service port; a driver whose replicas get their own ports (process)
        uses theirs. The ec2 driver honours FLEETKEEPER_REPLICA_HOST (tests and benchmarks).
        """
        ...
