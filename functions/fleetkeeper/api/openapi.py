"""The OpenAPI 3.1 document of a Router's routes: the same declarations the router validates with
(parameters from the functions' annotations, bodies and answers from pydantic's JSON schemas of
their models), so the document cannot drift from what the api checks.

Only GET /v1/openapi.json and `make openapi` use it: no cold start imports it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from pydantic.json_schema import models_json_schema

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pydantic import BaseModel

    from fleetkeeper.api.routing import Parameter, Route, Router

REF = "#/components/schemas/{model}"
Mode = Literal["validation", "serialization"]


def document(
    router: Router,
    *,
    title: str,
    version: str,
    description: str,
    security_schemes: dict[str, Any],
    security: list[dict[str, list[str]]],
) -> dict[str, Any]:
    routes = [route for route in router.routes if route.include_in_schema]
    models = _models(routes)
    refs, definitions = models_json_schema(list(models), ref_template=REF)
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        operation: dict[str, Any] = {
            "summary": f"{route.method} {route.path}",
            "operationId": operation_id(route),
        }
        parameters = [_parameter(p) for p in route.signature.parameters]
        if parameters:
            operation["parameters"] = parameters
        if route.signature.body is not None:
            schema = refs[route.signature.body[1], "validation"]
            operation["requestBody"] = {"content": {"application/json": {"schema": schema}}, "required": True}
        operation["responses"] = {str(status): _response(answer, refs) for status, answer in route.responses.items()}
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    generated: dict[str, Any] = _without_nulls(
        {
            "openapi": "3.1.0",
            "info": {"title": title, "description": description, "version": version},
            "servers": [{"url": "/"}],
            "paths": paths,
            "components": {"schemas": definitions.get("$defs", {}), "securitySchemes": security_schemes},
            "security": security,
        }
    )
    return generated


def _without_nulls(value: Any) -> Any:
    """The document without members whose value is null (a field's `"default": null`): a document
    says nothing rather than null, as Powertools' generator left them out (exclude_none)."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def operation_id(route: Route) -> str:
    """FUNCTION_PATH_METHOD with every non-word character made `_` (as FastAPI and Powertools name them)."""
    return re.sub(r"\W", "_", f"{route.function.__name__}{route.path}") + f"_{route.method.lower()}"


def _models(routes: list[Route]) -> dict[tuple[type[BaseModel], Mode], None]:
    """Every model a route takes as its body (validation) or answers (serialization), in order."""
    found: dict[tuple[type[BaseModel], Mode], None] = {}
    for route in routes:
        if route.signature.body is not None:
            found[route.signature.body[1], "validation"] = None
        for answer in route.responses.values():
            for content in answer.get("content", {}).values():
                if "model" in content:
                    found[content["model"], "serialization"] = None
    return found


def _parameter(parameter: Parameter) -> dict[str, Any]:
    schema: dict[str, Any] = parameter.adapter.json_schema(ref_template=REF)
    field = parameter.annotation.__metadata__[0]
    schema["title"] = parameter.title.replace("_", " ").title()
    if not parameter.required and parameter.default is not None:
        schema["default"] = parameter.default
    described: dict[str, Any] = {"description": field.description} if field.description else {}
    return {
        **described,
        "required": parameter.required,
        "schema": schema,
        "name": parameter.key,
        "in": parameter.location,
    }


def _response(answer: dict[str, Any], refs: Mapping[Any, dict[str, Any]]) -> dict[str, Any]:
    """A declared answer, its content's `model` replaced by a reference to the model's schema."""
    out = {key: value for key, value in answer.items() if key != "content"}
    if "content" in answer:
        out["content"] = {
            media: {"schema": refs[content["model"], "serialization"]} if "model" in content else content
            for media, content in answer["content"].items()
        }
    return out
