"""The strict-AWS controller and the one hook through which it sees every AWS request.

How it hooks in
---------------
moto's `mock_aws` answers requests from a botocore `before-send` handler (its `BotocoreStubber`)
that `moto.core.models` appends to botocore's `BUILTIN_HANDLERS`, so every botocore session made
afterwards registers it on its clients. `install_hooks()` puts `StrictSend` in that very slot, in
front of moto's stubber: for each attempt botocore is about to put on the wire, the layer decides
whether moto sees the request at all, what it sees, and what goes back.

Why `before-send`, and why in place of moto's handler rather than beside it:

- `before-send` is the last event before the wire. An answer given there is parsed by botocore,
  goes through its retry handler (standard mode: throttling codes and 5xx are retried, with
  backoff) and becomes the modelled exception, exactly as an answer from AWS would. A fault
  injected any earlier (`before-call`, `before-parameter-build`) would skip the retries and is
  not what AWS does.
- botocore emits `before-send` to *every* handler and takes the first answer, so a second handler
  registered beside moto's could not stop moto from executing a request the layer refuses (a
  throttled PutItem must not be written). Wrapping moto's handler can.
- The layer answers in the service's wire format (JSON for DynamoDB, XML for EC2), so no botocore
  parsing or exception-mapping code is bypassed, and it works unchanged for every client made
  from any botocore or boto3 session in the process: fleetkeeper's (`fleetkeeper.aws`),
  Powertools', the tests' own.
- Everything moto does happens inside one Python call of that handler, so a per-service lock held
  around it makes each request atomic, and lets the layer change what moto sees for the duration
  of a single request (a torn read, an instance still invisible) with no other thread observing it.

When no `StrictAws` is active `StrictSend` is moto's stubber, unchanged: installing the hooks is
harmless, which is why `tests/conftest.py` installs them before any client exists.

Retry pauses: while a controller is active, botocore's pause between attempts (`time.sleep` in
`botocore.endpoint`) is taken on the layer's clock instead of the wall clock, so a burst of
throttles costs virtual seconds (visible to a Lambda context's remaining time), never real ones.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from fleetkeeper.aws import CONNECT_TIMEOUT_SECONDS, READ_TIMEOUT_SECONDS
from tests.strict_aws import callers, model_validation
from tests.strict_aws.authorization import VPC_ENDPOINTS, Authorizer, denied, denied_message, endpoint_name
from tests.strict_aws.clock import VirtualClock
from tests.strict_aws.cloudwatch import CloudWatchLayer
from tests.strict_aws.context import LambdaContext
from tests.strict_aws.dynamodb import DynamoDBLayer
from tests.strict_aws.ec2 import Ec2Layer
from tests.strict_aws.elbv2 import Elbv2Layer
from tests.strict_aws.iam import IamLayer
from tests.strict_aws.wire import Call, Response, aws_response, error_for, normalise

if TYPE_CHECKING:
    from collections.abc import Iterator

    from botocore.awsrequest import AWSPreparedRequest, AWSResponse

# The throttling error each service answers with, its HTTP status and message.
THROTTLES: dict[str, tuple[int, str]] = {
    "ProvisionedThroughputExceededException": (
        400,
        "The level of configured provisioned throughput for the table was exceeded. "
        "Consider increasing your provisioning level with the UpdateTable API.",
    ),
    "ThrottlingException": (
        400,
        "Throughput exceeds the current capacity of your table or index. DynamoDB is automatically scaling "
        "your table or index so please try again shortly. If exceptions persist, check if you have a hot key: "
        "https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html.",
    ),
    "RequestLimitExceeded": (503, "Request limit exceeded."),
}
DEFAULT_THROTTLE = {"dynamodb": "ProvisionedThroughputExceededException", "ec2": "RequestLimitExceeded"}


@dataclass(frozen=True)
class FaultRates:
    """Per-attempt probabilities of faults drawn from the controller's seeded RNG (a simulation's).

    All zero by default: a test schedules faults explicitly instead. Draws happen in request order,
    so a simulation that makes its AWS calls from one thread replays exactly from its seed.
    """

    throttle: float = 0.0  # any DynamoDB or EC2 attempt: the service's throttling error
    torn_read: float = 0.0  # Query/Scan/BatchGetItem: torn against a transaction still the last write to its tables
    transaction_conflict: float = 0.0  # TransactWriteItems: cancelled, TransactionConflict on one item
    write_conflict: float = 0.0  # PutItem/UpdateItem/DeleteItem: TransactionConflictException

    @classmethod
    def parse(cls, text: str) -> FaultRates:
        """From "torn_read=0.2,throttle=0.05" (FLEETKEEPER_STRICT_AWS_FAULTS)."""
        rates: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, value = part.partition("=")
            if name.strip() not in cls.__dataclass_fields__:
                raise ValueError(f"unknown fault {name.strip()!r}; one of {sorted(cls.__dataclass_fields__)}")
            rates[name.strip()] = float(value)
        return cls(**rates)


@dataclass
class _Burst:
    service: str
    operation: str | None
    code: str
    remaining: int


@dataclass
class _Hang:
    service: str
    operation: str | None
    kind: str  # "connect" or "read"
    seconds: float
    remaining: int


# What a hung attempt costs before botocore gives up on it: the client's timeout (fleetkeeper's).
HANG_SECONDS = {"connect": float(CONNECT_TIMEOUT_SECONDS), "read": float(READ_TIMEOUT_SECONDS)}


@dataclass(frozen=True)
class Fault:
    """A fault the layer injected (its log: `StrictAws.faults_injected`)."""

    service: str
    operation: str
    kind: str


class StrictAws:
    """AWS's semantics over moto: always-on validation, plus faults scheduled by a test or drawn
    from a seeded RNG. Thread-safe. See the package docstring for the fixtures.

    Attributes a test reads:
        attempts   Counter of (service, operation) -> attempts that reached the layer (retries count)
        faults_injected   every fault answered, in order
        backoff    botocore's retry pauses, in seconds (taken on `clock`)
        rate_limited   adaptive mode's client-side waits for a token, in seconds (taken on `clock`)
        clock      the layer's VirtualClock; `call_latency` seconds are added per attempt
        dynamodb / ec2 / elbv2 / cloudwatch / iam   the per-service layers
    """

    def __init__(
        self,
        *,
        seed: int = 0,
        clock: VirtualClock | None = None,
        call_latency: float = 0.0,
        faults: FaultRates | None = None,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = clock or VirtualClock()
        self.call_latency = call_latency
        self.faults = faults or FaultRates()
        self.attempts: Counter[tuple[str, str]] = Counter()
        self.faults_injected: list[Fault] = []
        # Every attempt in order, (service, operation, digest of its body), when `record_calls` is set:
        # a seeded simulation replays call for call (tests/simulation/test_replay.py).
        self.record_calls = False
        self.call_log: list[tuple[str, str, str]] = []
        # Requests refused for breaking their service model's constraints (model_validation), in order.
        self.violations: list[model_validation.Violation] = []
        self.backoff: list[float] = []
        self.dynamodb = DynamoDBLayer(self)
        self.ec2 = Ec2Layer(self)
        self.iam = IamLayer(self)
        self.elbv2 = Elbv2Layer(self)
        self.cloudwatch = CloudWatchLayer(self)
        self._lock = threading.RLock()
        self._bursts: list[_Burst] = []
        self._hangs: list[_Hang] = []
        self._invocation: LambdaContext | None = None
        # A context variable, not a thread-local: work a caller hands to a pool in a copy of its
        # context (the reconciler's parallel reads) acts as that caller.
        self._actor: contextvars.ContextVar[str | None] = contextvars.ContextVar("strict_aws_actor", default=None)
        self.rate_limited: list[float] = []
        # IAM and the network (tests/strict_aws/authorization.py): every call of a template function is
        # authorized against its role and must be reachable from its network. `nat_gateway`: the VPC
        # has a NAT (docs/DEPLOY.md requires one of stacks with a hosted zone), so every service answers.
        self.authorizer = Authorizer()
        self.nat_gateway = False
        self._calling_as: contextvars.ContextVar[str | None] = contextvars.ContextVar("strict_aws_caller", default=None)

    # -- activation (one controller at a time, process-wide) --

    def activate(self) -> None:
        install_hooks()
        global _active
        with _activation:
            if _active is not None and _active is not self:
                raise RuntimeError("another StrictAws is active")
            _active = self
            _VirtualBackoff.enable()
            _VirtualTokenWait.enable()

    def deactivate(self) -> None:
        global _active
        with _activation:
            if _active is self:
                _active = None
                _VirtualBackoff.disable()
                _VirtualTokenWait.disable()

    @contextlib.contextmanager
    def active(self) -> Iterator[StrictAws]:
        self.activate()
        try:
            yield self
        finally:
            self.deactivate()

    # -- faults --

    def throttle(self, service: str, operation: str | None = None, *, times: int, code: str | None = None) -> None:
        """The next `times` attempts of `operation` (any of the service's, when None) are throttled.

        Injected before moto sees the request, as AWS throttles before doing anything, so
        botocore's standard retries see them: a burst shorter than the client's attempts (6 for
        fleetkeeper's clients: `retries={"max_attempts": 5}` means 5 retries) is absorbed, and
        `attempts` shows the retries. Codes:
        ProvisionedThroughputExceededException (DynamoDB's default), ThrottlingException,
        RequestLimitExceeded (EC2's default, HTTP 503).
        """
        chosen = code or DEFAULT_THROTTLE.get(service, "ThrottlingException")
        if chosen not in THROTTLES:
            raise ValueError(f"unknown throttling code {chosen!r}")
        with self._lock:
            self._bursts.append(_Burst(service, operation, chosen, times))

    def hang(
        self,
        service: str,
        operation: str | None = None,
        *,
        times: int,
        kind: str = "connect",
        seconds: float | None = None,
    ) -> None:
        """The next `times` attempts of `operation` (any of the service's, when None) hang until the
        client gives up: the clock moves by `seconds` (the client's timeout: fleetkeeper's connect
        timeout, 3 s, for kind "connect"; its read timeout, 10 s, for "read"), then the attempt fails
        with botocore's ConnectTimeoutError or ReadTimeoutError, which botocore retries.

        "connect": nothing reached the service (one the network does not route to, or that does not
        answer). "read": the service received the request and carried it out, and its answer never
        came: the caller cannot tell whether it was done. When the invocation's time runs out during
        the hang, Lambda kills it there (`LambdaTimeout`, with the clock at the invocation's end).
        """
        if kind not in HANG_SECONDS:
            raise ValueError(f"unknown hang {kind!r}; one of {sorted(HANG_SECONDS)}")
        cost = HANG_SECONDS[kind] if seconds is None else seconds
        with self._lock:
            self._hangs.append(_Hang(service, operation, kind, cost, times))

    def clear_hangs(self) -> None:
        """No more hangs: the attempts still scheduled to hang are answered."""
        with self._lock:
            self._hangs.clear()

    def attempts_of(self, service: str, operation: str) -> int:
        with self._lock:
            return self.attempts[(service, operation)]

    def record_fault(self, service: str, operation: str, kind: str) -> None:
        with self._lock:
            self.faults_injected.append(Fault(service, operation, kind))

    # -- actors (for RNG-drawn torn reads) --

    @contextlib.contextmanager
    def acting_as(self, actor: str) -> Iterator[None]:
        """AWS calls in this block (on this thread) are made by `actor` ("api", "reconciler", ...).

        A read drawn to be torn (FaultRates.torn_read) is torn only against a transaction of
        another actor: DynamoDB tears a read that overlapped a transaction, and the actor that made
        the transaction had its answer before its next read started. Calls outside any block have
        no actor and may overlap anything.
        """
        token = self._actor.set(actor)
        try:
            yield
        finally:
            self._actor.reset(token)

    def actor(self) -> str | None:
        return self._actor.get()

    # -- callers (for IAM and the network) --

    @contextlib.contextmanager
    def calling_as(self, function: str | None) -> Iterator[None]:
        """AWS calls in this block are made by the template function `function` (a logical id such as
        "ReconcilerFunction"; None: the test itself), whatever code makes them (tests/strict_aws/callers.py
        otherwise tells from the stack)."""
        token = self._calling_as.set(function or "")
        try:
            yield
        finally:
            self._calling_as.reset(token)

    def caller(self) -> str | None:
        chosen = self._calling_as.get()
        if chosen is not None:
            return chosen or None
        return callers.calling_function()

    @property
    def denials(self) -> list[Any]:
        """Every call IAM denied, in order (tests/strict_aws/authorization.py's Denial)."""
        with self.authorizer.lock:
            return list(self.authorizer.denials)

    def _unreachable(self, call: Call, function: str) -> bool:
        if self.nat_gateway:
            return False
        from tests.strict_aws.stack_policies import Bindings, for_bindings

        if not for_bindings(Bindings()).in_vpc(function):
            return False
        return endpoint_name(call.request.url) not in VPC_ENDPOINTS

    # -- Lambda --

    def lambda_context(self, *, timeout_seconds: float = 300.0, function_name: str = "fleetkeeper") -> LambdaContext:
        """A new invocation, current from now on: when its time is up the next AWS call is killed."""
        context = LambdaContext(self.clock, timeout_seconds=timeout_seconds, function_name=function_name)
        with self._lock:
            if self._invocation is not None:
                self._invocation.end()
            self._invocation = context
        return context

    # -- the request path --

    def _take_throttle(self, service: str, operation: str) -> str | None:
        with self._lock:
            for burst in self._bursts:
                if burst.remaining > 0 and burst.service == service and burst.operation in (None, operation):
                    burst.remaining -= 1
                    return burst.code
            rate = self.faults.throttle
            if rate and service in DEFAULT_THROTTLE and self.rng.random() < rate:
                return DEFAULT_THROTTLE[service]
        return None

    def _take_hang(self, service: str, operation: str) -> _Hang | None:
        with self._lock:
            for hang in self._hangs:
                if hang.remaining > 0 and hang.service == service and hang.operation in (None, operation):
                    hang.remaining -= 1
                    return hang
        return None

    def _hang(self, call: Call, hang: _Hang, invocation: LambdaContext | None) -> NoReturn:
        """Spend the hung attempt's time on the clock, then fail it as botocore's HTTP layer would."""
        from botocore.exceptions import ConnectTimeoutError, ReadTimeoutError

        self.record_fault(call.service, call.operation, f"hang:{hang.kind}")
        if hang.kind == "read":
            self._send_to_service(call)  # done, its answer lost
        seconds = hang.seconds
        if invocation is not None and not invocation.ended:
            seconds = min(seconds, max(0.0, invocation.deadline - self.clock.time()))
        self.clock.advance(seconds)
        if invocation is not None and invocation.expired:
            raise invocation.kill()
        url = call.request.url
        raise ConnectTimeoutError(endpoint_url=url) if hang.kind == "connect" else ReadTimeoutError(endpoint_url=url)

    def handle(self, call: Call) -> Response:
        invocation = self._invocation
        if invocation is not None and invocation.expired:
            raise invocation.kill()
        with self._lock:
            self.attempts[(call.service, call.operation)] += 1
            if self.record_calls:
                digest = hashlib.sha256(call.body_bytes()).hexdigest()[:16]
                self.call_log.append((call.service, call.operation, digest))
        try:
            # Taken first, so that a call refused below leaves no violation behind for the next one.
            violation = model_validation.take()
            function = self.caller()
            if function is not None:
                if self._unreachable(call, function):
                    self._hang(
                        call, _Hang(call.service, call.operation, "connect", HANG_SECONDS["connect"], 1), invocation
                    )
                refusal = self.authorizer.decide(call, function)
                if refusal is not None:
                    check, decision, principal = refusal
                    self.record_fault(call.service, call.operation, f"denied:{check.action}")
                    return denied(call, denied_message(principal, check, decision, function))
            if violation is not None:
                self.record_fault(call.service, call.operation, f"model:{violation.path}")
                self.violations.append(violation)
                return model_validation.refusal(violation)
            hang = self._take_hang(call.service, call.operation)
            if hang is not None:
                self._hang(call, hang, invocation)
            code = self._take_throttle(call.service, call.operation)
            if code is not None:
                self.record_fault(call.service, call.operation, code)
                status, message = THROTTLES[code]
                return error_for(call.service, code, message, status=status)
            return self._send_to_service(call)
        finally:
            if self.call_latency:
                self.clock.advance(self.call_latency)

    def _send_to_service(self, call: Call) -> Response:
        if call.service == "dynamodb":
            return self.dynamodb.send(call)
        if call.service == "dynamodb-streams":
            with self.dynamodb.lock:  # the stream shard lives in the table
                return call.send()
        if call.service == "ec2":
            return self.ec2.send(call)
        if call.service == "elastic-load-balancing-v2":
            return self.elbv2.send(call)
        if call.service == "cloudwatch":
            return self.cloudwatch.send(call)
        if call.service == "iam":
            return self.iam.send(call)
        return call.send()


_active: StrictAws | None = None
_activation = threading.Lock()


def active_controller() -> StrictAws | None:
    return _active


class StrictSend:
    """botocore `before-send` handler standing in for moto's own (see the module docstring)."""

    def __init__(self, moto_stubber: Any) -> None:
        self.moto = moto_stubber

    def __call__(self, event_name: str, request: AWSPreparedRequest, **kwargs: Any) -> AWSResponse | None:
        controller = _active
        if controller is None or not self.moto.enabled or not _is_aws(request.url):
            return self.moto(event_name, request, **kwargs)  # type: ignore[no-any-return]
        _, service, operation = event_name.split(".", 2)
        call = Call(service, operation, request, self._forward)
        return aws_response(request.url, controller.handle(call))

    def _forward(self, request: AWSPreparedRequest) -> Response | None:
        answer = self.moto.process_request(request)
        return None if answer is None else normalise(answer)


def _is_aws(url: str) -> bool:
    from urllib.parse import urlsplit

    return (urlsplit(url).hostname or "").endswith(".amazonaws.com")


class _VirtualBackoff:
    """botocore.endpoint's `time`, with `sleep` taken on the active controller's clock."""

    _saved: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        controller = _active
        if controller is None:
            time.sleep(seconds)
            return
        with controller._lock:
            controller.backoff.append(seconds)
        controller.clock.sleep(seconds)

    @classmethod
    def enable(cls) -> None:
        endpoint = _endpoint_module()
        if not isinstance(endpoint.time, _VirtualBackoff):
            cls._saved = endpoint.time
            endpoint.time = _VirtualBackoff()

    @classmethod
    def disable(cls) -> None:
        endpoint = _endpoint_module()
        if isinstance(endpoint.time, _VirtualBackoff):
            endpoint.time = cls._saved


class _VirtualTokenWait:
    """botocore's adaptive retry mode, with its client-side rate limiter waiting on the layer's clock.

    In adaptive mode (fleetkeeper's EC2 client) every attempt first takes a token from a bucket whose
    fill rate botocore lowers on each throttle; short of a token, `TokenBucket._acquire` waits on a
    condition variable for (tokens missing / fill rate) seconds of real time. While a controller is
    active that wait is taken on its clock instead (recorded in `rate_limited`), and the bucket is
    credited the tokens the wait would have filled: the same decision, in virtual seconds.
    """

    _saved: Any = None

    @staticmethod
    def acquire(bucket: Any, amount: int, block: bool) -> bool:
        controller = _active
        if controller is None or not block:
            return bool(_VirtualTokenWait._saved(bucket, amount, block))
        bucket._refill()
        if amount > bucket._current_capacity:
            wait = bucket._sleep_amount(amount)
            with controller._lock:
                controller.rate_limited.append(wait)
            controller.clock.sleep(wait)
            bucket._current_capacity = amount
        bucket._current_capacity -= amount
        return True

    @classmethod
    def enable(cls) -> None:
        from botocore.retries.bucket import TokenBucket

        if cls._saved is None:
            cls._saved = TokenBucket._acquire
            TokenBucket._acquire = lambda bucket, amount, block: cls.acquire(bucket, amount, block)

    @classmethod
    def disable(cls) -> None:
        from botocore.retries.bucket import TokenBucket

        if cls._saved is not None:
            TokenBucket._acquire = cls._saved
            cls._saved = None


def _endpoint_module() -> Any:
    import botocore.endpoint

    return botocore.endpoint


_installed = False
_install_lock = threading.Lock()


def install_hooks() -> None:
    """Put `StrictSend` in moto's slot of botocore's BUILTIN_HANDLERS (once per process).

    Clients created afterwards carry it; call this before any client exists (tests/conftest.py
    does, at import). Inert until a `StrictAws` is activated.
    """
    global _installed
    with _install_lock:
        if _installed:
            return
        import moto.core.models as moto_models
        from botocore.handlers import BUILTIN_HANDLERS

        stubber = moto_models.botocore_stubber
        for position, entry in enumerate(BUILTIN_HANDLERS):
            if entry[0] == "before-send" and entry[1] is stubber:
                BUILTIN_HANDLERS[position] = ("before-send", StrictSend(stubber))
                break
        else:  # pragma: no cover - moto changed how it hooks into botocore
            raise RuntimeError("moto's before-send handler is not among botocore's BUILTIN_HANDLERS")
        model_validation.install()
        _installed = True
