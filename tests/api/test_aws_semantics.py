"""The api on AWS's semantics (the strict-AWS layer): torn reads, contention, and response sizes.

The invariants (docs/architecture/invariants.md) 1 (no reader acts on half a transaction), 8 (nothing
a client sends yields a 5xx, judged by AWS's rules, 6 MB responses included) and 9 (proven on AWS's
semantics).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fleetkeeper import aws
from fleetkeeper.model import ReplicaRecord, ReplicaStatus
from fleetkeeper.store.codec import replica_item, to_raw
from fleetkeeper.store.errors import Contention
from fleetkeeper.store.keys import IDEMPOTENCY_PARTITION
from tests.strict_aws import StrictAws
from tests.support import TABLE
from tests.support.handler_client import TEST_CALLER, FakeContext, HandlerClient
from tests.support.specs import hello_spec

LAMBDA_RESPONSE_LIMIT = 6 * 1024 * 1024  # Lambda's synchronous response payload
DYNAMODB_ITEM_LIMIT = 400 * 1024


def _raw(method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """The api's Lambda response as API Gateway receives it (its body is what counts against 6 MB)."""
    from fleetkeeper.api.handler import lambda_handler
    from fleetkeeper.aws.apigw import rest_event

    event = rest_event(
        method, path, headers={"Content-Type": "application/json", **(headers or {})}, body=body, principal=TEST_CALLER
    )
    response: dict[str, Any] = lambda_handler(event, FakeContext())
    return response


def _updated(api: HandlerClient, value: str = "2") -> None:
    assert api.put("/v1/services/web", {"spec": hello_spec(envs={"V": value})}).status == 200


# --- a. partial visibility, reading side -----------------------------------------------------------


@pytest.fixture
def web(strict_aws: StrictAws, api: HandlerClient) -> HandlerClient:
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec(envs={"V": "1"})}).status == 201
    return api


def test_a_get_torn_after_the_service_item_re_reads_until_the_target_version_is_there(
    strict_aws: StrictAws, web: HandlerClient
) -> None:
    _updated(web)
    # The update's transaction: [0] the service item (target 2), [1] version 2. Version 2 unseen.
    strict_aws.dynamodb.tear_next_read([1])
    response = web.get("/v1/services/web")
    assert len(strict_aws.dynamodb.torn_reads) == 1
    assert response.status == 200, response.body
    assert response.body["target_version"] == 2
    assert response.body["spec"]["envs"] == {"V": "2"}


def test_a_get_torn_before_the_service_item_is_the_state_before_the_write(
    strict_aws: StrictAws, web: HandlerClient
) -> None:
    _updated(web)
    strict_aws.dynamodb.tear_next_read([0])  # the old service item beside the new version 2
    response = web.get("/v1/services/web")
    assert len(strict_aws.dynamodb.torn_reads) == 1
    assert response.status == 200, response.body
    assert (response.body["target_version"], response.body["spec"]["envs"]) == (1, {"V": "1"})


def test_a_get_torn_during_a_create_never_shows_a_service_without_its_version(
    strict_aws: StrictAws, api: HandlerClient
) -> None:
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    strict_aws.dynamodb.tear_next_read([1])  # service item, no version 1
    response = api.get("/v1/services/web")
    assert response.status == 200 and response.body["spec"] is not None, response.body
    strict_aws.dynamodb.tear_next_read([0])  # version 1, no service item: the create has not happened
    assert api.get("/v1/services/web").status == 404


def test_a_read_that_keeps_tearing_is_a_503_with_retry_after(strict_aws: StrictAws, web: HandlerClient) -> None:
    _updated(web)
    strict_aws.dynamodb.tear_next_read([1], times=2)
    assert web.get("/v1/services/web").status == 200  # three consistent Queries: the third is whole
    strict_aws.dynamodb.tear_next_read([1], times=100)
    response = web.get("/v1/services/web")
    assert response.status == 503, response.body
    assert response.headers["Retry-After"] == "1"
    assert response.error["code"] == "unavailable"
    assert strict_aws.attempts_of("dynamodb", "Query") >= 3 * 3  # 3 tries of 3 Queries, no more


