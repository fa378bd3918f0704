"""The simulation engine: one seed, many interleaved steps, the invariants after each
(docs/architecture/invariants.md).

Everything is driven by the seed and nothing by the wall clock:

- `Simulation.rng` (steps, their arguments, probe verdicts), the strict layer's RNG (drawn faults),
  moto's id generator (`mock_random`), the service uids (`keys.new_uid` replaced by a counter) and
  Python's global `random` (botocore's retry jitter) are all seeded from it;
- time is the strict layer's `VirtualClock`: the reconciler's `now`, moto's LaunchTime, describe
  lag, Lambda deadlines and botocore's retry pauses all read it;
- probes never touch a socket: the Reconciler's `prober` answers from the simulation's model (a
  version's readiness path says whether it is healthy);
- concurrency is explicit: two reconciler runs interleave by pausing one at its k-th AWS call (a
  botocore `before-call` hook) while the other runs to completion, so only one thread ever runs;
- the kick queue is modelled: the reconciler's follow-ups (delayed kicks) and EC2's state-change
  notifications (when AWS terminates an instance) are delivered when due, or late, twice, or never,
  drawn from an RNG of their own (the seeds' other steps stay what they were); a follow-up later
  than a period past its due time is dropped, as the worker drops it.

The invariants read moto's backends directly (never through botocore), so checking draws no fault
and moves no clock.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import logging
import random
import threading
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import TYPE_CHECKING, Any

import time_machine
from botocore.exceptions import ClientError

from fleetkeeper import aws
from fleetkeeper.model import Interruption, InterruptionKind, ReplicaStatus, ServiceStatus, VersionState, to_iso
from fleetkeeper.reconciler.budget import ShardBudget
from fleetkeeper.reconciler.driver import MANAGED_TAG, REPLICA_TAG, SERVICE_TAG, STACK_TAG, UID_TAG, VERSION_TAG
from fleetkeeper.reconciler.fanout import rotated
from fleetkeeper.reconciler.plan import Policy, ProbeResult
from fleetkeeper.reconciler.state_changes import StateChange
from fleetkeeper.settings import DEFAULT_STACK_ID
from fleetkeeper.store.codec import from_raw, state_from_items
from fleetkeeper.store.errors import Contention
from tests.strict_aws import STATE_REASONS, Fault, FaultRates, LambdaTimeout, StrictAws
from tests.support import TABLE
from tests.support.cleanup_support import CleanupContext, lambda_record
from tests.support.handler_client import HandlerClient, HttpResult
from tests.support.moto_tuning import default_amis, share_stream_records
from tests.support.reconciler_world import ec2_driver, is_mutation

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterator, Sequence

    from fleetkeeper.model import ServiceState
    from fleetkeeper.reconciler.probe import ProbeTarget
    from fleetkeeper.reconciler.report import RunReport

NAMES = ("alpha", "beta", "gamma")
BASE = datetime(2026, 1, 1, tzinfo=UTC)
REGION = "us-east-1"
LIVE_STATES = {"pending", "running", "stopping", "stopped"}
LEAVING = {
    ReplicaStatus.SHUTTING_DOWN,
    ReplicaStatus.FAILED_PROVISION,
    ReplicaStatus.FAILED_INITIAL_DELAY,
    ReplicaStatus.FAILED_PROBING,
    ReplicaStatus.PREEMPTED,
}
# A second stack of the template in the same account and Region (seeds run with `stacks=2`): its own
# table, its own id, services of the same names; the simulated stack never touches its instances,
# nor it the simulated stack's (invariant 11). The simulated stack is the tests' default id.
MAIN_STACK = DEFAULT_STACK_ID
NEIGHBOUR_STACK = "neighbour"
NEIGHBOUR_TABLE = "fleetkeeper-neighbour"
# Readiness paths: the model's verdict for every replica of a version (no HTTP anywhere).
GOOD, BAD, HUNG = "/ok", "/fail", "/hang"

# Known defects being fixed elsewhere: a failure classified as one of these is expected (xfail).
# Both that the simulation first found are fixed (api 5xx on contention -> 503 + Retry-After; a torn
# read of the target version -> "not observed"), so none is expected now and either one fails a seed.
# A new finding that cannot be fixed at once goes here, named, until it is.
KNOWN_DEFECTS: dict[str, str] = {}


# Invariants a known defect can break later on (the final state after a version wrongly FAILED).
CONSEQUENCES = {"final-state", "converges"}


class SimCrash(BaseException):
    """The reconciler's process dies at an AWS call (not an Exception: nothing in the shell catches it)."""


# The error code botocore raises for a fault the strict layer answered, by the fault's kind, where
# they differ: a throttle's or a refusal's kind is its code, a transaction conflict cancels the whole
# transaction. Kinds with a colon (`denied:...` by IAM, `model:...` by the service model, `hang:...`)
# are findings about fleetkeeper (a missing permission, a malformed request, an unreachable
# endpoint), never AWS's bad luck: a run that fails on one fails its seed.
_CODE_OF_FAULT = {"TransactionConflict": "TransactionCanceledException"}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception it was raised from or while handling (`__cause__`, `__context__`)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]


class _LoggedExceptions(logging.Handler):
    """The exceptions fleetkeeper's code logs (with `exc_info`) on one thread: what it caught and
    went on from, as the shell does for one service's failure."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()
        self.caught: list[BaseException] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread and record.exc_info and record.exc_info[1] is not None:
            self.caught.append(record.exc_info[1])


@contextlib.contextmanager
def _logged_exceptions() -> Iterator[list[BaseException]]:
    handler = _LoggedExceptions()
    logger = logging.getLogger("fleetkeeper")
    logger.addHandler(handler)
    try:
        yield handler.caught
    finally:
        logger.removeHandler(handler)


def injected_fault(exc: BaseException, faults: Sequence[Fault]) -> Fault | None:
    """The injected fault `exc` comes from: an AWS error in its chain whose operation and code are
    those of a fault among `faults` (the ones injected while it ran), or the store's `Contention` on
    a torn read when a read was torn. None: `exc` is a bug."""
    for error in _chain(exc):
        if isinstance(error, Contention) and error.reason.startswith("torn read"):
            # A torn read is a successful answer, only incomplete: no AWS error, the store's own.
            torn = next((fault for fault in faults if fault.kind == "TornRead"), None)
            if torn is not None:
                return torn
        if not isinstance(error, ClientError):
            continue
        code = error.response.get("Error", {}).get("Code")
        for fault in faults:
            if ":" in fault.kind or fault.operation != error.operation_name:
                continue
            if _CODE_OF_FAULT.get(fault.kind, fault.kind) == code:
                return fault
    return None


class Violation(AssertionError):
    def __init__(self, invariant: str, detail: str, known: str | None = None) -> None:
        super().__init__(f"[{invariant}] {detail}")
        self.invariant = invariant
        self.detail = detail
        # Only a defect still listed as known is excused; a fixed one that comes back is a failure.
        self.known = known if known in KNOWN_DEFECTS else None


class SimulationFailure(AssertionError):
    """A violated invariant, with everything needed to replay it."""

    def __init__(self, seed: int, steps: list[str], violation: Violation) -> None:
        self.seed = seed
        self.steps = steps
        self.violation = violation
        self.known = violation.known
        listing = "\n".join(f"  {n:3d}. {s}" for n, s in enumerate(steps, 1))
        super().__init__(
            f"simulation seed {seed} failed at step {len(steps)}: {violation}\n"
            f"replay: SIM_SEED={seed} .venv/bin/python -m pytest tests/simulation/test_simulation.py -p no:xdist\n"
            f"steps:\n{listing}"
        )


@dataclass
class Expected:
    """The last accepted API write for a name: what the final state must match."""

    deleted: bool = True
    uid: str = ""
    target: int = 0
    specs: dict[int, dict[str, Any]] = field(default_factory=dict)
    generation: int = 0


@dataclass(frozen=True)
class _TableView:
    """What `Simulation._view` decoded from moto's table, and the state of the table it read."""

    table: Any
    shard: Any
    mark: tuple[int, int]
    items: list[dict[str, Any]]
    states: dict[str, ServiceState]


