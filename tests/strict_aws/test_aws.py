"""The strict-AWS layer reproduces AWS's behaviour through fleetkeeper's own botocore clients over moto.

One test per behaviour: each drives real botocore clients (`fleetkeeper.aws`, the store, the ec2
driver) and checks what AWS would answer, including what botocore's standard retries do with it.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper.model import ServiceState, to_iso
from fleetkeeper.reconciler.driver import MANAGED_TAG, LaunchRefused, LaunchRequest
from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver
from fleetkeeper.spec.service import ServiceSpec
from fleetkeeper.store.codec import to_raw
from fleetkeeper.store.commands import CommandStore
from fleetkeeper.store.errors import Contention
from fleetkeeper.store.keys import SERVICES_INDEX, service_pk, version_sk
from fleetkeeper.store.reads import ServiceReads
from fleetkeeper.store.runs import ReconcilerStore
from fleetkeeper.store.table import Table
from tests.strict_aws import STATE_REASONS, FaultRates, LambdaTimeout, StrictAws
from tests.support import TABLE
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from collections.abc import Callable

NOW = "2026-11-29T12:00:00.000Z"
AMI = "ami-12345678"


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code"))


def _one_query_read(table: str, name: str) -> ServiceState | None:
    """One Query, as the layer answers it: the api's reads re-read a torn partition, this one does not."""
    return ServiceReads(Table(table)).load(name)


def _create(table: str, name: str) -> ServiceState:
    return CommandStore(Table(table)).create_service(name, _spec(), "rolling", NOW, status_message="created")


def _spec(**overrides: Any) -> ServiceSpec:
    return ServiceSpec.model_validate(hello_spec(**overrides))


def _partition(name: str, *, events: bool = False) -> list[str]:
    """The sort keys a plain Query of the service's partition returns (without the service's events,
    the create's and update's third item, unless asked for)."""
    page = aws.dynamodb().query(
        TableName=TABLE,
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues={":pk": {"S": service_pk(name)}},
        ConsistentRead=True,
    )
    keys = [item["SK"]["S"] for item in page["Items"]]
    return keys if events else [key for key in keys if not key.startswith("E#")]


# === DynamoDB: reads are only read-committed against TransactWriteItems ======================


def test_a_torn_query_after_a_create_shows_the_service_without_its_version(strict_aws: StrictAws, table: str) -> None:
    store = CommandStore(Table(table))
    created = store.create_service("web", _spec(), "rolling", NOW, status_message="created")
    # The version item (index 1 of the create's TransactItems) is read before the transaction.
    strict_aws.dynamodb.tear_next_read(lambda item: item.key_value("SK").startswith("V#"))

    torn = _one_query_read(table, "web")

    assert torn is not None
    assert torn.service.uid == created.service.uid
    assert torn.service.target_version == 1
    assert torn.versions == {}  # the target version is missing: invariant 1's "not observed yet"
    assert [(t.operation, t.stale) for t in strict_aws.dynamodb.torn_reads] == [("Query", (1,))]
    # Only the scheduled read was torn.
    assert sorted(store.require("web").versions) == [1]


def test_a_torn_query_after_a_create_shows_the_version_without_its_service(strict_aws: StrictAws, table: str) -> None:
    store = CommandStore(Table(table))
    uid = store.create_service("web", _spec(), "rolling", NOW, status_message="created").service.uid
    strict_aws.dynamodb.tear_next_read([0])  # the service item: still absent

    assert _partition("web") == [version_sk(uid, 1)]
    assert store.load("web") is not None


def test_a_torn_query_after_an_update_shows_the_new_version_without_the_move_to_it(
    strict_aws: StrictAws, table: str
) -> None:
    store = CommandStore(Table(table))
    state = store.create_service("web", _spec(), "rolling", NOW, status_message="created")
    store.add_version(state, _spec(envs={"RELEASE": "2"}), "rolling", NOW, expected_generation=None)
    strict_aws.dynamodb.tear_next_read([0])  # the service item's Update: still at version 1

    torn = store.require("web")

    assert torn.service.target_version == torn.service.latest_version == 1
    assert sorted(torn.versions) == [1, 2]


