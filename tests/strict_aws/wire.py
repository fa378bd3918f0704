"""What the layer sees of a request and how it answers: AWS's wire formats, nothing more.

A request reaches the layer as botocore prepared it (`AWSPreparedRequest`, already serialised for
the service's protocol); an answer leaves it as an HTTP status, headers and body, exactly what the
service would send. botocore then parses it, decides on retries and raises the modelled exception,
as it would for AWS.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit
from xml.sax.saxutils import escape

from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.utils import percent_encode_sequence

if TYPE_CHECKING:
    from collections.abc import Callable

# (HTTP status, headers, body): what moto's request handlers return, and what the layer returns.
Response = tuple[int, dict[str, str], bytes]

DYNAMODB_TYPE_PREFIX = "com.amazonaws.dynamodb.v20120810"
_JSON_TYPE_PREFIXES = {
    "ValidationException": "com.amazon.coral.validate",
    "ThrottlingException": "com.amazon.coral.availability",
}


@dataclass
class Call:
    """One attempt of one AWS operation, as it would leave for the wire."""

    service: str  # botocore's hyphenised service id: "dynamodb", "ec2", "ssm", "dynamodb-streams"
    operation: str  # "Query", "RunInstances", ...
    request: AWSPreparedRequest
    forward: Callable[[AWSPreparedRequest], Response | None]  # hand it to moto
    _json: dict[str, Any] | None = field(default=None, repr=False)
    _form: list[tuple[str, str]] | None = field(default=None, repr=False)

    @property
    def region(self) -> str:
        # https://<service>.<region>.amazonaws.com/
        parts = (urlsplit(self.request.url).hostname or "").split(".")
        return parts[1] if len(parts) == 4 else "us-east-1"

    def body_bytes(self) -> bytes:
        body: Any = self.request.body
        if body is None:
            return b""
        if isinstance(body, str):
            return body.encode()
        if isinstance(body, bytes | bytearray):
            return bytes(body)
        data = body.read()
        body.seek(0)
        return as_bytes(data)

    def json(self) -> dict[str, Any]:
        """The body of a JSON-protocol request (DynamoDB, SSM)."""
        if self._json is None:
            raw = self.body_bytes()
            self._json = json.loads(raw) if raw else {}
        return self._json

    def form(self) -> list[tuple[str, str]]:
        """The parameters of an EC2 query-protocol request, in order."""
        if self._form is None:
            self._form = parse_qsl(self.body_bytes().decode(), keep_blank_values=True)
        return self._form

    def param(self, name: str) -> str | None:
        return next((value for key, value in self.form() if key == name), None)

    def send(self, request: AWSPreparedRequest | None = None) -> Response:
        """Hand the request (or a rewritten one) to moto; its answer."""
        response = self.forward(request or self.request)
        if response is None:
            raise RuntimeError(f"moto did not answer {self.service}:{self.operation} ({self.request.url})")
        return response

    def with_form(self, params: list[tuple[str, str]]) -> AWSPreparedRequest:
        """A copy of this EC2 request with other parameters (what EC2 itself would act on)."""
        body = percent_encode_sequence(params).encode()  # type: ignore[arg-type] # pairs keep their order
        headers = {k: v for k, v in self.request.headers.items() if k.lower() != "content-length"}
        headers["Content-Length"] = str(len(body))
        return AWSPreparedRequest(
            method=self.request.method,
            url=self.request.url,
            headers=headers,  # type: ignore[arg-type] # any mapping does
            body=body,
            stream_output=self.request.stream_output,
        )


def as_bytes(body: str | bytes | None) -> bytes:
    if body is None:
        return b""
    return body.encode() if isinstance(body, str) else bytes(body)


def normalise(response: tuple[int, Any, Any]) -> Response:
    status, headers, body = response
    return int(status), {str(k): str(v) for k, v in dict(headers).items()}, as_bytes(body)


def aws_response(url: str, response: Response) -> AWSResponse:
    from moto.core.botocore_stubber import MockRawResponse

    status, headers, body = response
    return AWSResponse(url, status, headers, MockRawResponse(body))  # type: ignore[arg-type]


def request_id() -> str:
    return str(uuid.uuid4())


def json_error(code: str, message: str, *, status: int = 400, prefix: str | None = None, **extra: Any) -> Response:
    """An error of a JSON-protocol service (awsJson1_0/1_1): `__type` names the error, `message` says it."""
    type_prefix = prefix or _JSON_TYPE_PREFIXES.get(code, DYNAMODB_TYPE_PREFIX)
    payload = {"__type": f"{type_prefix}#{code}", "message": message, **extra}
    headers = {"Content-Type": "application/x-amz-json-1.0", "x-amzn-RequestId": request_id()}
    return status, headers, json.dumps(payload).encode()


def ec2_error(code: str, message: str, *, status: int = 400) -> Response:
    """An error of the EC2 query protocol."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
        f"</Errors><RequestID>{request_id()}</RequestID></Response>"
    )
    return status, {"Content-Type": "text/xml;charset=UTF-8"}, body.encode()


def error_for(service: str, code: str, message: str, *, status: int = 400) -> Response:
    if service == "ec2":
        return ec2_error(code, message, status=status)
    return json_error(code, message, status=status)
