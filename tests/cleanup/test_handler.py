"""The cleanup Lambda handler: partial batch failures, the checked-in event, and the re-create race
played through the api and the table's real stream."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError

from fleetkeeper import aws
from fleetkeeper.cleanup import handler
from fleetkeeper.cleanup.logic import Budget
from fleetkeeper.store.codec import to_raw
from fleetkeeper.store.keys import SERVICE_SK, child_prefixes, service_pk, version_sk
from tests.strict_aws import LambdaContext, StrictAws
from tests.support.cleanup_support import (
    EVENT_PATH,
    CleanupContext,
    FaultyClient,
    access_denied,
    children_of,
    partition_keys,
    removal_record,
    seed_children,
    stream_records,
)
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec


def invoke(records: list[dict[str, Any]], context: CleanupContext | LambdaContext | None = None) -> dict[str, Any]:
    response: dict[str, Any] = handler.lambda_handler({"Records": records}, context or CleanupContext())
    return response


def test_the_checked_in_event_cleans_up_its_incarnation(table: str) -> None:
    event = json.loads(EVENT_PATH.read_text())
    image = event["Records"][0]["dynamodb"]["OldImage"]
    name, uid = image["name"]["S"], image["uid"]["S"]
    seed_children(table, name, uid, versions=3, replicas=4)

    response = handler.lambda_handler(event, CleanupContext())

    assert response == {"batchItemFailures": []}
    assert partition_keys(table, name) == set()


@pytest.mark.parametrize("fault", ["dynamodb refuses", "old image without uid"])
def test_a_failing_middle_record_is_the_only_batch_item_failure(
    table: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fault: str
) -> None:
    for name, uid in (("alpha", "aaaa"), ("bravo", "bbbb"), ("charlie", "cccc")):
        seed_children(table, name, uid, versions=60, replicas=2)
    bravo_before = partition_keys(table, "bravo")
    records = [
        removal_record("alpha", "aaaa", "100"),
        removal_record("bravo", "bbbb", "200"),
        removal_record("charlie", "cccc", "300"),
    ]
    if fault == "dynamodb refuses":
        real = aws.dynamodb()

        def refuse_bravo(request_items: dict[str, Any], _call: int) -> None:
            ((requests),) = request_items.values()
            if any(r["DeleteRequest"]["Key"]["PK"]["S"] == service_pk("bravo") for r in requests):
                raise access_denied()

        monkeypatch.setattr(aws, "dynamodb", lambda: FaultyClient(real, refuse_bravo))
    else:
        records[1]["dynamodb"]["OldImage"].pop("uid")

    response = invoke(records)

    assert response == {"batchItemFailures": [{"itemIdentifier": "200"}]}
    assert partition_keys(table, "alpha") == set()
    assert partition_keys(table, "charlie") == set()
    assert partition_keys(table, "bravo") == bravo_before
    (metrics,) = _metric_blobs(capsys)
    assert metrics["CleanupItemsDeleted"] == [62.0, 0.0, 62.0]
    assert metrics["CleanupRecordsIncomplete"] == [1.0]


def test_records_the_time_budget_does_not_reach_fail_and_their_redelivery_finishes(
    table: str, strict_aws: StrictAws
) -> None:
    seed_children(table, "alpha", "aaaa", versions=30)
    seed_children(table, "bravo", "bbbb", versions=30)
    # Each call takes 2 s. Before each, the cleanup holds back its first attempt's worst case and 5 s
    # to report; 13 s more are left: alpha's 7 calls (the re-read of its service item; 3 Queries:
    # versions, replicas, events; 2 batches; the listing of its secrets) fit, bravo's first Query does not.
    held_back = Budget(remaining_ms=lambda: 0).attempt_ms + 5_000
    strict_aws.call_latency = 2.0
    records = [removal_record("alpha", "aaaa", "100"), removal_record("bravo", "bbbb", "200")]

    with strict_aws.lambda_context(timeout_seconds=(held_back + 13_000) / 1000) as context:
        assert invoke(records, context) == {"batchItemFailures": [{"itemIdentifier": "200"}]}
    assert not context.killed
    strict_aws.call_latency = 0.0
    assert partition_keys(table, "alpha") == set()
    assert len(partition_keys(table, "bravo")) == 30

    # Lambda delivers again from the failed record on; alpha's is harmless to repeat.
    assert invoke(records) == {"batchItemFailures": []}
    assert partition_keys(table, "bravo") == set()


def test_a_batch_whose_every_record_fails_is_a_function_error(table: str) -> None:
    """Powertools raises when nothing succeeded: Lambda then bisects and retries the whole batch."""
    seed_children(table, "web", "aaaa", versions=30)

    with pytest.raises(BatchProcessingError):
        invoke([removal_record("web", "aaaa", "100")], CleanupContext(remaining_ms=4_000))
    assert len(partition_keys(table, "web")) == 30

    assert invoke([removal_record("web", "aaaa", "100")]) == {"batchItemFailures": []}
    assert partition_keys(table, "web") == set()


def test_records_that_are_not_service_removals_are_left_alone(table: str) -> None:
    seed_children(table, "web", "aaaa", versions=2)
    version_removal = removal_record("web", "aaaa", "100")
    version_removal["dynamodb"]["Keys"] = to_raw({"PK": service_pk("web"), "SK": version_sk("aaaa", 1)})
    insert = removal_record("web", "aaaa", "101")
    insert["eventName"] = "INSERT"

    assert invoke([version_removal, insert]) == {"batchItemFailures": []}
    assert len(partition_keys(table, "web")) == 2


def test_metrics_report_items_deleted_per_record(table: str, capsys: pytest.CaptureFixture[str]) -> None:
    seed_children(table, "alpha", "aaaa", versions=7)
    seed_children(table, "bravo", "bbbb", versions=40)

    invoke([removal_record("alpha", "aaaa", "1"), removal_record("bravo", "bbbb", "2")])

    (metrics,) = _metric_blobs(capsys)
    assert metrics["CleanupItemsDeleted"] == [7.0, 40.0]
    assert "CleanupRecordsIncomplete" not in metrics


def _metric_blobs(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The EMF documents the handler flushed to stdout (one per invocation)."""
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]


