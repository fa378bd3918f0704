"""`fleetkeeper doctor`'s second owner as on AWS: the role is assumed with STS (moto), the API is
called with that role's credentials, and the owner the api handler records from the caller's
identity is checked against the role.

API Gateway reports the SigV4 signer's session ARN as the caller; here a bridge stands for it (the
api handler behind it is the real one, on a moto table), reporting the session the test names. And
the client the doctor makes on AWS is shown to sign with the assumed credentials: its signature
verifies with them, by SigV4's own algorithm (botocore's)."""

from __future__ import annotations

import contextlib
import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from fleetkeeper.api.handler import lambda_handler
from fleetkeeper.cli.doctor import Account, Doctor, Owner, doctor_spec
from fleetkeeper.cli.doctor_options import Options
from fleetkeeper.cli.http import ApiClient, local_token
from fleetkeeper.cli.steps import StepFailed
from tests.support.local_process import serving_bridge

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from botocore.credentials import Credentials

ACCOUNT = "123456789012"  # moto's
YOU = f"arn:aws:sts::{ACCOUNT}:assumed-role/team-a-ci/run-1"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/ci/team-b-ci"  # with a path: the owner is recorded without it
SESSION = f"arn:aws:sts::{ACCOUNT}:assumed-role/team-b-ci/fk-doctor-abc123"


@pytest.fixture
def bridges(table: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Bridges on one table, each reporting its caller as API Gateway would: principal -> URL."""
    with contextlib.ExitStack() as stack:
        urls = {}
        for n, principal in enumerate((YOU, SESSION, f"arn:aws:sts::{ACCOUNT}:assumed-role/someone/else")):
            server = stack.enter_context(
                serving_bridge(
                    lambda_handler,
                    tmp_path / f"state-{n}",
                    on_kick=lambda _n: None,
                    logs_dir=tmp_path / "logs",
                    principal=principal,
                )
            )
            urls[principal] = server.url
        yield urls


def client(url: str) -> ApiClient:
    return ApiClient(url, token=local_token(url))


def doctor(you: str, second: str, received: list[Credentials]) -> Doctor:
    def client_as(credentials: Credentials) -> ApiClient:
        received.append(credentials)
        return client(second)

    return Doctor(
        client(you),
        Account(lambda service: boto3.client(service, region_name="us-east-1"), None, None, embedded=False),
        Options(second_owner_role=ROLE),
        out=io.StringIO(),
        err=io.StringIO(),
        suffix="abc123",
        client_as=client_as,
    )


def test_the_second_service_belongs_to_the_assumed_role_and_yours_does_not_exist_for_it(
    bridges: dict[str, str],
) -> None:
    received: list[Credentials] = []
    subject = doctor(bridges[YOU], bridges[SESSION], received)
    subject._create(subject.you, subject.name, doctor_spec("v1"))

    second, expected, session = subject._assume(ROLE)
    assert (expected, session) == (f"arn:aws:iam::{ACCOUNT}:role/team-b-ci", SESSION)
    # The client acts with what STS handed out: temporary credentials, with their session token.
    assert received[0].access_key.startswith("ASIA") and received[0].token
    subject.second = Owner(f"role {ROLE}", second)
    subject._create(subject.second, subject.second_name, doctor_spec("b", autoscaled=False))

    said = subject._ownership(expected, session)
    assert said == f"owned by arn:aws:iam::{ACCOUNT}:role/team-b-ci; fk-doctor-abc123 does not exist for it (404)"


def test_a_service_the_api_gives_another_owner_fails_the_step(bridges: dict[str, str]) -> None:
    other = f"arn:aws:sts::{ACCOUNT}:assumed-role/someone/else"
    subject = doctor(bridges[YOU], bridges[other], [])
    second, expected, session = subject._assume(ROLE)
    subject.second = Owner(f"role {ROLE}", second)
    subject._create(subject.second, subject.second_name, doctor_spec("b", autoscaled=False))

    with pytest.raises(StepFailed) as failed:
        subject._ownership(expected, session)
    assert str(failed.value) == (
        f"expected fk-doctor-abc123-b's owner to be arn:aws:iam::{ACCOUNT}:role/team-b-ci (the role of {SESSION}); "
        f"the API says arn:aws:iam::{ACCOUNT}:role/someone"
    )


def test_your_own_role_is_no_second_owner(bridges: dict[str, str]) -> None:
    subject = doctor(bridges[SESSION], bridges[SESSION], [])
    subject._create(subject.you, subject.name, doctor_spec("v1"))
    second, expected, session = subject._assume(ROLE)
    subject.second = Owner(f"role {ROLE}", second)
    subject._create(subject.second, subject.second_name, doctor_spec("b", autoscaled=False))

    with pytest.raises(StepFailed, match="the second role is the owner of fk-doctor-abc123 too"):
        subject._ownership(expected, session)


class _Capture(BaseHTTPRequestHandler):
    seen: list[tuple[str, str, dict[str, str]]] = []

    def do_GET(self) -> None:
        self.seen.append((self.command, self.path, dict(self.headers.items())))
        body = json.dumps({"services": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_on_aws_the_second_owners_requests_are_signed_with_the_assumed_credentials(aws: None) -> None:
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}/api"
    try:
        subject = Doctor(
            ApiClient(base),
            Account(lambda service: boto3.client(service, region_name="us-east-1"), None, None, embedded=False),
            Options(second_owner_role=ROLE),
            out=io.StringIO(),
            err=io.StringIO(),
            suffix="abc123",
        )
        second, _, _ = subject._assume(ROLE)
        second.request("GET", "/v1/services?limit=100")
    finally:
        server.shutdown()
        server.server_close()

    method, path, headers = _Capture.seen[-1]
    assert second.signer is not None
    credentials = second.signer.credentials
    authorization = headers["Authorization"]
    assert authorization.startswith(f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/")
    assert "/us-east-1/execute-api/aws4_request" in authorization
    assert headers["X-Amz-Security-Token"] == credentials.token
    # The signature is SigV4's over what was sent, with the assumed secret key.
    signed = authorization.split("SignedHeaders=")[1].split(",")[0].split(";")
    lowered = {k.lower(): v for k, v in headers.items()}
    request = AWSRequest(method=method, url=f"http://{lowered['host']}{path}", headers={h: lowered[h] for h in signed})
    request.context["timestamp"] = lowered["x-amz-date"]
    signer = SigV4Auth(credentials, "execute-api", "us-east-1")
    expected = signer.signature(signer.string_to_sign(request, signer.canonical_request(request)), request)
    assert authorization.endswith(f"Signature={expected}")
