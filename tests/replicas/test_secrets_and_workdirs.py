"""Secrets and workdirs through the api (moto: DynamoDB, Parameter Store, S3), and their cleanup.

Secrets: the values go to one SecureString per set of values, never to the table, an answer or an
Idempotency-Key record; an update whose spec and values equal the target's writes nothing; the
cleanup deletes every parameter of the removed incarnation. Workdirs: the api hands out a presigned
upload whose signed checksum makes S3 keep only the digest's bytes, adopts an upload into the
incarnation's copy when a version names it, refuses a digest never uploaded, and the cleanup deletes
the copies.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from fleetkeeper import aws
from fleetkeeper.replicas.secrets import SecretStore, parameter_prefix
from fleetkeeper.replicas.workdirs import S3WorkdirStore, service_key, upload_key
from tests.support import TABLE
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec

SECRET = "hf_s3cr3t_value_9f8e7d"
BUCKET = "fk-test-workdirs"


def with_secret(value: str = SECRET, **spec: Any) -> dict[str, Any]:
    base = hello_spec(**spec)
    base["secrets"] = {"HF_TOKEN": value}
    base["service"] = {
        "readiness_probe": {"path": "/health", "headers": {"Authorization": "Bearer $HF_TOKEN"}},
        "replicas": 2,
        "ports": 8080,
    }
    return base


def parameters() -> dict[str, str]:
    found: dict[str, str] = {}
    pages = aws.ssm().get_paginator("get_parameters_by_path")
    for page in pages.paginate(Path=parameter_prefix(TABLE), Recursive=True, WithDecryption=True):
        found.update({p["Name"]: p["Value"] for p in page["Parameters"]})
    return found


def table_dump() -> str:
    return json.dumps(aws.dynamodb().scan(TableName=TABLE)["Items"])


def test_a_secret_is_kept_in_parameter_store_never_in_the_table_or_an_answer(api: HandlerClient) -> None:
    created = api.post("/v1/services", {"name": "llm", "spec": with_secret()}, headers={"Idempotency-Key": "k1"})
    assert created.status == 201, created.body
    answers = [created, api.get("/v1/services/llm"), api.get("/v1/services/llm/versions"), api.get("/v1/services")]
    for answer in answers:
        assert SECRET not in json.dumps(answer.body)
    assert created.body["spec"]["secrets"] == {"HF_TOKEN": None}
    # The probe keeps its template; the value is filled where the probe is made.
    assert created.body["spec"]["service"]["readiness_probe"]["headers"] == {"Authorization": "Bearer $HF_TOKEN"}
    assert SECRET not in table_dump()  # versions, service item, idempotency record
    (name, value), *more = parameters().items()
    assert more == []
    # Under the owner's scope (fleetkeeper.replicas.identity): the api's callers own what they create.
    assert name.startswith(
        SecretStore(parameter_prefix(TABLE)).incarnation_path("llm", created.body["uid"], created.body["owner"]) + "/"
    )
    assert json.loads(value) == {"HF_TOKEN": SECRET}
    assert aws.ssm().describe_parameters()["Parameters"][0]["Type"] == "SecureString"


def test_an_identical_update_writes_nothing_and_says_so(api: HandlerClient) -> None:
    created = api.post("/v1/services", {"name": "llm", "spec": with_secret()})
    before = table_dump()
    again = api.put("/v1/services/llm", {"spec": with_secret()})
    assert again.status == 200, again.body
    assert again.body["changed"] is False
    assert (again.body["target_version"], again.body["generation"]) == (1, created.body["generation"])
    assert again.headers["ETag"] == f'"{created.body["generation"]}"'
    assert table_dump() == before  # not a byte written
    assert len(parameters()) == 1
    # A stale If-Match is still a stale If-Match.
    stale = api.put("/v1/services/llm", {"spec": with_secret()}, headers={"If-Match": "7"})
    assert stale.status == 412


def test_new_secret_values_make_a_new_version_with_their_own_parameter(api: HandlerClient) -> None:
    api.post("/v1/services", {"name": "llm", "spec": with_secret()})
    rotated = api.put("/v1/services/llm", {"spec": with_secret("rotated")})
    assert (rotated.status, rotated.body["changed"], rotated.body["target_version"]) == (200, True, 2)
    assert sorted(json.loads(v)["HF_TOKEN"] for v in parameters().values()) == sorted([SECRET, "rotated"])
    # Same values, another spec: a new version that reuses the target's parameter.
    scaled = api.put("/v1/services/llm", {"spec": with_secret("rotated", envs={"X": "1"})})
    assert scaled.body["target_version"] == 3
    assert len(parameters()) == 2
    # Rolling back to v1 brings its own values back (its parameter is kept with it).
    assert api.post("/v1/services/llm/rollback", {"version": 1}).body["target_version"] == 1


def test_an_idempotency_key_record_keeps_no_secret_value_yet_the_values_count(api: HandlerClient) -> None:
    # The payload a replay must match is the request with secret values replaced by null, plus their
    # HMAC under the stack's key (fleetkeeper.api.request_hmac): the same key with the same values is a
    # replay, with other values another request (422), and the table holds neither value, nor a hash
    # of one anybody could test guesses against.
    import hashlib

    api.post("/v1/services", {"name": "llm", "spec": with_secret()})
    key = {"Idempotency-Key": "u"}
    first = api.put("/v1/services/llm", {"spec": with_secret("first-value-77", envs={"X": "1"})}, headers=key)
    replay = api.put("/v1/services/llm", {"spec": with_secret("first-value-77", envs={"X": "1"})}, headers=key)
    other = api.put("/v1/services/llm", {"spec": with_secret("second-value-88", envs={"X": "1"})}, headers=key)
    assert first.status == replay.status == 200
    assert replay.body == first.body
    assert other.status == 422, other.body
    assert other.error["code"] == "idempotency_key_reused"
    assert "second-value-88" not in json.dumps(other.body)
    dump = table_dump()
    for value in ("first-value-77", "second-value-88"):
        assert value not in dump
        assert hashlib.sha256(value.encode()).hexdigest() not in dump
        assert hashlib.md5(value.encode()).hexdigest() not in dump


def test_a_failed_create_leaves_no_secret_behind(api: HandlerClient) -> None:
    assert api.post("/v1/services", {"name": "llm", "spec": with_secret()}).status == 201
    duplicate = api.post("/v1/services", {"name": "llm", "spec": with_secret("other")})
    assert duplicate.status == 409
    assert "fleetkeeper update llm SPEC.yaml" in duplicate.error["message"]
    assert [json.loads(v)["HF_TOKEN"] for v in parameters().values()] == [SECRET]


def test_an_unfilled_secret_is_a_400_naming_it(api: HandlerClient) -> None:
    spec = with_secret()
    spec["secrets"] = {"HF_TOKEN": None}
    answer = api.post("/v1/services", {"name": "llm", "spec": spec})
    assert answer.status == 400
    assert "HF_TOKEN has no value: pass it with `--secret HF_TOKEN`" in answer.error["message"]
    assert parameters() == {}


def test_the_cleanup_deletes_the_incarnations_secrets_and_workdir_copies(table: str) -> None:
    from fleetkeeper.cleanup.handler import record_handler
    from fleetkeeper.replicas.workdirs import LocalWorkdirStore

    class Record:
        def __init__(self, name: str, uid: str) -> None:
            from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord

            self.inner = DynamoDBRecord(
                {
                    "eventID": "1",
                    "eventName": "REMOVE",
                    "dynamodb": {
                        "Keys": {"PK": {"S": f"SVC#{name}"}, "SK": {"S": "META"}},
                        "OldImage": {"name": {"S": name}, "uid": {"S": uid}},
                        "SequenceNumber": "1",
                    },
                }
            )

    from fleetkeeper.store.table import Table

    secrets = SecretStore(parameter_prefix(table))
    secrets.put("web", "u1", "r1", {"A": "1"})
    secrets.put("web", "u1", "r2", {"A": "2"})
    secrets.put("web", "u2", "r3", {"A": "3"})  # a newer incarnation of the name: untouched
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        workdirs = LocalWorkdirStore(Path(folder), "")
        for uid in ("u1", "u2"):
            copy = workdirs.path(service_key("web", uid, "sha256:" + "0" * 64))
            copy.parent.mkdir(parents=True)
            copy.write_bytes(b"x")

        class Context:
            @staticmethod
            def get_remaining_time_in_millis() -> int:
                return 300_000

        stores = (("secrets", secrets), ("workdirs", workdirs))
        record_handler(Record("web", "u1").inner, Context(), table=Table(table), stores=stores)  # type: ignore[arg-type]
        assert sorted(parameters()) == [f"/fleetkeeper/{table}/web/u2/r3"]
        assert not workdirs.path("services/web/u1").exists()
        assert workdirs.path(service_key("web", "u2", "sha256:" + "0" * 64)).exists()
        # Redelivered: nothing left to delete, and no error.
        record_handler(Record("web", "u1").inner, Context(), table=Table(table), stores=stores)  # type: ignore[arg-type]


# --- workdirs in S3 -----------------------------------------------------------------------------------


def archive(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return raw.getvalue()


@pytest.fixture
def bucket(api: HandlerClient, monkeypatch: pytest.MonkeyPatch) -> str:
    aws.s3().create_bucket(Bucket=BUCKET)
    monkeypatch.setenv("WORKDIR_BUCKET", BUCKET)
    return BUCKET


def test_an_upload_is_presigned_with_the_digests_checksum_then_adopted_per_incarnation(
    api: HandlerClient, bucket: str
) -> None:
    data = archive({"server.py": b"print('hi')\n"})
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    asked = api.post("/v1/workdirs", {"digest": digest, "size": len(data)})
    assert asked.status == 200, asked.body
    upload = asked.body["upload"]
    checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
    assert upload["method"] == "PUT"
    assert upload["headers"] == {"x-amz-checksum-sha256": checksum, "content-length": str(len(data))}
    query = parse_qs(urlsplit(upload["url"]).query)
    # SigV4, the checksum header among what is signed: S3 refuses any other bytes under this URL.
    assert query["X-Amz-Algorithm"] == ["AWS4-HMAC-SHA256"]
    assert "x-amz-checksum-sha256" in query["X-Amz-SignedHeaders"][0].split(";")
    assert urlsplit(upload["url"]).path.endswith(upload_key(digest))
    # What the client does with the URL, done here through boto3 (moto does not serve the URL itself).
    aws.s3().put_object(Bucket=bucket, Key=upload_key(digest), Body=data, ChecksumSHA256=checksum)
    assert api.post("/v1/workdirs", {"digest": digest, "size": len(data)}).body["upload"] is None

    created = api.post("/v1/services", {"name": "web", "spec": hello_spec(workdir={"digest": digest})})
    assert created.status == 201, created.body
    uid = created.body["uid"]
    owner = created.body["owner"]
    copy = aws.s3().get_object(Bucket=bucket, Key=service_key("web", uid, digest, owner))["Body"].read()
    assert copy == data
    # Asked for this service, the digest needs no upload even once the upload itself expired.
    aws.s3().delete_object(Bucket=bucket, Key=upload_key(digest))
    again = api.post("/v1/workdirs", {"digest": digest, "size": len(data), "service": "web"})
    assert again.body["upload"] is None
    # An identical update (same digest) is a no-op; another digest is a new version.
    assert api.put("/v1/services/web", {"spec": hello_spec(workdir={"digest": digest})}).body["changed"] is False
    assert S3WorkdirStore(bucket).delete_incarnation("web", uid, owner) == 1


def test_a_new_service_asks_for_an_upload_like_any_other(api: HandlerClient, bucket: str) -> None:
    asked = api.post("/v1/workdirs", {"digest": "sha256:" + "4" * 64, "size": 1, "service": "not-yet"})
    assert asked.status == 200 and asked.body["upload"] is not None


def test_a_digest_never_uploaded_is_a_400_naming_it(api: HandlerClient, bucket: str) -> None:
    digest = "sha256:" + "1" * 64
    answer = api.post("/v1/services", {"name": "web", "spec": hello_spec(workdir={"digest": digest})})
    assert answer.status == 400
    assert answer.error["details"] == [{"field": "spec.workdir.digest", "problem": "not uploaded"}]
    assert f"workdir {digest} was not uploaded" in answer.error["message"]
    assert api.get("/v1/services/web").status == 404


def test_an_upload_that_does_not_hash_to_its_digest_is_refused(api: HandlerClient, bucket: str) -> None:
    digest = "sha256:" + "2" * 64
    aws.s3().put_object(Bucket=bucket, Key=upload_key(digest), Body=b"other bytes")  # no checksum recorded
    answer = api.post("/v1/services", {"name": "web", "spec": hello_spec(workdir={"digest": digest})})
    assert answer.status == 400
    assert "does not hash to the digest" in answer.error["message"]


def test_a_workdir_without_a_store_is_refused_in_words(api: HandlerClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORKDIR_BUCKET", raising=False)
    answer = api.post("/v1/services", {"name": "web", "spec": hello_spec(workdir={"digest": "sha256:" + "3" * 64})})
    assert answer.status == 400
    assert "has no workdir store" in answer.error["message"]