class _Hooks:
    """botocore `before-call` on fleetkeeper's clients: counts calls per thread, crashes or pauses
    a thread at its k-th call, and records every call (for the steady-state check)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.per_thread: Counter[int] = Counter()
        self.crash_at: dict[int, int] = {}
        self.pause_at: dict[int, tuple[int, threading.Event, threading.Event]] = {}

    def attach(self) -> None:
        for client in (aws.dynamodb(), aws.ec2(), aws.ssm()):
            client.meta.events.register("before-call", self.before)

    def before(self, model: Any, **_: Any) -> None:
        me = threading.get_ident()
        self.calls.append((model.service_model.service_name, model.name))
        self.per_thread[me] += 1
        number = self.per_thread[me]
        if self.crash_at.get(me) == number:
            del self.crash_at[me]
            raise SimCrash(f"crash before AWS call {number} ({model.name})")
        pause = self.pause_at.get(me)
        if pause is not None and pause[0] == number:
            del self.pause_at[me]
            pause[1].set()
            pause[2].wait()

    def start(self) -> None:
        self.per_thread[threading.get_ident()] = 0


def service_message(state: ServiceState) -> str:
    return state.service.status_message or ""


@cache
def _cleanup_patterns() -> list[dict[str, Any]]:
    """The cleanup mapping's FilterCriteria, from template.yaml as CloudFormation receives it."""
    from fleetkeeper.aws.eventfilter import patterns_of
    from tests.support.cfn import refers_to, resources_of_type, translate

    mappings = [
        body["Properties"]
        for body in resources_of_type(translate(), "AWS::Lambda::EventSourceMapping").values()
        if refers_to(body["Properties"]["FunctionName"], "CleanupFunction")
    ]
    return patterns_of(mappings[0]["FilterCriteria"])


