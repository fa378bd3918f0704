"""The reconciler function: a scheduled run over every service, or a kick for one.

EventBridge invokes it on `ReconcileSchedule` (all services + the orphan sweep); the api invokes
it asynchronously with {"service": name} after each write so a change starts within seconds.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit

from fleetkeeper.settings import Settings

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from fleetkeeper.reconciler.shell import Reconciler

logger = Logger()
# ReconcileCompleted, once per run that got to the end: the stack's "no completed run in 5 minutes"
# alarm watches it (namespace and `service` dimension from POWERTOOLS_* in template.yaml).
metrics = Metrics()
# The shell logs through the stdlib logger "fleetkeeper.reconciler.shell": give its "fleetkeeper"
# ancestor Powertools' JSON handler (it must exist first: Powertools configures registered loggers).
logging.getLogger("fleetkeeper")
copy_config_to_registered_loggers(source_logger=logger, include={"fleetkeeper"})


def build_reconciler(settings: Settings) -> Reconciler:
    """A reconciler for one invocation, from the settings the invocation read."""
    from fleetkeeper.reconciler.balancers import make_balancer
    from fleetkeeper.reconciler.drivers import make_driver
    from fleetkeeper.reconciler.shell import Reconciler
    from fleetkeeper.store.reconciler import ReconcilerStore
    from fleetkeeper.store.table import Table

    return Reconciler(
        store=ReconcilerStore(Table(settings.table_name)),
        driver=make_driver(settings),
        probe_budget_seconds=settings.probe_budget_seconds,
        balancer=make_balancer(settings),
    )


def service_of(event: Any) -> str | None:
    """The service a kick names; None for the schedule's event (or anything else): run them all."""
    if isinstance(event, dict) and isinstance(event.get("service"), str):
        return str(event["service"])
    return None


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # Configuration is read once per invocation, never at import.
    reconciler = build_reconciler(Settings.from_env(os.environ))
    name = service_of(event)
    report = reconciler.run_one(name) if name is not None else reconciler.run_all()
    summary = report.as_dict()
    # A run that changed nothing is the steady state: keep it out of the INFO log (one line a minute
    # per stack would be most of the log volume).
    changed = any(
        summary.get(key)
        for key in ("actions", "errors", "superseded", "orphans_terminated", "unloadable", "foreign_instances")
    )
    log = logger.info if changed else logger.debug
    log("reconcile run done", extra={"kick": name, **summary})
    metrics.add_metric(name="ReconcileCompleted", unit=MetricUnit.Count, value=1)
    return summary
