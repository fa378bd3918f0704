"""A run's probe phase: which replicas it probes, with what, and for how long.

Every replica the plan wants judged (plan.probe_targets) whose instance has an address is probed at
once (fleetkeeper.reconciler.probe), its readiness probe's `$NAME`s filled from the version's envs
and secrets (`ProbeSecrets`). Probes whose timeout the run's probe budget holds are the run's own
phase; longer ones ("long probes") start with it on a thread of their own and are planned in a
second pass (fleetkeeper.reconciler.run), so they cost the run no time of its critical path.
"""

from __future__ import annotations

import contextvars
import logging
import math
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from fleetkeeper.aws import DeadlineReached
from fleetkeeper.reconciler.plan import ProbeResult, probe_targets
from fleetkeeper.reconciler.probe import ProbeTarget, rotated
from fleetkeeper.settings import MAX_PROBE_TIMEOUT_SECONDS, PROBE_HEADROOM_SECONDS

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
    from datetime import datetime

    from fleetkeeper.model import ServiceState, VersionRecord
    from fleetkeeper.reconciler.budget import ShardBudget
    from fleetkeeper.reconciler.driver import Instance, ReplicaDriver
    from fleetkeeper.spec.service import ReadinessProbe

    # Probes these targets within so many seconds: a verdict by target key (probe.probe_all).
    Prober = Callable[[Sequence[ProbeTarget], float], dict[Hashable, ProbeResult]]

logger = logging.getLogger(__name__)


class SecretsUnreadable(Exception):
    """A probe that names a secret (`$TOKEN` in a header) whose values could not be read."""


@dataclass
class ProbeSecrets:
    """The readiness probes of one run with `$NAME`s filled from envs and secrets. A version whose
    probe names a secret costs one Parameter Store read per run (values are never kept longer)."""

    table_name: str
    _values: dict[tuple[str, str], dict[str, str] | str] = field(default_factory=dict)

    def probe(self, service: str, version: VersionRecord, owner: str = "") -> ReadinessProbe:
        spec = version.spec
        if not spec.probe_needs_secrets or version.secrets_ref is None:
            return spec.probe_for({})
        key = (version.uid, version.secrets_ref)
        if key not in self._values:
            from fleetkeeper.replicas.secrets import SecretStore, parameter_prefix

            try:
                self._values[key] = SecretStore(parameter_prefix(self.table_name)).get(
                    service, version.uid, version.secrets_ref, owner
                )
            except DeadlineReached:
                raise  # not the secrets' fault: no status may say they could not be read
            except Exception as exc:
                code = getattr(exc, "response", {}).get("Error", {}).get("Code") or type(exc).__name__
                logger.warning("service %s: the secrets its readiness probe names could not be read: %s", service, code)
                # Deterministic (a status message shows it): the error code, never a value.
                self._values[key] = f"the secrets the readiness probe names could not be read ({code})"
        values = self._values[key]
        if isinstance(values, str):
            raise SecretsUnreadable(values)
        return spec.probe_for(values)


