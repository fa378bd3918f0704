"""Crash injection: the reconciler 'dies' at the k-th AWS call, for every k; the next runs finish.

The `-alb` phases run the same with the stack's load balancer (moto's elbv2): a crash before and
after each call that makes the endpoint, registers, deregisters, asks how a drain goes or removes
the endpoint. Afterwards the target group holds exactly the live replicas
(and every replica item says REGISTERED), and a deleted service leaves no target group, listener or
rule behind.

For each phase (create, rolling update, delete) the calls of an undisturbed phase are counted; then,
for every k that leaves a world of its own, a fresh world replays the phase with a crash after (it
happened, the answer is lost) or, with a load balancer, before (the call never happens) its k-th AWS
call, and runs again until a run changes nothing. Every AWS call is counted, so a crash before call k
leaves AWS and the table as a crash after call k-1 does, and a crash after a read leaves them as a
crash after the last write before it does: sweeping the writes "after" covers every distinct state a
crash can leave. (What differs is only how long the reconciler then stays down; the seeded
simulation, tests/simulation/test_simulation.py, kills runs at any call and jumps the clock.)
Afterwards exactly the desired instances exist, no replica id was ever launched twice, the records
match EC2, a deleted service left nothing behind, and the unmanaged instance is untouched.

The twins of Ray Serve's recovery tests: "recover during rolling update" is the update phase;
"replica died before recover" kills a replica's instance while the reconciler is down.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from moto import mock_aws

from fleetkeeper.model import BalancerState
from fleetkeeper.reconciler.driver import UID_TAG
from tests.support.reconciler_world import (
    Crash,
    ProbeServer,
    World,
    alb_resources,
    assert_converged,
    assert_deleted,
    is_mutation,
    make_alb,
    tags,
    target_health,
)

if TYPE_CHECKING:
    pass

PHASES = ["create", "update", "delete", "replica-died-during-update", "create-alb", "update-alb", "delete-alb"]


def _world(server: ProbeServer, phase: str) -> World:
    return World(server, balancer=make_alb() if phase.endswith("-alb") else None)


def _start(world: World, phase: str) -> str:
    """Bring a fresh world to the start of `phase`; returns the service's uid."""
    uid = world.create().service.uid
    if phase.startswith("create"):
        return uid
    world.converge()
    if phase.startswith("delete"):
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
    if phase.startswith("delete"):
        assert_deleted(world, uid)
    else:
        assert_converged(world, version=1 if phase.startswith("create") else 2)
    balancer = world.reconciler.balancer
    if balancer is None:
        return
    if phase.startswith("delete"):
        assert alb_resources(balancer) == {"target_groups": [], "listeners": [], "rules": []}  # type: ignore[arg-type]
        return
    state = world.store.load("svc")
    assert state is not None and state.service.endpoint is not None
    live = {i["InstanceId"] for i in world.instances() if tags(i).get(UID_TAG) == uid}
    assert target_health(state.service.endpoint.target_group) == dict.fromkeys(live, "healthy")
    assert {r.balancer for r in state.replicas.values()} == {BalancerState.REGISTERED}
    assert len(alb_resources(balancer)["listeners"]) == 1  # type: ignore[arg-type]


def _kill_one_replica(world: World, uid: str) -> None:
    live = sorted((i for i in world.instances() if tags(i).get(UID_TAG) == uid), key=lambda i: i["InstanceId"])
    if live:
        World._raw_ec2().terminate_instances(InstanceIds=[live[0]["InstanceId"]])


def _calls_of_undisturbed(phase: str, server: ProbeServer) -> list[tuple[str, str]]:
    with mock_aws():
        world = _world(server, phase)
        _start(world, phase)
        mark = world.log.mark()
        world.converge()
        return world.log.since(mark)


def _crash_points(phase: str, when: str, calls: list[tuple[str, str]]) -> list[int]:
    """The calls of a phase (1-based) to crash at. Without a load balancer, its writes. With one,
    the load balancer's calls only: a crash before one (never made) and after one (made, its answer
    and everything after it lost, which is also a crash before the write that would record it). A
    crash before call k leaves what a crash after call k-1 leaves, so "before" skips a load balancer
    call that follows another (swept "after"). The other calls are those of the phase without a
    load balancer, swept there; sweeping them again would double the suite's longest test."""
    if not phase.endswith("-alb"):
        # Only a call that changes AWS or the table leaves a state of its own: a crash after a read
        # leaves what a crash after the last write before it left (swept there).
        return [k for k, call in enumerate(calls, start=1) if is_mutation(*call)]
    points = []
    for k, (service, _) in enumerate(calls, start=1):
        follows_one = k > 1 and calls[k - 2][0] == "elbv2"
        if service == "elbv2" and not (when == "before" and follows_one):
            points.append(k)
    return points


# Every AWS call is counted (the log hooks each of fleetkeeper's clients), so between the answer of
# call k-1 and the request of call k nothing outside the process changes: a crash before call k
# leaves AWS and the table exactly as a crash after call k-1 does. Without a load balancer, where
# every write is swept "after", a "before" sweep would repeat cases. With one, only the load
# balancer's calls are swept, so "before" adds the cases whose previous call is not the balancer's.
# (The instance that dies while the reconciler is down is also an "after" case: a lost answer.)
CASES = [(phase, "after") for phase in PHASES] + [(phase, "before") for phase in PHASES if phase.endswith("-alb")]


@pytest.mark.parametrize(("phase", "when"), CASES)
def test_a_crash_at_every_aws_call_is_completed_by_the_next_runs(
    phase: str, when: str, server: ProbeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    calls = _calls_of_undisturbed(phase, server)
    total = len(calls)
    assert total > 5
    points = _crash_points(phase, when, calls)
    assert points
    for k in points:
        with mock_aws():
            world = _world(server, phase)
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