class Simulation:
    """One seed's world. `run(steps)` plays `steps` random steps, then the final convergence."""

    def __init__(self, seed: int, *, stacks: int = 1) -> None:
        self.seed = seed
        self.stacks = stacks
        self.rng = random.Random(seed)
        # The neighbouring stack's steps draw from an RNG of their own: one stack's seeds stay what they were.
        self.neighbourly = random.Random(seed ^ 0x57AC)
        self.acting_stack = MAIN_STACK  # whose run is making the AWS calls now
        self.trespasses: list[str] = []  # a stack's terminate or tag call on another stack's instance
        self.neighbour_deleted = False
        self.warnings = random.Random(seed ^ 0x5B07)
        rates = FaultRates(
            throttle=self.rng.choice([0.0, 0.01, 0.03]),
            torn_read=self.rng.choice([0.0, 0.0, 0.05, 0.15]),
            transaction_conflict=self.rng.choice([0.0, 0.02, 0.05]),
            write_conflict=self.rng.choice([0.0, 0.02]),
        )
        self.rates = rates
        self.strict = StrictAws(seed=seed, faults=rates)
        self.policy = Policy()
        self.api = HandlerClient()
        self.hooks = _Hooks()
        self.steps: list[str] = []
        self.expected: dict[str, Expected] = {name: Expected() for name in NAMES}
        self.deleted_uids: dict[str, str] = {}  # uid -> name, once a delete was accepted
        self.removed_at: dict[str, float] = {}  # uid -> virtual time its service item was seen gone
        self.cleaned: set[str] = set()  # uids whose REMOVE record a cleanup handled successfully
        self.blame: Counter[tuple[str, int]] = Counter()  # (uid, version) -> VERSION-cause kills injected
        self.full_runs_at: list[float] = []  # virtual times of scheduled runs that completed
        self.seen_records: set[str] = set()
        self.pending: list[dict[str, Any]] = []  # admitted REMOVE records not yet handled
        self.delivered: list[dict[str, Any]] = []
        self.unmanaged = ""
        self._stream_read = 0  # records of moto's stream shard already read
        self._uids = itertools.count(1)
        self._live_before: dict[Any, int] = {}
        self._table_view: _TableView | None = None
        self.known_failed: set[tuple[str, int]] = set()
        self.known_hits: list[Violation] = []  # known defects met on the way (the run goes on)
        self.reclaims: list[tuple[float, str]] = []  # (virtual time, instance id): AWS takes it back then
        # The kick queue: follow-ups and EC2's state changes, (virtual time due, order, kind, payload).
        self.kicks = random.Random(seed ^ 0xF0110)
        self.queued: list[tuple[float, int, str, Any]] = []
        self._queue_order = itertools.count()
        self.followups_sent: dict[tuple[str, int], list[int]] = {}  # (name, due) -> when sent
        self.followup_problems: list[str] = []

    # -- the run --

    def run(self, steps: int) -> None:
        with self._world():
            try:
                for _ in range(steps):
                    self._step()
                    self._check()
                self._finish()
            except Violation as violation:
                if violation.known is None and self.known_hits and violation.invariant in CONSEQUENCES:
                    # What a known defect left behind (a wrongly FAILED version stays FAILED).
                    violation.known = self.known_hits[0].known
                raise SimulationFailure(self.seed, self.steps, violation) from None
        if self.known_hits:
            # Only known defects (other branches are fixing them): the seed fails as that defect.
            raise SimulationFailure(self.seed, self.steps, self.known_hits[0])

    @contextlib.contextmanager
    def _world(self) -> Iterator[None]:
        import os

        import moto.ec2.models.instances as moto_instances
        from moto import mock_aws
        from moto.moto_api._internal import mock_random

        from fleetkeeper.local.template import create_table
        from fleetkeeper.store import keys

        saved_env = {k: os.environ.get(k) for k in ("TABLE_NAME", "FLEETKEEPER_REPLICA_HOST")}
        saved_utcnow, saved_uid = moto_instances.utcnow, keys.new_uid
        # moto's TransactWriteItems backs up the tables it touches, stream shard included: a copy
        # that would grow with the seed's history, were the records not shared (tests/support/moto_tuning.py).
        share_stream_records()
        saved_random = random.getstate()
        random.seed(self.seed)  # botocore's retry jitter draws from the global RNG
        # botocore fills idempotency tokens (TransactWriteItems' ClientRequestToken) with uuid4, from
        # the OS's entropy: drawn from the seed instead, so the requests replay byte for byte.
        saved_uuid4 = uuid.uuid4
        tokens = random.Random(self.seed)
        uuid.uuid4 = lambda: uuid.UUID(int=tokens.getrandbits(128), version=4)
        mock_random.seed(self.seed)
        os.environ["TABLE_NAME"] = TABLE
        os.environ.pop("FLEETKEEPER_REPLICA_HOST", None)
        moto_instances.utcnow = lambda: self.now().replace(tzinfo=None)  # type: ignore[attr-defined]
        keys.new_uid = lambda: f"{self.seed % 2**32:08x}{next(self._uids):08x}"  # type: ignore[assignment]
        aws.reset_clients()
        try:
            # moto's full set of AMIs: each draws ids from moto's RNG (tests/support/moto_tuning.py).
            with default_amis(), mock_aws():
                # moto re-creates a region's backend when a mock stops, drawing its default VPC's ids
                # then (issue getmoto/moto#6592: the backends stay cached), so the backend a later
                # seed starts with was drawn outside its seed. Made here, then made again from the seed.
                from moto.core import DEFAULT_ACCOUNT_ID
                from moto.ec2.models import ec2_backends

                ec2_backends[DEFAULT_ACCOUNT_ID][REGION]
                mock_random.seed(self.seed)
                ec2_backends[DEFAULT_ACCOUNT_ID][REGION].reset()
                # Set up on plain moto: the layer's RNG is drawn only by the simulation's steps.
                import boto3

                create_table(aws.dynamodb(), TABLE)
                made = boto3.client("ec2", region_name=REGION).run_instances(
                    ImageId="ami-12345678", MinCount=1, MaxCount=1
                )
                self.unmanaged = made["Instances"][0]["InstanceId"]
                if self.stacks > 1:
                    self._neighbour_setup()  # on plain moto too, as the simulated stack's table
                # The process's wall clock is the simulation's too: the api's timestamps, Powertools'
                # idempotency expiry, moto's own dates and botocore's adaptive rate limiter (its token
                # bucket refills by `time.time()`) read it, so a seed replays call for call. The
                # clients are made inside, so their limiters start on that clock.
                with time_machine.travel(self.now(), tick=False) as traveller, self.strict.active():
                    self.hooks.attach()
                    aws.ec2().meta.events.register("before-parameter-build.ec2.TerminateInstances", self._guard)
                    aws.ec2().meta.events.register("before-parameter-build.ec2.CreateTags", self._guard)
                    moved = lambda seconds: traveller.move_to(BASE + timedelta(seconds=seconds))  # noqa: E731
                    self.strict.clock.listeners.append(moved)
                    try:
                        yield
                    finally:
                        self.strict.clock.listeners.remove(moved)
        finally:
            aws.reset_clients()
            moto_instances.utcnow = saved_utcnow  # type: ignore[attr-defined]
            keys.new_uid = saved_uid  # type: ignore[assignment]
            random.setstate(saved_random)
            uuid.uuid4 = saved_uuid4
            for key, value in saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def now(self) -> datetime:
        return BASE + timedelta(seconds=self.strict.clock.time())

    def _log(self, text: str) -> None:
        self.steps.append(f"t={self.strict.clock.time():.0f}s {text}")

    # -- steps --

    def _step(self) -> None:
        kinds: list[tuple[Callable[[], None], int]] = [
            (self._api_create, 8),
            (self._api_update, 8),
            (self._api_rollback, 3),
            (self._api_delete, 4),
            (self._api_invalid, 3),
            (self._run_scheduled, 14),
            (self._run_kick, 8),
            (self._run_crashed, 5),
            (self._run_timed_out, 3),
            (self._run_interleaved, 5),
            (self._cleanup, 8),
            (self._fault, 10),
            (self._clock_jump, 3),
        ]
        self._reclaim_due()
        if self.queued and self.kicks.random() < 0.6:
            self._deliver_kicks()
        if self.stacks > 1 and self.neighbourly.random() < 0.3:
            self._neighbour_step()
            self._check()
        # EC2's warnings draw from an RNG of their own: the seeds' other steps stay what they were.
        if self.warnings.random() < 0.04:
            self._interrupt()
            self._check()
        choice = self.rng.choices([k for k, _ in kinds], weights=[w for _, w in kinds])[0]
        choice()

    def _spec(self) -> dict[str, Any]:
        health = self.rng.choices([GOOD, BAD, HUNG], weights=[8, 2, 1])[0]
        mode = self.rng.choices(["rolling", "blue_green"], weights=[4, 1])[0]
        surge = self.rng.choice([0, 1, 2]) if mode == "rolling" else 1
        unavailable = self.rng.choice([0, 1]) if surge else 1
        return {
            "service": {
                "readiness_probe": {
                    "path": health,
                    # A good version always answers long before its deadline; a bad one fails fast.
                    "initial_delay_seconds": 1800 if health == GOOD else 120,
                    "timeout_seconds": 5,
                },
                "replicas": self.rng.choice([1, 2, 3]),
                "ports": 8080,
            },
            "resources": {"instance_type": "t3.micro", "use_spot": self.rng.random() < 0.3},
            "run": "python3 -m http.server $PORT",
            "envs": {"RELEASE": str(self.rng.randrange(1000))},
            "update": {"mode": mode, "max_surge": surge, "max_unavailable": unavailable},
        }

    def _call_api(self, label: str, method: str, path: str, body: Any = None, **kw: Any) -> HttpResult:
        before = len(self.strict.faults_injected)
        with self.strict.acting_as("api"):
            result = self.api.call(method, path, body, **kw)
        faults = {f.kind for f in self.strict.faults_injected[before:]}
        self._log(f"api {label} {method} {path} -> {result.status} (faults: {sorted(faults) or '-'})")
        if result.status >= 500:
            contention = faults & {
                "TransactionConflict",
                "ProvisionedThroughputExceededException",
                "ThrottlingException",
            }
            contention |= {k for k in faults if "onflict" in k}
            if result.status == 503 and "Retry-After" in result.headers and contention:
                return result
            known = "api-5xx-contention" if contention and result.status == 500 else None
            violation = Violation("api-no-5xx", f"{method} {path} answered {result.status}: {result.body}", known)
            if violation.known is None:
                raise violation
            self._known(violation)
        return result

    def _known(self, violation: Violation) -> None:
        """A known defect: noted (the seed ends as an xfail), and the simulation goes on."""
        self._log(f"KNOWN DEFECT {violation.known}: {violation}")
        self.known_hits.append(violation)

    def _resync(self, name: str) -> None:
        """After an answer that is not a clean 2xx/4xx, learn what the table holds for `name`."""
        state = self._states().get(name)
        exp = self.expected[name]
        if state is None or state.service.lifecycle.value == "DELETING":
            exp.deleted = True
            if state is not None:
                self.deleted_uids[state.service.uid] = name
            return
        if state.service.uid != exp.uid or state.service.target_version != exp.target or exp.deleted:
            exp.deleted, exp.uid = False, state.service.uid
            exp.target, exp.generation = state.service.target_version, state.service.generation
            exp.specs[exp.target] = self._spec_in_table(name, exp.uid, exp.target)

    def _name(self) -> str:
        return self.rng.choice(NAMES)

    def _accept(self, name: str, body: dict[str, Any], spec: dict[str, Any] | None) -> None:
        exp = self.expected[name]
        if body["uid"] != exp.uid:
            exp.specs = {}
        exp.deleted, exp.uid, exp.target, exp.generation = (
            False,
            body["uid"],
            body["target_version"],
            body["generation"],
        )
        if spec is not None:
            exp.specs[body["target_version"]] = spec

    def _api_create(self) -> None:
        name, spec = self._name(), self._spec()
        result = self._call_api(f"create {name}", "POST", "/v1/services", {"name": name, "spec": spec})
        if result.status >= 500:
            self._resync(name)
        elif result.status == 201:
            self._accept(name, result.body, spec)
        elif result.status != 409:
            raise Violation("api-answers", f"create {name}: {result.status} {result.body}")

    def _api_update(self) -> None:
        name, spec = self._name(), self._spec()
        exp = self.expected[name]
        headers = {}
        if self.rng.random() < 0.4 and not exp.deleted:
            headers["If-Match"] = str(exp.generation - self.rng.choice([0, 0, 1]))
        result = self._call_api("update", "PUT", f"/v1/services/{name}", {"spec": spec}, headers=headers)
        if result.status >= 500:
            self._resync(name)
        elif result.status == 200:
            self._accept(name, result.body, spec)
        elif result.status not in (404, 409, 412):
            raise Violation("api-answers", f"update {name}: {result.status} {result.body}")

    def _api_rollback(self) -> None:
        name = self._name()
        body = {} if self.rng.random() < 0.5 else {"version": self.rng.randint(1, 4)}
        result = self._call_api("rollback", "POST", f"/v1/services/{name}/rollback", body)
        if result.status >= 500:
            self._resync(name)
        elif result.status == 200:
            exp = self.expected[name]
            self._accept(name, result.body, None)
            if exp.target not in exp.specs:
                exp.specs[exp.target] = self._spec_in_table(name, exp.uid, exp.target)
        elif result.status not in (400, 404, 409, 412):
            raise Violation("api-answers", f"rollback {name}: {result.status} {result.body}")

    def _api_delete(self) -> None:
        name = self._name()
        result = self._call_api("delete", "DELETE", f"/v1/services/{name}")
        if result.status >= 500:
            self._resync(name)
        elif result.status == 202:
            self.expected[name].deleted = True
            self.deleted_uids[result.body["uid"]] = name
        elif result.status != 404:
            raise Violation("api-answers", f"delete {name}: {result.status} {result.body}")

    def _api_invalid(self) -> None:
        spec = self._spec()
        case = self.rng.randrange(5)
        if case == 0:
            call = ("POST", "/v1/services", {"name": "Bad_Name", "spec": spec})
        elif case == 1:
            call = ("POST", "/v1/services", {"name": self._name(), "spec": {**spec, "file_mounts": {"/x": "y"}}})
        elif case == 2:
            spec["service"]["replicas"] = -1
            call = ("PUT", f"/v1/services/{self._name()}", {"spec": spec})
        elif case == 3:
            call = ("POST", f"/v1/services/{self._name()}/rollback", {"version": 9999})
        else:
            call = ("PUT", f"/v1/services/{self._name()}", {"spec": spec, "mode": "sideways"})
        result = self._call_api("invalid", *call)
        # A 5xx was judged by _call_api already (a 503 under contention is fine, a 500 is raised or
        # noted as the known defect): only a 2xx/3xx is wrong here.
        if result.status < 400:
            raise Violation("api-invalid-4xx", f"{call[0]} {call[1]}: {result.status} {result.body}")

    # -- reconciler runs --

    def prober(self, targets: Sequence[ProbeTarget], budget: float) -> dict[Hashable, ProbeResult]:
        verdicts: dict[Hashable, ProbeResult] = {}
        for target in sorted(targets, key=lambda t: repr(t.key)):
            path = target.probe.path
            if path == HUNG or (path == GOOD and self.rng.random() < 0.05):
                continue  # no verdict within the budget
            ok = path == GOOD
            verdicts[target.key] = ProbeResult(target.base_url, ok, "HTTP 200" if ok else "HTTP 503")
        return verdicts

    def _reconciler(self) -> Any:
        from fleetkeeper.reconciler.run import Reconciler
        from fleetkeeper.store.runs import ReconcilerStore
        from fleetkeeper.store.table import Table

        return Reconciler(
            store=ReconcilerStore(Table(TABLE)),
            driver=ec2_driver(),
            now=self.now,
            policy=self.policy,
            probe_budget_seconds=5,
            prober=self.prober,
            follow_up=self._follow_up_sent,
        )

    # -- the kick queue --

    def _follow_up_sent(self, name: str, delay: int, due: int) -> None:
        """The reconciler asks for a follow-up (from whichever run, on whichever thread)."""
        sent_at = int(self.now().timestamp())
        gap = self.policy.follow_up_min_gap.total_seconds()
        earlier = self.followups_sent.setdefault((name, due), [])
        # Two runs at once (interleaved) must not both send one: only one conditional write lands. (The
        # same due time sent again much later is another incarnation of the name.)
        if any(abs(sent_at - then) < gap for then in earlier):
            self.followup_problems.append(f"{name}: the follow-up due {due} was sent twice")
        earlier.append(sent_at)
        if delay < gap:
            self.followup_problems.append(f"{name}: a follow-up delayed {delay}s, under the minimum gap")
        self._enqueue("followup", (name, due), delay)

    def _enqueue(self, kind: str, payload: Any, delay: float) -> None:
        """A message on the kick queue, delivered when due, late, twice, or never (at least once is
        SQS's and EventBridge's promise; a lost one is what the schedule is the backstop for)."""
        at = self.strict.clock.time() + delay
        fate = self.kicks.random()
        if fate < 0.1:
            self._log(f"queue: {kind} {payload} lost")
            return
        if fate < 0.25:
            at += self.kicks.choice([20, 60, 200])
        heapq.heappush(self.queued, (at, next(self._queue_order), kind, payload))
        if 0.25 <= fate < 0.4:  # delivered twice
            heapq.heappush(self.queued, (at + self.kicks.choice([0, 5, 30]), next(self._queue_order), kind, payload))

    def _deliver_kicks(self) -> None:
        """The kick queue's event source: up to two due messages, each one worker invocation."""
        for _ in range(2):
            if not self.queued or self.queued[0][0] > self.strict.clock.time():
                return
            _, _, kind, payload = heapq.heappop(self.queued)
            if kind == "followup":
                name, due = payload
                if int(self.now().timestamp()) - due > 60:
                    self._log(f"queue: follow-up of {name} due {due} dropped, older than a period")
                    continue
                outcome, report = self._one_run(name, followup=due)
                void = " (void)" if report is not None and report.void_followup else ""
                self._after_run(f"follow-up run_one({name}, due {due}){void}", outcome, report, scope=name, advance=5)
            else:
                outcome, report = self._one_run(None, change=payload)
                self._after_run(f"state change {payload}", outcome, report, advance=5)
            self._check()

    def _one_run(
        self,
        name: str | None,
        budget: ShardBudget | None = None,
        interruption: Interruption | None = None,
        *,
        followup: int | None = None,
        change: StateChange | None = None,
    ) -> tuple[str, RunReport | None]:
        """One reconciler invocation on this thread: its outcome and report. With a budget, the
        scheduled run is a shard worker's: every listed service, in the period's rotated order,
        started only while the budget allows (and no sweep: that is the dispatcher's)."""
        self.hooks.start()
        self._snapshot_live()  # the surge bound compares with what this very run started from
        before = len(self.strict.faults_injected)
        with self.strict.acting_as("reconciler"), _logged_exceptions() as logged:
            try:
                outcome, report = self._invoke(name, budget, interruption, followup=followup, change=change)
            except Exception as exc:
                # The whole run failed on a fault injected into it (AWS contention): the schedule
                # retries. On anything else (a TypeError, a refusal nobody injected) the seed fails.
                self._injected_or_fail(exc, before, "a reconciler run")
                outcome, report = f"failed ({type(exc).__name__})", None
        for caught in logged:
            # What the shell caught, logged and went on from (one service's trouble must not starve
            # the others): the same rule, or a TypeError in one service's planning would pass.
            self._injected_or_fail(caught, before, "a reconciler run (caught and logged by it)")
        if report is None:
            return outcome, None
        # Only the scheduled run sweeps orphans: an interruption's or a state change's run (no name
        # either: the reconciler finds the service from the instance) reconciles one service and
        # sweeps nothing, so it proves nothing about what the sweep leaves.
        scheduled = name is None and budget is None and interruption is None and change is None
        if scheduled and not report.errors:
            self.full_runs_at.append(self.strict.clock.time())
        return "done", report

    def _invoke(
        self,
        name: str | None,
        budget: ShardBudget | None,
        interruption: Interruption | None,
        *,
        followup: int | None,
        change: StateChange | None,
    ) -> tuple[str, RunReport | None]:
        """The reconciler invocation `_one_run` describes: done (with its report), crashed or timed
        out (without); an Exception it raises is `_one_run`'s to judge."""
        try:
            if interruption is not None:
                return "done", self._reconciler().interrupt(interruption)
            if change is not None:
                return "done", self._reconciler().instance_changed(change)
            if name:
                return "done", self._reconciler().run_one(name, followup=followup)
            if budget is not None:
                reconciler = self._reconciler()
                names = [entry.name for entry in reconciler.store.list_services()]
                run = int(self.strict.clock.time()) // 60
                return "done", reconciler.run_shard(rotated(sorted(names), run), budget)
            return "done", self._reconciler().run_all()
        except SimCrash as crash:
            return f"crashed ({crash})", None
        except LambdaTimeout:
            return "timed out", None

    def _injected_or_fail(self, exc: Exception, before: int, what: str) -> None:
        """Returns when `exc` comes from a fault injected since `faults_injected[before]`; raises a
        violation carrying its traceback otherwise."""
        if injected_fault(exc, self.strict.faults_injected[before:]) is None:
            trace = "".join(traceback.format_exception(exc))
            raise Violation("fails-only-on-injected-faults", f"{what} failed on no injected fault:\n{trace}") from exc

    def _after_run(
        self, label: str, outcome: str, report: RunReport | None, scope: str | None = None, advance: float = 60
    ) -> None:
        summary = "" if report is None else json.dumps(report.as_dict(), sort_keys=True)
        self._log(f"{label}: {outcome} {summary}")
        if report is not None:
            self._check_surge(report, scope)
        self.strict.clock.advance(advance)

    def _run_scheduled(self) -> None:
        self._after_run("run_all", *self._one_run(None))

    def _run_kick(self) -> None:
        name = self._name()
        self._after_run(f"run_one({name})", *self._one_run(name), scope=name)

    def _run_crashed(self) -> None:
        name = self.rng.choice([None, self._name()])
        k = self.rng.randint(1, 25)
        self.hooks.crash_at[threading.get_ident()] = k
        try:
            outcome, report = self._one_run(name)
        finally:
            self.hooks.crash_at.pop(threading.get_ident(), None)
        report = None if "crash" in outcome else report
        self._after_run(f"run({name or 'all'}) crash at call {k}", outcome, report, scope=name)

    def _run_timed_out(self) -> None:
        name = self.rng.choice([None, self._name()])
        timeout = self.rng.choice([0.5, 1.5, 3.0, 6.0])
        self.strict.call_latency = 0.25
        context = self.strict.lambda_context(timeout_seconds=timeout, function_name="fleetkeeper-reconciler")
        # A scheduled run with a Lambda timeout is a shard worker, which watches its time (what it
        # does not finish is the next run's); margins of about two calls, so a kill can still come.
        budget = ShardBudget(
            lambda: context.get_remaining_time_in_millis() / 1000, service_margin=0.5, action_margin=0.3
        )
        try:
            outcome, report = self._one_run(name, budget if name is None else None)
        finally:
            context.end()
            self.strict.call_latency = 0.0
        self._after_run(f"run({name or 'all'}) timeout {timeout}s", outcome, report, scope=name)

    def _run_interleaved(self) -> None:
        """Run A pauses at its k-th AWS call; run B runs to completion; then A resumes."""
        name_a, name_b = self.rng.choice([None, self._name()]), self.rng.choice([None, self._name()])
        k = self.rng.randint(1, 20)
        paused, resume = threading.Event(), threading.Event()
        result: list[tuple[str, RunReport | None]] = []
        raised: list[Violation] = []

        def run_a() -> None:
            self.hooks.start()
            self.hooks.pause_at[threading.get_ident()] = (k, paused, resume)
            try:
                result.append(self._one_run_counted(name_a))
            except Violation as violation:  # the seed fails on the main thread, as for run B
                raised.append(violation)
            finally:
                self.hooks.pause_at.pop(threading.get_ident(), None)
                paused.set()

        thread = threading.Thread(target=run_a, name="sim-run-a")
        thread.start()
        if not paused.wait(120):  # a safety net against a hung test, never a timing assertion
            raise Violation("simulation", "run A never reached a pause point")
        outcome_b, report_b = self._one_run(name_b)
        self._log(f"interleave: A=run({name_a or 'all'}) paused at call {k}; B=run({name_b or 'all'}): {outcome_b}")
        resume.set()
        thread.join()
        if raised:
            raise raised[0]
        outcome_a, report_a = result[0]
        self._after_run("interleave: A resumed", outcome_a, None)  # A's view is stale by design
        del report_a, report_b

    def _one_run_counted(self, name: str | None) -> tuple[str, RunReport | None]:
        """`_one_run` without resetting the thread's call count (the pause counts from its start)."""
        start = self.hooks.start
        self.hooks.start = lambda: None  # type: ignore[method-assign]
        try:
            return self._one_run(name)
        finally:
            self.hooks.start = start  # type: ignore[method-assign]

    # -- cleanup deliveries --

    def _read_stream(self) -> None:
        """Admit the stream records written since the last read (what the event source mapping polls).

        Read from moto's shard directly, from where the last read stopped: the mapping is AWS's, not
        a fleetkeeper call, so no fault is drawn for it (and re-serialising the whole stream through
        botocore at every read was most of a seed's time).
        """
        from fleetkeeper.aws.eventfilter import matches_any

        table = self._backend_table()
        fresh = table.stream_shard.items[self._stream_read :]
        self._stream_read = len(table.stream_shard.items)
        arn = f"{table.table_arn}/stream/{table.latest_stream_label}"
        records = [lambda_record(item.to_json(), arn) for item in fresh]
        for record in records:
            key = f"{record['dynamodb']['SequenceNumber']}/{record['eventID']}"
            if key in self.seen_records:
                continue
            self.seen_records.add(key)
            if matches_any(_cleanup_patterns(), record):
                self.pending.append(record)

    def _deliver(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Hand `batch` to the cleanup handler; returns the records it failed."""
        from fleetkeeper.cleanup import handler

        before = len(self.strict.faults_injected)
        with self.strict.acting_as("cleanup"):
            try:
                answer = handler.lambda_handler({"Records": batch}, CleanupContext())
            except Exception as exc:
                self._injected_or_fail(exc, before, "a cleanup delivery")
                return batch  # every record failed on an injected fault: Lambda retries the batch
        failed_ids = {f["itemIdentifier"] for f in answer["batchItemFailures"]}
        failed = [r for r in batch if r["dynamodb"]["SequenceNumber"] in failed_ids]
        for record in batch:
            if record not in failed:
                self.cleaned.add(record["dynamodb"]["OldImage"]["uid"]["S"])
        return failed

    def _cleanup(self) -> None:
        self._read_stream()
        if self.delivered and self.rng.random() < 0.25:  # a duplicate delivery
            batch = [self.rng.choice(self.delivered)]
        elif self.pending and self.rng.random() < 0.2:  # late: the mapping has not polled yet
            self._log(f"cleanup: {len(self.pending)} record(s) held back")
            return
        else:
            batch = self.pending[:10]
        if not batch:
            self._log("cleanup: nothing to deliver")
            return
        failed = self._deliver(batch)
        uids = [r["dynamodb"]["OldImage"]["uid"]["S"] for r in batch]
        self._log(f"cleanup: delivered {uids}, {len(failed)} failed")
        for record in batch:
            if record in self.pending and record not in failed:
                self.pending.remove(record)
                self.delivered.append(record)

    # -- faults --

    def _fault(self) -> None:
        kind = self.rng.randrange(9)
        if kind == 0:
            with contextlib.suppress(Exception):  # no transaction yet
                self.strict.dynamodb.tear_next_read()
                self._log("fault: tear the next read of the last transaction")
                return
            self._log("fault: (no transaction to tear)")
        elif kind == 1:
            self.strict.dynamodb.conflict_next_transaction()
            self._log("fault: TransactionConflict on the next transaction")
        elif kind == 2:
            times = self.rng.randint(1, 8)
            self.strict.throttle("dynamodb", None, times=times)
            self._log(f"fault: DynamoDB throttles the next {times} attempts")
        elif kind == 3:
            times = self.rng.randint(1, 8)
            self.strict.ec2.throttle(None, times=times)
            self._log(f"fault: RequestLimitExceeded on the next {times} EC2 attempts")
        elif kind == 4:
            lag = self.rng.choice([0, 0, 30, 90, 150])
            self.strict.ec2.set_describe_lag(lag)
            self._log(f"fault: describe lag {lag}s")
        elif kind == 5:
            times = self.rng.randint(1, 8)
            if self.rng.random() < 0.7:
                self.strict.ec2.insufficient_capacity(times=times)
                self._log(f"fault: InsufficientInstanceCapacity x{times}")
            else:
                self.strict.ec2.unsupported(times=times)
                self._log(f"fault: Unsupported x{times}")
        elif kind == 6:
            self.strict.dynamodb.conflict_next_write(times=self.rng.randint(1, 3))
            self._log("fault: TransactionConflictException on the next single writes")
        else:
            self._terminate_by_aws()

    def _terminate_by_aws(self) -> None:
        live = sorted(
            (tags.get(UID_TAG, ""), int(tags.get(REPLICA_TAG, "0")), inst)
            for inst, tags in self._instances()
            if inst.state == "running" and MANAGED_TAG in tags
        )
        if not live:
            self._log("fault: (no instance for AWS to terminate)")
            return
        uid, replica_id, instance = self.rng.choice(live)
        codes = [c for c in STATE_REASONS if c != "Server.SpotInstanceTermination"]
        if instance.lifecycle == "spot" and self.rng.random() < 0.6:
            code = "Server.SpotInstanceTermination"
        else:
            code = self.rng.choice(codes)
        self.strict.ec2.terminate_by_aws(instance.id, code)
        self._enqueue("ec2", StateChange(instance.id, "shutting-down"), 1)
        if code.startswith("Client."):
            version = int(dict(self._tags(instance)).get(VERSION_TAG, "0"))
            self.blame[(uid, version)] += 1
        self._log(f"fault: AWS terminates replica {replica_id} of uid {uid} ({code})")

    def _interrupt(self) -> None:
        """EC2 warns about a running spot replica (the kick queue's worker gets it, and may crash);
        after an interruption warning, AWS takes the instance back two minutes later."""
        live = sorted(
            (inst.id, tags.get(SERVICE_TAG, ""))
            for inst, tags in self._instances()
            if inst.state == "running" and MANAGED_TAG in tags and inst.lifecycle == "spot"
        )
        if not live:
            self._log("interruption: (no running spot replica)")
            return
        instance_id, name = self.warnings.choice(live)
        kind = self.warnings.choice([InterruptionKind.SPOT_INTERRUPTION, InterruptionKind.REBALANCE])
        warning = Interruption(kind, instance_id, to_iso(self.now()))
        if kind is InterruptionKind.SPOT_INTERRUPTION:
            self.reclaims.append((self.strict.clock.time() + 120, instance_id))
        k = self.warnings.randint(1, 12) if self.warnings.random() < 0.3 else None
        if k is not None:
            self.hooks.crash_at[threading.get_ident()] = k
        try:
            outcome, report = self._one_run(name or None, interruption=warning)
        finally:
            self.hooks.crash_at.pop(threading.get_ident(), None)
        report = None if "crash" in outcome else report
        crash = f" crash at call {k}" if k is not None else ""
        self._after_run(f"interrupt({kind.value} {instance_id} of {name}){crash}", outcome, report, scope=name)

    def _reclaim_due(self) -> None:
        """AWS takes back the spot instances whose interruption warning was two minutes ago."""
        now = self.strict.clock.time()
        due = [instance_id for at, instance_id in self.reclaims if at <= now]
        self.reclaims = [(at, i) for at, i in self.reclaims if at > now]
        running = {inst.id for inst, _ in self._instances() if inst.state == "running"}
        for instance_id in due:
            if instance_id in running:
                self.strict.ec2.terminate_by_aws(instance_id, "Server.SpotInstanceTermination")
                self._enqueue("ec2", StateChange(instance_id, "shutting-down"), 1)
                self._log(f"AWS reclaims {instance_id} (two minutes after its interruption warning)")

    def _clock_jump(self) -> None:
        seconds = self.rng.choice([120, 300, 600, 900])
        self.strict.clock.advance(seconds)
        self._log(f"clock jumps {seconds}s")

    # -- the neighbouring stack --

    def _guard(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        """Before every TerminateInstances and CreateTags (their parameters as the caller gave them,
        before serialization): each instance named must be the acting
        stack's (its stack tag), or, for CreateTags, carry none yet and be tagged with the acting
        stack's id only (an adoption). Recorded, checked by `_check`: raising here would be caught."""
        ids = params.get("InstanceIds") or params.get("Resources") or []
        for instance_id in ids:
            owner = dict(self._backend_ec2().tags.get(instance_id, {})).get(STACK_TAG)
            adopting = (
                model.name == "CreateTags"
                and owner is None
                and params.get("Tags") == [{"Key": STACK_TAG, "Value": self.acting_stack}]
            )
            if owner != self.acting_stack and not adopting:
                self.trespasses.append(f"stack {self.acting_stack}: {model.name} on {instance_id} of stack {owner}")

    def _neighbour_setup(self) -> None:
        """The neighbouring stack: its table, and two services named as the simulated stack's are."""
        from fleetkeeper.api.services import ServiceCommands
        from fleetkeeper.local.template import create_table
        from fleetkeeper.spec.service import ServiceSpec
        from fleetkeeper.store.commands import CommandStore
        from fleetkeeper.store.table import Table

        create_table(aws.dynamodb(), NEIGHBOUR_TABLE)
        commands = ServiceCommands(CommandStore(Table(NEIGHBOUR_TABLE)), now=lambda: to_iso(self.now()))
        spec = {
            "service": {"readiness_probe": GOOD, "replicas": 2, "ports": 8080},
            "resources": {"instance_type": "t3.micro"},
            "run": "python3 -m http.server $PORT",
        }
        for name in NAMES[:2]:
            commands.create(name, ServiceSpec.model_validate(spec))

    def _neighbour_reconciler(self) -> Any:
        from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver
        from fleetkeeper.reconciler.run import Reconciler
        from fleetkeeper.store.runs import ReconcilerStore
        from fleetkeeper.store.table import Table

        def healthy(targets: Sequence[ProbeTarget], budget: float) -> dict[Hashable, ProbeResult]:
            return {t.key: ProbeResult(t.base_url, True, "HTTP 200") for t in targets}

        return Reconciler(
            store=ReconcilerStore(Table(NEIGHBOUR_TABLE)),
            driver=Ec2Driver(stack_id=NEIGHBOUR_STACK),
            now=self.now,
            policy=self.policy,
            probe_budget_seconds=5,
            prober=healthy,
        )

    def _neighbour_run(self) -> str:
        """One scheduled run of the neighbouring stack (its services, then its orphan sweep)."""
        self.acting_stack = NEIGHBOUR_STACK
        before = len(self.strict.faults_injected)
        try:
            with self.strict.acting_as("reconciler"), _logged_exceptions() as logged:
                report = self._neighbour_reconciler().run_all()
        except LambdaTimeout as exc:
            return f"failed ({type(exc).__name__})"
        except Exception as exc:
            self._injected_or_fail(exc, before, "the neighbouring stack's reconciler run")
            return f"failed ({type(exc).__name__})"
        finally:
            self.acting_stack = MAIN_STACK
        for caught in logged:
            self._injected_or_fail(caught, before, "the neighbouring stack's reconciler run (caught and logged by it)")
        return json.dumps(report.as_dict(), sort_keys=True)

    def _neighbour_step(self) -> None:
        if not self.neighbour_deleted and self.neighbourly.random() < 0.1:
            from fleetkeeper.api.services import ServiceCommands
            from fleetkeeper.store.commands import CommandStore
            from fleetkeeper.store.table import Table

            before = len(self.strict.faults_injected)
            try:
                ServiceCommands(CommandStore(Table(NEIGHBOUR_TABLE)), now=lambda: to_iso(self.now())).delete(NAMES[1])
            except Exception as exc:  # contention drawn by the strict layer: the next step tries again
                self._injected_or_fail(exc, before, "the neighbouring stack's delete")
                self._log(f"neighbour: delete {NAMES[1]} failed ({type(exc).__name__})")
            else:
                self.neighbour_deleted = True
                self._log(f"neighbour: delete {NAMES[1]}")
        self._log(f"neighbour run_all: {self._neighbour_run()}")

    def _neighbour_states(self) -> dict[str, ServiceState]:
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.dynamodb.models import dynamodb_backends

        table = dynamodb_backends[DEFAULT_ACCOUNT_ID][REGION].get_table(NEIGHBOUR_TABLE)
        partitions: dict[str, list[dict[str, Any]]] = {}
        for item in table.all_items():
            raw = from_raw(item.to_json()["Attributes"])
            if str(raw["PK"]).startswith("SVC#"):
                partitions.setdefault(str(raw["PK"])[4:], []).append(raw)
        states = {name: state_from_items(items) for name, items in partitions.items()}
        return {name: state for name, state in states.items() if state is not None}

    def _check_neighbour_final(self) -> None:
        """After the end's quiet period: the neighbour's kept service serves with its own replicas,
        and its deleted one (once deleted past the grace period) left no instance."""
        for _ in range(8):
            self._log(f"neighbour converge run_all: {self._neighbour_run()}")
            self.strict.clock.advance(60)
        states = self._neighbour_states()
        live: Counter[str] = Counter()
        for inst, tags in self._instances():
            if tags.get(STACK_TAG) == NEIGHBOUR_STACK and inst.state in LIVE_STATES:
                live[tags.get(UID_TAG, "")] += 1
        kept = states.get(NAMES[0])
        if kept is None or kept.service.status is not ServiceStatus.READY or live[kept.service.uid] != 2:
            detail = "missing" if kept is None else f"{kept.service.status}: {live[kept.service.uid]} live"
            raise Violation("stack-isolation", f"the neighbouring stack's {NAMES[0]}: {detail}")
        known = {state.service.uid for state in states.values()}
        strays = sorted(uid for uid in live if uid not in known)
        if strays:
            raise Violation("stack-isolation", f"the neighbouring stack's deleted services left instances: {strays}")

    # -- reading the world without AWS calls --

    @staticmethod
    def _backend_ec2() -> Any:
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends

        return ec2_backends[DEFAULT_ACCOUNT_ID][REGION]

    def _tags(self, instance: Any) -> dict[str, str]:
        return dict(self._backend_ec2().tags.get(instance.id, {}))

    def _instances(self) -> list[tuple[Any, dict[str, str]]]:
        return [(inst, self._tags(inst)) for inst in self._backend_ec2().all_instances()]

    @staticmethod
    def _backend_table() -> Any:
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.dynamodb.models import dynamodb_backends

        return dynamodb_backends[DEFAULT_ACCOUNT_ID][REGION].get_table(TABLE)

    def _view(self) -> _TableView:
        """The table's items and service states as moto holds them now, decoded once per change.

        The checks after every step read them many times over, and the table changes only by a
        write, which appends a stream record (moto's rollback of a cancelled transaction puts back
        another table object, shard and all); an AWS call made meanwhile also starts a new view.
        Callers only read what they are given.
        """
        table = self._backend_table()
        shard = table.stream_shard
        mark = (len(shard.items), len(self.hooks.calls))
        view = self._table_view
        if view is None or view.table is not table or view.shard is not shard or view.mark != mark:
            items = [from_raw(item.to_json()["Attributes"]) for item in table.all_items()]
            partitions: dict[str, list[dict[str, Any]]] = {}
            for item in items:
                if str(item["PK"]).startswith("SVC#"):
                    partitions.setdefault(str(item["PK"])[4:], []).append(item)
            states = {name: state_from_items(found) for name, found in partitions.items()}
            live = {name: state for name, state in states.items() if state is not None}
            view = self._table_view = _TableView(table, shard, mark, items, live)
        return view

    def _items(self) -> list[dict[str, Any]]:
        return self._view().items

    def _states(self) -> dict[str, ServiceState]:
        return self._view().states

    def _spec_in_table(self, name: str, uid: str, version: int) -> dict[str, Any]:
        state = self._states().get(name)
        assert state is not None and state.service.uid == uid
        return state.versions[version].spec.model_dump(mode="json", exclude_none=True)

    def _live_counts(self) -> dict[Any, int]:
        """Live instances per uid, and per (uid, version), whose replica is not leaving (the ones a
        surge bound counts)."""
        states = {s.service.uid: s for s in self._states().values()}
        counts: Counter[Any] = Counter()
        for inst, tags in self._instances():
            uid = tags.get(UID_TAG)
            if uid is None or inst.state not in LIVE_STATES:
                continue
            state = states.get(uid)
            record = state.replicas.get(int(tags.get(REPLICA_TAG, "-1"))) if state else None
            # A replica AWS warned about is replaced beyond the surge, by design: it is on its way out.
            if record is None or (record.status not in LEAVING and record.interruption is None):
                counts[uid] += 1
                counts[(uid, int(tags.get(VERSION_TAG, "0")))] += 1
        return dict(counts)

    def _snapshot_live(self) -> None:
        self._live_before = self._live_counts()

    # -- invariants --

    def _check_surge(self, report: RunReport, scope: str | None = None) -> None:
        """After a run that completed for a service (of `scope`, when the run was for one service):
        its live, non-leaving instances stay within target + max_surge (rolling; blue_green: the
        target's own replicas), or did not grow in this run (an excess a run inherits, e.g. from a
        scale-down or an update that lowered max_surge, only shrinks)."""
        live = self._live_counts()
        for name, state in self._states().items():
            if scope is not None and name != scope:
                continue
            if name in report.errors or name in report.superseded or state.target is None:
                continue
            spec = state.target.spec
            update = spec.update
            replicas = spec.service.replicas or 0
            uid = state.service.uid
            if update.mode == "rolling":
                bound, count = replicas + update.max_surge, live.get(uid, 0)
            else:  # blue_green launches the whole new set at once: the target's own replicas are bounded
                bound, count = replicas, live.get((uid, state.service.target_version), 0)
            before = self._live_before.get(uid if update.mode == "rolling" else (uid, state.service.target_version), 0)
            if count > bound and count > before:
                raise Violation(
                    "surge-bound",
                    f"{name} ({uid}): {count} live non-leaving instances > {bound} "
                    f"(target {replicas}, {update.mode}, max_surge {update.max_surge}), up from "
                    f"{before}",
                )

    def _check(self) -> None:
        if self.trespasses:
            raise Violation("stack-isolation", "; ".join(self.trespasses[:3]))
        if self.followup_problems:
            raise Violation("followup-coalesced", "; ".join(self.followup_problems))
        now = self.strict.clock.time()
        instances = self._instances()
        unmanaged = [inst for inst, _ in instances if inst.id == self.unmanaged]
        if not unmanaged or unmanaged[0].state != "running":
            raise Violation("unmanaged-untouched", f"unmanaged instance {self.unmanaged} is not running")
        launched: Counter[tuple[str, str]] = Counter()
        live_by_uid: Counter[str] = Counter()
        for inst, tags in instances:
            if MANAGED_TAG in tags:
                launched[(tags.get(UID_TAG, ""), tags.get(REPLICA_TAG, ""))] += 1
                if inst.state in LIVE_STATES:
                    live_by_uid[tags.get(UID_TAG, "")] += 1
        twice = sorted(key for key, n in launched.items() if n > 1)
        if twice:
            raise Violation("launch-once", f"replica ids launched more than once (uid, replica id): {twice}")
        states = self._states()
        live_uids = {s.service.uid for s in states.values()}
        for name, state in states.items():
            self._check_failed(name, state)
        items = self._items()
        for uid in self.deleted_uids:
            if uid in live_uids:
                continue
            self.removed_at.setdefault(uid, now)
            grace = self.policy.orphan_grace.total_seconds() + 120
            swept = any(t > self.removed_at[uid] + grace for t in self.full_runs_at)
            if swept and live_by_uid.get(uid):
                raise Violation("deleted-leaves-nothing", f"uid {uid}: {live_by_uid[uid]} live instance(s) survive")
            if uid in self.cleaned:
                left = [i["SK"] for i in items if str(i["SK"]).startswith((f"V#{uid}#", f"R#{uid}#"))]
                if left:
                    raise Violation("deleted-leaves-nothing", f"uid {uid}: items after its cleanup: {left[:5]}")

    def _check_failed(self, name: str, state: ServiceState) -> None:
        uid = state.service.uid
        for number, version in state.versions.items():
            if version.state is not VersionState.FAILED:
                continue
            path = version.spec.service.readiness_probe.path
            if path == GOOD and self.blame[(uid, number)] < self.policy.breaker_threshold:
                if (uid, number) in self.known_failed:
                    continue
                torn = bool(self.strict.dynamodb.torn_reads)
                violation = Violation(
                    "failed-only-when-failed",
                    f"{name} v{number} (healthy; {self.blame[(uid, number)]} VERSION-cause kills injected) "
                    f"is FAILED: {version.state_message} / "
                    f"{state.service.status_message}",
                    "partial-visibility" if torn else None,
                )
                if violation.known is None:
                    raise violation
                self.known_failed.add((uid, number))
                self._known(violation)
        # The status is the reconciler's verdict on `observed_generation`; after a newer api write it
        # is stale until the next run records one (observed_generation says so).
        current = state.service.observed_generation == state.service.generation
        if current and state.service.status is ServiceStatus.FAILED:
            target = state.target
            if target is not None and target.state is not VersionState.FAILED:
                if (uid, -target.version) in self.known_failed:
                    return
                # A torn read that hid the target version ("the target version is missing") is the
                # same known defect as a torn read acted on: the status is then recorded FAILED.
                torn = bool(self.strict.dynamodb.torn_reads) and "missing" in service_message(state)
                violation = Violation(
                    "failed-only-when-failed",
                    f"{name} FAILED while v{target.version} is {target.state}: {service_message(state)}",
                    "partial-visibility" if torn else None,
                )
                if violation.known is None:
                    raise violation
                self.known_failed.add((uid, -target.version))
                self._known(violation)

    # -- the end of a seed --

    def _quiesce(self) -> None:
        self.strict.faults = FaultRates()
        self.strict._bursts.clear()
        self.strict.dynamodb._tears.clear()
        self.strict.dynamodb._transaction_conflicts.clear()
        self.strict.dynamodb._write_conflicts.clear()
        self.strict.ec2.capacity_rules.clear()
        self.strict.ec2.set_describe_lag(0)

    def _drain_cleanup(self) -> None:
        self._read_stream()
        while self.pending:
            batch = self.pending[:10]
            failed = self._deliver(batch)
            if failed:
                raise Violation("cleanup-completes", f"cleanup failed without faults: {failed[:1]}")
            for record in batch:
                self.pending.remove(record)
                self.delivered.append(record)

    def _finish(self) -> None:
        self._log("end: faults stop")
        self._quiesce()
        self.strict.clock.advance(self.policy.orphan_grace.total_seconds() + 60)
        quiet = 0  # consecutive runs without a write: 4 span more than any deadline of the model
        for _attempt in range(60):
            mark = len(self.hooks.calls)
            outcome, report = self._one_run(None)
            self._after_run("converge run_all", outcome, report)
            self._drain_cleanup()
            self._check()
            writes = [c for c in self.hooks.calls[mark:] if is_mutation(*c)]
            quiet = quiet + 1 if outcome == "done" and report is not None and not report.errors and not writes else 0
            if quiet == 4:
                break
        else:
            raise Violation("converges", "no steady state after 60 runs")
        self._check_final()
        if self.stacks > 1:
            self._check_neighbour_final()
            self._check()

    def _check_final(self) -> None:
        mark = len(self.hooks.calls)
        asked = sum(len(sent) for sent in self.followups_sent.values())
        outcome, _ = self._one_run(None)
        writes = [c for c in self.hooks.calls[mark:] if is_mutation(*c)]
        self._log(f"steady run_all: {outcome}, writes {writes}")
        if writes:
            raise Violation("steady-state-no-write", f"a run after convergence wrote {writes}")
        if sum(len(sent) for sent in self.followups_sent.values()) != asked:
            raise Violation("steady-state-no-followup", "a run after convergence asked for a follow-up")
        states = self._states()
        live: dict[str, list[tuple[Any, dict[str, str]]]] = {}
        for inst, tags in self._instances():
            # The simulated stack's (a neighbouring stack's instances are its own business: below).
            if MANAGED_TAG in tags and inst.state in LIVE_STATES and tags.get(STACK_TAG) == MAIN_STACK:
                live.setdefault(tags.get(UID_TAG, ""), []).append((inst, tags))
        for name, exp in self.expected.items():
            state = states.get(name)
            if exp.deleted:
                if state is not None and state.service.uid == exp.uid and exp.uid:
                    raise Violation("final-state", f"{name} was deleted but its service item remains")
                continue
            if state is None or state.service.uid != exp.uid:
                raise Violation("final-state", f"{name}: service {exp.uid} missing")
            self._check_final_service(name, exp, state, live.get(exp.uid, []))
        known_live = {s.service.uid for s in states.values()}
        strays = sorted(uid for uid in live if uid not in known_live)
        if strays:
            raise Violation("deleted-leaves-nothing", f"live instances of no service: {strays}")
        for uid in self.deleted_uids:
            if uid in known_live:
                continue
            left = [i["SK"] for i in self._items() if str(i["SK"]).startswith((f"V#{uid}#", f"R#{uid}#"))]
            if left:
                raise Violation("deleted-leaves-nothing", f"uid {uid}: items after the final cleanup: {left[:5]}")

    def _check_final_service(
        self, name: str, exp: Expected, state: ServiceState, live: list[tuple[Any, dict[str, str]]]
    ) -> None:
        service = state.service
        wanted = exp.specs.get(exp.target) or self._spec_in_table(name, exp.uid, exp.target)
        health = wanted["service"]["readiness_probe"]["path"]
        target = state.target
        assert target is not None
        if health == GOOD and self.blame[(exp.uid, exp.target)] < self.policy.breaker_threshold:
            if service.target_version != exp.target:
                raise Violation("final-state", f"{name}: target v{service.target_version}, last write v{exp.target}")
            self._check_serving(name, state, live)
            return
        # A bad last write: the breaker rolled back to a serving version, or the service is FAILED.
        if service.target_version == exp.target:
            if target.state is VersionState.READY:
                self._check_serving(name, state, live)  # became READY before its failures: legitimate
                return
            if service.status is not ServiceStatus.FAILED and target.state is not VersionState.FAILED:
                # still waiting on a hung or failing version, within its deadlines: not converged
                raise Violation("final-state", f"{name}: v{exp.target} undecided: {service.status_message}")
            return
        rolled = target.spec.service.readiness_probe.path
        if target.state is not VersionState.READY and rolled == GOOD:
            raise Violation("final-state", f"{name}: rolled back to v{target.version} ({target.state})")
        if target.state is VersionState.READY:
            self._check_serving(name, state, live)

    def _check_serving(self, name: str, state: ServiceState, live: list[tuple[Any, dict[str, str]]]) -> None:
        service, target = state.service, state.target
        assert target is not None
        replicas = target.spec.service.replicas or 0
        versions = sorted(int(tags.get(VERSION_TAG, "0")) for _, tags in live)
        if len(live) != replicas or set(versions) - {service.target_version}:
            raise Violation(
                "final-state",
                f"{name}: live instance versions {versions}, want {replicas} of v{service.target_version}",
            )
        not_ready = [r for r in state.replicas.values() if r.status is not ReplicaStatus.READY]
        if not_ready or service.status is not ServiceStatus.READY:
            raise Violation("final-state", f"{name}: {service.status}: {service.status_message}")
        if service.observed_generation != service.generation:
            raise Violation("final-state", f"{name}: observed generation {service.observed_generation}")
