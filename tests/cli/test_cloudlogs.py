"""`fleetkeeper logs` on AWS: the replicas' streams in the stack's CloudWatch Logs group (moto's logs).

The streams are written as the replica's shipper writes them (`<service>/<uid>/<replica id>`,
reconciler/replica_logs.py); the CLI reads them with the caller's credentials.
"""

from __future__ import annotations

import contextlib
import io
import time
from typing import TYPE_CHECKING, Any

import boto3
import pytest

from fleetkeeper.cli import cloudlogs
from fleetkeeper.cli.http import UsageError
from fleetkeeper.cli.main import run
from tests.cli.test_cli import ScriptedClient, view

if TYPE_CHECKING:
    from collections.abc import Iterator

GROUP = "/fleetkeeper/test/replicas"
API_GW = "https://abc123.execute-api.eu-west-1.amazonaws.com/api"


@pytest.fixture
def logs(aws: None) -> Iterator[Any]:
    client = boto3.client("logs", region_name="us-east-1")
    client.create_log_group(logGroupName=GROUP)
    yield client


def _put(client: Any, stream: str, lines: list[str], at_ms: int) -> None:
    with contextlib.suppress(client.exceptions.ResourceAlreadyExistsException):
        client.create_log_stream(logGroupName=GROUP, logStreamName=stream)
    events = [{"timestamp": at_ms + n, "message": line} for n, line in enumerate(lines)]
    client.put_log_events(logGroupName=GROUP, logStreamName=stream, logEvents=events)


def test_every_replica_of_the_incarnation_then_one_then_since(logs: Any) -> None:
    now_ms = int(time.time() * 1000)
    _put(logs, "web/u1/0", ["setup: ok", "serving on 8080"], now_ms - 3_600_000)  # an hour ago
    _put(logs, "web/u1/1", ["serving on 8080 too"], now_ms - 60_000)
    _put(logs, "web/u1/10", ["replica ten"], now_ms - 30_000)
    _put(logs, "web/old-uid/0", ["an earlier incarnation"], now_ms - 30_000)

    out = io.StringIO()
    printed = cloudlogs.print_logs(logs, GROUP, "web", "u1", replica=None, since_seconds=None, follow=False, out=out)
    assert printed == 4
    assert out.getvalue().splitlines() == [
        "[replica 0] setup: ok",
        "[replica 0] serving on 8080",
        "[replica 1] serving on 8080 too",
        "[replica 10] replica ten",
    ]

    out = io.StringIO()  # replica 1 is not replica 10: its stream by exact name
    cloudlogs.print_logs(logs, GROUP, "web", "u1", replica=1, since_seconds=None, follow=False, out=out)
    assert out.getvalue() == "serving on 8080 too\n"

    out = io.StringIO()
    cloudlogs.print_logs(logs, GROUP, "web", "u1", replica=None, since_seconds=600, follow=False, out=out)
    assert "setup: ok" not in out.getvalue() and "[replica 1] serving on 8080 too" in out.getvalue()


def test_follow_prints_new_lines_once_until_the_service_is_gone(logs: Any) -> None:
    now_ms = int(time.time() * 1000)
    _put(logs, "web/u1/0", ["first"], now_ms - 1_000)
    polls: list[int] = []

    def sleep(_seconds: float) -> None:
        polls.append(1)
        if len(polls) == 1:
            _put(logs, "web/u1/0", ["second"], now_ms + 5_000)

    out = io.StringIO()
    printed = cloudlogs.print_logs(
        logs,
        GROUP,
        "web",
        "u1",
        replica=0,
        since_seconds=None,
        follow=True,
        out=out,
        sleep=sleep,
        still_there=lambda: len(polls) < 3,
    )
    assert out.getvalue() == "first\nsecond\n" and printed == 2


def test_a_missing_group_is_a_usage_error(logs: Any) -> None:
    with pytest.raises(UsageError, match="does not exist"):
        cloudlogs.print_logs(
            logs, "/nope", "web", "u1", replica=None, since_seconds=None, follow=False, out=io.StringIO()
        )


def test_the_cli_reads_the_stacks_group_with_the_callers_credentials(
    logs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    _put(logs, "web/u1/0", ["hello from replica 0"], int(time.time() * 1000))
    cloudformation = boto3.client("cloudformation", region_name="us-east-1")
    template = '{"Resources": {"Q": {"Type": "AWS::SQS::Queue"}}, "Outputs": {"ReplicaLogGroup": {"Value": "%s"}}}'
    cloudformation.create_stack(StackName="fk", TemplateBody=template % GROUP)
    monkeypatch.delenv("FLEETKEEPER_LOG_GROUP", raising=False)
    monkeypatch.setattr(cloudlogs, "logs_client", lambda: logs)
    monkeypatch.setattr(cloudlogs, "_client", lambda service: boto3.client(service, region_name="us-east-1"))
    client = ScriptedClient({("GET", "/v1/services/web"): [view(uid="u1")]}, embedded=False)
    out, err = io.StringIO(), io.StringIO()
    code = run(
        ["logs", "web", "--api-url", API_GW, "--stack", "fk", "--since", "10m"],
        out=out,
        err=err,
        client_factory=lambda _url: client,
    )
    assert code == 0, err.getvalue()
    assert out.getvalue() == "[replica 0] hello from replica 0\n"
    assert cloudlogs.since_seconds("2h") == 7200


def test_printed_lines_carry_no_control_characters(logs: Any) -> None:
    """A line a service wrote with terminal escapes (clear the screen, set the title, write the
    clipboard, move the cursor) and other controls is printed as its text only."""
    now_ms = int(time.time() * 1000)
    hostile = [
        "\x1b[2J\x1b[Hall good\x1b[0m",
        "\x1b]0;owned\x07title\x1b]52;c;ZWNobyBoaQ==\x1b\\ clip",
        "tab\tkept\rover\x08\x00\x7f \x9b31mc1 \x85nel",
        "two\nlines",
    ]
    _put(logs, "web/u1/0", hostile, now_ms - 1000)
    out = io.StringIO()
    printed = cloudlogs.print_logs(logs, GROUP, "web", "u1", replica=None, since_seconds=None, follow=False, out=out)
    assert printed == 4
    assert out.getvalue().splitlines() == [
        "[replica 0] all good",
        "[replica 0] title clip",
        "[replica 0] tab\tkeptover c1 nel",
        "[replica 0] two lines",
    ]
