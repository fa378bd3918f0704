"""A deadline every fleetkeeper client honours: no attempt starts, and no retry waits, past it.

A Lambda handler knows when it will be killed (its context's remaining time); botocore does not. One
call of fleetkeeper's clients may last 6 attempts of up to connect + read timeout each (3 + 10 s),
with backoff pauses of up to 20 s (+5 s for `x-amz-retry-after`) between them: a call started with
the budget's margins in hand can still outlast the invocation. Under `within(remaining)` (a context
variable: the handler sets it for its invocation, and work handed to a pool in a copy of the
caller's context inherits it), every fleetkeeper client checks it at botocore's two decision points:

- `before-send` (the last event before an attempt goes on the wire): the attempt starts only if the
  remaining time covers its worst case, the client's connect + read timeout (+ the adaptive rate
  limiter's longest wait for a token, for an adaptive client);
- `needs-retry` (after an attempt failed): when botocore's own retry conditions (StandardRetryConditions,
  the same checks its handler makes) would retry, the retry is taken only if the remaining time
  covers the longest pause botocore's backoff can choose for it plus the next attempt's worst case.

Short of it, the call raises `DeadlineReached` (carrying the service, operation, remaining and
needed seconds, and the error a vetoed retry followed) instead of starting the attempt or the
pause. A call that botocore would not retry (a ConditionalCheckFailedException, a validation error,
the last attempt) is never touched: its own error surfaces unchanged.

What it does not bound: one attempt itself. botocore's read timeout bounds each wait for data on the
socket, not the whole response (fleetkeeper's answers are small: one or a few reads), and name
resolution is not under the connect timeout. Those are the "attempt's worst case" assumptions.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

# botocore's adaptive mode (botocore/retries/bucket.py, TokenBucket): before an attempt the client
# takes a token, waiting for one at no less than 0.5 tokens a second: at most 2 s for the one it needs.
_ADAPTIVE_TOKEN_WAIT_SECONDS = 2.0


class DeadlineReached(Exception):
    """An AWS call stopped by the deadline: the attempt (or the retry) would have outlasted it.

    Not a ClientError: no caller mistakes it for AWS's answer. Nothing was sent for the attempt it
    stopped; an earlier attempt of the same call may have been (`after` names what it answered).
    """

    def __init__(self, service: str, operation: str, remaining: float, needed: float, after: str | None = None) -> None:
        self.service = service
        self.operation = operation
        self.remaining = remaining
        self.needed = needed
        self.after = after
        what = f"a retry after {after}" if after else "an attempt"
        super().__init__(
            f"{service} {operation}: {max(remaining, 0.0):.1f} s left before the deadline, "
            f"{what} may need up to {needed:.1f} s"
        )


@dataclass
class Deadline:
    """The time the current invocation has left for AWS calls, and the first call it stopped."""

    remaining: Callable[[], float]  # seconds; may fall below zero
    stopped: DeadlineReached | None = field(default=None)

    @property
    def reached(self) -> bool:
        """True once it stopped a call: the remaining time only shrinks, so every later call would stop too."""
        return self.stopped is not None

    def require(self, needed: float, service: str, operation: str, after: str | None = None) -> None:
        left = self.remaining()
        if left >= needed:
            return
        reached = DeadlineReached(service, operation, left, needed, after)
        if self.stopped is None:
            self.stopped = reached
        raise reached


_current: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("fleetkeeper_aws_deadline", default=None)


def current() -> Deadline | None:
    """The deadline the calls made here are held to (None: none, as in the api and the CLI)."""
    return _current.get()


def reached() -> bool:
    """Whether the current deadline has stopped a call (False without one)."""
    deadline = _current.get()
    return deadline is not None and deadline.reached


@contextlib.contextmanager
def within(remaining: Callable[[], float]) -> Iterator[Deadline]:
    """Hold every AWS call in this block (and in work handed on in a copy of its context) to
    `remaining()` seconds. Nested inside another deadline, the earlier of the two holds."""
    outer = _current.get()
    if outer is None:
        deadline = Deadline(remaining)
    else:
        outer_remaining = outer.remaining
        deadline = Deadline(lambda: min(remaining(), outer_remaining()))
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)


def keeping(seconds: float) -> contextlib.AbstractContextManager[Deadline | None]:
    """Hold every AWS call in this block to the current deadline less `seconds` (what the caller keeps
    for its work after the block); without a current deadline, to none."""
    outer = _current.get()
    if outer is None:
        return contextlib.nullcontext()
    return within(lambda: outer.remaining() - seconds)


def seconds_left(context: Any, reserve_seconds: float) -> Callable[[], float]:
    """A Lambda context's remaining time, less what the handler keeps to return (`within`'s argument)."""
    return lambda: context.get_remaining_time_in_millis() / 1000 - reserve_seconds


class ClientGuard:
    """One client's `before-send` and `needs-retry` handlers (see the module docstring)."""

    def __init__(self, client: Any) -> None:
        from botocore.retries.standard import (
            ExponentialBackoff,
            RetryEventAdapter,
            StandardRetryConditions,
            ThrottlingErrorDetector,
        )

        config = client.meta.config
        retries = config.retries or {}
        self.service = client.meta.service_model.service_id.hyphenize()
        self.attempt_seconds = float(config.connect_timeout) + float(config.read_timeout)
        if retries.get("mode") == "adaptive":
            self.attempt_seconds += _ADAPTIVE_TOKEN_WAIT_SECONDS
        # The checks botocore's standard handler makes (its own classes, as its register_retry_handler
        # builds them), and its backoff with the jitter at its top: the longest pause it can choose.
        self._adapter = RetryEventAdapter()
        self._conditions = StandardRetryConditions(max_attempts=int(retries.get("total_max_attempts", 1)))
        self._longest_backoff = ExponentialBackoff(
            random=lambda: 1.0,
            service_name=self.service,
            throttling_detector=ThrottlingErrorDetector(self._adapter),
        )

    def install(self, client: Any) -> None:
        events = client.meta.events
        # First: before the attempt is sent (and, in tests, before moto's handler answers it).
        events.register_first("before-send", self.before_send, unique_id=f"fleetkeeper-deadline-send-{self.service}")
        # Last of all (after botocore's retry handler and the adaptive rate limiter have seen the
        # response): raising is the only way to stop a retry another handler asked for.
        events.register_last("needs-retry", self.needs_retry, unique_id=f"fleetkeeper-deadline-retry-{self.service}")

    def before_send(self, event_name: str = "", **_: Any) -> None:
        deadline = _current.get()
        if deadline is not None:
            deadline.require(self.attempt_seconds, self.service, _operation(event_name))

    def needs_retry(
        self,
        attempts: int,
        operation: Any,
        request_dict: dict[str, Any],
        response: Any = None,
        caught_exception: BaseException | None = None,
        **_: Any,
    ) -> None:
        deadline = _current.get()
        if deadline is None or isinstance(caught_exception, DeadlineReached):
            return
        context = self._adapter.create_retry_context(
            attempts=attempts,
            operation=operation,
            request_dict=request_dict,
            response=response,
            caught_exception=caught_exception,
        )
        if not self._conditions.is_retryable(context) or _quota_refused(context):
            return  # botocore does not retry it: its error surfaces as it is
        pause = self._longest_backoff.delay_amount(context)
        deadline.require(pause + self.attempt_seconds, self.service, operation.name, after=_error_of(context))


def guard(client: Any) -> None:
    """Make `client` honour the current deadline (fleetkeeper.aws does it for each client it makes)."""
    ClientGuard(client).install(client)


def _operation(event_name: str) -> str:
    # "before-send.<service>.<Operation>"
    return event_name.rsplit(".", 1)[-1] if event_name.count(".") >= 2 else "?"


def _quota_refused(context: Any) -> bool:
    """botocore's handler (it runs first) found its retry quota spent: it does not retry."""
    parsed = context.parsed_response
    return bool(parsed and parsed.get("ResponseMetadata", {}).get("RetryQuotaReached"))


def _error_of(context: Any) -> str:
    code = context.get_error_code()
    if code:
        return str(code)
    if context.caught_exception is not None:
        return type(context.caught_exception).__name__
    status = getattr(context.http_response, "status_code", None)
    return f"HTTP {status}" if status is not None else "an error"
