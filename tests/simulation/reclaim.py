"""A reclaim wave, simulated: EC2 warns about half of a service's spot replicas and takes each back
two minutes after its warning. How low does READY capacity go?

One seeded wave on a `World` (the reconciler over the strict-AWS layer, probes answered on
127.0.0.1), in 10-second ticks of the world's clock:

- a service of 4-10 spot replicas (with SkyPilot's dynamic on-demand fallback, or without), READY;
- the wave: warnings for half of them (a random half), each sent at a random second of the first
  30 and delivered as the stack's rule delivers it (the kick queue's worker: `Reconciler.interrupt`);
- spot capacity refused for a random number of RunInstances attempts from the wave on (0-16), so
  some replacements cannot start before their replica is reclaimed;
- the scheduled run every 60 s, and the delayed kicks the reconciler asks for (when a warned
  replica's drain must start), at the first tick after they are due; AWS reclaims each warned
  instance 120 s after its warning (`Server.SpotInstanceTermination`), if it is still running.

At every tick, READY capacity is the replicas recorded READY whose instance is still running. The
bound the wave must keep (issue 14): capacity never below target - L, where L is the number of
warned replicas reclaimed before a replacement was READY to stand in for them (at each reclaim:
reclaimed so far, less the replacements READY by then).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from fleetkeeper.model import Interruption, InterruptionKind, ReplicaStatus, to_iso
from fleetkeeper.spec.service import ServiceSpec
from tests.support.reconciler_world import spec_dict

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import World

TICK = 10  # seconds of the world's clock between observations
RUN_EVERY = 60  # the schedule
NOTICE = 120  # EC2 takes a spot instance back this long after its interruption warning
WAVE_TICKS = 48  # eight minutes from the first warning


@dataclass
class WaveResult:
    seed: int
    target: int
    warned: int
    dynamic_fallback: bool
    spot_refusals: int
    min_ready: int = 0
    lost: int = 0  # L: warned replicas reclaimed before a replacement was READY
    recovered_after: int | None = None  # seconds from the first warning until READY = target again
    timeline: list[tuple[int, int]] = field(default_factory=list)  # (second, READY capacity)

    @property
    def bound(self) -> int:
        return self.target - self.lost

    @property
    def holds(self) -> bool:
        return self.min_ready >= self.bound


def _ready(world: World, name: str) -> tuple[int, set[int]]:
    """READY capacity (READY records whose instance is running) and the READY replica ids."""
    running = {i["InstanceId"] for i in world.instances() if i["State"]["Name"] == "running"}
    state = world.store.require(name)
    ready = {
        r.replica_id for r in state.replicas.values() if r.status is ReplicaStatus.READY and r.instance_id in running
    }
    return len(ready), ready


def run_wave(seed: int, world: World, strict: StrictAws, name: str = "wave") -> WaveResult:
    rng = random.Random(seed)
    target = rng.randint(4, 10)
    dynamic = rng.random() < 0.5
    refusals = rng.choice([0, 0, 2, 4, 8, 16])
    data = spec_dict(world.server.port)
    data["service"] = {
        "readiness_probe": "/health",
        "ports": world.server.port,
        "replica_policy": {"min_replicas": target, **({"dynamic_ondemand_fallback": True} if dynamic else {})},
        # 30 s, not the default 120 s (EC2's whole notice, which drains a warned replica at once): the
        # wave's bound is about warned replicas serving until their replacements are READY.
        "drain_seconds": 30,
    }
    data["resources"] = {"use_spot": True, "instance_type": "t3.micro"}
    world.commands.create(name, ServiceSpec.model_validate(data))
    reconciler = world.reconciler
    for _ in range(10):
        reconciler.run_one(name)
        world.clock.advance(RUN_EVERY)
        if _ready(world, name)[0] == target and len(world.store.require(name).replicas) == target:
            break
    capacity, serving = _ready(world, name)
    assert capacity == target, f"seed {seed}: the service never became READY before the wave"

    result = WaveResult(seed, target, target // 2, dynamic, refusals)
    state = world.store.require(name)
    before = set(state.replicas)
    chosen = rng.sample(sorted(serving), target // 2)
    instance_of = {rid: state.replicas[rid].instance_id for rid in chosen}
    warn_at = {rid: rng.randrange(0, 30, TICK) for rid in chosen}
    reclaim_at = {rid: warn_at[rid] + NOTICE for rid in chosen}
    if refusals:
        # HTTP 400, not retried by botocore: `refusals` launch attempts are refused.
        strict.ec2.spot_refused("MaxSpotInstanceCountExceeded", times=refusals)

    start = world.clock()
    # The delayed kicks the reconciler asks for (a drain's moment), delivered at the first tick after
    # they are due, as the kick queue's DelaySeconds and a Lambda start would.
    wakeups: list[float] = []
    reconciler.kick = lambda _name, delay: wakeups.append((world.clock() - start).total_seconds() + delay)
    reclaimed: set[int] = set()
    result.min_ready = capacity
    for tick in range(WAVE_TICKS + 1):
        second = tick * TICK
        for rid in chosen:
            if warn_at[rid] == second:
                instance_id = instance_of[rid]
                assert instance_id is not None
                moment = to_iso(start + timedelta(seconds=second))
                reconciler.interrupt(Interruption(InterruptionKind.SPOT_INTERRUPTION, instance_id, moment))
            if reclaim_at[rid] == second:
                live = {i["InstanceId"] for i in world.instances()}
                if instance_of[rid] in live:
                    strict.ec2.terminate_by_aws(str(instance_of[rid]), "Server.SpotInstanceTermination")
                reclaimed.add(rid)
                replacements = _ready(world, name)[1] - before
                result.lost = max(result.lost, len(reclaimed) - len(replacements))
        if second % RUN_EVERY == 0 and second > 0:
            reconciler.run_all()
        elif any(due <= second for due in wakeups):
            reconciler.run_one(name)
        wakeups[:] = [due for due in wakeups if due > second]
        capacity = _ready(world, name)[0]
        result.timeline.append((second, capacity))
        result.min_ready = min(result.min_ready, capacity)
        if result.recovered_after is None and second > max(reclaim_at.values()) and capacity >= target:
            result.recovered_after = second
        world.clock.advance(TICK)
    return result


def summary(results: list[WaveResult]) -> dict[str, Any]:
    holds = sum(1 for r in results if r.holds)
    dips = [r.target - r.min_ready for r in results]
    return {
        "waves": len(results),
        "bound held": holds,
        "waves with no dip": sum(1 for d in dips if d == 0),
        "largest dip (replicas)": max(dips, default=0),
        "largest L": max((r.lost for r in results), default=0),
    }
