"""Request-rate autoscaling: the pure decision (no AWS, no clock, no I/O: `now` is an argument).

`decide(policy, state, rate, now)` takes a service's autoscaler state as the table holds it
(`model.AutoscalerState`), the request rate the load balancer's metric reports, and the time, and
returns the next state: the target the service should run, and the recommendations that later
decisions need. The shell writes it only when it differs (a steady service writes nothing), with a
condition on the state it read, so a reconciler that crashes or is replaced between any two
decisions changes no decision: the next one starts from exactly the state the last one wrote.

The rules (SkyPilot Serve's fields and defaults, Kubernetes HPA's stabilization):

- recommendation = clip(ceil(rate / target_qps_per_replica), min_replicas, max_replicas), except
  that a rate within ±10% of what the current target is sized for (`TOLERANCE`) recommends the
  current target (HPA's tolerance: noise around the threshold changes nothing);
- scale up to the LOWEST recommendation of the last `upscale_delay_seconds`, down to the HIGHEST of
  the last `downscale_delay_seconds`: a change happens only once every recommendation of its window
  agrees, and one noisy sample delays it by at most its own duration instead of resetting a counter
  (SkyPilot issue #4444);
- to zero only when every recommendation of the last `downscale_to_zero_delay_seconds` was zero (when
  set; else the downscale delay applies to zero too);
- at zero replicas, the first requests scale at once (no delay: nothing serves them) straight to
  their recommendation, clip(ceil(rate / target_qps_per_replica)), as SkyPilot's "faster scale up
  when there is no replica" does;
- a target per accelerator (`{A100: 5, L4: 2}`) is SkyPilot's InstanceAwareRequestRateAutoscaler: the
  rate the target version's live replicas serve is the sum of their accelerators' targets; above it,
  as many more replicas as the excess needs at the largest target; below it, the fewest READY
  replicas, largest first, whose targets exceed the rate (`Capacity`); no tolerance (SkyPilot has none);
- before the first recommendation (a new service, a policy just turned on) the window holds the
  current target: nothing moves until a whole window of evidence says so.

Recommendations are kept as change points (the time a recommendation started, the replicas, the
rate that made it), so a steady rate appends nothing; entries that no window reaches any more are
dropped whenever the state is written anyway.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Literal

from fleetkeeper.model import AutoscalerState, Recommendation, from_iso, to_iso

if TYPE_CHECKING:
    from collections.abc import Sequence

    from fleetkeeper.spec.service import ServiceSpec

# HPA's default: a usage ratio within 10% of 1 recommends the current target.
TOLERANCE = 0.1
# The reason's wording: "7.9 req/s > 2 x 3" with a multiplication sign (the rate against what the
# current target is sized for).
TIMES = "\N{MULTIPLICATION SIGN}"
# Rates are kept to the thousandth of a request a second (they are stored; floats are not).
_RATE_DIGITS = 3
# ceil() of a ratio that is a whole number but for float rounding (6.000000001 -> 6, not 7).
_EPSILON = 1e-9


@dataclass(frozen=True)
class ScalingPolicy:
    """The autoscaling part of a target version's spec (`service.replica_policy`)."""

    min_replicas: int
    max_replicas: int
    # One replica's target rate; with `per_accelerator`, the largest of them (what a replica added
    # for excess demand is sized at, as SkyPilot's instance-aware autoscaler does).
    target_qps_per_replica: float
    upscale_delay_seconds: int = 300
    downscale_delay_seconds: int = 1200
    downscale_to_zero_delay_seconds: int | None = None
    # SkyPilot's target per accelerator, (name, rate) pairs; empty: one target for every replica.
    per_accelerator: tuple[tuple[str, float], ...] = ()

    def clip(self, replicas: int) -> int:
        return min(max(replicas, self.min_replicas), self.max_replicas)

    @property
    def longest_window(self) -> int:
        zero = self.downscale_to_zero_delay_seconds or 0
        return max(self.upscale_delay_seconds, self.downscale_delay_seconds, zero)


@dataclass(frozen=True)
class Capacity:
    """For a target per accelerator: the target rate of each of the target version's live replicas
    (provisioning, starting or READY: SkyPilot's `_calculate_total_qps_from_replicas`), and of the READY
    ones (what a scale-down keeps)."""

    live: tuple[float, ...] = ()
    ready: tuple[float, ...] = ()


NO_CAPACITY = Capacity()


