"""The scheduled run's fan-out as CloudFormation receives it: the dispatcher, the two queues, the
workers' event sources and their concurrency caps, and the dispatcher's least privilege."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.kick import MAX_DELAY_SECONDS
from fleetkeeper.reconciler import followup
from fleetkeeper.settings import MAX_SHARD_SIZE, SettingsError, period_of
from tests.support.cfn import (
    Resolver,
    as_list,
    condition_keys,
    function_role,
    refers_to,
    resources_of_type,
    role_statements,
    statements_granting,
)


def event_sources(translated: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The reconciler's event source mappings, by the queue they read."""
    found: dict[str, dict[str, Any]] = {}
    for body in resources_of_type(translated, "AWS::Lambda::EventSourceMapping").values():
        props = body["Properties"]
        if refers_to(props["FunctionName"], "ReconcilerFunction"):
            queue = props["EventSourceArn"]["Fn::GetAtt"][0]
            found[queue] = props
    return found


def test_each_queue_feeds_the_worker_one_message_at_a_time_under_a_concurrency_cap(
    translated: dict[str, Any],
) -> None:
    sources = event_sources(translated)
    assert set(sources) == {"ReconcileQueue", "KickQueue"}
    resolve = Resolver(translated).resolve
    caps = {}
    for queue, props in sources.items():
        assert props["BatchSize"] == 1
        caps[queue] = resolve(props["ScalingConfig"]["MaximumConcurrency"])
    # What the template promises: whatever the traffic, at most 12 worker executions at once.
    assert caps == {"ReconcileQueue": 10, "KickQueue": 2}
    # No function reserves concurrency but the wake target (a bound on an anonymous flood, docs/SECURITY.md):
    # Lambda keeps 100 executions unreserved, so in a new account (a concurrency quota of 10) any
    # reservation fails the deployment (https://docs.aws.amazon.com/lambda/latest/dg/configuration-concurrency.html),
    # and WakeConcurrency=0 reserves none. Nothing provisions concurrency.
    for logical_id, body in resources_of_type(translated, "AWS::Lambda::Function").items():
        props = body["Properties"]
        if logical_id == "WakeFunction":
            assert props["ReservedConcurrentExecutions"]["Fn::If"][0] == "HasWakeReservation"
        else:
            assert "ReservedConcurrentExecutions" not in props, logical_id
        assert "ProvisionedConcurrencyConfig" not in props, logical_id
    assert translated["Parameters"]["WakeConcurrency"]["MinValue"] == 0
    # The workers' caps can go as low as SQS event sources allow (2 each: 4 executions in all), which
    # is what docs/DEPLOY.md advises for an account whose quota is 10.
    for name in ("ReconcilerShardConcurrency", "ReconcilerKickConcurrency"):
        assert translated["Parameters"][name]["MinValue"] == 2


def test_the_queues_are_encrypted_short_lived_and_outlast_the_worker(translated: dict[str, Any]) -> None:
    timeout = translated["Resources"]["ReconcilerFunction"]["Properties"]["Timeout"]
    for queue in ("ReconcileQueue", "KickQueue"):
        props = translated["Resources"][queue]["Properties"]
        assert props["SqsManagedSseEnabled"] is True
        # AWS: an event source's queue keeps messages invisible at least the function's timeout
        # (6 times it is their advice); stale work expires within minutes.
        assert props["VisibilityTimeout"] >= 6 * timeout
    # A shard is stale after its period: it expires within minutes.
    assert translated["Resources"]["ReconcileQueue"]["Properties"]["MessageRetentionPeriod"] <= 900
    kicks = translated["Resources"]["KickQueue"]["Properties"]
    # SQS expires a message by its enqueue time, its delay included: a kick delayed the longest SQS
    # allows must still be there for its delivery and one redelivery after a failed invocation.
    assert kicks["MessageRetentionPeriod"] >= MAX_DELAY_SECONDS + 2 * kicks["VisibilityTimeout"]
    assert followup.MAX_DELAY_SECONDS <= MAX_DELAY_SECONDS