def test_a_torn_query_after_an_update_shows_the_move_without_the_new_version(strict_aws: StrictAws, table: str) -> None:
    store = CommandStore(Table(table))
    state = store.create_service("web", _spec(), "rolling", NOW, status_message="created")
    store.add_version(state, _spec(envs={"RELEASE": "2"}), "rolling", NOW, expected_generation=None)
    strict_aws.dynamodb.tear_next_read([1])  # the new version's Put: not there yet

    torn = _one_query_read(table, "web")
    assert torn is not None

    assert torn.service.target_version == 2
    assert sorted(torn.versions) == [1]


def test_a_torn_query_of_the_services_index_misses_a_new_service(strict_aws: StrictAws, table: str) -> None:
    """The sparse index is read from the same mixed state: a create's service item is not listed."""
    store = CommandStore(Table(table))
    store.create_service("old", _spec(), "rolling", NOW, status_message="created")
    store.create_service("new", _spec(), "rolling", NOW, status_message="created")
    strict_aws.dynamodb.tear_next_read([0])

    assert [s.name for s in store.iter_services()] == ["old"]
    assert [s.name for s in store.iter_services()] == ["new", "old"]


def test_a_torn_batch_get_item_returns_one_item_of_the_transaction(strict_aws: StrictAws, table: str) -> None:
    uid = _create(table, "web").service.uid
    keys = [to_raw({"PK": service_pk("web"), "SK": sk}) for sk in ("META", version_sk(uid, 1))]
    strict_aws.dynamodb.tear_next_read([0], operations=["BatchGetItem"])

    torn = aws.dynamodb().batch_get_item(RequestItems={table: {"Keys": keys, "ConsistentRead": True}})
    whole = aws.dynamodb().batch_get_item(RequestItems={table: {"Keys": keys, "ConsistentRead": True}})

    assert [i["SK"]["S"] for i in torn["Responses"][table]] == [version_sk(uid, 1)]
    assert len(whole["Responses"][table]) == 2


def test_get_item_is_never_torn_and_an_item_changed_since_is_not_in_flight(strict_aws: StrictAws, table: str) -> None:
    store = ReconcilerStore(Table(table))
    state = _create(table, "web")
    create = strict_aws.dynamodb.last_transaction()
    store.record_status(state.service, state.service.status, "changed since", observed_generation=1)
    strict_aws.dynamodb.tear_next_read(transaction=create, times=2, stale=[0, 1])

    meta = aws.dynamodb().get_item(TableName=table, Key=to_raw({"PK": service_pk("web"), "SK": "META"}))
    after = _one_query_read(table, "web")
    assert after is not None

    assert meta["Item"]["status_message"]["S"] == "changed since"  # GetItem: serializable
    assert after.service.status_message == "changed since"  # the service item left the transaction's state
    assert after.versions == {}  # the version item did not: it still reads as before the create
    assert strict_aws.dynamodb.torn_reads[-1].stale == (1,)


def test_drawn_tears_hit_only_another_actors_transaction_still_in_flight(strict_aws: StrictAws, table: str) -> None:
    """With FaultRates.torn_read=1 every read that may be torn is: only by another actor, and only
    while the transaction is the last write to the table."""
    strict_aws.faults = FaultRates(torn_read=1.0)
    store = CommandStore(Table(table))
    with strict_aws.acting_as("api"):
        store.create_service("web", _spec(), "rolling", NOW, status_message="created")
        assert len(_partition("web", events=True)) == 3  # its own read: after the transaction returned

    with strict_aws.acting_as("reconciler"):
        # Overlapped the api's transaction (service, version, event): some of its three items.
        assert 0 < len(_partition("web", events=True)) < 3
        aws.dynamodb().put_item(TableName=table, Item=to_raw({"PK": "SVC#other", "SK": "META"}))
        assert len(_partition("web", events=True)) == 3  # a later write: no longer in flight

    assert [t.transaction for t in strict_aws.dynamodb.torn_reads] == [1]


# === DynamoDB: ExclusiveStartKey is validated ===================================================


def _index_page(**extra: Any) -> dict[str, Any]:
    return dict(
        aws.dynamodb().query(
            TableName=TABLE,
            IndexName=SERVICES_INDEX,
            KeyConditionExpression="list_pk = :p",
            ExpressionAttributeValues={":p": {"S": "SERVICE"}},
            Limit=1,
            **extra,
        )
    )