def policy_of(spec: ServiceSpec) -> ScalingPolicy | None:
    """The spec's autoscaling policy; None when the spec does not autoscale (fixed replicas)."""
    policy = spec.service.replica_policy
    if policy is None or policy.target_qps_per_replica is None:
        return None
    top = policy.max_replicas if policy.max_replicas is not None else policy.min_replicas
    if top <= policy.min_replicas:
        return None  # SkyPilot's "Fixed N replicas": a target with min_replicas == max_replicas
    targets = policy.target_qps_per_replica
    per_accelerator = tuple(sorted(targets.items())) if isinstance(targets, dict) else ()
    return ScalingPolicy(
        min_replicas=policy.min_replicas,
        max_replicas=top,
        target_qps_per_replica=max(targets.values()) if isinstance(targets, dict) else targets,
        upscale_delay_seconds=policy.upscale_delay_seconds,
        downscale_delay_seconds=policy.downscale_delay_seconds,
        downscale_to_zero_delay_seconds=policy.downscale_to_zero_delay_seconds,
        per_accelerator=per_accelerator,
    )


def replica_target(policy: ScalingPolicy, accelerator: str | None) -> float:
    """One replica's target rate on an instance with `accelerator`: its own target; one the targets do
    not name (a stored spec, an instance type the catalogue does not know) counts at the smallest, as
    SkyPilot's `_get_target_qps_for_gpu_type` falls back."""
    if not policy.per_accelerator:
        return policy.target_qps_per_replica
    targets = dict(policy.per_accelerator)
    return targets.get(accelerator or "", min(targets.values()))


def current_target(policy: ScalingPolicy, state: AutoscalerState | None) -> int:
    """The replicas to run now: the autoscaled target (within the policy's bounds), else the minimum."""
    return policy.clip(state.target) if state is not None else policy.min_replicas


def recommend(policy: ScalingPolicy, rate: float, current: int, capacity: Capacity = NO_CAPACITY) -> int:
    """The replicas `rate` requests a second call for, given the `current` target (its tolerance), or
    with a target per accelerator, given what the live replicas serve (`capacity`)."""
    if policy.per_accelerator:
        return policy.clip(_instance_aware(policy, rate, capacity))
    if current > 0:
        usage = rate / (policy.target_qps_per_replica * current)
        if abs(usage - 1.0) <= TOLERANCE:
            return policy.clip(current)
    return policy.clip(math.ceil(rate / policy.target_qps_per_replica - _EPSILON))


def _instance_aware(policy: ScalingPolicy, rate: float, capacity: Capacity) -> int:
    """SkyPilot's InstanceAwareRequestRateAutoscaler: more replicas at the largest target for the rate
    the live ones do not serve; else the fewest READY ones (largest first) that serve more than it."""
    served = sum(capacity.live)
    if rate >= served:
        return len(capacity.live) + math.ceil((rate - served) / policy.target_qps_per_replica - _EPSILON)
    count, total = 0, 0.0
    for target in sorted(capacity.ready, reverse=True) or [policy.target_qps_per_replica]:
        count, total = count + 1, total + target
        if total > rate:
            break
    return count


def decide(
    policy: ScalingPolicy,
    state: AutoscalerState | None,
    rate: float | None,
    now: datetime,
    capacity: Capacity = NO_CAPACITY,
) -> AutoscalerState | None:
    """The autoscaler's next state; `state` itself (the same object) when nothing changed.

    `rate`: requests a second over the last metric window (0 after windows without a data point), or
    None when there is no reading this run (no endpoint yet, the metric could not be read, its newest
    data point may be late: metrics.RequestRates.read): then nothing changes.
    """
    if rate is None:
        return state
    rate = round(max(rate, 0.0), _RATE_DIGITS)
    target = current_target(policy, state)
    before = state.history if state is not None else ()
    recommended = recommend(policy, rate, target, capacity)
    history = before
    if not history or history[-1].replicas != recommended:
        entry = Recommendation(at=to_iso(now), replicas=recommended, rate=rate)
        # Two decisions at the same instant: the later one is what held from then on.
        kept = history[:-1] if history and history[-1].at == entry.at else history
        history = (*kept, entry)
    # The first requests at zero replicas: their recommendation at once (nothing serves them meanwhile).
    at_zero = target == 0 and rate > 0
    new_target = max(recommended, policy.clip(1)) if at_zero else _stabilized(policy, history, target, now)
    if state is not None and new_target == state.target and history == before:
        return state  # steady: nothing to write
    return AutoscalerState(
        target=new_target, history=_prune(history, policy, now), rev=state.rev if state is not None else 0
    )


