"""The cleanup logic against moto: every child of the removed uid goes, in ceil(n / 25) BatchWriteItem
calls; deferred items are retried; errors botocore already retried (throttling) fail the record at
once; the time budget, botocore's retry waits included, stops and a retry resumes; nothing of another
incarnation is ever touched."""

from __future__ import annotations

import math
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper.aws import RETRIES, WORST_CASE_RETRY_WAIT_SECONDS
from fleetkeeper.cleanup import manual
from fleetkeeper.cleanup.logic import (
    Budget,
    Cleaner,
    GaveUp,
    Incarnation,
    MalformedRecord,
    OutOfTime,
    RetryPolicy,
)
from fleetkeeper.store.cleanup import ChildKeys
from fleetkeeper.store.errors import Contention
from fleetkeeper.store.keys import version_sk
from fleetkeeper.store.table import Table
from tests.support.cleanup_support import (
    FaultyClient,
    access_denied,
    children_of,
    count_calls,
    defer_last,
    partition_keys,
    seed_children,
    throttled,
)
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec

UID_A = "a0a0a0a0a0a0a0a0"
UID_B = "b1b1b1b1b1b1b1b1"
PLENTY = Budget(remaining_ms=lambda: 300_000)
# What a budget holds back before every call: its first attempt's worst case and the reserve.
HELD_BACK_MS = Budget(remaining_ms=lambda: 0).attempt_ms + 5_000


def cleaner(table: str, name: str, uid: str, *, client: Any = None, **kwargs: Any) -> Cleaner:
    sleeps: list[float] = kwargs.pop("sleeps", [])
    return Cleaner(
        children=ChildKeys(Table(table, client=client), name, uid),
        budget=kwargs.pop("budget", PLENTY),
        sleep=sleeps.append,
        **kwargs,
    )


@pytest.mark.parametrize("n", [1, 25, 26, 1_000, 10_000])
def test_every_version_goes_in_ceil_n_over_25_batch_calls(table: str, n: int) -> None:
    seed_children(table, "web", UID_A, versions=n)
    batch_calls = count_calls("BatchWriteItem")

    progress = cleaner(table, "web", UID_A).run()

    assert partition_keys(table, "web") == set()
    assert len(batch_calls) == math.ceil(n / 25)
    assert all(len(call["RequestItems"][table]) <= 25 for call in batch_calls)
    assert progress.deleted == n
    assert progress.batch_calls == math.ceil(n / 25)
    assert progress.retries == 0


def test_replicas_go_too_and_chunks_span_versions_and_replicas(table: str) -> None:
    seed_children(table, "web", UID_A, versions=30, replicas=20)
    batch_calls = count_calls("BatchWriteItem")

    progress = cleaner(table, "web", UID_A).run()

    assert partition_keys(table, "web") == set()
    assert progress.deleted == 50
    assert len(batch_calls) == 2  # 25 + 25, not 25 + 5 + 20


def test_nothing_left_succeeds_and_a_redelivery_is_harmless(table: str) -> None:
    seed_children(table, "web", UID_A, versions=40)
    cleaner(table, "web", UID_A).run()
    batch_calls = count_calls("BatchWriteItem")

    again = cleaner(table, "web", UID_A).run()

    assert again.deleted == 0
    assert batch_calls == []  # only the query: nothing is left to delete


def test_unprocessed_items_are_retried_with_growing_jittered_pauses(table: str) -> None:
    seed_children(table, "web", UID_A, versions=60)
    real = aws.dynamodb()
    # Calls 1-3 carry out only part of their chunk and hand the rest back as UnprocessedItems.
    deferrals = {1: 10, 2: 5, 3: 1}
    client = FaultyClient(
        real, lambda items, call: defer_last(real, items, deferrals[call]) if call in deferrals else None
    )
    sleeps: list[float] = []
    policy = RetryPolicy(attempts=5, base_seconds=0.1, cap_seconds=10.0)

    progress = cleaner(table, "web", UID_A, client=client, sleeps=sleeps, policy=policy, jitter=lambda cap: cap).run()

    assert partition_keys(table, "web") == set()
    assert progress.deleted == 60
    assert progress.retries == 3
    assert sleeps == [0.2, 0.4, 0.8]  # base * 2^retry, jitter at its ceiling here
    assert client.batch_calls == math.ceil(60 / 25) + 3


