"""Terminating one replica (SkyPilot's `sky serve down NAME --replica-id N`; `fleetkeeper down NAME
--replica-id N`; DELETE /v1/services/{name}/replicas/{replica_id}), through the api's command and the
shell on AWS's semantics: the replica's instance is terminated, another replica replaces it, the
others keep running; asking twice writes once; an unknown replica is a 404 naming the ones there are."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from fleetkeeper.errors import NotFound
from fleetkeeper.model import ReplicaStatus
from fleetkeeper.reconciler.plan.replicas import TERMINATED_BY_REQUEST
from tests.support.reconciler_world import instance_state

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import World


def test_a_terminated_replica_is_replaced_and_the_others_keep_running(strict_aws: StrictAws, world: World) -> None:
    world.create(replicas=2)
    world.converge()
    before = world.store.require("svc").replicas
    gone, kept = before[0], before[1]

    state, changed = world.commands.terminate_replica("svc", 0)
    assert changed and state.replicas[0].terminate_requested_at is not None
    again = world.commands.terminate_replica("svc", 0)
    assert again[1] is False  # asked for already: nothing written

    world.run("svc")
    drained = world.store.require("svc").replicas[0]
    assert (drained.status, drained.status_message) == (ReplicaStatus.SHUTTING_DOWN, TERMINATED_BY_REQUEST)
    world.converge()
    after = world.store.require("svc")
    assert 0 not in after.replicas
    assert after.replicas[1].instance_id == kept.instance_id  # the other one kept its instance
    assert sorted(after.replicas) == [1, 2] and {r.status for r in after.replicas.values()} == {ReplicaStatus.READY}
    assert instance_state(str(gone.instance_id)) in ("shutting-down", "terminated")
    events, _ = world.store.events_page(after.service, limit=100, next_token=None, now_epoch=0)
    assert "TerminationRequested" in [e.event.reason for e in events]


def test_an_unknown_replica_is_not_found_and_says_which_there_are(world: World) -> None:
    world.create(replicas=2)
    world.run("svc")
    with pytest.raises(NotFound, match=r"service 'svc' has no replica 7 \(its replicas: 0, 1\)"):
        world.commands.terminate_replica("svc", 7)
    with pytest.raises(NotFound, match="does not exist"):
        world.commands.terminate_replica("nope", 0)
