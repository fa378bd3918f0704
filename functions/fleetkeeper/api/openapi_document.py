"""The api's own OpenAPI 3 document (also checked in as docs/openapi.json, `make openapi`).

fleetkeeper.api.openapi generates a Router's document from its declarations; here it is given the
api's title and security, and made true to what the api answers beyond its routes. Only GET
/v1/openapi.json and `make openapi` use it: no cold start imports it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fleetkeeper.api.models import RollbackRequest
from fleetkeeper.api.openapi import document
from fleetkeeper.api.responses import BODY_ERRORS

if TYPE_CHECKING:
    from fleetkeeper.api.routing import Router


def openapi_json(router: Router) -> str:
    """The OpenAPI 3 document of the api's `router`, as JSON text."""
    sigv4 = {
        "type": "apiKey",
        "description": "AWS Signature Version 4 for execute-api (API Gateway AWS_IAM auth)",
        "in": "header",
        "name": "Authorization",
    }
    generated = document(
        router,
        title="fleetkeeper",
        version="1",
        description="Create, update, roll back and delete services; every route needs AWS_IAM (SigV4).",
        security_schemes={"sigv4": sigv4},
        security=[{"sigv4": []}],
    )
    return json.dumps(_as_answered(generated), indent=2)


def _as_answered(document: dict[str, Any]) -> dict[str, Any]:
    """The generated document made true to what the api answers.

    Every request with a body is measured and typed before any route (413, 415). Rollback's body is
    optional, so it is read by the route rather than declared: it is added here. The document itself
    is served by GET /v1/openapi.json.
    """
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    document["paths"]["/v1/openapi.json"] = {
        "get": {
            "summary": "GET /v1/openapi.json",
            "operationId": "openapi_document",
            "responses": {
                "200": {
                    "description": "this document (OpenAPI 3)",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
            },
        }
    }
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for methods in document["paths"].values():
        for operation in methods.values():
            responses = operation.setdefault("responses", {})
            for status, answered in BODY_ERRORS.items():
                responses.setdefault(str(status), {"description": answered["description"], "content": error})
    rollback = document["paths"]["/v1/services/{name}/rollback"]["post"]
    rollback["requestBody"] = {
        "required": False,
        "description": "optional: without a body (or without `version`) the previous usable version",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/RollbackRequest"}}},
    }
    schemas["RollbackRequest"] = RollbackRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    return document
