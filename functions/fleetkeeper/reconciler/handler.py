"""The reconciler's two functions: the dispatcher (the schedule) and the worker (shards and kicks).

`dispatch_handler`: EventBridge invokes it on `ReconcileSchedule`. It lists the services, queues
them in shards and runs the orphan sweep (fleetkeeper.reconciler.dispatcher).

`lambda_handler`, the worker, is invoked by two queues' event sources, one message an invocation,
each with a maximum concurrency (template.yaml), so neither a storm of writes nor a big stack can
take the account's Lambda concurrency:
- the reconcile queue: a shard; it reconciles the shard's services within its budget (what its
  invocation and the period leave; fleetkeeper.reconciler.budget);
- the kick queue: {"service": name}, sent by the api after each write: that one service at once,
  with no budget beyond the function's timeout. A kick older than a period is dropped: the
  scheduled run has been over that service since. The stack's InterruptionRule puts EC2's spot
  interruption warnings and rebalance recommendations on the same queue: the warned replica is
  recorded and its service reconciled at once (fleetkeeper.reconciler.interruptions). The
  InstanceStateRule puts EC2's state-change notifications there too (stopping, stopped,
  shutting-down, terminated): the service whose replica it was is reconciled at once
  (fleetkeeper.reconciler.state_changes). And the reconciler's own follow-ups (a delayed kick that
  names its due time, fleetkeeper.reconciler.followup) come back through it.
A direct invoke with {"service": name} is a kick too (an operator's `aws lambda invoke`).

Both hold every AWS call of the invocation to its Lambda deadline (`aws.within`, less the reserve it
keeps to return): a call that would outlast it raises `aws.DeadlineReached` instead of being killed
with the invocation. The worker's runs end there as its budget's end ends them (the service in
progress `cut_short`, the rest `skipped`) and return their report; the dispatcher stops its
period's work there (fleetkeeper.reconciler.dispatcher). An EC2 event whose replica was not yet
recorded when the deadline came fails its invocation instead, so that SQS delivers it again.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit

from fleetkeeper import aws
from fleetkeeper.reconciler import interruptions, state_changes
from fleetkeeper.settings import Settings, SettingsError

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

    from fleetkeeper.reconciler.dispatcher import Dispatcher
    from fleetkeeper.reconciler.run import Reconciler

logger = Logger()
# ReconcileCompleted, once per run that got to the end: the stack's "no completed run in 5 minutes"
# alarm watches it (namespace and `service` dimension from POWERTOOLS_* in template.yaml).
metrics = Metrics()
# The reconciler logs through stdlib loggers (fleetkeeper.reconciler.run, .apply...): give their "fleetkeeper"
# ancestor Powertools' JSON handler (it must exist first: Powertools configures registered loggers).
logging.getLogger("fleetkeeper")
copy_config_to_registered_loggers(source_logger=logger, include={"fleetkeeper"})

# What a function keeps for itself after its last AWS call: the report, the log line, the metrics.
# Its budget and its calls' deadline both end this long before Lambda's timeout.
_RETURN_RESERVE_SECONDS = 1.0
_CHANGED = (
    "actions",
    "errors",
    "superseded",
    "orphans_terminated",
    "unloadable",
    "foreign_instances",
    "adopted_instances",
)


def build_reconciler(settings: Settings) -> Reconciler:
    """A reconciler for one invocation, from the settings the invocation read."""
    from fleetkeeper.reconciler.balancers import make_balancer
    from fleetkeeper.reconciler.drivers import make_driver
    from fleetkeeper.reconciler.metrics import RequestRates
    from fleetkeeper.reconciler.run import Reconciler
    from fleetkeeper.store.runs import ReconcilerStore
    from fleetkeeper.store.table import Table

    balancer = make_balancer(settings)
    # The request rate comes from the endpoints' metric: no load balancer, no signal.
    rates = (
        RequestRates(window_seconds=settings.metric_window_seconds, lag_seconds=settings.metric_lag_seconds)
        if balancer is not None
        else None
    )
    from fleetkeeper.kick import ReconcilerKick

    kick = ReconcilerKick.from_settings(settings)
    return Reconciler(
        kick=kick if kick.queue_url or kick.url else None,
        follow_up=kick.follow_up if kick.queue_url or kick.url else None,
        store=ReconcilerStore(Table(settings.table_name)),
        driver=make_driver(settings),
        probe_budget_seconds=settings.probe_budget_seconds,
        read_concurrency=settings.read_concurrency,
        adopt_untagged_replicas=settings.adopt_untagged_replicas,
        balancer=balancer,
        rates=rates,
    )


def build_dispatcher(settings: Settings) -> Dispatcher:
    from fleetkeeper.reconciler.dispatcher import Dispatcher
    from fleetkeeper.reconciler.queue import ShardQueue

    if settings.reconcile_queue_url is None:
        raise SettingsError("FLEETKEEPER_RECONCILE_QUEUE_URL is not set: the dispatcher has nowhere to send shards")
    from fleetkeeper.replicas.identity import IdentityKeeper, ReplicaIdentities
    from fleetkeeper.store.identities import IdentityRecords
    from fleetkeeper.store.table import Table

    ec2 = settings.ec2
    identities = None
    if settings.driver == "ec2" and ec2.replica_identity == "owner" and ec2.replica_policy_arn:
        identities = IdentityKeeper(
            ReplicaIdentities(ec2.stack_id, ec2.replica_policy_arn), IdentityRecords(Table(settings.table_name))
        )
    return Dispatcher(
        reconciler=build_reconciler(settings),
        queue=ShardQueue(settings.reconcile_queue_url),
        shard_size=settings.shard_size,
        period_seconds=settings.period_seconds,
        identities=identities,
    )


def service_of(event: Any) -> str | None:
    """The service a kick names; None for anything else."""
    if isinstance(event, dict) and isinstance(event.get("service"), str):
        return str(event["service"])
    return None


def sqs_records(event: Any) -> list[dict[str, Any]] | None:
    """The records of an SQS event (the reconcile or kick queue's), None for another event."""
    if not isinstance(event, dict) or not isinstance(event.get("Records"), list):
        return None
    records: list[dict[str, Any]] = event["Records"]
    if not all(isinstance(r, dict) and r.get("eventSource") == "aws:sqs" for r in records):
        return None
    return records


def _json_object(body: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _due(message: Any) -> float | None:
    """When a delayed kick is due (epoch seconds; fleetkeeper.kick), None for an immediate one."""
    due = message.get("due") if isinstance(message, dict) else None
    return float(due) if isinstance(due, int | float) and not isinstance(due, bool) else None


def followup_of(message: Any) -> int | None:
    """The due time a follow-up kick names (fleetkeeper.kick.ReconcilerKick.follow_up), else None."""
    stamp = message.get("followup") if isinstance(message, dict) else None
    return stamp if isinstance(stamp, int) and not isinstance(stamp, bool) else None


def kick_in(message: Any) -> str | None:
    """The service a kick message (parsed) names; None for a shard (or anything else)."""
    return service_of(message) if isinstance(message, dict) and "format" not in message else None


def sent_at(record: dict[str, Any]) -> float | None:
    """When SQS accepted the message, in epoch seconds (the event source's SentTimestamp, in ms)."""
    raw = record.get("attributes", {}).get("SentTimestamp") if isinstance(record.get("attributes"), dict) else None
    try:
        return int(raw) / 1000 if raw is not None else None
    except ValueError:
        return None


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def dispatch_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    dispatcher = build_dispatcher(Settings.from_env(os.environ))
    with aws.within(aws.seconds_left(context, _RETURN_RESERVE_SECONDS)):
        summary = dispatcher.run().as_dict()
    if summary["out_of_time"]:
        logger.warning("dispatch cut short", extra=summary)
        return summary  # not a completed run: the stalled alarm counts it as a killed one
    logger.info("dispatched", extra=summary)
    # The "no completed run in 5 minutes" alarm watches this (template.yaml, ReconcilerStalledAlarm).
    metrics.add_metric(name="ReconcileCompleted", unit=MetricUnit.Count, value=1)
    return summary


@metrics.log_metrics
@logger.inject_lambda_context(clear_state=True)
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # Configuration is read once per invocation, never at import.
    settings = Settings.from_env(os.environ)
    reconciler = build_reconciler(settings)
    with aws.within(aws.seconds_left(context, _RETURN_RESERVE_SECONDS)):
        return _handle(reconciler, settings, event, context)


def _handle(
    reconciler: Reconciler, settings: Settings, event: dict[str, Any], context: LambdaContext
) -> dict[str, Any]:
    if interruptions.is_warning(event):
        return _interrupt(reconciler, event)
    if state_changes.is_state_change(event):
        return _state_change(reconciler, event)
    name = service_of(event)
    if name is not None:
        return _run_kick(reconciler, name, followup_of(event))
    records = sqs_records(event)
    if records is None:
        # The schedule invokes the dispatcher, not this function: nothing to do here.
        logger.warning("not a kick nor a shard: ignored", extra={"event_keys": sorted(event)[:10]})
        return {"ignored": "expected {'service': name} or an SQS event of the reconcile or kick queue"}
    summaries = [_run_record(reconciler, settings, record, context) for record in records]
    return {"runs": summaries}


def _interrupt(reconciler: Reconciler, event: Any) -> dict[str, Any]:
    """One of EC2's warnings (the InterruptionRule's, through the kick queue, or a direct invoke)."""
    interruption = interruptions.interruption_of(event)
    if interruption is None:
        logger.error("dropped an EC2 warning that names no instance or time", extra={"event": event})
        return {"dropped": "an EC2 warning without detail.instance-id or time"}
    try:
        report = reconciler.interrupt(interruption)
    except aws.DeadlineReached:
        # Before the warning was recorded: failing the invocation has SQS deliver it again.
        logger.error("out of time before the EC2 warning about %s was recorded", interruption.instance_id)
        raise
    summary = {"interruption": interruption.instance_id, **report.as_dict()}
    _log_run(summary, kick=interruption.instance_id)
    return summary


def _state_change(reconciler: Reconciler, event: Any) -> dict[str, Any]:
    """One of EC2's state-change notifications (the InstanceStateRule's, through the kick queue)."""
    change = state_changes.state_change_of(event)
    if change is None:
        logger.error("dropped an EC2 state-change notification that names no instance or state", extra={"event": event})
        return {"dropped": "an EC2 state-change notification without detail.instance-id or a rule's state"}
    try:
        report = reconciler.instance_changed(change)
    except aws.DeadlineReached:
        # Before the instance was known: failing the invocation has SQS deliver it again.
        logger.error("out of time before the state change of %s was looked up", change.instance_id)
        raise
    summary = {"instance": change.instance_id, "state": change.state, **report.as_dict()}
    _log_run(summary, kick=change.instance_id)
    return summary


def _run_kick(reconciler: Reconciler, name: str, followup: int | None) -> dict[str, Any]:
    report = reconciler.run_one(name, followup=followup)
    if report.void_followup:
        # A duplicate delivery, or a follow-up a newer one replaced: its read was all it cost.
        return {"kick": name, "followup": followup, "void": True}
    summary = {"kick": name, **report.as_dict()}
    _log_run(summary, kick=name)
    return summary


def _run_record(
    reconciler: Reconciler, settings: Settings, record: dict[str, Any], context: LambdaContext
) -> dict[str, Any]:
    body = str(record.get("body", ""))
    message = _json_object(body)
    if interruptions.is_warning(message):
        # Never dropped for its age: a late warning is still acted on (the plan sees what is left).
        return _interrupt(reconciler, message)
    if state_changes.is_state_change(message):
        # Nor a state change: the replica is still to be replaced.
        return _state_change(reconciler, message)
    name = kick_in(message)
    if name is None:
        return _run_shard(reconciler, settings, body, context)
    sent = sent_at(record)
    due = _due(message)
    if due is not None and sent is not None:
        sent = max(sent, due)  # a delayed kick (a warned replica's drain) is as old as its due time
    if sent is not None and time.time() - sent > settings.period_seconds:
        logger.info("kick for %s is older than a period: dropped (the scheduled run has covered it)", name)
        return {"kick": name, "stale": True}
    return _run_kick(reconciler, name, followup_of(message))


def _run_shard(reconciler: Reconciler, settings: Settings, body: str, context: LambdaContext) -> dict[str, Any]:
    from fleetkeeper.reconciler.budget import ShardBudget
    from fleetkeeper.reconciler.fanout import Shard, ShardError

    try:
        shard = Shard.from_body(body)
    except ShardError as exc:
        # Retrying it would not help; the next dispatch sends well-formed shards.
        logger.error("dropped a message that is not a shard: %s", exc)
        return {"dropped": str(exc)}

    def remaining() -> float:
        # The invocation's time and the period's, whichever ends first, less the return reserve.
        invocation = context.get_remaining_time_in_millis() / 1000
        return min(invocation, shard.not_after - time.time()) - _RETURN_RESERVE_SECONDS

    if shard.not_after <= time.time():
        # It waited in the queue past its period: the next dispatch has handed its services out again.
        logger.warning("shard %d of run %d is stale: skipped", shard.index, shard.run)
        return {"shard": shard.index, "run": shard.run, "stale": True, "skipped": list(shard.services)}
    budget = ShardBudget(remaining, settings.service_margin_seconds, settings.action_margin_seconds)
    report = reconciler.run_shard(shard.ordered(), budget)
    summary = {"shard": shard.index, "run": shard.run, **report.as_dict()}
    _log_run(summary, kick=None)
    return summary


def _log_run(summary: dict[str, Any], *, kick: str | None) -> None:
    # A run that changed nothing is the steady state: keep it out of the INFO log (one line a minute
    # per shard would be most of the log volume).
    changed = any(summary.get(key) for key in (*_CHANGED, "skipped", "cut_short"))
    log = logger.info if changed else logger.debug
    log("reconcile run done", extra={"kick": kick, **summary})
    if kick is None:
        # Zero too: the "falling behind" alarm needs a data point to say all is well.
        skipped = len(summary.get("skipped", [])) + len(summary.get("cut_short", []))
        metrics.add_metric(name="ServicesSkipped", unit=MetricUnit.Count, value=skipped)
    else:
        metrics.add_metric(name="KicksCompleted", unit=MetricUnit.Count, value=1)
