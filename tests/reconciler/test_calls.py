"""The exact AWS calls of each phase of a reconcile run (observe, probe, apply, record), against moto.

One small scenario per phase; each pins the whole call list of the run, in order, with the
parameters that make it what it is (keys, conditions, filters, client tokens). A call added, lost,
repeated or reordered fails. Calls are recorded by `tests.support.aws_calls.AwsCalls`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper import aws as aws_clients
from fleetkeeper.reconciler.drivers.ec2 import DEFAULT_IMAGE_PARAMETER
from fleetkeeper.reconciler.probe import probe_all
from tests.support.aws_calls import AwsCalls
from tests.support.reconciler_world import World

if TYPE_CHECKING:
    from collections.abc import Hashable, Sequence

    from fleetkeeper.reconciler.plan import ProbeResult
    from fleetkeeper.reconciler.probe import ProbeTarget


MANAGED = {"Name": "tag:fleetkeeper:managed", "Values": ["true"]}
LIST_SERVICES = (
    "dynamodb",
    "Query",
    {"IndexName": "services", "KeyConditionExpression": "list_pk = :lpk", "values": {":lpk": "SERVICE"}},
)
# The scheduled run's listing: this stack's managed instances (its id: the tests' default).
STACK = {"Name": "tag:fleetkeeper:stack", "Values": ["fleetkeeper"]}
DESCRIBE_MANAGED = ("ec2", "DescribeInstances", {"Filters": [MANAGED, STACK], "MaxResults": 1000})
RECORD_STATUS = "SET #status = :status, status_message = :message, observed_generation = :observed"


def load(name: str = "svc") -> tuple[str, str, dict[str, Any]]:
    return (
        "dynamodb",
        "Query",
        {
            "KeyConditionExpression": "PK = :pk AND SK >= :meta",
            "ConsistentRead": True,
            "values": {":pk": f"SVC#{name}", ":meta": "META"},
        },
    )


def replica_sk(uid: str, replica_id: int) -> str:
    return f"R#{uid}#{replica_id:010d}"


def put_replica(
    uid: str, replica_id: int, rev: int, status: str, *events: str, **facts: str
) -> tuple[str, str, dict[str, Any]]:
    """The replica's write: a PutItem, or with the events it reports ONE TransactWriteItems."""
    if events:
        put = {
            "kind": "Put",
            "SK": replica_sk(uid, replica_id),
            "ConditionExpression": "rev = :rev",
            "values": {":rev": rev},
            "status": status,
        }
        return ("dynamodb", "TransactWriteItems", {"items": [put, *({"kind": "Update", "event": e} for e in events)]})
    return (
        "dynamodb",
        "PutItem",
        {
            "SK": replica_sk(uid, replica_id),
            "status": status,
            **facts,
            "ConditionExpression": "rev = :rev",
            "values": {":rev": rev},
        },
    )


def record_status(
    uid: str, status: str, message: str, generation: int = 1, *events: str
) -> tuple[str, str, dict[str, Any]]:
    """The status write: an UpdateItem, or with the status's event (it moved) ONE TransactWriteItems."""
    update = {
        "SK": "META",
        "UpdateExpression": RECORD_STATUS,
        "ConditionExpression": "uid = :uid AND generation = :generation",
        "values": {
            ":status": status,
            ":message": message,
            ":observed": generation,
            ":uid": uid,
            ":generation": generation,
        },
    }
    if events:
        items = [{"kind": "Update", **update}, *({"kind": "Update", "event": e} for e in events)]
        return ("dynamodb", "TransactWriteItems", {"items": items})
    return ("dynamodb", "UpdateItem", update)


def test_observe_lists_services_loads_each_partition_and_describes_managed_instances_once(world: World) -> None:
    a = world.create("a", replicas=1).service.uid
    world.create("b", replicas=1)
    world.converge()
    with AwsCalls() as scheduled:
        world.run()
    assert scheduled.brief() == [LIST_SERVICES, load("a"), load("b"), DESCRIBE_MANAGED]
    with AwsCalls() as kick:
        world.run("a")
    assert kick.brief() == [
        load("a"),
        (
            "ec2",
            "DescribeInstances",
            {"Filters": [MANAGED, {"Name": "tag:fleetkeeper:uid", "Values": [a]}], "MaxResults": 1000},
        ),
    ]