def test_the_dispatcher_runs_on_the_schedule_with_the_queue_and_the_shard_size(translated: dict[str, Any]) -> None:
    dispatcher = translated["Resources"]["DispatcherFunction"]["Properties"]
    assert dispatcher["Handler"] == "fleetkeeper.reconciler.handler.dispatch_handler"
    assert "VpcConfig" not in dispatcher  # it probes nothing
    variables = dispatcher["Environment"]["Variables"]
    assert refers_to(variables["FLEETKEEPER_RECONCILE_QUEUE_URL"], "ReconcileQueue")
    resolve = Resolver(translated).resolve
    assert period_of(resolve(variables["FLEETKEEPER_RECONCILE_SCHEDULE"])) == 60
    assert 1 <= int(resolve(variables["FLEETKEEPER_SHARD_SIZE"])) <= MAX_SHARD_SIZE
    worker_variables = translated["Resources"]["ReconcilerFunction"]["Properties"]["Environment"]["Variables"]
    assert resolve(worker_variables["FLEETKEEPER_RECONCILE_SCHEDULE"]) == resolve(
        variables["FLEETKEEPER_RECONCILE_SCHEDULE"]
    )
    shard_size = translated["Parameters"]["ReconcileShardSize"]
    assert (shard_size["MinValue"], shard_size["MaxValue"]) == (1, MAX_SHARD_SIZE)


@pytest.mark.parametrize(
    ("schedule", "accepted"),
    [
        ("rate(1 minute)", True),
        ("rate(5 minutes)", True),
        ("rate(10 minutes)", True),
        ("rate(1 hour)", True),
        ("rate(2 hours)", True),
        ("cron(0 * * * ? *)", False),
        # EventBridge: singular for 1, plural otherwise (eb-rate-expressions.html); these fail at deploy.
        ("rate(5 minute)", False),
        ("rate(1 minutes)", False),
        ("rate(1 hours)", False),
        ("rate(2 hour)", False),
        ("rate(0 minutes)", False),
        ("rate(01 minute)", False),
    ],
)
def test_the_schedule_parameter_admits_rates_only(translated: dict[str, Any], schedule: str, accepted: bool) -> None:
    import re

    pattern = translated["Parameters"]["ReconcileSchedule"]["AllowedPattern"]
    assert bool(re.fullmatch(pattern, schedule)) is accepted
    if accepted:
        assert period_of(schedule) > 0
    elif schedule.startswith("rate("):
        # The settings refuse what the parameter refuses (the embedded mode and tests read it too).
        with pytest.raises(SettingsError):
            period_of(schedule)


def test_the_dispatcher_may_list_queue_describe_and_terminate_managed_instances_only(
    translated: dict[str, Any],
) -> None:
    statements = role_statements(translated, function_role(translated, "DispatcherFunction"))
    actions = {action.lower() for statement in statements for action in as_list(statement["Action"])}
    assert actions == {
        "logs:createlogstream",
        "logs:putlogevents",
        "dynamodb:query",
        "sqs:sendmessage",
        "ec2:describeinstances",
        "ec2:terminateinstances",
    }
    (query,) = statements_granting(statements, "dynamodb:Query")
    assert query["Resource"] == {"Fn::Sub": "${Table.Arn}/index/services"}  # the index, not the table
    (send,) = statements_granting(statements, "sqs:SendMessage")
    assert send["Resource"] == {"Fn::GetAtt": ["ReconcileQueue", "Arn"]}
    (terminate,) = statements_granting(statements, "ec2:TerminateInstances")
    # Managed and this stack's (tests/stacks/test_isolation_iam.py checks the id's value).
    assert set(condition_keys(terminate)) == {
        "aws:resourcetag/fleetkeeper:managed",
        "aws:resourcetag/fleetkeeper:stack",
    }
    assert condition_keys(terminate)["aws:resourcetag/fleetkeeper:managed"] == "true"