def test_a_real_last_evaluated_key_pages_through_the_index(strict_aws: StrictAws, table: str) -> None:
    store = CommandStore(Table(table))
    for name in ("a", "b", "c"):
        store.create_service(name, _spec(), "rolling", NOW, status_message="created")
    names, token = [], None
    while True:
        page, token = store.list_services(limit=1, next_token=token)
        names += [s.name for s in page]
        if token is None:
            break
    assert names == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("mangle", "message"),
    [
        pytest.param(lambda k: {a: v for a, v in k.items() if a != "SK"}, "is invalid", id="missing-table-key"),
        pytest.param(lambda k: {**k, "extra": {"S": "x"}}, "is invalid", id="extra-attribute"),
        pytest.param(lambda k: {**k, "list_sk": {"N": "1"}}, "does not match the schema", id="wrong-type"),
        pytest.param(lambda k: {**k, "list_pk": {"S": "OTHER"}}, "outside query boundaries", id="other-partition"),
    ],
)
def test_an_invalid_exclusive_start_key_is_a_validation_exception(
    strict_aws: StrictAws, table: str, mangle: Callable[[dict[str, Any]], dict[str, Any]], message: str
) -> None:
    store = CommandStore(Table(table))
    store.create_service("a", _spec(), "rolling", NOW, status_message="created")
    store.create_service("b", _spec(), "rolling", NOW, status_message="created")
    start = _index_page()["LastEvaluatedKey"]
    assert _index_page(ExclusiveStartKey=start)["Items"]  # the real one is fine

    with pytest.raises(ClientError) as caught:
        _index_page(ExclusiveStartKey=mangle(start))

    assert _code(caught.value) == "ValidationException"
    assert "The provided starting key" in str(caught.value) and message in str(caught.value)
    assert caught.value.response["ResponseMetadata"]["RetryAttempts"] == 0


def test_a_start_key_outside_the_sort_key_condition_is_refused(strict_aws: StrictAws, table: str) -> None:
    uid = _create(table, "web").service.uid
    query: dict[str, Any] = {
        "TableName": table,
        "KeyConditionExpression": "PK = :pk AND begins_with(SK, :prefix)",
        "ExpressionAttributeValues": {":pk": {"S": service_pk("web")}, ":prefix": {"S": f"V#{uid}#"}},
    }
    inside = to_raw({"PK": service_pk("web"), "SK": version_sk(uid, 1)})
    outside = to_raw({"PK": service_pk("web"), "SK": "META"})

    assert aws.dynamodb().query(**query, ExclusiveStartKey=inside)["Items"] == []
    with pytest.raises(ClientError, match="does not match the range key predicate"):
        aws.dynamodb().query(**query, ExclusiveStartKey=outside)


def test_a_scan_start_key_must_have_the_key_schema(strict_aws: StrictAws, table: str) -> None:
    with pytest.raises(ClientError, match="does not match the schema") as caught:
        aws.dynamodb().scan(TableName=table, ExclusiveStartKey={"PK": {"S": "SVC#web"}})
    assert _code(caught.value) == "ValidationException"


# === DynamoDB: numbers =======================================================================


@pytest.mark.parametrize(
    ("number", "problem"),
    [
        ("1" * 38, None),
        ("1" * 39, "more than 38 significant digits"),
        ("0.000" + "1" * 39, "more than 38 significant digits"),
        ("1" + "0" * 60, None),  # one significant digit: trailing zeros are trimmed
        ("9.9999999999999999999999999999999999999E+125", None),
        ("1E+126", "Number overflow"),
        ("-1E-130", None),
        ("1E-131", "Number underflow"),
        ("NaN", "cannot be converted to a numeric value"),
        ("1_000", "cannot be converted to a numeric value"),
    ],
)
def test_numbers_follow_dynamodbs_rules(strict_aws: StrictAws, table: str, number: str, problem: str | None) -> None:
    key = to_raw({"PK": "SVC#n", "SK": "META"})
    put: dict[str, Any] = {"TableName": table, "Item": {**key, "n": {"N": number}}}
    if problem is None:
        aws.dynamodb().put_item(**put)
        assert aws.dynamodb().get_item(TableName=table, Key=key)["Item"]["n"]["N"]
        return
    with pytest.raises(ClientError, match=problem) as caught:
        aws.dynamodb().put_item(**put)
    assert _code(caught.value) == "ValidationException"
    assert "Item" not in aws.dynamodb().get_item(TableName=table, Key=key)


