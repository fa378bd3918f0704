"""Prints the DynamoDB calls each api operation makes.

    python bench/api_calls.py

Calls are counted on the handler's own boto3 client (botocore `before-call` events) against an
in-process moto. The cold-start import ratios of every handler are bench/cold_start.py's.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "TABLE_NAME": "fleetkeeper-bench",
        "POWERTOOLS_LOG_LEVEL": "ERROR",
    }
)
for var in ("FLEETKEEPER_AWS_ENDPOINT_URL", "FLEETKEEPER_KICK_QUEUE_URL", "FLEETKEEPER_KICK_URL"):
    os.environ.pop(var, None)

READS = {"Query", "GetItem", "Scan", "BatchGetItem"}


def count_calls() -> None:
    from moto import mock_aws

    from fleetkeeper import aws
    from fleetkeeper.api.handler import lambda_handler
    from fleetkeeper.aws.apigw import rest_event
    from fleetkeeper.local.template import create_table
    from tests.support.handler_client import FakeContext
    from tests.support.specs import hello_spec

    with mock_aws():
        aws.reset_clients()
        create_table(aws.dynamodb(), "fleetkeeper-bench")
        calls: Counter[str] = Counter()
        aws.dynamodb().meta.events.register("before-call.dynamodb.*", lambda model, **_: calls.update([model.name]))

        def run(label: str, method: str, path: str, body: object = None, headers: dict[str, str] | None = None) -> None:
            calls.clear()
            event = rest_event(
                method,
                path,
                headers=headers,
                body=json.dumps(body) if body is not None else None,
                principal="arn:aws:sts::123456789012:assumed-role/fleetkeeper-bench/bench",
            )
            status = lambda_handler(event, FakeContext())["statusCode"]
            reads = sum(n for op, n in calls.items() if op in READS)
            writes = sum(n for op, n in calls.items() if op not in READS)
            detail = ", ".join(f"{op} {n}" for op, n in sorted(calls.items()))
            print(f"| {label} | {status} | {reads} | {writes} | {sum(calls.values())} | {detail} |")

        print("| operation | status | reads | writes | total calls | calls |")
        print("|---|---|---|---|---|---|")
        run("create", "POST", "/v1/services", {"name": "web", "spec": hello_spec()})
        run("get", "GET", "/v1/services/web")
        run("update", "PUT", "/v1/services/web", {"spec": hello_spec(envs={"V": "2"})})
        run("update with If-Match", "PUT", "/v1/services/web", {"spec": hello_spec()}, {"If-Match": "2"})
        run("versions", "GET", "/v1/services/web/versions")
        run("rollback", "POST", "/v1/services/web/rollback")
        run("list", "GET", "/v1/services?limit=50")
        run(
            "create with Idempotency-Key",
            "POST",
            "/v1/services",
            {"name": "api", "spec": hello_spec()},
            {"Idempotency-Key": "k1"},
        )
        run(
            "replay of that create",
            "POST",
            "/v1/services",
            {"name": "api", "spec": hello_spec()},
            {"Idempotency-Key": "k1"},
        )
        run("delete", "DELETE", "/v1/services/web")


if __name__ == "__main__":
    count_calls()