def test_the_worker_may_take_messages_from_its_two_queues_and_send_only_delayed_kicks(
    translated: dict[str, Any],
) -> None:
    statements = role_statements(translated, function_role(translated, "ReconcilerFunction"))
    for action in ("sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:GetQueueAttributes"):
        granting = statements_granting(statements, action)
        queues = sorted(r["Fn::GetAtt"][0] for s in granting for r in as_list(s["Resource"]))
        assert queues == ["KickQueue", "ReconcileQueue"], (action, granting)
    # A kick delayed until a spot-interrupted replica's drain must start (fleetkeeper/kick.py).
    sending = statements_granting(statements, "sqs:SendMessage")
    assert [r["Fn::GetAtt"][0] for s in sending for r in as_list(s["Resource"])] == ["KickQueue"]


def test_ec2s_warnings_reach_the_worker_through_the_kick_queue(translated: dict[str, Any]) -> None:
    """InterruptionRule: EC2's two spot warnings, trimmed to what the worker reads, onto the kick
    queue (whose event source caps the worker's concurrency); only that rule may send from outside."""
    from fleetkeeper.reconciler.interruptions import DETAIL_TYPES, SOURCE

    resources = translated["Resources"]
    rule = resources["InterruptionRule"]["Properties"]
    assert rule["EventPattern"] == {"source": [SOURCE], "detail-type": sorted(DETAIL_TYPES, reverse=True)}
    [target] = rule["Targets"]
    assert target["Arn"] == {"Fn::GetAtt": ["KickQueue", "Arn"]}
    paths = target["InputTransformer"]["InputPathsMap"]
    assert paths == {"type": "$.detail-type", "instance": "$.detail.instance-id", "time": "$.time"}

    policy = resources["KickQueuePolicy"]["Properties"]
    assert policy["Queues"] == [{"Ref": "KickQueue"}]
    allowed = [s for s in policy["PolicyDocument"]["Statement"] if s.get("Sid") == "InterruptionWarnings"]
    assert allowed == [
        {
            "Sid": "InterruptionWarnings",
            "Effect": "Allow",
            "Principal": {"Service": "events.amazonaws.com"},
            "Action": "sqs:SendMessage",
            "Resource": {"Fn::GetAtt": ["KickQueue", "Arn"]},
            "Condition": {"ArnEquals": {"aws:SourceArn": {"Fn::GetAtt": ["InterruptionRule", "Arn"]}}},
        }
    ]
    worker = resources["ReconcilerFunction"]["Properties"]["Environment"]["Variables"]
    assert worker["FLEETKEEPER_KICK_QUEUE_URL"] == {"Ref": "KickQueue"}


def test_the_longest_readiness_probe_fits_a_kicked_run_of_the_worker(translated: dict[str, Any]) -> None:
    """A long probe a shard's period cut short is judged by a run of its own (a kick), which has the
    whole invocation: the spec's bound must fit it, with the service margin, a probe's headroom and
    the run's own reads around it (settings.MAX_READINESS_TIMEOUT_SECONDS says how it is made). The
    embedded mode's loop gives its worker the same timeout."""
    from fleetkeeper.local.reconcile_loop import ReconcileLoop
    from fleetkeeper.settings import (
        DEFAULT_SERVICE_MARGIN_SECONDS,
        MAX_READINESS_TIMEOUT_SECONDS,
        PROBE_HEADROOM_SECONDS,
    )

    timeout = int(translated["Resources"]["ReconcilerFunction"]["Properties"]["Timeout"])
    reads_and_cold_start = 15
    assert (
        MAX_READINESS_TIMEOUT_SECONDS + PROBE_HEADROOM_SECONDS + DEFAULT_SERVICE_MARGIN_SECONDS + reads_and_cold_start
        <= timeout
    )
    assert ReconcileLoop(lambda event, context: None, tick=1).timeout_seconds == timeout
