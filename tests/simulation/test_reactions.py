"""Issue 26's reaction times, in schedule time, on the strict layer with a simulated clock
(tests/simulation/reactions.py says how): smaller cases of what `bench/reactions.py` prints, each
against its target and against the schedule alone, so a follow-up that stopped working fails here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from fleetkeeper.spec.service import DEFAULT_DRAIN_SECONDS
from tests.simulation import reactions

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import ProbeServer


@pytest.fixture
def server(server: ProbeServer, aws: None, monkeypatch: pytest.MonkeyPatch) -> ProbeServer:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    return server


def test_an_app_answering_is_ready_and_registered_within_15_seconds(server: ProbeServer, strict_aws: StrictAws) -> None:
    reaction = reactions.ready_latency(server, follow_ups=True, phase=5, extra_boot=3)
    assert reaction.seconds is not None and 0 <= reaction.seconds <= 15, reaction
    # Booting and starting: one follow-up about every 10 s, each one SQS message and one invocation.
    assert 5 <= reaction.sent <= 9 and reaction.followups == reaction.sent, reaction


def test_without_follow_ups_the_schedule_is_what_notices(server: ProbeServer, strict_aws: StrictAws) -> None:
    reaction = reactions.ready_latency(server, follow_ups=False, phase=5, extra_boot=3)
    assert reaction.seconds is not None and 15 < reaction.seconds <= 60, reaction
    assert reaction.sent == 0, reaction


def test_a_rolling_update_takes_about_boot_and_ready_per_replica(server: ProbeServer, strict_aws: StrictAws) -> None:
    reaction = reactions.rolling_update(server, follow_ups=True, replicas=2)
    # Each step within boot + ready + 15 s; then the last old replica's drain (the default, SkyPilot's 120 s).
    bound = 2 * (reactions.BOOT + reactions.READY + 15) + DEFAULT_DRAIN_SECONDS
    assert reaction.seconds is not None and reaction.seconds <= bound, reaction


def test_an_instance_aws_ends_is_replaced_at_ec2s_event(server: ProbeServer, strict_aws: StrictAws) -> None:
    reaction = reactions.replacement_latency(server, strict_aws, follow_ups=True, events=True, phase=50, at=0)
    assert reaction.seconds is not None and reaction.seconds <= 10, reaction
    assert reaction.invocations == 1  # EC2's event; the replacement's follow-ups come after


def test_a_steady_service_costs_nothing_beyond_the_schedule(server: ProbeServer, strict_aws: StrictAws) -> None:
    steady, writes = reactions.steady_cost(server, hours=0.25)
    assert (steady.sent, steady.invocations, writes) == (0, 0, 0)
