"""How fast the control plane reacts, in schedule time: the reconciler over the strict-AWS layer on
moto, driven by a simulated clock and an event queue that plays the schedule, the kick queue and
EventBridge (issue 26).

Every trigger is an event on one timeline (seconds from the scenario's start):

- the schedule: a run of every service every `period` seconds (from a phase the scenario picks);
- the api's kick after a write, and EC2's state-change notification: delivered `delivery` seconds
  after they happen (EventBridge / SQS to a warm worker);
- the delayed kicks the reconciler asks for (follow-ups, a warned replica's drain): delivered
  `delivery` seconds after their DelaySeconds are over, to `Reconciler.run_one` with the follow-up's
  due time, as the worker passes it (a void one costs its read).

Instances: moto reports a launched instance running at once; the app on it answers its readiness
probe `boot + ready` seconds after the replica's launch (the prober answers from that model, on the
simulated clock: no socket). Runs take no simulated time. Nothing leaves the process.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from fleetkeeper.model import BalancerState, ReplicaStatus, ServiceStatus, from_iso
from fleetkeeper.reconciler.plan import ProbeResult
from fleetkeeper.reconciler.state_changes import StateChange
from tests.support.reconciler_world import ec2_driver, make_alb

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Sequence

    from fleetkeeper.reconciler.probe import ProbeTarget
    from tests.strict_aws import StrictAws
    from tests.support.reconciler_world import ProbeServer, World

BOOT = 60.0  # an instance boots in 60 s
READY = 10.0  # and its app answers 10 s later
DELIVERY = 1.0  # EventBridge or SQS to a warm worker
PERIOD = 60.0  # the schedule


@dataclass
class Timeline:
    """The scenario's triggers and what they cost."""

    world: World
    follow_ups: bool
    boot: float = BOOT
    ready: float = READY
    delivery: float = DELIVERY
    period: float = PERIOD
    now: float = 0.0
    events: list[tuple[float, int, str, Any]] = field(default_factory=list)
    order: itertools.count[int] = field(default_factory=itertools.count)
    # Counted from `mark()`: SQS messages the reconciler sent, worker invocations by kind.
    sent: int = 0
    invocations: dict[str, int] = field(default_factory=dict)
    names: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.start = self.world.clock()
        reconciler = self.world.reconciler
        reconciler.prober = self._probe
        reconciler.kick = lambda name, delay: self._sent("kick", delay, name)
        reconciler.follow_up = (
            (lambda name, delay, due: self._sent("followup", delay, (name, due))) if self.follow_ups else None
        )

    # -- triggers --

    def at(self, second: float, kind: str, payload: Any = None) -> None:
        heapq.heappush(self.events, (second, next(self.order), kind, payload))

    def schedule(self, phase: float) -> None:
        self.at(phase, "schedule")

    def api_kick(self, name: str) -> None:
        """The api wrote `name`: its kick reaches the worker `delivery` seconds later."""
        self.at(self.now + self.delivery, "kick", name)

    def ec2_event(self, instance_id: str, state: str) -> None:
        """EC2 changed an instance's state now: EventBridge delivers the notification later."""
        self.at(self.now + self.delivery, "ec2", StateChange(instance_id, state))

    def _sent(self, kind: str, delay: int, payload: Any) -> None:
        self.sent += 1
        self.at(self.now + delay + self.delivery, kind, payload)

    def mark(self) -> None:
        self.sent = 0
        self.invocations = {}

    # -- running --

    def advance_to(self, second: float) -> None:
        if second < self.now:
            raise ValueError("time does not go back")
        self.now = second
        self.world.clock.moment = self.start + timedelta(seconds=second)

    def run_until(self, done: Callable[[], bool], limit: float) -> float | None:
        """Play the events in time order until `done()` holds after one (its time), or `limit`."""
        while self.events and self.events[0][0] <= limit:
            second, _, kind, payload = heapq.heappop(self.events)
            self.advance_to(second)
            self._fire(kind, payload)
            if done():
                return second
        self.advance_to(max(self.now, limit))
        return None

    def _fire(self, kind: str, payload: Any) -> None:
        reconciler = self.world.reconciler
        if kind == "schedule":
            reconciler.run_all()
            self.at(self.now + self.period, "schedule")
        else:
            self.invocations[kind] = self.invocations.get(kind, 0) + 1
            if kind == "kick":
                reconciler.run_one(payload)
            elif kind == "followup":
                name, due = payload
                reconciler.run_one(name, followup=due)
            elif kind == "ec2":
                reconciler.instance_changed(payload)
        reconciler.driver = ec2_driver()  # a driver lives for one invocation

    def _probe(self, targets: Sequence[ProbeTarget], budget: float) -> dict[Hashable, ProbeResult]:
        """The app answers `boot + ready` seconds after its replica's launch."""
        answered: dict[Hashable, ProbeResult] = {}
        launched = self._launch_times()
        for target in targets:
            when = launched.get(target.key)
            up = when is not None and self.now >= when + self.boot + self.ready
            answered[target.key] = ProbeResult(target.base_url, up, "HTTP 200" if up else "connection refused")
        return answered

    def _launch_times(self) -> dict[Hashable, float]:
        times: dict[Hashable, float] = {}
        for name in self.names:
            state = self.world.store.load(name)
            for record in state.replicas.values() if state is not None else ():
                if record.launched_at is not None:
                    offset = (from_iso(record.launched_at) - self.start).total_seconds()
                    times[(record.uid, record.replica_id)] = offset
        return times