def test_the_reads_behind_writes_never_act_on_half_a_transaction(strict_aws: StrictAws, web: HandlerClient) -> None:
    _updated(web)
    strict_aws.dynamodb.tear_next_read([1])
    deleted = web.delete("/v1/services/web")
    assert deleted.status == 202, deleted.body
    assert (deleted.body["target_version"], deleted.body["spec"]["envs"]) == (2, {"V": "2"})


def test_a_rollback_after_a_torn_read_rolls_back_from_the_real_target(
    strict_aws: StrictAws, web: HandlerClient
) -> None:
    _updated(web)
    _updated(web, "3")
    strict_aws.dynamodb.tear_next_read([1])
    rolled = web.post("/v1/services/web/rollback")
    assert rolled.status == 200, rolled.body
    assert rolled.body["target_version"] == 2


# --- b. contention: a typed store error, a bounded retry, then 503 + Retry-After --------------------


def test_a_transaction_conflict_is_retried_by_the_command(strict_aws: StrictAws, web: HandlerClient) -> None:
    strict_aws.dynamodb.conflict_next_transaction(times=2)
    response = web.put("/v1/services/web", {"spec": hello_spec(envs={"V": "2"})})
    assert response.status == 200, response.body
    assert strict_aws.attempts_of("dynamodb", "TransactWriteItems") == 1 + 3  # the create, then 3 tries


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("PUT", "/v1/services/web", {"spec": hello_spec(envs={"V": "2"})}),
        ("POST", "/v1/services/web/rollback", {"version": 1}),
        ("POST", "/v1/services", {"name": "api", "spec": hello_spec()}),
    ],
)
def test_a_transaction_conflict_that_persists_is_a_503_and_writes_nothing(
    strict_aws: StrictAws, web: HandlerClient, method: str, path: str, body: dict[str, Any]
) -> None:
    if path.endswith("rollback"):
        _updated(web)
    before = web.get("/v1/services/web").body["generation"]
    strict_aws.dynamodb.conflict_next_transaction(times=3)
    response = web.call(method, path, body)
    assert response.status == 503, response.body
    assert response.headers["Retry-After"] == "1"
    assert set(response.error) == {"code", "message", "details"}
    assert web.get("/v1/services/web").body["generation"] == before
    assert web.get("/v1/services/api").status == 404


def test_a_transaction_conflict_on_delete_is_retried_then_a_503(strict_aws: StrictAws, web: HandlerClient) -> None:
    # Delete is ONE TransactWriteItems (the service item and its Deleting event).
    strict_aws.dynamodb.conflict_next_transaction([0], times=1)
    assert web.delete("/v1/services/web").status == 202
    assert web.post("/v1/services", {"name": "api", "spec": hello_spec()}).status == 201
    strict_aws.dynamodb.conflict_next_transaction([0], times=3)
    response = web.delete("/v1/services/api")
    assert response.status == 503, response.body
    assert web.get("/v1/services/api").body["lifecycle"] == "ACTIVE"


def test_throttling_that_outlasts_botocore_is_a_503_not_retried_again(
    strict_aws: StrictAws, web: HandlerClient
) -> None:
    strict_aws.throttle("dynamodb", "Query", times=50)
    response = web.get("/v1/services/web")
    assert response.status == 503, response.body
    assert response.headers["Retry-After"] == "5"
    assert strict_aws.attempts_of("dynamodb", "Query") == 6  # botocore's 1 + 5; the command adds none


def test_a_throttled_idempotency_record_is_a_503(strict_aws: StrictAws, web: HandlerClient) -> None:
    strict_aws.throttle("dynamodb", "PutItem", times=50)
    response = web.put("/v1/services/web", {"spec": hello_spec()}, headers={"Idempotency-Key": "k"})
    assert response.status == 503, response.body
    assert web.get("/v1/services/web").body["generation"] == 1


