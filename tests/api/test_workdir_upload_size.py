"""A workdir upload is exactly the size its client declared, and the declared size is at most
MAX_WORKDIR_BYTES: on AWS the size is a signed header (Content-Length) of the presigned PUT URL, so
S3 refuses any other; in embedded mode the local upload endpoint checks it the same way.

moto does not serve presigned URLs, so the URL's signature is checked here as S3 checks a SigV4
query-string signature (the canonical request over the headers named in X-Amz-SignedHeaders, with
the values the PUT actually carries):
https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-query-string-auth.html
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import threading
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, quote, urlsplit

import pytest

from fleetkeeper import aws
from fleetkeeper.replicas.workdirs import MAX_WORKDIR_BYTES, LocalWorkdirStore, upload_key

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.support.handler_client import HandlerClient

BUCKET = "fk-test-workdirs"


def _secret() -> str:
    """The secret key the api's S3 client signs with (moto's stand-in credentials)."""
    return str(aws.s3()._request_signer._credentials.get_frozen_credentials().secret_key)  # type: ignore[attr-defined]


def s3_would_accept(url: str, method: str, headers: dict[str, str]) -> bool:
    """Whether S3 would find the URL's signature valid for a request carrying `headers`."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    signature = query.pop("X-Amz-Signature")
    sent = {k.lower(): v.strip() for k, v in {**headers, "host": parts.netloc}.items()}
    names = query["X-Amz-SignedHeaders"].split(";")
    if any(name not in sent for name in names):
        return False
    canonical_query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items()))
    canonical = "\n".join(
        [
            method,
            parts.path,
            canonical_query,
            "".join(f"{name}:{sent[name]}\n" for name in names),
            ";".join(names),
            "UNSIGNED-PAYLOAD",
        ]
    )
    _, day, region, service, _ = query["X-Amz-Credential"].split("/")
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", query["X-Amz-Date"], scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = f"AWS4{_secret()}".encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.compare_digest(hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest(), signature)


@pytest.fixture
def bucket(api: HandlerClient, monkeypatch: pytest.MonkeyPatch) -> str:
    aws.s3().create_bucket(Bucket=BUCKET)
    monkeypatch.setenv("WORKDIR_BUCKET", BUCKET)
    return BUCKET


def test_the_declared_size_is_signed_into_the_upload_url(api: HandlerClient, bucket: str) -> None:
    data = b"x" * 1000
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    answer = api.post("/v1/workdirs", {"digest": digest, "size": len(data)})
    assert answer.status == 200, answer.body
    upload = answer.body["upload"]
    signed = dict(parse_qsl(urlsplit(upload["url"]).query))["X-Amz-SignedHeaders"].split(";")
    assert "content-length" in signed and "x-amz-checksum-sha256" in signed
    assert upload["headers"]["content-length"] == str(len(data))
    assert urlsplit(upload["url"]).path.endswith(upload_key(digest))

    checksum = upload["headers"]["x-amz-checksum-sha256"]
    exact = {"x-amz-checksum-sha256": checksum, "Content-Length": str(len(data))}
    assert s3_would_accept(upload["url"], "PUT", exact)
    for other in (len(data) + 1, len(data) - 1, 5 * 1024**3):
        assert not s3_would_accept(upload["url"], "PUT", {**exact, "Content-Length": str(other)}), other
    assert not s3_would_accept(upload["url"], "PUT", {"x-amz-checksum-sha256": checksum})


@pytest.mark.parametrize("size", [MAX_WORKDIR_BYTES + 1, 5 * 1024**3, 0])
def test_a_size_over_the_limit_or_empty_is_a_400_naming_the_field(api: HandlerClient, bucket: str, size: int) -> None:
    answer = api.post("/v1/workdirs", {"digest": "sha256:" + "5" * 64, "size": size})
    assert answer.status == 400, answer.body
    assert answer.error["code"] == "invalid_request"
    assert "size" in answer.error["message"]
    assert [d["field"] for d in answer.error["details"]] == ["size"]
    assert aws.s3().list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0


def test_the_limit_itself_is_accepted(api: HandlerClient, bucket: str) -> None:
    answer = api.post("/v1/workdirs", {"digest": "sha256:" + "6" * 64, "size": MAX_WORKDIR_BYTES})
    assert answer.status == 200 and answer.body["upload"] is not None


# --- embedded mode: the local upload endpoint takes exactly the declared size --------------------------

TOKEN = "upload-size-test-token"


@pytest.fixture
def bridge(table: str, tmp_path: Path) -> Iterator[tuple[str, LocalWorkdirStore]]:
    from fleetkeeper.api.handler import lambda_handler
    from fleetkeeper.local.http_bridge import ApiBridge

    server = ApiBridge(
        ("127.0.0.1", 0), lambda_handler, token=TOKEN, on_kick=lambda _n: None, logs_dir=tmp_path / "logs"
    )
    store = LocalWorkdirStore(tmp_path / "workdirs", server.url + "/_local/workdirs")
    server.workdirs = store
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.url, store
    server.shutdown()
    server.server_close()


def _put(url: str, body: bytes) -> int:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        connection.putrequest("PUT", parts.path)
        connection.putheader("Content-Length", str(len(body)))
        connection.putheader("Authorization", f"Bearer {TOKEN}")  # the run's credential (local/auth.py)
        connection.endheaders()
        connection.send(body)
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def test_the_embedded_upload_refuses_any_other_size_than_declared(bridge: tuple[str, LocalWorkdirStore]) -> None:
    _, store = bridge
    data = b"packed workdir bytes"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    # Declared one byte short: the right bytes (they hash to the digest) are refused all the same.
    upload = store.upload(digest, len(data) - 1, None, None)
    assert upload is not None and upload.headers == {"content-length": str(len(data) - 1)}
    assert _put(upload.url, data) == 400
    assert not store.path(upload_key(digest)).exists()

    upload = store.upload(digest, len(data), None, None)
    assert upload is not None
    assert _put(upload.url, data) == 200
    assert store.path(upload_key(digest)).read_bytes() == data


def test_an_embedded_upload_nobody_asked_for_is_refused(bridge: tuple[str, LocalWorkdirStore]) -> None:
    url, store = bridge
    data = b"unasked"
    digest = hashlib.sha256(data).hexdigest()
    assert _put(f"{url}/_local/workdirs/{digest}", data) == 400
    assert not store.path(upload_key("sha256:" + digest)).exists()
