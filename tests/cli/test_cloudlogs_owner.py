"""`fleetkeeper logs` of a service with an owner: its streams are under the owner's scope
(`_o/<scope>/<service>/<uid>/<replica id>`, fleetkeeper.replicas.identity), where only the owner's replicas may
write; a stream another owner's replica made under the same service name is never shown."""

from __future__ import annotations

import io
import time
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from fleetkeeper.cli import cloudlogs
from fleetkeeper.reconciler.userdata import log_stream
from fleetkeeper.replicas.identity import owner_scope

if TYPE_CHECKING:
    from collections.abc import Iterator

GROUP = "/fleetkeeper/test/replicas"
OWNER = "arn:aws:iam::123456789012:role/team-a-ci"
OTHER = "arn:aws:iam::123456789012:role/team-b-ci"


@pytest.fixture
def logs(aws: None) -> Iterator[Any]:
    client = boto3.client("logs", region_name="us-east-1")
    client.create_log_group(logGroupName=GROUP)
    yield client


def _put(client: Any, stream: str, line: str, at_ms: int) -> None:
    client.create_log_stream(logGroupName=GROUP, logStreamName=stream)
    client.put_log_events(logGroupName=GROUP, logStreamName=stream, logEvents=[{"timestamp": at_ms, "message": line}])


def test_an_owned_services_streams_are_read_under_its_owners_scope(logs: Any) -> None:
    now_ms = int(time.time() * 1000)
    # As the replicas' shippers name them (the reconciler puts log_stream(...) in their user data).
    _put(logs, log_stream("web", "u1", 0, OWNER), "mine, replica 0", now_ms - 2_000)
    _put(logs, log_stream("web", "u1", 1, OWNER), "mine, replica 1", now_ms - 1_000)
    # Another owner's replica can write only under its own scope: never shown for this service.
    _put(logs, log_stream("web", "u1", 2, OTHER), "forged by another owner", now_ms - 500)
    _put(logs, "web/u1/3", "a legacy stream", now_ms - 400)
    assert log_stream("web", "u1", 0, OWNER) == f"_o/{owner_scope(OWNER)}/web/u1/0"

    out = io.StringIO()
    cloudlogs.print_logs(logs, GROUP, "web", "u1", replica=None, since_seconds=None, follow=False, out=out, owner=OWNER)
    assert out.getvalue().splitlines() == ["[replica 0] mine, replica 0", "[replica 1] mine, replica 1"]

    out = io.StringIO()
    cloudlogs.print_logs(logs, GROUP, "web", "u1", replica=1, since_seconds=None, follow=False, out=out, owner=OWNER)
    assert out.getvalue() == "mine, replica 1\n"

    # A service without an owner reads the legacy names, as before.
    out = io.StringIO()
    cloudlogs.print_logs(logs, GROUP, "web", "u1", replica=None, since_seconds=None, follow=False, out=out)
    assert out.getvalue().splitlines() == ["[replica 3] a legacy stream"]
