"""The call-level deadline (fleetkeeper.aws.deadline) on the strict layer's virtual clock: no attempt
starts and no retry pauses past it, and an error botocore does not retry surfaces unchanged."""

from __future__ import annotations

import contextvars
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError, ConnectTimeoutError, ReadTimeoutError

from fleetkeeper import aws
from fleetkeeper.store.codec import to_raw
from tests.strict_aws import LambdaTimeout, StrictAws

KEY = to_raw({"PK": "SVC#x", "SK": "META"})
# fleetkeeper's clients: one attempt may take connect + read timeout; EC2's (adaptive) may first
# wait up to 2 s for a token.
ATTEMPT = aws.CONNECT_TIMEOUT_SECONDS + aws.READ_TIMEOUT_SECONDS
EC2_ATTEMPT = ATTEMPT + 2


def test_without_a_deadline_a_hanging_call_outlasts_the_invocation(strict_aws: StrictAws, table: str) -> None:
    """The failure the deadline exists for: 6 read timeouts of 10 s outlast 20 s."""
    context = strict_aws.lambda_context(timeout_seconds=20)
    strict_aws.hang("dynamodb", "GetItem", times=6, kind="read")

    with pytest.raises(LambdaTimeout):
        aws.dynamodb().get_item(TableName=table, Key=KEY)

    assert context.killed
    assert strict_aws.clock.time() == pytest.approx(context.deadline)


def test_a_hanging_call_stops_before_an_attempt_the_time_left_cannot_cover(strict_aws: StrictAws, table: str) -> None:
    context = strict_aws.lambda_context(timeout_seconds=20)
    strict_aws.hang("dynamodb", "GetItem", times=6)

    with aws.within(aws.seconds_left(context, 1.0)) as deadline, pytest.raises(aws.DeadlineReached) as caught:
        aws.dynamodb().get_item(TableName=table, Key=KEY)

    # 19 s in hand: the first attempt (up to 13 s) fits, and hangs 3 s; the retry's longest pause
    # (0.025 s: not a throttle) and a second attempt fit in the 16 s left, and it hangs 3 s; in the
    # 13 s left the next pause (0.05 s) and attempt do not.
    assert strict_aws.attempts_of("dynamodb", "GetItem") == 2
    reached = caught.value
    assert (reached.service, reached.operation, reached.after) == ("dynamodb", "GetItem", "ConnectTimeoutError")
    assert reached.remaining < reached.needed
    assert deadline.reached and deadline.stopped is reached
    assert not context.killed
    assert context.get_remaining_time_in_millis() > 1000  # what the handler keeps to return


def test_no_attempt_starts_without_its_worst_case_in_hand(strict_aws: StrictAws, table: str) -> None:
    context = strict_aws.lambda_context(timeout_seconds=20)
    strict_aws.clock.advance(20 - ATTEMPT + 0.5)  # 12.5 s left

    with aws.within(aws.seconds_left(context, 0.0)), pytest.raises(aws.DeadlineReached) as caught:
        aws.dynamodb().get_item(TableName=table, Key=KEY)

    assert caught.value.after is None  # stopped before its first attempt
    assert caught.value.needed == ATTEMPT
    assert strict_aws.attempts_of("dynamodb", "GetItem") == 0  # nothing was sent


def test_an_adaptive_client_keeps_room_for_its_token_wait(strict_aws: StrictAws) -> None:
    context = strict_aws.lambda_context(timeout_seconds=60)
    strict_aws.clock.advance(60 - EC2_ATTEMPT + 1)  # enough for a standard client's attempt, not EC2's

    with aws.within(aws.seconds_left(context, 0.0)), pytest.raises(aws.DeadlineReached) as caught:
        aws.ec2().describe_instances()

    assert caught.value.needed == EC2_ATTEMPT
    assert strict_aws.attempts_of("ec2", "DescribeInstances") == 0


def test_a_throttle_burst_near_the_deadline_is_not_retried_past_it(strict_aws: StrictAws, table: str) -> None:
    context = strict_aws.lambda_context(timeout_seconds=30)
    strict_aws.throttle("dynamodb", "GetItem", times=10)

    with aws.within(aws.seconds_left(context, 1.0)), pytest.raises(aws.DeadlineReached) as caught:
        aws.dynamodb().get_item(TableName=table, Key=KEY)

    assert caught.value.after == "ProvisionedThroughputExceededException"
    # 29 s in hand. A retry is taken only while its longest pause (throttling: 1, 2, 4, 8, 16 s) and
    # an attempt (13 s) fit: the first four retries do (the pauses taken sum to at most 15 s, leaving
    # at least 14 s), the fifth (16 + 13 s) never does.
    assert strict_aws.attempts_of("dynamodb", "GetItem") == 5
    assert len(strict_aws.backoff) == 4
    assert not context.killed
    assert context.get_remaining_time_in_millis() / 1000 >= 1.0 + caught.value.remaining - 1e-3


