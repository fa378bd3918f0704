"""Crash injection: the reconciler 'dies' at the k-th AWS call, for every k; the next runs finish.

For each phase (create, rolling update, delete) the calls of an undisturbed phase are counted; then,
for every k, a fresh world replays the phase with a crash before (the call never happens) or after
(it happened, the answer is lost) its k-th AWS call, and runs again until a run changes nothing.
Afterwards exactly the desired instances exist, no replica id was ever launched twice, the records
match EC2, a deleted service left nothing behind, and the unmanaged instance is untouched.

The twins of Ray Serve's recovery tests: "recover during rolling update" is the update phase;
"replica died before recover" kills a replica's instance while the reconciler is down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from moto import mock_aws

from fleetkeeper.reconciler.driver import UID_TAG
from tests.reconciler_world import Crash, ProbeServer, World, assert_converged, assert_deleted, tags

if TYPE_CHECKING:
    pass

PHASES = ["create", "update", "delete", "replica-died-during-update"]


def _start(world: World, phase: str) -> str:
    """Bring a fresh world to the start of `phase`; returns the service's uid."""
    uid = world.create().service.uid
    if phase == "create":
        return uid
    world.converge()
    if phase == "delete":
        world.delete()
    else:
        world.update(envs={"RELEASE": "2"})
    return uid


def _settle(world: World, max_runs: int = 25) -> None:
    """Run until a run after the crash mutates nothing."""
    for _ in range(max_runs):
        mark = world.log.mark()
        try:
            world.run()
        except Crash:
            continue
        if world.log.crashed and not world.log.mutations(mark):
            return
    raise AssertionError(f"not settled after {max_runs} runs")


def _check(world: World, phase: str, uid: str) -> None:
    if phase == "delete":
        assert_deleted(world, uid)
    else:
        assert_converged(world, version=1 if phase == "create" else 2)


def _kill_one_replica(world: World, uid: str) -> None:
    live = sorted((i for i in world.instances() if tags(i).get(UID_TAG) == uid), key=lambda i: i["InstanceId"])
    if live:
        World._raw_ec2().terminate_instances(InstanceIds=[live[0]["InstanceId"]])


def _calls_of_undisturbed(phase: str, server: ProbeServer) -> int:
    with mock_aws():
        world = World(server)
        _start(world, phase)
        mark = world.log.mark()
        world.converge()
        return len(world.log.since(mark))


CASES = [(phase, when) for phase in PHASES for when in ("before", "after")]
# The instance dies while the reconciler is down: after a lost answer is the interesting case.
CASES.remove(("replica-died-during-update", "before"))


@pytest.mark.parametrize(("phase", "when"), CASES)
def test_a_crash_at_every_aws_call_is_completed_by_the_next_runs(
    phase: str, when: str, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    total = _calls_of_undisturbed(phase, server)
    assert total > 5
    for k in range(1, total + 1):
        with mock_aws():
            world = World(server)
            uid = _start(world, phase)
            world.log.crash_at, world.log.crash_when = world.log.mark() + k, when
            while not world.log.crashed:
                try:
                    world.run()
                except Crash:
                    break
            assert world.log.crashed, f"call {k} was never made"
            if phase == "replica-died-during-update":
                _kill_one_replica(world, uid)
            try:
                _settle(world)
                _check(world, phase, uid)
            except AssertionError as exc:
                raise AssertionError(f"{phase}: crash {when} call {k} of {total}: {exc}") from exc