def test_a_39_digit_number_is_refused_anywhere_in_a_request(strict_aws: StrictAws, table: str) -> None:
    key = to_raw({"PK": "SVC#n", "SK": "META"})
    aws.dynamodb().put_item(TableName=table, Item=key)
    big = {"N": "1" * 39}
    requests: list[tuple[str, dict[str, Any]]] = [
        (
            "update_item",
            {"Key": key, "UpdateExpression": "SET n = :v", "ExpressionAttributeValues": {":v": big}},
        ),
        ("put_item", {"Item": {**key, "m": {"M": {"deep": {"L": [big]}}}}}),
        ("put_item", {"Item": {**key, "s": {"NS": ["1", "1" * 39]}}}),
        ("query", {"KeyConditionExpression": "PK = :pk", "FilterExpression": "n = :v",
                   "ExpressionAttributeValues": {":pk": key["PK"], ":v": big}}),
    ]  # fmt: skip
    for operation, kwargs in requests:
        with pytest.raises(ClientError, match="38 significant digits"):
            getattr(aws.dynamodb(), operation)(TableName=table, **kwargs)


# === DynamoDB: transaction conflicts ==========================================================


def test_a_transaction_conflict_cancels_the_transaction_and_is_not_retried(strict_aws: StrictAws, table: str) -> None:
    strict_aws.dynamodb.conflict_next_transaction([1])

    with pytest.raises(Contention) as contention:
        _create(table, "web")

    caught = contention.value.__cause__
    assert isinstance(caught, ClientError)
    response: dict[str, Any] = caught.response  # type: ignore[assignment]
    assert contention.value.reason == "TransactionConflict"
    assert _code(caught) == "TransactionCanceledException"
    # The service, the version (in conflict), the Created event.
    assert [r["Code"] for r in response["CancellationReasons"]] == ["None", "TransactionConflict", "None"]
    assert response["CancellationReasons"][1]["Message"] == "Transaction is ongoing for the item."
    assert "[None, TransactionConflict, None]" in str(caught)
    assert strict_aws.attempts_of("dynamodb", "TransactWriteItems") == 1  # botocore does not retry it
    assert _partition("web") == []  # nothing written
    CommandStore(Table(table)).create_service(
        "web", _spec(), "rolling", NOW, status_message="created"
    )  # the next one goes through


def test_a_single_item_write_overlapping_a_transaction_gets_transaction_conflict(
    strict_aws: StrictAws, table: str
) -> None:
    key = to_raw({"PK": "SVC#web", "SK": "META"})
    strict_aws.dynamodb.conflict_next_write(key=key)

    aws.dynamodb().put_item(TableName=table, Item={**to_raw({"PK": "SVC#other", "SK": "META"})})
    with pytest.raises(ClientError) as caught:
        aws.dynamodb().put_item(TableName=table, Item={**key, "v": {"N": "1"}})

    assert _code(caught.value) == "TransactionConflictException"
    assert strict_aws.attempts_of("dynamodb", "PutItem") == 2  # not retried by botocore
    assert "Item" not in aws.dynamodb().get_item(TableName=table, Key=key)


# === DynamoDB: throttling ======================================================================


def test_a_throttle_burst_of_3_is_absorbed_by_botocores_retries(strict_aws: StrictAws, table: str) -> None:
    _create(table, "web")
    strict_aws.throttle("dynamodb", "Query", times=3)
    start = strict_aws.clock.time()

    page = aws.dynamodb().query(
        TableName=table,
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues={":pk": {"S": service_pk("web")}},
    )

    assert len(page["Items"]) == 3  # the service, its version, its Created event
    assert page["ResponseMetadata"]["RetryAttempts"] == 3
    assert strict_aws.attempts_of("dynamodb", "Query") == 4
    assert [f.kind for f in strict_aws.faults_injected] == ["ProvisionedThroughputExceededException"] * 3
    # The pauses were botocore's own, taken on the layer's clock.
    assert len(strict_aws.backoff) == 3
    assert strict_aws.clock.time() - start == pytest.approx(sum(strict_aws.backoff))