def test_the_reconciler_store_reports_the_same_contention(strict_aws: StrictAws, web: HandlerClient) -> None:
    from fleetkeeper.model import ServiceStatus
    from fleetkeeper.store.runs import ReconcilerStore
    from fleetkeeper.store.table import Table

    store = ReconcilerStore(Table(TABLE))
    state = store.load("web")
    assert state is not None
    strict_aws.dynamodb.conflict_next_write(operations=["UpdateItem"])
    with pytest.raises(Contention) as conflict:
        store.record_status(state.service, ServiceStatus.NO_REPLICA, "m", state.service.generation)
    assert (conflict.value.reason, conflict.value.throttled) == ("TransactionConflictException", False)
    strict_aws.dynamodb.conflict_next_transaction()
    with pytest.raises(Contention, match="TransactionConflict"):
        store.claim_replicas(state.service, 1, [0], "2026-01-01T00:00:00Z")
    strict_aws.throttle("dynamodb", "Query", times=6)
    with pytest.raises(Contention) as throttled:
        store.load("web")
    assert throttled.value.throttled


# --- i. bounded sizes ----------------------------------------------------------------------------------


def test_the_kick_makes_one_short_attempt(api: HandlerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.awsrequest import AWSResponse

    monkeypatch.setenv("FLEETKEEPER_KICK_QUEUE_URL", "https://sqs.us-east-1.amazonaws.com/123456789012/kicks")
    client = aws.sqs_for_kick()
    assert (client.meta.config.connect_timeout, client.meta.config.read_timeout) == (1, 2)
    assert client.meta.config.retries["total_max_attempts"] == 1
    sent: list[object] = []

    def unavailable(request: Any, **_: Any) -> AWSResponse:
        sent.append(request)  # a 503 botocore would retry 5 times on the shared client
        return AWSResponse(request.url, 503, {}, None)  # type: ignore[arg-type]

    client.meta.events.register_first("before-send.sqs.SendMessage", unavailable)
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    assert len(sent) == 1


NON_ASCII = "ünïcødé ✓ 漢字 🚀"


def test_specs_are_stored_as_utf8_and_escaped_items_still_read(api: HandlerClient, table: str) -> None:
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec(envs={"T": NON_ASCII})}).status == 201
    client = aws.dynamodb()
    items = client.query(
        TableName=table,
        KeyConditionExpression="PK = :pk AND begins_with(SK, :v)",
        ExpressionAttributeValues={":pk": {"S": "SVC#web"}, ":v": {"S": "V#"}},
    )["Items"]
    stored = items[0]["spec"]["S"]
    assert NON_ASCII in stored and "\\u" not in stored
    # An item written before (json.dumps' default \uXXXX escapes) reads the same.
    escaped = dict(items[0], spec={"S": json.dumps(json.loads(stored), sort_keys=True)})
    assert "\\u" in escaped["spec"]["S"]
    client.put_item(TableName=table, Item=escaped)
    assert api.get("/v1/services/web").body["spec"]["envs"] == {"T": NON_ASCII}


