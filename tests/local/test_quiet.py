"""Embedded mode is quiet by default: no EMF blobs, no Powertools warnings, no per-run INFO lines."""

from __future__ import annotations

import io
import logging
import warnings
from typing import TYPE_CHECKING, Any

import pytest
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from fleetkeeper.local import readable_logs
from fleetkeeper.local.context import LocalContext
from fleetkeeper.local.server import _without_metrics, quiet_library_warnings

if TYPE_CHECKING:
    from collections.abc import Iterator


@pytest.fixture
def metrics_disabled(monkeypatch: pytest.MonkeyPatch) -> Iterator[Metrics]:
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", "true")
    monkeypatch.setenv("POWERTOOLS_METRICS_NAMESPACE", "fk-quiet-test")
    metrics = Metrics()
    metrics.clear_metrics()
    yield metrics
    metrics.clear_metrics()


def counting_handler(metrics: Metrics) -> Any:
    @metrics.log_metrics
    def handler(event: dict[str, Any], context: Any) -> None:
        metrics.add_metric(name="Runs", unit=MetricUnit.Count, value=1)

    return handler


def test_powertools_prints_an_emf_blob_after_100_runs_even_when_disabled(
    metrics_disabled: Metrics, capsys: pytest.CaptureFixture[str]
) -> None:
    """What embedded mode works around: the disabled metrics pile up until add_metric prints them."""
    handler = counting_handler(metrics_disabled)
    for _ in range(101):
        handler({}, LocalContext("ReconcilerFunction", 10))
    assert "CloudWatchMetrics" in capsys.readouterr().out


def test_embedded_mode_drops_each_invocations_metrics_so_nothing_is_printed(
    metrics_disabled: Metrics, capsys: pytest.CaptureFixture[str]
) -> None:
    handler = _without_metrics(counting_handler(metrics_disabled))
    for _ in range(250):
        handler({}, LocalContext("ReconcilerFunction", 10))
    assert capsys.readouterr().out == ""


def test_the_empty_metrics_warning_is_not_shown_in_embedded_mode(metrics_disabled: Metrics) -> None:
    @metrics_disabled.log_metrics
    def quiet_handler(event: dict[str, Any], context: Any) -> None:
        return None

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_handler({}, LocalContext("ReconcilerFunction", 10))
    assert any("No application metrics to publish" in str(w.message) for w in seen)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_library_warnings()  # what configure_environment does
        quiet_handler({}, LocalContext("ReconcilerFunction", 10))
    assert seen == []


def test_the_reconcilers_per_run_summaries_are_shown_with_verbose_only(restore_root_logging: None) -> None:
    stream = io.StringIO()
    logger = Logger(service="fk-quiet-logs-test", stream=stream)
    try:
        readable_logs.make_logs_readable(logging.INFO, routine=False)
        logger.info("dispatched", extra={"services": 1})
        logger.info("reconcile run done", extra={"services": 1})
        logger.info("status recorded", extra={"status": "READY"})
        logger.warning("reconcile run done")  # a warning is never routine
        lines = stream.getvalue().splitlines()
        assert len(lines) == 2
        assert "status recorded" in lines[0] and "WARNING" in lines[1]
        readable_logs.make_logs_readable(logging.INFO, routine=True)  # -v
        logger.info("dispatched", extra={"services": 1})
        assert "dispatched" in stream.getvalue().splitlines()[-1]
    finally:
        for handler in logging.getLogger("fk-quiet-logs-test").handlers:
            for kept in [f for f in handler.filters if isinstance(f, readable_logs._NoRoutine)]:
                handler.removeFilter(kept)