def test_far_from_the_deadline_a_throttle_burst_is_retried_as_before(strict_aws: StrictAws, table: str) -> None:
    context = strict_aws.lambda_context(timeout_seconds=300)
    strict_aws.throttle("dynamodb", "GetItem", times=3)

    with aws.within(aws.seconds_left(context, 1.0)) as deadline:
        aws.dynamodb().get_item(TableName=table, Key=KEY)

    assert strict_aws.attempts_of("dynamodb", "GetItem") == 4
    assert len(strict_aws.backoff) == 3
    assert not deadline.reached


def test_an_error_botocore_does_not_retry_is_unchanged_near_the_deadline(strict_aws: StrictAws, table: str) -> None:
    context = strict_aws.lambda_context(timeout_seconds=20)
    strict_aws.clock.advance(20 - ATTEMPT - 1)  # room for one attempt, none for a retry

    with aws.within(aws.seconds_left(context, 0.0)) as deadline, pytest.raises(ClientError) as caught:
        aws.dynamodb().put_item(
            TableName=table, Item={**KEY, "v": {"N": "1"}}, ConditionExpression="attribute_exists(PK)"
        )

    assert caught.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    assert not deadline.reached


def test_the_last_attempts_error_surfaces_unchanged(strict_aws: StrictAws, table: str) -> None:
    """botocore retries no more after its 6th attempt: its throttle is the caller's, not a deadline's."""
    strict_aws.lambda_context(timeout_seconds=900)
    strict_aws.throttle("dynamodb", "GetItem", times=6)

    with aws.within(lambda: 900.0), pytest.raises(ClientError, match="reached max retries: 5") as caught:
        aws.dynamodb().get_item(TableName=table, Key=KEY)

    assert caught.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"


def test_a_read_hang_was_carried_out_and_its_answer_lost(strict_aws: StrictAws, table: str) -> None:
    strict_aws.hang("dynamodb", "PutItem", times=6, kind="read")
    start = strict_aws.clock.time()

    with pytest.raises(ReadTimeoutError):
        aws.dynamodb().put_item(TableName=table, Item={**KEY, "v": {"N": "1"}})

    assert strict_aws.clock.time() - start >= 6 * aws.READ_TIMEOUT_SECONDS
    assert strict_aws.attempts_of("dynamodb", "PutItem") == 6
    assert "Item" in aws.dynamodb().get_item(TableName=table, Key=KEY)  # it was written


def test_a_connect_hang_reaches_nothing(strict_aws: StrictAws, table: str) -> None:
    strict_aws.hang("dynamodb", "PutItem", times=6)

    with pytest.raises(ConnectTimeoutError):
        aws.dynamodb().put_item(TableName=table, Item={**KEY, "v": {"N": "1"}})

    assert "Item" not in aws.dynamodb().get_item(TableName=table, Key=KEY)
    assert [f.kind for f in strict_aws.faults_injected] == ["hang:connect"] * 6


def test_work_handed_to_a_pool_in_a_copy_of_the_context_keeps_the_deadline(strict_aws: StrictAws, table: str) -> None:
    with aws.within(lambda: ATTEMPT - 1) as deadline, ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(contextvars.copy_context().run, aws.dynamodb().get_item, TableName=table, Key=KEY)
        with pytest.raises(aws.DeadlineReached):
            future.result()

    assert deadline.reached
    assert not aws.reached()  # outside the block: no deadline
    aws.dynamodb().get_item(TableName=table, Key=KEY)


def test_a_nested_deadline_keeps_the_earlier_of_the_two(strict_aws: StrictAws, table: str) -> None:
    with aws.within(lambda: ATTEMPT - 1), aws.within(lambda: 900.0), pytest.raises(aws.DeadlineReached):
        aws.dynamodb().get_item(TableName=table, Key=KEY)


def test_keeping_ends_the_calls_of_its_block_that_much_before_the_current_deadline(
    strict_aws: StrictAws, table: str
) -> None:
    """`aws.keeping(s)`: the current deadline less s (the dispatcher's identities keep the shards'
    time); without a current deadline it sets none."""
    with aws.keeping(60.0) as none:
        assert none is None and aws.deadline.current() is None
        assert "Item" not in aws.dynamodb().get_item(TableName=table, Key=KEY)
    with aws.within(lambda: ATTEMPT + 5), aws.keeping(5.0) as kept:
        assert kept is not None and kept.remaining() == pytest.approx(ATTEMPT)
        aws.dynamodb().get_item(TableName=table, Key=KEY)  # an attempt's worst case is just in hand
    with aws.within(lambda: ATTEMPT + 5), aws.keeping(5.1), pytest.raises(aws.DeadlineReached) as caught:
        aws.dynamodb().get_item(TableName=table, Key=KEY)
    assert caught.value.needed == ATTEMPT and caught.value.remaining == pytest.approx(ATTEMPT - 0.1)