@dataclass
class ProbePhase:
    """One run's probes: made through `prober`, addressed through `driver`, secrets read from the
    parameters of `table_name`'s stack."""

    driver: ReplicaDriver
    prober: Prober
    table_name: str

    def run(
        self,
        states: Iterable[ServiceState],
        by_uid: Mapping[str, Sequence[Instance]],
        now: datetime,
        budget_seconds: float,
        invocation_seconds: float = math.inf,
    ) -> tuple[dict[tuple[str, int], ProbeResult], Future[dict[Hashable, ProbeResult]] | None]:
        """The verdicts of the probes that fit the run's probe budget, and the long probes started
        (those whose timeout does not fit it), running in the background until their own timeouts or
        what the invocation can give them, whichever comes first."""
        targets, unprobed, probed = self._targets(states, by_uid)
        # Long: a timeout the run's probe budget is not made to hold (settings keep the budget at
        # least MAX_PROBE_TIMEOUT_SECONDS plus a probe's headroom).
        long = [t for t in targets if t.probe.timeout_seconds > MAX_PROBE_TIMEOUT_SECONDS]
        targets = [t for t in targets if t.probe.timeout_seconds <= MAX_PROBE_TIMEOUT_SECONDS]
        pending = self._start_long_probes(long, now, invocation_seconds)
        if not targets or budget_seconds <= 0:
            # No time to probe: this run plans without verdicts (no replica changes state), except
            # for the probes that could not be made at all.
            return unprobed, pending
        # Probes start in this order: rotated by the run's time so that, when there are more probes
        # than the budget lets finish, it is not the same replicas that go without a verdict.
        results = self.prober(rotated(targets, now), budget_seconds)
        # The run's phase holds every short probe's timeout: one it cut was queued behind hung ones, a
        # failed probe (a READY replica that cannot answer in time is not ready).
        answered = {key: replace(result, answered=True) for key, result in results.items() if isinstance(key, tuple)}
        return {**unprobed, **self._diagnosed(answered, probed)}, pending

    def _targets(
        self, states: Iterable[ServiceState], by_uid: Mapping[str, Sequence[Instance]]
    ) -> tuple[list[ProbeTarget], dict[tuple[str, int], ProbeResult], dict[tuple[str, int], Instance]]:
        """What to probe (keyed by (uid, replica id)), the failed verdicts of probes that could not be
        made (their secrets unreadable), and the instance of each target."""
        targets: list[ProbeTarget] = []
        unprobed: dict[tuple[str, int], ProbeResult] = {}
        probed: dict[tuple[str, int], Instance] = {}
        secrets = ProbeSecrets(self.table_name)
        for state in states:
            for replica_id, instance in probe_targets(state, list(by_uid.get(state.service.uid, []))).items():
                version = state.versions.get(state.replicas[replica_id].version)
                if version is None:
                    continue
                base_url = self.driver.base_url(instance, version.spec.port)
                if base_url is not None:
                    key = (state.service.uid, replica_id)
                    try:
                        probe = secrets.probe(state.service.name, version, state.service.owner)
                    except SecretsUnreadable as exc:
                        unprobed[key] = ProbeResult(url=base_url, ok=False, detail=str(exc))
                        continue
                    targets.append(ProbeTarget(key, base_url, probe))
                    probed[key] = instance
        return targets, unprobed, probed

    def _diagnosed(
        self, answered: dict[tuple[str, int], ProbeResult], probed: Mapping[tuple[str, int], Instance]
    ) -> dict[tuple[str, int], ProbeResult]:
        """A driver that can tell why a replica does not answer (the process driver: an app listening
        on another port than its $PORT) says so instead of "connection refused"."""
        diagnose = getattr(self.driver, "diagnose", None)
        if diagnose is None:
            return answered
        for key, result in answered.items():
            hint = None if result.ok or key not in probed else diagnose(probed[key])
            if hint:
                answered[key] = replace(result, detail=hint)
        return answered

    def _start_long_probes(
        self, long: Sequence[ProbeTarget], now: datetime, invocation_seconds: float
    ) -> Future[dict[Hashable, ProbeResult]] | None:
        """The probes too long for the run's probe budget, started now on a thread of their own (the
        prober's pool under it), so the run goes on to its services meanwhile. Their phase lasts the
        longest of their timeouts (plus a probe's headroom), never more than the invocation can give:
        a hung replica's probe ends at its own timeout, and the phase at that bound, with "no verdict"
        for what is left, as in the run's own phase. None: no long probe, or no time for one."""
        if not long:
            return None
        seconds = min(max(t.probe.timeout_seconds for t in long) + PROBE_HEADROOM_SECONDS, invocation_seconds)
        if seconds <= 0:
            return None  # no verdicts: nothing changes for these replicas this run
        starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="long-probes")
        try:
            return starter.submit(
                contextvars.copy_context().run, long_verdicts, self.prober, rotated(long, now), seconds, now
            )
        finally:
            starter.shutdown(wait=False)


def by_service(
    results: Mapping[tuple[str, int], ProbeResult] | Mapping[Hashable, ProbeResult],
) -> dict[str, dict[int, ProbeResult]]:
    """Verdicts keyed (uid, replica id), grouped by uid: what each service's plan is given."""
    grouped: dict[str, dict[int, ProbeResult]] = {}
    for key, result in results.items():
        if isinstance(key, tuple):
            grouped.setdefault(key[0], {})[key[1]] = result
    return grouped


def long_verdicts(
    prober: Prober,
    targets: Sequence[ProbeTarget],
    seconds: float,
    started: datetime,
) -> dict[Hashable, ProbeResult]:
    """The long probes' verdicts, each judged at the moment it was sent (the plan that records them
    runs later, in the second pass). A probe the phase cut before its own timeout is no verdict (not a
    failed probe): the run had no more time for it, and its service's follow-up (a run of its own, with
    the whole invocation) probes it again."""
    verdicts = prober(targets, seconds)
    timeouts = {target.key: target.probe.timeout_seconds for target in targets}
    out: dict[Hashable, ProbeResult] = {}
    for key, result in verdicts.items():
        # Cut by a phase shorter than its timeout: no verdict. Cut by one that held its timeout: failed.
        held = timeouts.get(key, 0) + PROBE_HEADROOM_SECONDS <= seconds
        out[key] = replace(result, started_at=started, answered=result.answered or held)
    return out


def invocation_seconds(budget: ShardBudget | None) -> float:
    """How long the long probes may run: what the invocation has left after the service margin (a
    worker's ShardBudget); unbounded without one (a single process: the embedded mode, the tests, where
    each probe's own timeout bounds them)."""
    if budget is None:
        return math.inf
    return max(0.0, budget.remaining() - budget.service_margin)