@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException", "ThrottlingException"])
def test_a_throttle_burst_longer_than_the_retries_reaches_the_caller(
    strict_aws: StrictAws, table: str, code: str
) -> None:
    strict_aws.throttle("dynamodb", "GetItem", times=10, code=code)

    with pytest.raises(ClientError, match=r"reached max retries: 5") as caught:
        aws.dynamodb().get_item(TableName=table, Key=to_raw({"PK": "SVC#x", "SK": "META"}))

    assert _code(caught.value) == code
    # fleetkeeper's clients: Config(retries={"max_attempts": 5}) is 5 retries, 6 attempts.
    assert strict_aws.attempts_of("dynamodb", "GetItem") == 6


# === EC2 ===============================================================================================


def _launch_args(token: str | None = "fk-abc-1", **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "ImageId": AMI,
        "InstanceType": "t3.micro",
        "MinCount": 1,
        "MaxCount": 1,
        # As this stack launches them: the managed tag and the stack's id (the tests' default).
        "TagSpecifications": [
            {
                "ResourceType": "instance",
                "Tags": [{"Key": MANAGED_TAG, "Value": "true"}, {"Key": "fleetkeeper:stack", "Value": "fleetkeeper"}],
            }
        ],
    }
    if token:
        args["ClientToken"] = token
    args.update(overrides)
    return args


def _run_instances(args: dict[str, Any]) -> dict[str, Any]:
    return dict(aws.ec2().run_instances(**args))


def _all_instances() -> list[dict[str, Any]]:
    reservations: list[dict[str, Any]] = aws.ec2().describe_instances()["Reservations"]  # type: ignore[assignment]
    return [i for r in reservations for i in r["Instances"]]


def test_the_same_client_token_and_parameters_give_the_same_instance(strict_aws: StrictAws) -> None:
    first = _run_instances(_launch_args())
    again = _run_instances(_launch_args())

    assert again["Instances"][0]["InstanceId"] == first["Instances"][0]["InstanceId"]
    assert again["ReservationId"] == first["ReservationId"]
    assert len(_all_instances()) == 1


def test_the_same_client_token_with_other_parameters_is_a_mismatch(strict_aws: StrictAws) -> None:
    _run_instances(_launch_args())

    with pytest.raises(ClientError) as caught:
        _run_instances(_launch_args(InstanceType="t3.small"))

    assert _code(caught.value) == "IdempotentParameterMismatch"
    assert len(_all_instances()) == 1
    _run_instances(_launch_args(token="fk-abc-2", InstanceType="t3.small"))  # another token: another launch
    assert len(_all_instances()) == 2


def test_a_client_token_is_claimed_only_by_a_launch_that_succeeded(strict_aws: StrictAws) -> None:
    refusal = strict_aws.ec2.unsupported(instance_type="t3.micro")
    with pytest.raises(ClientError, match="Unsupported"):
        _run_instances(_launch_args())
    refusal.clear()

    launched = _run_instances(_launch_args())

    assert [i["InstanceId"] for i in _all_instances()] == [launched["Instances"][0]["InstanceId"]]


