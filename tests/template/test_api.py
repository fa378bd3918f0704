"""The REST API as CloudFormation receives it: SigV4 on every route, throttling, an access log."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.support.cfn import refers_to, resources_of_type, sam_template, translate

HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options", "x-amazon-apigateway-any-method"}


def rest_api(translated: dict[str, Any]) -> dict[str, Any]:
    apis = resources_of_type(translated, "AWS::ApiGateway::RestApi")
    assert list(apis) == ["Api"], f"expected exactly one REST API, got {sorted(apis)}"
    return apis["Api"]


def stage(translated: dict[str, Any]) -> dict[str, Any]:
    stages = resources_of_type(translated, "AWS::ApiGateway::Stage")
    # One stage only: a second ("Stage", SAM's default) would be an unthrottled, unlogged copy.
    assert len(stages) == 1, f"expected one stage, got {sorted(stages)}"
    return next(iter(stages.values()))


def methods(body: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, verb, operation)
        for path, item in body["paths"].items()
        for verb, operation in item.items()
        if verb.lower() in HTTP_METHODS
    ]


def methods_without_sigv4(translated: dict[str, Any]) -> list[str]:
    """Every route whose caller is not authenticated by AWS_IAM (SigV4)."""
    body = rest_api(translated)["Properties"]["Body"]
    schemes = {
        **(body.get("securityDefinitions") or {}),
        **((body.get("components") or {}).get("securitySchemes") or {}),
    }
    sigv4 = {name for name, s in schemes.items() if s.get("x-amazon-apigateway-authtype") == "awsSigv4"}
    open_routes = []
    for path, verb, operation in methods(body):
        security = operation.get("security", body.get("security"))
        names = {name for requirement in security or [] for name in requirement}
        # Every alternative must be SigV4: an empty requirement ({}) would mean "no auth" is allowed.
        if not security or names - sigv4 or any(not requirement for requirement in security):
            open_routes.append(f"{verb.upper()} {path}")
    return open_routes


def api_events(template: dict[str, Any]) -> set[tuple[str, str]]:
    """(METHOD, path) of every Api event declared on any function of the SAM template."""
    found = set()
    for body in template["Resources"].values():
        if body["Type"] != "AWS::Serverless::Function":
            continue
        for event in (body["Properties"].get("Events") or {}).values():
            if event["Type"] == "Api":
                found.add((event["Properties"]["Method"].upper(), event["Properties"]["Path"]))
    return found


def test_every_route_requires_sigv4(translated: dict[str, Any]) -> None:
    assert methods_without_sigv4(translated) == []
    body = rest_api(translated)["Properties"]["Body"]
    routes = {(verb.upper(), path) for path, verb, _ in methods(body)}
    # Every declared event is a route (so none was dropped) and there is no route nobody declared.
    assert routes == api_events(sam_template())


def test_a_route_without_auth_would_be_caught() -> None:
    template = sam_template()
    events = template["Resources"]["ApiFunction"]["Properties"]["Events"]
    events["Sneaky"] = {
        "Type": "Api",
        "Properties": {
            "RestApiId": {"Ref": "Api"},
            "Path": "/v1/debug",
            "Method": "GET",
            "Auth": {"Authorizer": "NONE"},
        },
    }
    assert methods_without_sigv4(translate(template)) == ["GET /v1/debug"]


def test_callers_need_no_lambda_permission(translated: dict[str, Any]) -> None:
    """InvokeRole NONE: API Gateway invokes through a resource policy, not the caller's credentials."""
    body = rest_api(translated)["Properties"]["Body"]
    for path, verb, operation in methods(body):
        integration = operation["x-amazon-apigateway-integration"]
        assert "credentials" not in integration, f"{verb.upper()} {path} calls Lambda as the caller"


def test_lambda_permissions_are_scoped_to_this_api(translated: dict[str, Any]) -> None:
    permissions = resources_of_type(translated, "AWS::Lambda::Permission")
    from_apigw = {k: v for k, v in permissions.items() if v["Properties"]["Principal"] == "apigateway.amazonaws.com"}
    assert from_apigw, "no API Gateway permission found"
    for logical_id, permission in from_apigw.items():
        source = permission["Properties"].get("SourceArn")
        assert source is not None and "${__ApiId__}" in json.dumps(source), f"{logical_id}: {source!r}"


def test_every_route_is_throttled(translated: dict[str, Any]) -> None:
    settings = stage(translated)["Properties"]["MethodSettings"]
    catch_all = [s for s in settings if s.get("ResourcePath") == "/*" and s.get("HttpMethod") == "*"]
    assert len(catch_all) == 1, settings
    assert catch_all[0]["ThrottlingRateLimit"] == {"Ref": "ApiThrottleRateLimit"}
    assert catch_all[0]["ThrottlingBurstLimit"] == {"Ref": "ApiThrottleBurstLimit"}
    # A per-route setting must not lift a route out of throttling.
    for setting in settings:
        assert "ThrottlingRateLimit" in setting and "ThrottlingBurstLimit" in setting, setting
    params = sam_template()["Parameters"]
    rate, burst = params["ApiThrottleRateLimit"]["Default"], params["ApiThrottleBurstLimit"]["Default"]
    assert 0 < rate <= burst


def test_no_request_bodies_are_logged(translated: dict[str, Any]) -> None:
    """Specs may carry secrets in `envs`: execution logs and data traces stay off."""
    for setting in stage(translated)["Properties"]["MethodSettings"]:
        assert setting.get("DataTraceEnabled") is False
        assert setting.get("LoggingLevel") == "OFF"


def test_access_log_goes_to_a_log_group_with_retention(translated: dict[str, Any]) -> None:
    access = stage(translated)["Properties"]["AccessLogSetting"]
    groups = resources_of_type(translated, "AWS::Logs::LogGroup")
    targets = [lid for lid in groups if refers_to(access["DestinationArn"], lid)]
    assert len(targets) == 1, access["DestinationArn"]
    assert groups[targets[0]]["Properties"]["RetentionInDays"] == {"Ref": "LogRetentionDays"}
    # The format is one JSON object per request, naming the caller and the outcome.
    record = json.loads(re.sub(r"\$context\.[A-Za-z.]+", "x", access["Format"]))
    assert {"requestId", "userArn", "httpMethod", "resourcePath", "status"} <= set(record)


@pytest.mark.parametrize("kind", ["DEFAULT_4XX", "DEFAULT_5XX"])
def test_api_gateways_own_errors_have_the_error_shape(translated: dict[str, Any], kind: str) -> None:
    """A 403 for an unsigned call or a 429 from throttling parses like the function's errors."""
    responses = rest_api(translated)["Properties"]["Body"]["x-amazon-apigateway-gateway-responses"]
    template = responses[kind]["responseTemplates"]["application/json"]
    # messageString is substituted as a quoted JSON string; responseType as a bare word.
    rendered = template.replace("$context.error.messageString", json.dumps('Missing "Authentication" token'))
    rendered = rendered.replace("$context.error.responseType", "MISSING_AUTHENTICATION_TOKEN")
    assert json.loads(rendered) == {
        "error": {
            "code": "MISSING_AUTHENTICATION_TOKEN",
            "message": 'Missing "Authentication" token',
            "details": [],
        }
    }


def test_api_function_gives_up_before_api_gateway_does(translated: dict[str, Any]) -> None:
    """REST integrations time out at 29 s; a longer function would go on writing after the 504."""
    assert translated["Resources"]["ApiFunction"]["Properties"]["Timeout"] < 29
