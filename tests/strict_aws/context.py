"""A Lambda context whose remaining time runs out on the layer's clock, and Lambda's kill."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import TracebackType

    from tests.strict_aws.clock import VirtualClock

_request_ids = itertools.count(1)


class LambdaTimeout(BaseException):
    """Lambda stopped the invocation: its time ran out.

    A BaseException, like the SIGKILL it models: no `except Exception` in the handler catches it, so
    nothing after the kill runs (no cleanup, no partial-failure report). The strict layer raises it
    from the first AWS call (attempt) made once the invocation's remaining time has reached zero;
    the call is not sent.
    """


class LambdaContext:
    """What Lambda passes as `context`, with `get_remaining_time_in_millis()` on a virtual clock.

    Made by `StrictAws.lambda_context()`, which also makes it the current invocation: while it is
    current and its time is up, every AWS call raises `LambdaTimeout`. `end()` (or leaving a `with`
    block) ends the invocation, e.g. before the test inspects AWS itself.
    """

    function_version = "$LATEST"
    memory_limit_in_mb = 512
    log_stream_name = "strict-aws"

    def __init__(self, clock: VirtualClock, *, timeout_seconds: float, function_name: str) -> None:
        if timeout_seconds <= 0:
            raise ValueError("a Lambda timeout is positive")
        self._clock = clock
        self.timeout_seconds = float(timeout_seconds)
        self.started_at = clock.time()
        self.deadline = self.started_at + self.timeout_seconds
        self.function_name = function_name
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.aws_request_id = f"strict-{next(_request_ids):06d}"
        self.ended = False
        self.killed = False

    def get_remaining_time_in_millis(self) -> int:
        return max(0, round((self.deadline - self._clock.time()) * 1000))

    @property
    def expired(self) -> bool:
        return not self.ended and self._clock.time() >= self.deadline

    def end(self) -> None:
        """The invocation is over (returned, or was killed and the test moves on)."""
        self.ended = True

    def kill(self) -> LambdaTimeout:
        self.killed = True
        return LambdaTimeout(f"{self.aws_request_id} Task timed out after {self.timeout_seconds:.2f} seconds")

    def __enter__(self) -> LambdaContext:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.end()
