"""The api Lambda called in-process: `HandlerClient` hands its handler API Gateway events, as API
Gateway would, and checks every answer against the OpenAPI document. (The CLI's `ApiClient`,
fleetkeeper.cli.http, is the other side: HTTP to a deployed or local api.)"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tests.support import openapi_conformance


@dataclass
class HttpResult:
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def error(self) -> dict[str, Any]:
        error: dict[str, Any] = self.body["error"]
        return error


class FakeContext:
    """A Lambda context: the api's by name; the other handlers' tests hand it to theirs too."""

    function_name = "fleetkeeper-api"
    function_version = "$LATEST"
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:fleetkeeper-api"
    memory_limit_in_mb = 512
    aws_request_id = "req-1"
    log_group_name = "/aws/lambda/fleetkeeper-api"
    log_stream_name = "local"

    @staticmethod
    def get_remaining_time_in_millis() -> int:
        return 30_000


# Who the suite's api calls are signed as, unless a test says otherwise: a session of one CI role,
# not an administrator (tests/api/test_owners.py tries other roles, users and administrators).
TEST_CALLER = "arn:aws:sts::123456789012:assumed-role/fleetkeeper-test/pytest"


class HandlerClient:
    """Calls the api Lambda handler with API Gateway events, as API Gateway would, signed as `principal`
    (its ARN in `requestContext.identity.userArn`; None: an event without an identity)."""

    def __init__(self, principal: str | None = TEST_CALLER) -> None:
        self.principal = principal

    def as_(self, principal: str | None) -> HandlerClient:
        """The same api, called as another principal."""
        return HandlerClient(principal)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: dict[str, str] | None = None,
        raw: str | bytes | None = None,
    ) -> HttpResult:
        from fleetkeeper.api.handler import lambda_handler
        from fleetkeeper.aws.apigw import response_parts, rest_event

        payload = raw if raw is not None else (json.dumps(body) if body is not None else None)
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        event = rest_event(method, path, headers=all_headers, body=payload, principal=self.principal)
        status, out_headers, data = response_parts(lambda_handler(event, FakeContext()))
        result = HttpResult(status, out_headers, json.loads(data) if data else None)
        # Every answer the suite receives conforms to the OpenAPI document (tests/support/openapi_conformance.py).
        openapi_conformance.check(method, path, status, out_headers, result.body)
        return result

    def all_versions(self, name: str) -> list[dict[str, Any]]:
        """Every version of a service, following GET .../versions' pages."""
        versions: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page = self.get(f"/v1/services/{name}/versions?limit=20" + (f"&next_token={token}" if token else ""))
            assert page.status == 200, page.body
            versions.extend(page.body["versions"])
            token = page.body["next_token"]
            if not token:
                return versions

    def get(self, path: str, **kw: Any) -> HttpResult:
        return self.call("GET", path, **kw)

    def post(self, path: str, body: Any = None, **kw: Any) -> HttpResult:
        return self.call("POST", path, body, **kw)

    def put(self, path: str, body: Any = None, **kw: Any) -> HttpResult:
        return self.call("PUT", path, body, **kw)

    def delete(self, path: str, **kw: Any) -> HttpResult:
        return self.call("DELETE", path, **kw)
