"""API Gateway REST proxy events: built from an HTTP request, and responses turned back into HTTP.

The embedded mode serves the api handler over real HTTP with these, and the tests use the same
builder, so what the handler sees locally is what API Gateway would hand it.
"""

from __future__ import annotations

import base64
import re
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

# Routes as API Gateway knows them (template.yaml); resource and pathParameters are derived from these.
ROUTES: tuple[tuple[str, str], ...] = (
    ("/v1/services/{name}/versions", r"^/v1/services/(?P<name>[^/]+)/versions$"),
    ("/v1/services/{name}/events", r"^/v1/services/(?P<name>[^/]+)/events$"),
    ("/v1/services/{name}/metrics", r"^/v1/services/(?P<name>[^/]+)/metrics$"),
    ("/v1/services/{name}/rollback", r"^/v1/services/(?P<name>[^/]+)/rollback$"),
    ("/v1/services/{name}/access", r"^/v1/services/(?P<name>[^/]+)/access$"),
    ("/v1/services/{name}/replicas/{replica_id}", r"^/v1/services/(?P<name>[^/]+)/replicas/(?P<replica_id>[^/]+)$"),
    ("/v1/services/{name}", r"^/v1/services/(?P<name>[^/]+)$"),
    ("/v1/services", r"^/v1/services$"),
    ("/v1/openapi.json", r"^/v1/openapi\.json$"),
    ("/v1/workdirs", r"^/v1/workdirs$"),
)
_COMPILED = [(resource, re.compile(pattern)) for resource, pattern in ROUTES]


def rest_event(
    method: str,
    target: str,
    *,
    headers: dict[str, str] | None = None,
    body: bytes | str | None = None,
    stage: str = "api",
    source_ip: str = "127.0.0.1",
    principal: str | None = None,
) -> dict[str, Any]:
    """The REST API (v1 payload) proxy event API Gateway would send for this request.

    `principal`: the signer's ARN as API Gateway's AWS_IAM auth reports it in
    `requestContext.identity.userArn` (an assumed-role session's ARN, a user's), or the embedded
    mode's `local:<os-user>`; None: an identity without one (fleetkeeper refuses it).
    """
    split = urlsplit(target)
    path = split.path or "/"
    query = parse_qs(split.query, keep_blank_values=True)
    resource, path_parameters = "/{proxy+}", None
    for candidate, pattern in _COMPILED:
        match = pattern.fullmatch(path)
        if match:
            # API Gateway hands path parameters over percent-decoded.
            resource, path_parameters = candidate, {k: unquote(v) for k, v in match.groupdict().items()} or None
            break
    header_map = dict(headers or {})
    encoded = False
    text: str | None
    if body is None or body == b"" or body == "":
        text = None
    elif isinstance(body, bytes):
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError:
            text, encoded = base64.b64encode(body).decode(), True
    else:
        text = body
    now = time.time()
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method.upper(),
        "headers": header_map or None,
        "multiValueHeaders": {k: [v] for k, v in header_map.items()} or None,
        "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
        "multiValueQueryStringParameters": query or None,
        "pathParameters": path_parameters,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": resource,
            "httpMethod": method.upper(),
            "path": f"/{stage}{path}",
            "stage": stage,
            "requestId": str(uuid.uuid4()),
            "requestTimeEpoch": int(now * 1000),
            "identity": _identity(principal, source_ip, header_map.get("User-Agent", "")),
            "accountId": "123456789012",
            "apiId": "local",
            "protocol": "HTTP/1.1",
        },
        "body": text,
        "isBase64Encoded": encoded,
    }


def _identity(principal: str | None, source_ip: str, user_agent: str) -> dict[str, Any]:
    """`requestContext.identity` as API Gateway fills it for a SigV4-signed request: userArn, and
    `caller`/`user` (the principal id, ROLE-ID:SESSION for a session), accountId."""
    identity: dict[str, Any] = {"sourceIp": source_ip, "userAgent": user_agent}
    if principal:
        parts = principal.split(":")
        account = parts[4] if principal.startswith("arn:") and len(parts) > 5 else None
        session = principal.rsplit("/", 1)[-1]
        principal_id = f"AROAFLEETKEEPEREXAMPLE:{session}" if ":assumed-role/" in principal else principal
        identity.update({"userArn": principal, "caller": principal_id, "user": principal_id, "accountId": account})
    return identity


def response_parts(response: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body bytes of a Lambda proxy response."""
    headers: dict[str, str] = {str(k): str(v) for k, v in (response.get("headers") or {}).items()}
    for key, values in (response.get("multiValueHeaders") or {}).items():
        headers[str(key)] = ", ".join(str(v) for v in values)
    raw = response.get("body") or ""
    body = base64.b64decode(raw) if response.get("isBase64Encoded") else str(raw).encode()
    return int(response["statusCode"]), headers, body