def test_a_throttling_error_botocore_gave_up_on_fails_the_record_and_the_redelivery_finishes(table: str) -> None:
    seed_children(table, "web", UID_A, versions=100, replicas=3)
    # The error as it leaves botocore after its own retries (fleetkeeper.aws: standard mode).
    client = FaultyClient(aws.dynamodb(), lambda items, call: _raise(throttled()) if call == 2 else None)
    sleeps: list[float] = []

    # Every store reports throttling past botocore's retries as the typed Contention (store.table).
    with pytest.raises(Contention, match="ProvisionedThroughputExceeded"):
        cleaner(table, "web", UID_A, client=client, sleeps=sleeps).run()

    assert client.batch_calls == 2  # not retried on top of botocore's retries
    assert sleeps == []
    assert len(partition_keys(table, "web")) == 103 - 25
    cleaner(table, "web", UID_A).run()
    assert partition_keys(table, "web") == set()


def test_full_jitter_stays_under_the_capped_exponential_ceiling() -> None:
    policy = RetryPolicy(base_seconds=0.05, cap_seconds=2.0)
    ceilings = [policy.delay(retry, lambda cap: cap) for retry in range(1, 9)]
    assert ceilings == [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    assert policy.delay(3, lambda cap: 0.0) == 0.0


def test_retries_are_bounded_then_the_record_fails_with_what_was_done(table: str) -> None:
    seed_children(table, "web", UID_A, versions=30)
    real = aws.dynamodb()
    # The first chunk goes through; the second is deferred forever.
    client = FaultyClient(real, lambda items, call: defer_last(real, items, 5) if call >= 2 else None)
    sleeps: list[float] = []

    with pytest.raises(GaveUp) as failure:
        cleaner(table, "web", UID_A, client=client, sleeps=sleeps, policy=RetryPolicy(attempts=4)).run()

    assert failure.value.progress.deleted == 25
    assert client.batch_calls == 1 + 4
    assert len(sleeps) == 3
    assert partition_keys(table, "web") == {version_sk(UID_A, v) for v in range(26, 31)}
    # A later delivery, with DynamoDB well again, finishes the job.
    cleaner(table, "web", UID_A).run()
    assert partition_keys(table, "web") == set()


@pytest.mark.parametrize("error", [access_denied, throttled], ids=["access denied", "throttled"])
def test_client_errors_are_not_retried(table: str, error: Any) -> None:
    seed_children(table, "web", UID_A, versions=3)
    client = FaultyClient(aws.dynamodb(), lambda items, call: _raise(error()))
    sleeps: list[float] = []

    # Throttling arrives as the store's typed Contention, anything else as the ClientError itself.
    with pytest.raises((ClientError, Contention)):
        cleaner(table, "web", UID_A, client=client, sleeps=sleeps).run()

    assert client.batch_calls == 1
    assert sleeps == []


def test_out_of_time_stops_and_the_next_attempt_continues_where_it_stopped(table: str) -> None:
    seed_children(table, "web", UID_A, versions=1_000)
    batch_calls = count_calls("BatchWriteItem")

    def clock_of_one_attempt() -> Budget:
        # Each BatchWriteItem "costs" one second of 25 s to spend above what the budget holds back
        # (the next call's first attempt, and 5 s to report the failure).
        start = len(batch_calls)
        return Budget(remaining_ms=lambda: HELD_BACK_MS + 25_000 - (len(batch_calls) - start) * 1_000, reserve_ms=5_000)

    with pytest.raises(OutOfTime) as stopped:
        cleaner(table, "web", UID_A, budget=clock_of_one_attempt()).run()
    assert stopped.value.progress.deleted == 25 * 25
    assert len(partition_keys(table, "web")) == 1_000 - 625

    cleaner(table, "web", UID_A, budget=clock_of_one_attempt()).run()

    assert partition_keys(table, "web") == set()
    assert len(batch_calls) == 40  # ceil(1000 / 25): the second attempt redid nothing


def test_a_retry_pause_that_would_overrun_the_budget_stops_instead(table: str) -> None:
    seed_children(table, "web", UID_A, versions=10)
    real = aws.dynamodb()
    client = FaultyClient(real, lambda items, call: defer_last(real, items, 3))
    sleeps: list[float] = []

    with pytest.raises(OutOfTime, match="retrying 3 deferred"):
        cleaner(
            table,
            "web",
            UID_A,
            client=client,
            sleeps=sleeps,
            budget=Budget(remaining_ms=lambda: HELD_BACK_MS + 1_000, reserve_ms=5_000),
            policy=RetryPolicy(base_seconds=1.0, cap_seconds=5.0),
            jitter=lambda cap: cap,
        ).run()

    assert client.batch_calls == 1
    assert sleeps == []  # a 2 s pause does not fit in the 1 s above what is held back


@pytest.mark.parametrize(("above", "calls"), [(1, 1), (0, 0)])
def test_a_call_starts_only_while_its_first_attempt_still_fits(table: str, above: int, calls: int) -> None:
    seed_children(table, "web", UID_A, versions=3)
    batch_calls = count_calls("BatchWriteItem")
    budget = Budget(remaining_ms=lambda: HELD_BACK_MS + above - 1_000 * len(batch_calls), reserve_ms=5_000)
    # The client's connect and read timeouts; its retries are the deadline's (tests/cleanup/test_handler.py).
    assert budget.attempt_ms == (aws.CONNECT_TIMEOUT_SECONDS + aws.READ_TIMEOUT_SECONDS) * 1000 == 13_000

    if calls:
        cleaner(table, "web", UID_A, budget=budget).run()
    else:
        with pytest.raises(OutOfTime):
            cleaner(table, "web", UID_A, budget=budget).run()

    assert len(batch_calls) == calls


def test_only_the_removed_uid_is_deleted(table: str) -> None:
    seed_children(table, "web", UID_A, versions=120, replicas=4)
    seed_children(table, "web", UID_B, versions=7, replicas=2)
    seed_children(table, "webapp", UID_A, versions=5)  # a name sharing the prefix, same uid even
    before_b = children_of(partition_keys(table, "web"), UID_B)

    cleaner(table, "web", UID_A).run()

    assert partition_keys(table, "web") == before_b
    assert len(before_b) == 9
    assert len(partition_keys(table, "webapp")) == 5


def test_a_uid_that_is_a_prefix_of_another_leaves_the_other_alone(table: str) -> None:
    seed_children(table, "web", "abc", versions=3)
    seed_children(table, "web", "abcd", versions=3)

    cleaner(table, "web", "abc").run()

    assert partition_keys(table, "web") == {version_sk("abcd", v) for v in (1, 2, 3)}


def test_the_store_refuses_a_key_of_another_incarnation(table: str) -> None:
    seed_children(table, "web", UID_B, versions=1)
    children = ChildKeys(Table(table), "web", UID_A)
    foreign = {"PK": {"S": "SVC#web"}, "SK": {"S": version_sk(UID_B, 1)}}

    with pytest.raises(ValueError, match="another incarnation"):
        children.delete([foreign])

    assert partition_keys(table, "web") == {version_sk(UID_B, 1)}


@pytest.mark.parametrize("image", [{}, {"name": "web"}, {"name": "web", "uid": ""}, {"uid": UID_A}])
def test_an_old_image_without_name_and_uid_is_refused(image: dict[str, Any]) -> None:
    with pytest.raises(MalformedRecord):
        Incarnation.from_old_image(image)


def test_the_reserved_waits_are_botocores_own_for_fleetkeepers_clients(table: str) -> None:
    """WORST_CASE_RETRY_WAIT_SECONDS restates botocore's backoff; this fails if botocore's changes."""
    from botocore.retries.standard import ExponentialBackoff, RetryContext

    assert aws.dynamodb().meta.config.retries == {"mode": "standard", "total_max_attempts": RETRIES + 1}

    class Throttled:
        def is_throttling_error_from_context(self, context: Any) -> bool:
            return True

    class RetryAfterForever:
        headers = {"x-amz-retry-after": str(10**9)}

    backoff = ExponentialBackoff(random=lambda: 1.0, service_name="dynamodb", throttling_detector=Throttled())
    waits = [
        backoff.delay_amount(RetryContext(attempt_number=n, http_response=RetryAfterForever()))
        for n in range(1, RETRIES + 1)
    ]
    assert sum(waits) == WORST_CASE_RETRY_WAIT_SECONDS


def _raise(exc: Exception) -> Any:
    raise exc


def test_the_manual_run_lists_uids_deletes_an_orphan_and_refuses_the_live_one(
    api: HandlerClient, table: str, capsys: pytest.CaptureFixture[str]
) -> None:
    live = api.post("/v1/services", {"name": "web", "spec": hello_spec()}).body["uid"]
    seed_children(table, "web", UID_A, versions=30, replicas=1)  # an orphan the stream gave up on

    assert manual.main(["--table", table, "--name", "web"]) == 0
    listing = capsys.readouterr().out
    assert f"{UID_A}  31 child item(s)\n" in listing
    assert f"{live}  1 child item(s)  (live incarnation)\n" in listing

    assert manual.main(["--table", table, "--name", "web", "--uid", live]) == 2
    assert manual.main(["--table", table, "--name", "web", "--uid", UID_A]) == 0

    assert children_of(partition_keys(table, "web"), UID_A) == set()
    assert api.get("/v1/services/web").status == 200
    assert len(api.get("/v1/services/web/versions").body["versions"]) == 1
