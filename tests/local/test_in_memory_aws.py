"""The embedded mode's in-memory AWS answers this run's own clients only, and never with CORS.

moto's server alone answers anyone on the machine (and, through CORS, any web page), its
`/moto-api/data.json` included: every Parameter Store value, i.e. the services' secrets in clear.
"""

from __future__ import annotations

import http.client
import json
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.exceptions import ClientError

from fleetkeeper.local.auth import new_access_key_id
from fleetkeeper.local.in_memory_aws import InMemoryAws

if TYPE_CHECKING:
    from collections.abc import Iterator

SECRET = "s3cret-value-never-leaves"


@pytest.fixture
def in_memory() -> Iterator[tuple[InMemoryAws, str]]:
    key = new_access_key_id()
    server = InMemoryAws("127.0.0.1", key)
    server.start()
    yield server, key
    server.stop()


def ssm(endpoint: str, key: str) -> Any:
    return boto3.session.Session().client(
        "ssm", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key, aws_secret_access_key="x"
    )


def raw(endpoint: str, method: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    parts = urlsplit(endpoint)
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        answer = connection.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        connection.close()


def signed_by(key: str) -> str:
    return f"AWS4-HMAC-SHA256 Credential={key}/20260101/us-east-1/ssm/aws4_request, SignedHeaders=host, Signature=0"


def test_moto_api_is_refused_to_anyone_without_the_runs_key_and_sends_no_cors(
    in_memory: tuple[InMemoryAws, str],
) -> None:
    server, key = in_memory
    ssm(server.endpoint, key).put_parameter(Name="/fk/web/TOKEN", Value=SECRET, Type="SecureString")
    host = {"Host": server.gate.authority}
    for headers in [
        host,  # another local process, curl
        {**host, "Authorization": signed_by("local")},  # the fixed key id embedded mode used to have
        {**host, "Authorization": signed_by(new_access_key_id())},  # another run's
        {**host, "Origin": "https://evil.example", "Authorization": signed_by(key)},  # a page (cannot have it)
        {"Host": "evil.example:" + server.endpoint.rsplit(":", 1)[1], "Authorization": signed_by(key)},  # rebinding
    ]:
        for method in ("GET", "OPTIONS"):
            status, answer_headers, body = raw(server.endpoint, method, "/moto-api/data.json", headers)
            assert status == 403, (headers, body)
            assert json.loads(body)["error"]["code"] == "forbidden"
            assert SECRET.encode() not in body
            assert not [name for name in answer_headers if name.startswith("access-control-")]
    # The run's own clients are served (and still without CORS headers).
    status, answer_headers, body = raw(
        server.endpoint, "GET", "/moto-api/data.json", {**host, "Authorization": signed_by(key)}
    )
    assert status == 200
    assert not [name for name in answer_headers if name.startswith("access-control-")]
    # moto's dashboard lists no model objects here: they are not tracked (fleetkeeper.local.moto_memory).
    assert SECRET.encode() not in body
    assert (
        ssm(server.endpoint, key).get_parameter(Name="/fk/web/TOKEN", WithDecryption=True)["Parameter"]["Value"]
        == SECRET
    )


def test_an_sdk_client_with_another_key_changes_nothing(in_memory: tuple[InMemoryAws, str]) -> None:
    server, key = in_memory
    with pytest.raises(ClientError) as refused:
        ssm(server.endpoint, "AKIDSOMEONEELSE").put_parameter(Name="/planted", Value="x", Type="String")
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    names = [p["Name"] for p in ssm(server.endpoint, key).describe_parameters()["Parameters"]]
    assert "/planted" not in names
    # A presigned URL names its key in the query: the same rule.
    assert server.gate.refuse(host=[server.gate.authority], origin=[], authorization="", query="") is not None
    query = f"X-Amz-Credential={key}%2F20260101%2Fus-east-1%2Fs3%2Faws4_request"
    assert server.gate.refuse(host=[server.gate.authority], origin=[], authorization="", query=query) is None
