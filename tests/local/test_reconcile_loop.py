"""The reconciler loop: scheduled runs every tick, kicked runs right away, failures survived."""

from __future__ import annotations

import threading
import time
from typing import Any

from fleetkeeper.local.reconcile_loop import ReconcileLoop


class Calls:
    def __init__(self, fail_first: int = 0) -> None:
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.fail_first = fail_first
        self.lock = threading.Lock()

    def __call__(self, event: dict[str, Any], context: Any) -> None:
        assert context.get_remaining_time_in_millis() > 0
        with self.lock:
            self.events.append((time.monotonic(), event))
            failing = len(self.events) <= self.fail_first
        if failing:
            raise RuntimeError("reconciler crashed")

    def kicked(self) -> list[str]:
        with self.lock:
            return [e["service"] for _, e in self.events if "service" in e]

    def scheduled(self) -> int:
        with self.lock:
            return sum(1 for _, e in self.events if e.get("detail-type") == "Scheduled Event")


def wait_until(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def test_scheduled_runs_happen_every_tick() -> None:
    calls = Calls()
    loop = ReconcileLoop(calls, tick=0.1)
    loop.start()
    try:
        wait_until(lambda: calls.scheduled() >= 4)
    finally:
        loop.stop()
    assert calls.kicked() == []


def test_a_kick_runs_that_service_at_once_not_at_the_next_tick() -> None:
    calls = Calls()
    loop = ReconcileLoop(calls, tick=30)
    loop.start()
    try:
        wait_until(lambda: calls.scheduled() == 1)  # the first run happens at start
        kicked_at = time.monotonic()
        loop.kick("web")
        wait_until(lambda: calls.kicked() == ["web"])
        ran_at = next(t for t, e in calls.events if e.get("service") == "web")
    finally:
        loop.stop()
    assert ran_at - kicked_at < 1.0
    assert calls.scheduled() == 1


def test_kicks_for_the_same_service_coalesce_while_a_run_is_busy() -> None:
    release = threading.Event()
    seen: list[dict[str, Any]] = []

    def slow(event: dict[str, Any], _context: Any) -> None:
        seen.append(event)
        release.wait(5)

    loop = ReconcileLoop(slow, tick=30)
    loop.start()
    try:
        wait_until(lambda: len(seen) == 1)  # busy with the first scheduled run
        for _ in range(5):
            loop.kick("web")
        loop.kick("api")
        release.set()
        wait_until(lambda: len(seen) == 3)
        time.sleep(0.1)
    finally:
        loop.stop()
    assert seen[1:] == [{"service": "api"}, {"service": "web"}]


def test_a_failing_run_does_not_stop_the_loop() -> None:
    calls = Calls(fail_first=2)
    loop = ReconcileLoop(calls, tick=0.05)
    loop.start()
    try:
        wait_until(lambda: calls.scheduled() >= 4)
    finally:
        loop.stop()
    assert loop.runs >= 4


def test_constant_kicks_do_not_starve_the_scheduled_run() -> None:
    calls = Calls()
    loop = ReconcileLoop(calls, tick=0.2)
    loop.start()
    stop = threading.Event()

    def kicker() -> None:
        while not stop.is_set():
            loop.kick("busy")
            time.sleep(0.01)

    thread = threading.Thread(target=kicker)
    thread.start()
    try:
        wait_until(lambda: calls.scheduled() >= 4, timeout=5)
    finally:
        stop.set()
        thread.join()
        loop.stop()


def test_a_delayed_kick_runs_when_due_and_a_follow_up_asked_twice_runs_once() -> None:
    """The reconciler's follow-ups in embedded mode: kept in-process until due (as SQS's DelaySeconds
    keeps them on AWS), each with the due time it names; the tick stays the backstop."""
    calls = Calls()
    loop = ReconcileLoop(calls, tick=30)
    loop.start()
    try:
        wait_until(lambda: calls.scheduled() == 1)
        asked = time.monotonic()
        loop.kick("web", 0.2, followup=1234)
        loop.kick("web", 0.2, followup=1234)  # the same follow-up again: kept once
        loop.kick("api", 0.05)
        assert loop.pending() == [("api", None), ("web", 1234)]
        wait_until(lambda: len(calls.kicked()) == 2)
    finally:
        loop.stop()
    with calls.lock:
        kicked = [(when, event) for when, event in calls.events if "service" in event]
    assert [event for _, event in kicked] == [{"service": "api"}, {"service": "web", "followup": 1234}]
    assert kicked[1][0] - asked >= 0.2  # not before its delay
    assert loop.pending() == [] and calls.scheduled() == 1