def test_concurrent_launches_with_one_client_token_make_one_instance(strict_aws: StrictAws) -> None:
    aws.ec2()  # one client for all threads (botocore clients are thread-safe)
    ids: list[str] = []
    barrier = threading.Barrier(8)

    def launch() -> None:
        barrier.wait()
        ids.append(_run_instances(_launch_args())["Instances"][0]["InstanceId"])

    threads = [threading.Thread(target=launch) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert len(set(ids)) == 1 and len(ids) == 8
    assert len(_all_instances()) == 1


def _request(replica_id: int = 1, **spec_overrides: Any) -> LaunchRequest:
    spec = _spec(**spec_overrides)
    return LaunchRequest(service="web", uid="abc", version=1, replica_id=replica_id, spec=spec)


def test_a_launched_instance_is_invisible_to_describe_for_the_lag(strict_aws: StrictAws) -> None:
    strict_aws.ec2.set_describe_lag(30)
    driver = Ec2Driver(default_image_parameter="/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64")
    launched = driver.launch(_request())

    assert driver.list_instances() == []  # tag-filtered
    assert driver.list_instances(uids=["abc"]) == []
    assert driver.find_instance("abc", 1) is None
    assert (
        aws.ec2().describe_instances(Filters=[{"Name": "instance-id", "Values": [launched.instance_id]}])[
            "Reservations"
        ]
        == []
    )
    with pytest.raises(ClientError) as caught:
        aws.ec2().describe_instances(InstanceIds=[launched.instance_id])
    assert _code(caught.value) == "InvalidInstanceID.NotFound"

    strict_aws.clock.advance(30)

    assert [i.instance_id for i in driver.list_instances()] == [launched.instance_id]
    found = driver.find_instance("abc", 1)
    assert found is not None and found.instance_id == launched.instance_id


def test_a_terminated_instance_is_listed_for_an_hour_then_not_at_all(strict_aws: StrictAws) -> None:
    # DescribeInstances: "Recently terminated instances might appear in the returned results. This
    # interval is usually less than one hour." moto lists them for ever.
    driver = Ec2Driver(default_image_parameter="/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64")
    kept, ended = driver.launch(_request(1)), driver.launch(_request(2))
    aws.ec2().terminate_instances(InstanceIds=[ended.instance_id])

    listed = {i.instance_id: i.state.value for i in driver.list_instances()}
    assert listed == {kept.instance_id: "running", ended.instance_id: "terminated"}

    strict_aws.clock.advance(3599)
    listed = {i.instance_id: i.state.value for i in driver.list_instances()}
    assert listed == {kept.instance_id: "running", ended.instance_id: "terminated"}

    strict_aws.clock.advance(1)
    assert [i.instance_id for i in driver.list_instances()] == [kept.instance_id]
    assert driver.instance(ended.instance_id) is None  # by id: InvalidInstanceID.NotFound
    with pytest.raises(ClientError) as caught:
        aws.ec2().describe_instances(InstanceIds=[ended.instance_id])
    assert _code(caught.value) == "InvalidInstanceID.NotFound"

    strict_aws.ec2.set_terminated_visibility(None)  # moto's own semantics, when a test asks for them
    listed = {i.instance_id: i.state.value for i in driver.list_instances()}
    assert listed == {kept.instance_id: "running", ended.instance_id: "terminated"}


@pytest.mark.parametrize("by", ["TerminateInstances", "AWS"])
def test_the_hour_counts_from_the_termination_not_from_the_first_describe(strict_aws: StrictAws, by: str) -> None:
    driver = Ec2Driver(default_image_parameter="/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64")
    kept, ended = driver.launch(_request(1)), driver.launch(_request(2))
    if by == "AWS":
        strict_aws.ec2.terminate_by_aws(ended.instance_id, "Server.InternalError")
    else:
        aws.ec2().terminate_instances(InstanceIds=[ended.instance_id])

    strict_aws.clock.advance(3600)  # no DescribeInstances in between

    assert [i.instance_id for i in driver.list_instances()] == [kept.instance_id]


def _default_subnets() -> list[dict[str, Any]]:
    subnets: list[dict[str, Any]] = aws.ec2().describe_subnets(  # type: ignore[assignment]
        Filters=[{"Name": "default-for-az", "Values": ["true"]}]
    )["Subnets"]
    return sorted(subnets, key=lambda s: s["AvailabilityZone"])


def test_insufficient_capacity_in_one_subnet_is_retried_by_botocore_then_refuses_the_launch(
    strict_aws: StrictAws,
) -> None:
    first, second = (s["SubnetId"] for s in _default_subnets()[:2])
    strict_aws.ec2.insufficient_capacity(subnet_id=first)
    driver = Ec2Driver(subnet_ids=[first, second], default_image_parameter="")

    with pytest.raises(LaunchRefused) as refused:
        driver.launch(_request(replica_id=2, resources={"instance_type": "t3.micro", "image_id": AMI}))
    launched = driver.launch(_request(replica_id=1, resources={"instance_type": "t3.micro", "image_id": AMI}))

    assert refused.value.code == "InsufficientInstanceCapacity"
    assert "sufficient t3.micro capacity in the Availability Zone you requested" in refused.value.message
    assert strict_aws.attempts_of("ec2", "RunInstances") == 6 + 1  # HTTP 500: botocore retried it
    assert [i["SubnetId"] for i in _all_instances()] == [second]
    assert launched.instance_id == _all_instances()[0]["InstanceId"]


def test_a_short_capacity_shortage_is_absorbed_by_botocores_retries(strict_aws: StrictAws) -> None:
    strict_aws.ec2.insufficient_capacity(instance_type="t3.micro", times=2)

    launched = _run_instances(_launch_args())

    assert launched["ResponseMetadata"]["RetryAttempts"] == 2
    assert len(_all_instances()) == 1


def test_an_unsupported_instance_type_is_refused_at_once(strict_aws: StrictAws) -> None:
    strict_aws.ec2.unsupported(instance_type="p5.48xlarge")

    with pytest.raises(ClientError) as caught:
        _run_instances(_launch_args(InstanceType="p5.48xlarge"))
    _run_instances(_launch_args(token="other"))

    assert _code(caught.value) == "Unsupported"
    assert "Your requested instance type (p5.48xlarge) is not supported" in str(caught.value)
    assert caught.value.response["ResponseMetadata"]["RetryAttempts"] == 0
    assert len(_all_instances()) == 1


def test_a_request_limit_burst_is_retried_by_botocore(strict_aws: StrictAws) -> None:
    strict_aws.ec2.throttle("DescribeInstances", times=2)

    response = aws.ec2().describe_instances()

    assert response["ResponseMetadata"]["RetryAttempts"] == 2
    assert strict_aws.attempts_of("ec2", "DescribeInstances") == 3
    assert {f.kind for f in strict_aws.faults_injected} == {"RequestLimitExceeded"}


@pytest.mark.parametrize("code", sorted(STATE_REASONS))
def test_a_termination_by_aws_reports_a_real_state_reason(strict_aws: StrictAws, code: str) -> None:
    spot = code == "Server.SpotInstanceTermination"
    market: dict[str, Any] = {"InstanceMarketOptions": {"MarketType": "spot"}} if spot else {}
    instance_id = _run_instances(_launch_args(**market))["Instances"][0]["InstanceId"]

    strict_aws.ec2.terminate_by_aws(instance_id, code)

    (described,) = _all_instances()
    assert described["State"]["Name"] == "terminated"
    assert described["StateReason"] == {"Code": code, "Message": f"{code}: {STATE_REASONS[code]}"}
    (observed,) = Ec2Driver().list_instances()
    assert observed.spot is spot
    assert observed.state_reason == f"{code}: {STATE_REASONS[code]}"


def test_aws_reclaims_only_spot_instances(strict_aws: StrictAws) -> None:
    instance_id = _run_instances(_launch_args())["Instances"][0]["InstanceId"]
    with pytest.raises(ValueError, match="not a spot instance"):
        strict_aws.ec2.terminate_by_aws(instance_id, "Server.SpotInstanceTermination")


def test_ec2_resolves_a_resolve_ssm_image_id_itself(strict_aws: StrictAws) -> None:
    aws.ssm().put_parameter(Name="/golden/ami", Value="ami-0123456789abcdef0", Type="String", DataType="text")
    aws.ssm().put_parameter(
        Name="/golden/ami", Value="ami-0fedcba9876543210", Type="String", DataType="text", Overwrite=True
    )

    latest = _run_instances(_launch_args(token="a", ImageId="resolve:ssm:/golden/ami"))
    pinned = _run_instances(_launch_args(token="b", ImageId="resolve:ssm:/golden/ami:1"))

    assert latest["Instances"][0]["ImageId"] == "ami-0fedcba9876543210"
    assert pinned["Instances"][0]["ImageId"] == "ami-0123456789abcdef0"
    assert {i["ImageId"] for i in _all_instances()} == {"ami-0fedcba9876543210", "ami-0123456789abcdef0"}


def test_a_resolve_ssm_image_id_of_a_missing_parameter_refuses_the_launch(strict_aws: StrictAws) -> None:
    with pytest.raises(ClientError) as caught:
        _run_instances(_launch_args(ImageId="resolve:ssm:/no/such/parameter"))

    assert _code(caught.value) == "InvalidParameterValue"
    assert "/no/such/parameter" in str(caught.value)
    assert _all_instances() == []


# === Lambda ==========================================================================================


def test_a_lambda_context_runs_out_and_the_next_aws_call_is_killed(strict_aws: StrictAws, table: str) -> None:
    strict_aws.call_latency = 0.4  # every AWS attempt costs 0.4 s of the invocation's time
    context = strict_aws.lambda_context(timeout_seconds=1.0, function_name="fleetkeeper-cleanup")
    key = to_raw({"PK": "SVC#x", "SK": "META"})
    remaining: list[int] = []

    def handler() -> None:
        for _ in range(10):
            remaining.append(context.get_remaining_time_in_millis())
            try:
                aws.dynamodb().get_item(TableName=table, Key=key)
            except Exception:  # what a handler catches: never the kill
                pytest.fail("LambdaTimeout must not be an Exception")

    with pytest.raises(LambdaTimeout, match=r"Task timed out after 1\.00 seconds"):
        handler()

    assert remaining == [1000, 600, 200, 0]
    assert strict_aws.attempts_of("dynamodb", "GetItem") == 3  # the killed call was never sent
    assert context.killed
    context.end()
    aws.dynamodb().get_item(TableName=table, Key=key)  # the invocation is over: calls work again


def test_botocores_retry_pauses_use_up_the_invocations_time(strict_aws: StrictAws, table: str) -> None:
    context = strict_aws.lambda_context(timeout_seconds=60)
    strict_aws.throttle("dynamodb", "GetItem", times=3)

    aws.dynamodb().get_item(TableName=table, Key=to_raw({"PK": "SVC#x", "SK": "META"}))

    assert context.get_remaining_time_in_millis() == round((60 - sum(strict_aws.backoff)) * 1000)


def test_the_clock_can_be_moved_by_the_test(strict_aws: StrictAws, table: str) -> None:
    with strict_aws.lambda_context(timeout_seconds=10) as context:
        strict_aws.clock.advance(9.5)
        assert context.get_remaining_time_in_millis() == 500
        aws.dynamodb().describe_table(TableName=table)
        strict_aws.clock.advance(0.5)
        with pytest.raises(LambdaTimeout):
            aws.dynamodb().describe_table(TableName=table)
    aws.dynamodb().describe_table(TableName=table)


# === the layer itself ================================================================================


def test_without_a_fault_the_layer_is_transparent(strict_aws: StrictAws, api: HandlerClient) -> None:
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 409
    current = api.get("/v1/services/web")
    generation = str(current.body["generation"])
    updated = api.put("/v1/services/web", {"spec": hello_spec(envs={"A": "1"})}, headers={"If-Match": generation})
    assert updated.status == 200, updated.body
    assert [s["name"] for s in api.get("/v1/services?limit=1").body["services"]] == ["web"]
    assert api.delete("/v1/services/web").status == 202
    assert strict_aws.faults_injected == []
    assert strict_aws.backoff == []


def test_concurrent_creates_of_one_name_are_atomic(strict_aws: StrictAws, table: str) -> None:
    """moto alone can let two transactions both pass `attribute_not_exists`; DynamoDB cannot."""
    store = CommandStore(Table(table))
    outcomes: list[str] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        barrier.wait()
        try:
            store.create_service("web", _spec(), "rolling", to_iso(datetime.now(UTC)), status_message="created")
            outcomes.append("created")
        except Exception as exc:
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=create) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(outcomes) == ["ServiceExists"] * 7 + ["created"]
    assert len(_partition("web")) == 2


def _seeded_tears(seed: int, name: str) -> list[tuple[int, tuple[int, ...]]]:
    """Creates and updates with reads in between, on a fresh controller drawing tears from `seed`."""
    with StrictAws(seed=seed, faults=FaultRates(torn_read=0.5)).active() as strict:
        store = CommandStore(Table(TABLE))
        state = store.create_service(name, _spec(), "rolling", NOW, status_message="created")
        for release in range(6):
            state = store.add_version(state, _spec(envs={"R": str(release)}), "rolling", NOW, expected_generation=None)
            for _ in range(3):
                store.load(name)
        return [(t.transaction, t.stale) for t in strict.dynamodb.torn_reads]


def test_random_faults_replay_from_the_seed(strict_aws: StrictAws, table: str) -> None:
    strict_aws.deactivate()  # this test runs its own controllers, one after the other
    first = _seeded_tears(7, "first")
    again = _seeded_tears(7, "again")
    other = _seeded_tears(8, "other")

    assert first and first == again
    assert other != first