def _stabilized(policy: ScalingPolicy, history: Sequence[Recommendation], target: int, now: datetime) -> int:
    up = min(_window(policy, history, target, now, policy.upscale_delay_seconds))
    down = max(_window(policy, history, target, now, policy.downscale_delay_seconds))
    zero_delay = policy.downscale_to_zero_delay_seconds
    if zero_delay is not None:
        if max(_window(policy, history, target, now, zero_delay)) == 0:
            down = 0
        elif down == 0:
            down = 1  # zero only after its own delay; down to one meanwhile
    if up > target:
        return up
    if down < target:
        return down
    return target


def _window(
    policy: ScalingPolicy, history: Sequence[Recommendation], target: int, now: datetime, seconds: int
) -> list[int]:
    """Every recommendation in effect at some time of [now - seconds, now], within today's bounds.
    Time before the first recommendation counts as the current target."""
    start = now - timedelta(seconds=seconds)
    values: list[int] = []
    if not history or from_iso(history[0].at) > start:
        values.append(target)
    for index, entry in enumerate(history):
        if index + 1 < len(history) and from_iso(history[index + 1].at) <= start:
            continue  # over before the window began
        values.append(policy.clip(entry.replicas))
    return values


def _prune(history: Sequence[Recommendation], policy: ScalingPolicy, now: datetime) -> tuple[Recommendation, ...]:
    """Drop the recommendations that ended before the longest window begins (no window reaches them)."""
    start = now - timedelta(seconds=policy.longest_window)
    first = 0
    while first + 1 < len(history) and from_iso(history[first + 1].at) <= start:
        first += 1
    return tuple(history[first:])


# --- what the autoscaler is about to do (the api's view, `fleetkeeper status`) ------------------------


@dataclass(frozen=True)
class Pending:
    """The next change the autoscaler will make if the rate stays where it is."""

    direction: Literal["up", "down"]
    replicas: int
    at: datetime
    reason: str

    def describe(self, now: datetime) -> str:
        """E.g. "scaling up to 3 in 2m: 7.9 req/s > 2 x 3" (with a multiplication sign)."""
        return f"scaling {self.direction} to {self.replicas} {_when(self.at, now)}: {self.reason}"


def pending(policy: ScalingPolicy, state: AutoscalerState | None, now: datetime) -> Pending | None:
    """When, and to what, the target changes next if the recommendation stays the last one.

    Exact for an unchanging rate: the decision is evaluated at every time a recommendation leaves
    one of the windows, and the first that changes the target is the answer.
    """
    if state is None or not state.history:
        return None
    target = current_target(policy, state)
    last = state.history[-1]
    if target == 0 and last.rate > 0:
        replicas = max(recommend(policy, last.rate, 0), policy.clip(1))
        return Pending("up", replicas, now, _reason(policy, last.rate, target, ">"))
    history = state.history
    delays = {policy.upscale_delay_seconds, policy.downscale_delay_seconds}
    if policy.downscale_to_zero_delay_seconds is not None:
        delays.add(policy.downscale_to_zero_delay_seconds)
    ends = [from_iso(entry.at) for entry in history]  # each entry's start is the previous one's end
    moments = sorted({end + timedelta(seconds=delay) for end in ends for delay in delays} | {now})
    for moment in moments:
        if moment < now:
            continue
        replicas = _stabilized(policy, history, target, moment)
        if replicas != target:
            up = replicas > target
            direction: Literal["up", "down"] = "up" if up else "down"
            return Pending(direction, replicas, moment, _reason(policy, last.rate, target, ">" if up else "<"))
    return None


def _reason(policy: ScalingPolicy, rate: float, target: int, sign: str) -> str:
    if policy.per_accelerator:
        targets = ", ".join(f"{name}: {_number(value)}" for name, value in policy.per_accelerator)
        return f"{_number(rate)} req/s {sign} what {target} replica(s) serve ({targets} each)"
    return f"{_number(rate)} req/s {sign} {_number(policy.target_qps_per_replica)} {TIMES} {target}"


def _number(value: float) -> str:
    """A rate as every rate is printed (here and by the CLI): one decimal, without a trailing `.0`."""
    text = f"{value:.1f}".removesuffix(".0")
    return "0" if text == "-0" else text


def _when(at: datetime, now: datetime) -> str:
    seconds = math.ceil((at - now).total_seconds())
    if seconds <= 0:
        return "at the next run"
    if seconds < 120:
        return f"in {seconds}s"
    return f"in {round(seconds / 60)}m"


def without_rev(state: AutoscalerState | None) -> AutoscalerState | None:
    """The state as the decision sees it (the store's revision aside): for comparing traces."""
    return replace(state, rev=0) if state is not None else None
