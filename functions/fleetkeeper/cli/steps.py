"""A checklist of steps, each bounded in time and reported PASS, FAIL or SKIP (`fleetkeeper doctor`).

A step is a function of its `Deadline` that returns what it saw (one line for people). It fails by
raising `StepFailed` with what was expected and what was seen, and is skipped by raising
`StepSkipped` with the reason. Any other error a step meets (the API's refusal, an unreachable
endpoint, an AWS error, Ctrl-C) is its FAIL too, never the end of the run: the caller decides which
steps still run (the clean-up always does), and the exit code is 1 once any step failed.

Deadlines are kept by the steps themselves: every wait asks `Deadline.remaining()` and every request
has a timeout of its own, so a step overruns its deadline by at most one request's timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import IO, TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


class Verdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    SKIP = "SKIP"


class StepFailed(Exception):
    """The step saw something other than what it expected; the message says both."""


class StepSkipped(Exception):
    """The step cannot run here; the message says why."""


@dataclass
class Deadline:
    """A step's time budget: `seconds` from when the step began."""

    seconds: float
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def remaining(self) -> float:
        return max(0.0, self.seconds - self.elapsed())

    def expired(self) -> bool:
        return self.remaining() <= 0.0


@dataclass(frozen=True)
class StepResult:
    number: int
    title: str
    verdict: Verdict
    elapsed: float
    detail: str


def wait_until(
    deadline: Deadline,
    check: Callable[[], T | None],
    *,
    expected: str,
    seen: Callable[[], str],
    interval: float = 1.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call `check` until it returns something other than None (that is the answer), at most until
    the deadline; then StepFailed saying what was expected and what was seen last."""
    while True:
        found = check()
        if found is not None:
            return found
        if deadline.expired():
            raise StepFailed(f"expected {expected} within {deadline.seconds:g}s; last seen: {seen()}")
        sleep(min(interval, max(deadline.remaining(), 0.01)))


class StepRunner:
    """Runs steps one by one, prints each one's verdict line as it ends, and keeps the results."""

    def __init__(
        self,
        out: IO[str],
        *,
        clock: Callable[[], float] = time.monotonic,
        width: int = 14,
    ) -> None:
        self.out = out
        self.clock = clock
        self.width = width
        self.results: list[StepResult] = []
        self.interrupted = False
        self._started = clock()

    @property
    def failed(self) -> bool:
        return any(r.verdict is Verdict.FAIL for r in self.results)

    def run(self, title: str, timeout: float, action: Callable[[Deadline], str]) -> StepResult:
        """Run one step within `timeout` seconds and report it; never raises (Ctrl-C included: it is
        this step's FAIL, and `interrupted` tells the caller to run nothing but the clean-up)."""
        deadline = Deadline(timeout, self.clock)
        try:
            detail = action(deadline)
            verdict = Verdict.PASS
        except StepFailed as exc:
            verdict, detail = Verdict.FAIL, str(exc)
        except StepSkipped as exc:
            verdict, detail = Verdict.SKIP, str(exc)
        except KeyboardInterrupt:
            self.interrupted = True
            verdict, detail = Verdict.FAIL, "interrupted (Ctrl-C)"
        except Exception as exc:  # a smoke test reports every error as the step's FAIL
            verdict, detail = Verdict.FAIL, f"{type(exc).__name__}: {exc}"
        return self._record(title, verdict, deadline.elapsed(), detail)

    def skip(self, title: str, reason: str) -> StepResult:
        return self._record(title, Verdict.SKIP, 0.0, reason)

    def _record(self, title: str, verdict: Verdict, elapsed: float, detail: str) -> StepResult:
        result = StepResult(len(self.results) + 1, title, verdict, elapsed, detail)
        self.results.append(result)
        self.out.write(f"{verdict.value}  {result.number} {title:<{self.width}} {elapsed:7.1f}s  {detail}\n")
        self.out.flush()
        return result

    def summary(self) -> str:
        counts = {v: sum(1 for r in self.results if r.verdict is v) for v in Verdict}
        took = self.clock() - self._started
        return (
            f"{counts[Verdict.PASS]} passed, {counts[Verdict.FAIL]} failed, {counts[Verdict.SKIP]} skipped "
            f"in {took:.0f}s"
        )

    def exit_code(self) -> int:
        return 1 if self.failed else 0