# --- the re-create race -----------------------------------------------------------------------------


def _remove_service_item(table: str, name: str, uid: str) -> None:
    """What the reconciler does at the end of SHUTTING_DOWN: remove the item of THAT incarnation."""
    aws.dynamodb().delete_item(
        TableName=table,
        Key=to_raw({"PK": service_pk(name), "SK": SERVICE_SK}),
        ConditionExpression="uid = :uid AND lifecycle = :deleting",
        ExpressionAttributeValues=to_raw({":uid": uid, ":deleting": "DELETING"}),
    )


def _recreate_with_versions(api: HandlerClient, versions: int) -> str:
    created = api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    assert created.status == 201, created.body
    for replicas in range(3, versions + 2):  # hello_spec runs 2: each version must differ from the last
        updated = api.put(
            "/v1/services/web",
            {"spec": hello_spec(service={"readiness_probe": "/health", "replicas": replicas, "ports": 8080})},
        )
        assert updated.status == 200, updated.body
    uid: str = created.body["uid"]
    return uid


@pytest.mark.parametrize("recreated", ["before the cleanup runs", "while the cleanup runs"])
def test_recreating_the_name_loses_nothing_of_the_new_incarnation(
    api: HandlerClient, table: str, monkeypatch: pytest.MonkeyPatch, recreated: str
) -> None:
    created = api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    uid_a = created.body["uid"]
    seed_children(table, "web", uid_a, versions=500, replicas=6)  # version 1 exists: the rest overwrite it
    assert api.delete("/v1/services/web").status == 202
    _remove_service_item(table, "web", uid_a)
    (removal,) = [r for r in stream_records(table) if r["eventName"] == "REMOVE"]

    new: dict[str, str] = {}
    if recreated == "before the cleanup runs":
        new["uid"] = _recreate_with_versions(api, versions=4)
        seed_children(table, "web", new["uid"], versions=0, replicas=3)
    else:
        real = aws.dynamodb()

        def recreate_after_first_batch(_items: dict[str, Any], call: int) -> None:
            if call == 2:  # one chunk of A deleted, the rest still to go
                monkeypatch.setattr(aws, "dynamodb", lambda: real)  # the api's own writes are not faulted
                new["uid"] = _recreate_with_versions(api, versions=4)
                seed_children(table, "web", new["uid"], versions=0, replicas=3)

        monkeypatch.setattr(aws, "dynamodb", lambda: FaultyClient(real, recreate_after_first_batch))

    response = invoke([removal])

    uid_b = new["uid"]
    assert uid_b != uid_a
    assert response == {"batchItemFailures": []}
    keys = partition_keys(table, "web")
    assert children_of(keys, uid_a) == set()
    # The new incarnation's versions and replicas (and its events) are all there.
    assert {k for k in keys if not k.startswith(child_prefixes(uid_b)[2])} == {SERVICE_SK} | {
        f"{child_prefixes(uid_b)[0]}{v:010d}" for v in range(1, 5)
    } | {f"{child_prefixes(uid_b)[1]}{r:010d}" for r in range(1, 4)}
    view = api.get("/v1/services/web")
    assert view.status == 200
    assert view.body["uid"] == uid_b
    assert [v["version"] for v in api.get("/v1/services/web/versions").body["versions"]] == [1, 2, 3, 4]


