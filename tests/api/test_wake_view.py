"""What a user sees of a service at zero: the api's autoscaling view says `waking` while the endpoint
routes to the wake target, and `fleetkeeper status` says what a request does then."""

from __future__ import annotations

from dataclasses import replace

from fleetkeeper.api.models import AutoscalingView, autoscaling_view
from fleetkeeper.cli.render import autoscaling_line
from tests.reconciler.plan.test_wake import WAKING, at_zero
from tests.support.builders import ENDPOINT, NOW


def test_the_view_says_waking_while_the_endpoint_routes_to_the_wake_target() -> None:
    shown = autoscaling_view(at_zero(), NOW)
    assert shown is not None and shown["waking"] is True and shown["target_replicas"] == 0
    AutoscalingView.model_validate(shown)  # the documented shape
    serving = at_zero(endpoint=ENDPOINT)
    assert autoscaling_view(serving, NOW)["waking"] is False  # type: ignore[index]
    no_endpoint = at_zero(endpoint=None)
    assert autoscaling_view(no_endpoint, NOW)["waking"] is False  # type: ignore[index]
    assert WAKING.waking and not replace(WAKING, waking_since=None).waking


def test_status_says_a_request_wakes_it() -> None:
    shown = autoscaling_view(at_zero(), NOW)
    line = autoscaling_line(shown, NOW)
    assert line is not None
    assert line.startswith("  autoscaling: 0 replica(s) (0-2, 2 req/s each)")
    assert line.endswith("; 0 req/s (read 1h ago); at zero: a request gets 503 + Retry-After and wakes it")
    assert "wakes it" not in (autoscaling_line({**shown, "waking": False}, NOW) or "")  # type: ignore[dict-item]


def test_a_booting_service_is_not_said_to_wake() -> None:
    """Waking routes a service with no READY replica to the wake target, a new one booting too; only
    one at zero is woken by a request (issue 36: "wakes it" on a service that was simply booting)."""
    shown = autoscaling_view(at_zero(), NOW)
    assert shown is not None
    booting = autoscaling_line({**shown, "target_replicas": 1, "request_rate": None}, NOW)
    assert booting == (
        "  autoscaling: 1 replica(s) (0-2, 2 req/s each); no reading yet; "
        "no replica ready yet: requests get 503 + Retry-After until one is"
    )