def _big_spec(release: int = 0) -> str:
    """A create/update body of just under 64 KiB of UTF-8, nearly all 4-byte characters: the spec
    whose JSON answer grows most (each becomes a 12-byte surrogate-pair escape). `release` tells
    versions apart (an update identical to the target writes no version)."""
    filler = "🚀" * ((64 * 1024 - 400) // 4)
    body = json.dumps({"spec": hello_spec(envs={"BIG": filler, "RELEASE": str(release)})}, ensure_ascii=False)
    assert 60 * 1024 < len(body.encode()) <= 64 * 1024
    return body


def test_versions_pages_stay_under_the_lambda_response_limit(strict_aws: StrictAws, api: HandlerClient) -> None:
    from fleetkeeper.api.handler import MAX_VERSIONS_PAGE
    from fleetkeeper.store.commands import VERSION_HISTORY_LIMIT

    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    for release in range(1, VERSION_HISTORY_LIMIT):
        assert _raw("PUT", "/v1/services/web", _big_spec(release))["statusCode"] == 200
    sizes: list[int] = []
    seen: list[int] = []
    token: str | None = None
    while True:
        query = f"?limit={MAX_VERSIONS_PAGE}" + (f"&next_token={token}" if token else "")
        response = _raw("GET", f"/v1/services/web/versions{query}")
        assert response["statusCode"] == 200, response["body"][:300]
        # What counts against the 6 MB: the whole response as the Lambda runtime serializes it (the
        # body's escapes and quotes escaped once more).
        sizes.append(len(json.dumps(response).encode()))
        page = json.loads(response["body"])
        seen.extend(v["version"] for v in page["versions"])
        token = page["next_token"]
        if not token:
            break
    print(f"versions pages of {MAX_VERSIONS_PAGE}: {sizes} bytes")
    assert seen == list(range(1, VERSION_HISTORY_LIMIT + 1))
    assert max(sizes) < 0.8 * LAMBDA_RESPONSE_LIMIT
    # What the unpaginated answer would have been: every version in one body, over the limit.
    assert sum(sizes) > LAMBDA_RESPONSE_LIMIT


def _idempotency_records(table: str) -> list[dict[str, Any]]:
    return aws.dynamodb().query(
        TableName=table,
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues={":pk": {"S": IDEMPOTENCY_PARTITION}},
    )["Items"]


def _item_size(item: dict[str, Any]) -> int:
    """DynamoDB's item size, near enough: attribute names and values as UTF-8 (numbers as text)."""

    def value_size(value: dict[str, Any]) -> int:
        ((kind, data),) = value.items()
        if kind == "M":
            return sum(len(k.encode()) + value_size(v) for k, v in data.items())
        if kind == "L":
            return sum(value_size(v) for v in data)
        return len(str(data).encode())

    return sum(len(name.encode()) + value_size(value) for name, value in item.items())


def test_the_idempotency_record_of_a_service_of_1000_replicas_is_small(api: HandlerClient, table: str) -> None:
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    uid = api.get("/v1/services/web").body["uid"]
    client = aws.dynamodb()
    now = "2026-01-01T00:00:00Z"
    for replica_id in range(1, 1001):
        record = ReplicaRecord(
            name="web",
            uid=uid,
            replica_id=replica_id,
            version=1,
            status=ReplicaStatus.READY,
            status_message="ready: probe /health answered 200",
            instance_id=f"i-{replica_id:017x}",
            url=f"http://10.0.{replica_id // 256}.{replica_id % 256}:8080",
            created_at=now,
            updated_at=now,
        )
        client.put_item(TableName=table, Item=to_raw(replica_item(record)))
    view = _raw("GET", "/v1/services/web")
    assert len(json.loads(view["body"])["replicas"]) == 1000
    body = json.dumps({"spec": hello_spec(envs={"V": "2"})})
    first = _raw("PUT", "/v1/services/web", body, {"Idempotency-Key": "deploy-1"})
    again = _raw("PUT", "/v1/services/web", body, {"Idempotency-Key": "deploy-1"})
    assert first["statusCode"] == again["statusCode"] == 200
    assert again["body"] == first["body"]  # the replay: byte for byte
    (record,) = _idempotency_records(table)
    size = _item_size(record)
    print(f"GET with 1000 replicas: {len(view['body'].encode())} bytes; idempotency record: {size} bytes")
    assert size < 4 * 1024  # independent of the replica count


def test_the_idempotency_record_of_the_largest_spec_fits_an_item(api: HandlerClient, table: str) -> None:
    assert api.post("/v1/services", {"name": "web", "spec": hello_spec()}).status == 201
    body = _big_spec()
    first = _raw("PUT", "/v1/services/web", body, {"Idempotency-Key": "big"})
    again = _raw("PUT", "/v1/services/web", body, {"Idempotency-Key": "big"})
    assert first["statusCode"] == 200 and again["body"] == first["body"]
    (record,) = _idempotency_records(table)
    size = _item_size(record)
    print(f"idempotency record of a 64 KiB 4-byte-character spec: {size} bytes")
    assert size < DYNAMODB_ITEM_LIMIT // 20
