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

    from fleetkeeper.spec.service import ServiceSpec

# Tags every instance fleetkeeper launches carries; the managed tag is what its IAM policy keys on.
MANAGED_TAG = "fleetkeeper:managed"
# The managed tag's value; the IAM policy lets the reconciler terminate only instances that carry it.
MANAGED_VALUE = "true"
SERVICE_TAG = "fleetkeeper:service"
UID_TAG = "fleetkeeper:uid"
VERSION_TAG = "fleetkeeper:version"
REPLICA_TAG = "fleetkeeper:replica-id"
# The stack that launched the instance (Settings.stack_id): every describe, sweep and terminate of a
# stack keys on it, and its IAM policy lets it terminate only instances carrying its own value
# (fleetkeeper.reconciler.ownership; docs/architecture/stacks-and-security.md, "Stacks sharing an
# account").
STACK_TAG = "fleetkeeper:stack"


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
    # Its STACK_TAG ("" for an instance launched before stacks had one: fleetkeeper.reconciler.ownership).
    stack: str = ""
    spot: bool = False
    # Why the instance stopped or terminated, when known: the code (EC2's StateReason code, such as
    # "Server.SpotInstanceTermination" or "Client.UserInitiatedShutdown", or a driver's own) is the
    # fact the reconciler decides on; the message is for people.
    state_reason_code: str | None = None
    state_reason: str | None = None
    launched_at: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    # The ClientToken it was launched with (DescribeInstances reports it; "" or None when launched
    # without one). Only a token fleetkeeper derives for the tagged stack and replica makes the
    # instance fleetkeeper's: anyone allowed ec2:CreateTags can copy the tags
    # (plan.launched_by_fleetkeeper).
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
    # Where the version's secret values are (fleetkeeper.replicas.secrets): the replica reads them at boot.
    secrets_ref: str | None = None
    # The service's owner (ServiceRecord.owner): its secrets, workdir copy and log stream are under the
    # owner's scope, and on AWS the replica runs with the owner's role (fleetkeeper.replicas.identity).
    owner: str = ""

    def client_token(self, stack: str) -> str:
        """Idempotency token for the launch by `stack`: unique per (stack, incarnation, replica, refusal)."""
        return client_token(self.uid, self.replica_id, self.attempt, stack=stack)


# EC2's limit on a RunInstances ClientToken: "Constraints: Maximum 64 ASCII characters"
# (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_RunInstances.html).
MAX_CLIENT_TOKEN_LENGTH = 64


def client_token(uid: str, replica_id: int, attempt: int = 0, *, stack: str = "") -> str:
    """The ClientToken of launch `attempt` of a replica by `stack`: `fk-<stack>-<uid>-<replica id>`,
    then `...-<attempt>`. Without a stack, the token a launch had before stacks had ids
    (`fk-<uid>-<replica id>[-<attempt>]`), which an upgraded stack still recognises on its own
    replicas (fleetkeeper.reconciler.ownership).

    A stack id is at most 12 characters and a uid 16, so a token stays under EC2's 64 for any replica
    id and attempt below 10**14 together (fk-, 12, -, 16, -, and 30 digits and a hyphen).
    """
    token = f"fk-{stack}-{uid}-{replica_id}" if stack else f"fk-{uid}-{replica_id}"
    token = token if attempt == 0 else f"{token}-{attempt}"
    if len(token) > MAX_CLIENT_TOKEN_LENGTH:
        raise ValueError(f"ClientToken {token!r} is over EC2's {MAX_CLIENT_TOKEN_LENGTH} characters")
    return token


class LaunchRefused(Exception):
    """The cloud refused the launch (capacity, quota, bad parameter); the message says what AWS said."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class ReplicaDriver(Protocol):
    # The stack this driver launches for (Settings.stack_id): tagged on, and part of the token of,
    # every instance it launches; its listing without uids is of this stack's instances only.
    stack_id: str

    def list_instances(self, uids: Sequence[str] | None = None) -> list[Instance]:
        """Every managed instance of this stack (tagged with its id); with `uids`, every managed
        instance of these incarnations, tagged with this stack's id or with none (a replica launched
        before the upgrade that gave stacks ids: the caller decides, fleetkeeper.reconciler.ownership).
        In as few calls as possible."""
        ...

    def adopt(self, instance_ids: Sequence[str]) -> None:
        """Tag these instances (launched by this stack before stacks had ids) with this stack's id."""
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
        """Start the replica's instance. Idempotent per its ClientToken (`request.client_token(stack_id)`).
        Raises LaunchRefused."""
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