def test_a_hanging_reread_of_the_service_item_fails_the_record_before_lambdas_timeout(
    table: str, strict_aws: StrictAws
) -> None:
    """The consistent GetItem that checks the incarnation is gone is an AWS call of the record like
    the deletes: its retries are held to the invocation's end less the reserve too."""
    seed_children(table, "web", "aaaa", versions=30)
    strict_aws.hang("dynamodb", "GetItem", times=100, kind="read")
    record = removal_record("web", "aaaa", "100")

    with strict_aws.lambda_context(timeout_seconds=30, function_name="fleetkeeper-cleanup") as context:
        with pytest.raises(BatchProcessingError, match="DeadlineReached"):
            handler.lambda_handler({"Records": [record]}, context)
        left = context.get_remaining_time_in_millis()
    assert not context.killed
    assert left >= Budget(remaining_ms=lambda: 0).reserve_ms
    # 25 s for AWS calls: the first attempt hung 10 s, a retry fitted in the 15 s left and hung
    # 10 s, and the next could not fit in 5 s. Nothing was deleted.
    assert [f.kind for f in strict_aws.faults_injected] == ["hang:read"] * 2
    assert len(partition_keys(table, "web")) == 30

    strict_aws.clear_hangs()
    assert invoke([record]) == {"batchItemFailures": []}
    assert partition_keys(table, "web") == set()


def test_a_hanging_delete_fails_the_record_before_lambdas_timeout_and_its_redelivery_finishes(
    table: str, strict_aws: StrictAws
) -> None:
    """botocore's retries are held to the invocation's end less the reserve (fleetkeeper.aws.deadline):
    a BatchWriteItem whose answers never come (read timeouts of 10 s) is not retried past it."""
    seed_children(table, "web", "aaaa", versions=30)
    strict_aws.hang("dynamodb", "BatchWriteItem", times=100, kind="read")
    record = removal_record("web", "aaaa", "100")

    with strict_aws.lambda_context(timeout_seconds=30, function_name="fleetkeeper-cleanup") as context:
        # The record fails (Powertools raises when no record of the batch succeeded); Lambda did not kill it.
        with pytest.raises(BatchProcessingError, match="OutOfTime"):
            handler.lambda_handler({"Records": [record]}, context)
        left = context.get_remaining_time_in_millis()
    assert not context.killed
    assert left >= Budget(remaining_ms=lambda: 0).reserve_ms
    # 25 s for AWS calls: the first attempt (13 s at most) hung 10 s, a retry fitted in the 15 s
    # left and hung 10 s, and the next could not fit in 5 s.
    assert [f.kind for f in strict_aws.faults_injected] == ["hang:read"] * 2

    strict_aws.clear_hangs()
    assert invoke([record]) == {"batchItemFailures": []}
    assert partition_keys(table, "web") == set()


def test_a_forged_removal_of_a_live_service_deletes_nothing(api: HandlerClient, table: str) -> None:
    """Whoever may lambda:InvokeFunction the cleanup hands it a REMOVE record of its own making, with
    the name and uid of a live service (both are in every GET). Before the consistent re-read of the
    service item, the cleanup deleted that service's versions and secrets: GET answered 503 for good."""
    created = api.post("/v1/services", {"name": "web", "spec": hello_spec(secrets={"TOKEN": "s3cr3t"})})
    assert created.status == 201, created.body
    uid = created.body["uid"]
    assert api.put("/v1/services/web", {"spec": hello_spec(secrets={"TOKEN": "s3cr3t2"})}).status == 200
    keys_before = partition_keys(table, "web")
    parameters_before = aws.ssm().describe_parameters()["Parameters"]
    assert parameters_before

    response = invoke([removal_record("web", uid, "100")])

    assert response == {"batchItemFailures": []}  # not a failure: nothing to do, never redelivered
    assert partition_keys(table, "web") == keys_before
    assert aws.ssm().describe_parameters()["Parameters"] == parameters_before
    view = api.get("/v1/services/web")
    assert view.status == 200 and view.body["uid"] == uid
    assert [v["version"] for v in api.get("/v1/services/web/versions").body["versions"]] == [1, 2]


def test_a_removal_of_an_older_incarnation_still_cleans_it_up(api: HandlerClient, table: str) -> None:
    """The re-read compares uids: a live item of another incarnation of the name does not stop it."""
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    seed_children(table, "web", "0ld0ld0ld0ld0ld0", versions=5, replicas=2)

    assert invoke([removal_record("web", "0ld0ld0ld0ld0ld0", "100")]) == {"batchItemFailures": []}

    assert children_of(partition_keys(table, "web"), "0ld0ld0ld0ld0ld0") == set()
    assert api.get("/v1/services/web").status == 200