def new_world(server: ProbeServer, *, balanced: bool) -> World:
    from tests.support.reconciler_world import World

    return World(server, balancer=make_alb() if balanced else None)


def _serving(world: World, name: str, version: int, replicas: int) -> bool:
    """Every replica of `version` READY and registered, nothing else left, the status READY."""
    state = world.store.require(name)
    records = list(state.replicas.values())
    balanced = world.reconciler.balancer is not None
    return (
        len(records) == replicas
        and all(r.version == version and r.status is ReplicaStatus.READY for r in records)
        and all(r.balancer is BalancerState.REGISTERED for r in records if balanced)
        and state.service.status is ServiceStatus.READY
    )


def _create(timeline: Timeline, name: str, replicas: int) -> None:
    from fleetkeeper.spec.service import ServiceSpec
    from tests.support.reconciler_world import spec_dict

    spec = spec_dict(timeline.world.server.port, replicas=replicas)
    timeline.world.commands.create(name, ServiceSpec.model_validate(spec))
    timeline.names.add(name)
    timeline.api_kick(name)


# --- scenarios --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reaction:
    seconds: float | None  # None: it never happened within the scenario's limit
    sent: int = 0  # SQS messages the reconciler sent (follow-ups, drain kicks)
    invocations: int = 0  # worker invocations beyond the schedule's (kicks, follow-ups, EC2 events)
    followups: int = 0  # of which follow-ups (void ones included)


def ready_latency(server: ProbeServer, *, follow_ups: bool, phase: float, extra_boot: float) -> Reaction:
    """App answering -> replica READY and registered: one replica, the schedule at `phase`, an
    instance that boots `extra_boot` seconds later than BOOT (to sweep the follow-ups' cadence)."""
    world = new_world(server, balanced=True)
    timeline = Timeline(world, follow_ups, boot=BOOT + extra_boot)
    timeline.schedule(phase)
    _create(timeline, "web", 1)
    done = timeline.run_until(lambda: _serving(world, "web", 1, 1), 1800)
    [record] = world.store.require("web").replicas.values()
    assert record.launched_at is not None
    answering = (from_iso(record.launched_at) - timeline.start).total_seconds() + timeline.boot + timeline.ready
    return Reaction(
        None if done is None else done - answering,
        timeline.sent,
        sum(timeline.invocations.values()),
        timeline.invocations.get("followup", 0),
    )


def _converged(timeline: Timeline, name: str, replicas: int) -> None:
    done = timeline.run_until(lambda: _serving(timeline.world, name, 1, replicas), 3600)
    assert done is not None, f"{name} never became READY"
    # Let any follow-up still queued land (each finds the service steady and asks for nothing more).
    timeline.run_until(lambda: False, timeline.now + 120)


def rolling_update(server: ProbeServer, *, follow_ups: bool, replicas: int = 10, phase: float = 30) -> Reaction:
    """A rolling update (surge 1, unavailable 0) of `replicas` READY replicas, from the api's write
    to every replica of the new version READY and registered and the old ones gone."""
    world = new_world(server, balanced=True)
    timeline = Timeline(world, follow_ups)
    timeline.schedule(phase)
    _create(timeline, "web", replicas)
    _converged(timeline, "web", replicas)
    timeline.mark()
    start = timeline.now
    world.update("web", replicas=replicas, envs={"RELEASE": "2"})
    timeline.api_kick("web")
    done = timeline.run_until(lambda: _serving(world, "web", 2, replicas), start + 6 * 3600)
    return Reaction(
        None if done is None else done - start,
        timeline.sent,
        sum(timeline.invocations.values()),
        timeline.invocations.get("followup", 0),
    )


def replacement_latency(
    server: ProbeServer, strict: StrictAws, *, follow_ups: bool, events: bool, phase: float, at: float
) -> Reaction:
    """An instance AWS terminates -> its replacement launched, from EC2's event (its time)."""
    world = new_world(server, balanced=False)
    timeline = Timeline(world, follow_ups)
    timeline.schedule(phase)
    _create(timeline, "web", 2)
    _converged(timeline, "web", 2)
    timeline.run_until(lambda: False, timeline.now + at)
    timeline.mark()
    state = world.store.require("web")
    victim = state.replicas[0].instance_id
    assert victim is not None
    ids = set(state.replicas)
    strict.ec2.terminate_by_aws(victim, "Server.InternalError")
    ended = timeline.now
    if events:
        timeline.ec2_event(victim, "shutting-down")

    def replaced() -> bool:
        records = world.store.require("web").replicas.values()
        return any(r.replica_id not in ids and r.instance_id is not None for r in records)

    done = timeline.run_until(replaced, ended + 600)
    return Reaction(
        None if done is None else done - ended,
        timeline.sent,
        sum(timeline.invocations.values()),
        timeline.invocations.get("followup", 0),
    )


def steady_cost(server: ProbeServer, *, hours: float = 1.0) -> tuple[Reaction, int]:
    """A READY service for `hours` of schedule: the reconciler's SQS messages, extra invocations, and
    DynamoDB writes (all three 0: a steady service schedules nothing and writes nothing)."""
    world = new_world(server, balanced=True)
    timeline = Timeline(world, True)
    timeline.schedule(30)
    _create(timeline, "web", 2)
    _converged(timeline, "web", 2)
    timeline.mark()
    mark = world.log.mark()
    timeline.run_until(lambda: False, timeline.now + hours * 3600)
    writes = len([c for c in world.log.mutations(mark) if c[0] == "dynamodb"])
    return Reaction(
        0, timeline.sent, sum(timeline.invocations.values()), timeline.invocations.get("followup", 0)
    ), writes