def test_probe_makes_no_aws_call_and_probes_each_running_replica_once_after_observing(world: World) -> None:
    uid = world.create(replicas=2).service.uid
    world.run()  # launched: moto's instances run at once
    probed: list[tuple[list[Hashable], int, list[Any]]] = []

    def prober(targets: Sequence[ProbeTarget], budget: float) -> dict[Hashable, ProbeResult]:
        with AwsCalls() as during:
            results = probe_all(targets, budget)
        probed.append((sorted(target.key for target in targets), len(run.calls), during.calls))
        return results

    world.reconciler.prober = prober
    world.server.requests.clear()
    with AwsCalls() as run:
        world.run()
    assert probed == [([(uid, 0), (uid, 1)], 3, [])]
    assert run.brief()[:3] == [LIST_SERVICES, load(), DESCRIBE_MANAGED]
    assert [(method, path) for method, path, _, _ in world.server.requests] == [("GET", "/health")] * 2


def test_apply_claims_launches_by_client_token_and_records_each_outcome(world: World) -> None:
    """Two replicas: the first launches, AWS refuses the second. Each outcome is recorded as it
    happens; then the status names the refusal (from the records as they are, not a re-plan)."""
    uid = world.create(replicas=2).service.uid
    # EC2 resolves the default image's parameter: the reconciler makes no SSM call (no SSM endpoint).
    image = f"resolve:ssm:{DEFAULT_IMAGE_PARAMETER}"

    def no_capacity_for_replica_1(params: dict[str, Any], **_: Any) -> None:
        if params["ClientToken"].endswith("-1"):
            error = {"Code": "InsufficientInstanceCapacity", "Message": "no capacity"}
            raise ClientError({"Error": error}, "RunInstances")

    def launch(replica_id: int) -> tuple[str, str, dict[str, Any]]:
        tags = {
            "fleetkeeper:managed": "true",
            "fleetkeeper:stack": "fleetkeeper",
            "fleetkeeper:service": "svc",
            "fleetkeeper:uid": uid,
            "fleetkeeper:version": "1",
            "fleetkeeper:replica-id": str(replica_id),
            "Name": f"fleetkeeper-svc-{replica_id}",
        }
        return (
            "ec2",
            "RunInstances",
            {
                "ClientToken": f"fk-fleetkeeper-{uid}-{replica_id}",
                "ImageId": image,
                "InstanceType": "t3.micro",
                "MinCount": 1,
                "MaxCount": 1,
                "tags": tags,
            },
        )

    events = aws_clients.ec2().meta.events
    events.register("before-parameter-build.ec2.RunInstances", no_capacity_for_replica_1)
    try:
        with AwsCalls() as calls:
            world.run()
    finally:
        events.unregister("before-parameter-build.ec2.RunInstances", no_capacity_for_replica_1)
    claim = {
        "items": [
            {
                "kind": "Update",
                "SK": "META",
                "UpdateExpression": "SET replica_seq = :next",
                "ConditionExpression": "uid = :uid AND lifecycle = :active AND replica_seq = :seen",
                "values": {":next": 2, ":uid": uid, ":active": "ACTIVE", ":seen": 0},
            },
            *(
                {
                    "kind": "Put",
                    "SK": replica_sk(uid, i),
                    "ConditionExpression": "attribute_not_exists(PK)",
                    "status": "PENDING",
                }
                for i in (0, 1)
            ),
            {"kind": "Update", "event": "Claimed"},
        ]
    }
    assert calls.brief() == [
        LIST_SERVICES,
        load(),
        DESCRIBE_MANAGED,
        ("dynamodb", "TransactWriteItems", claim),
        launch(0),
        put_replica(uid, 0, 0, "PROVISIONING", "Launched"),
        launch(1),
        put_replica(uid, 1, 0, "FAILED_PROVISION", "LaunchRefused"),
        record_status(
            uid,
            "REPLICA_INIT",
            "0/2 ready; replica 0 PROVISIONING; replica 1 FAILED_PROVISION: InsufficientInstanceCapacity: no capacity",
            1,
            "ServiceReplicaInit",
        ),
    ]


def test_record_writes_the_replica_the_version_mark_and_the_status_each_conditioned(world: World) -> None:
    uid = world.create(replicas=1).service.uid
    world.run()  # launched, PROVISIONING (rev 1)
    with AwsCalls() as calls:
        world.run()  # the probe answers 200: READY
    mark = {
        "items": [
            {
                "kind": "Update",
                "SK": f"V#{uid}#{1:010d}",
                "UpdateExpression": "SET #state = :state, state_message = :message",
                "ConditionExpression": "attribute_exists(PK) AND #state = :expected",
                "values": {":state": "READY", ":message": "", ":expected": "NEW"},
            },
            {"kind": "Update", "event": "VersionReady"},
        ]
    }
    assert calls.brief() == [
        LIST_SERVICES,
        load(),
        DESCRIBE_MANAGED,
        put_replica(uid, 0, 1, "READY", "ReplicaReady"),
        ("dynamodb", "TransactWriteItems", mark),
        record_status(uid, "READY", "1/1 ready", 1, "ServiceReady"),
    ]
