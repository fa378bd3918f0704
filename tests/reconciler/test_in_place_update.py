"""Updates that keep replicas, through the shell on AWS's semantics (the strict layer): a version that
changes only what a replica does not run (its count, its probe) takes effect on the READY replica in
place (no TerminateInstances, no RunInstances for it, the new version recorded on it, the new probe
path used); a change to what it runs (its envs) still replaces it; a rollback follows the same rule.
The planner's side, action by action, is in reconciler/plan/test_in_place.py."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.model import ReplicaStatus

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import ProbeServer, World


def _live(world: World) -> dict[int, str]:
    state = world.store.require("svc")
    return {r.replica_id: r.instance_id or "" for r in state.replicas.values() if r.status is ReplicaStatus.READY}


def _service(server: ProbeServer, path: str, replicas: int) -> dict[str, object]:
    return {"readiness_probe": path, "replicas": replicas, "ports": server.port}


def test_a_count_and_probe_change_keeps_the_ready_replica_and_probes_the_new_path(
    strict_aws: StrictAws, world: World, server: ProbeServer
) -> None:
    world.create(service=_service(server, "/health", 1))
    world.converge()
    (kept,) = _live(world).items()

    world.update(service=_service(server, "/ready", 2))
    mark = world.log.mark()
    world.converge()

    calls = world.log.since(mark)
    assert ("ec2", "TerminateInstances") not in calls
    assert calls.count(("ec2", "RunInstances")) == 1  # the second replica of the new count, only
    state = world.store.require("svc")
    assert {r.replica_id: (r.version, r.status) for r in state.replicas.values()} == {
        kept[0]: (2, ReplicaStatus.READY),
        kept[0] + 1: (2, ReplicaStatus.READY),
    }
    assert state.replicas[kept[0]].instance_id == kept[1]  # the same instance: no relaunch
    assert state.service.status_message == "2/2 ready"
    # The new probe is the one used, on the kept replica too: a steady run probes both on /ready.
    server.requests.clear()
    world.run()
    assert [path for _, path, _, _ in server.requests] == ["/ready", "/ready"]


def test_a_change_to_what_the_replica_runs_still_replaces_it(
    strict_aws: StrictAws, world: World, server: ProbeServer
) -> None:
    world.create(service=_service(server, "/health", 1))
    world.converge()
    (old,) = _live(world).values()
    world.update(service=_service(server, "/health", 1), envs={"MODEL": "v2"})
    mark = world.log.mark()
    world.converge()
    calls = world.log.since(mark)
    assert ("ec2", "RunInstances") in calls and ("ec2", "TerminateInstances") in calls
    (new,) = _live(world).values()
    assert new != old


def test_a_rollback_of_a_probe_change_keeps_the_replica_too(
    strict_aws: StrictAws, world: World, server: ProbeServer
) -> None:
    world.create(service=_service(server, "/health", 1))
    world.converge()
    world.update(service=_service(server, "/ready", 1))
    world.converge()
    (kept,) = _live(world).values()
    state = world.store.require("svc")
    world.commands.rollback("svc", 1, expected_generation=None)
    mark = world.log.mark()
    world.converge()
    calls = world.log.since(mark)
    assert ("ec2", "RunInstances") not in calls and ("ec2", "TerminateInstances") not in calls
    after = world.store.require("svc")
    assert [(r.version, r.instance_id) for r in after.replicas.values()] == [(1, kept)]
    assert after.service.generation > state.service.generation
