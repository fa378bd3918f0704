"""boto3 clients, created lazily and cached per (service, region, endpoint).

Lazy, because a client made at import time costs cold-start time and escapes moto when tests start
it later; cached, because creating a client costs ~50 ms. `reset_clients()` is for tests that
start a fresh in-memory AWS.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_lambda import LambdaClient
    from mypy_boto3_ssm import SSMClient

_clients: dict[tuple[str, str | None, str | None], Any] = {}
_lock = threading.Lock()


def _client(service: str) -> Any:
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    endpoint = os.environ.get("FLEETKEEPER_AWS_ENDPOINT_URL") or None
    key = (service, region, endpoint)
    with _lock:
        client = _clients.get(key)
        if client is None:
            import boto3  # deferred: most cold paths need one client, not the whole import up front
            from botocore.config import Config

            config = Config(
                retries={"mode": "standard", "max_attempts": 5}, connect_timeout=3, read_timeout=10
            )
            client = boto3.session.Session().client(
                service,  # type: ignore[call-overload]
                region_name=region,
                endpoint_url=endpoint,
                config=config,
            )
            _clients[key] = client
        return client


def dynamodb() -> DynamoDBClient:
    client: DynamoDBClient = _client("dynamodb")
    return client


def ec2() -> EC2Client:
    client: EC2Client = _client("ec2")
    return client


def lambda_() -> LambdaClient:
    client: LambdaClient = _client("lambda")
    return client


def ssm() -> SSMClient:
    client: SSMClient = _client("ssm")
    return client


def reset_clients() -> None:
    with _lock:
        _clients.clear()
