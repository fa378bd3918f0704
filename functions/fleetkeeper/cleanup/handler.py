"""The cleanup Lambda handler: one DynamoDB stream record = one removed service incarnation.

Thin: Powertools batch processing reports each failed record (ReportBatchItemFailures), so one
service whose cleanup fails or runs out of time never blocks the others; the logic is in logic.py.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response
from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecordEventName

from fleetkeeper import aws
from fleetkeeper.cleanup.logic import Budget, Cleaner, Incarnation, IncarnationStore
from fleetkeeper.replicas.secrets import SecretStore
from fleetkeeper.replicas.workdirs import store_from_settings
from fleetkeeper.settings import Settings
from fleetkeeper.store.cleanup import ChildKeys, live_uid
from fleetkeeper.store.keys import is_service_key
from fleetkeeper.store.table import Table

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
    from aws_lambda_powertools.utilities.data_classes.dynamo_db_stream_event import DynamoDBRecord
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger()
metrics = Metrics()
processor = BatchProcessor(event_type=EventType.DynamoDBStreams)


def _is_service_removal(record: DynamoDBRecord) -> bool:
    """The event source's filter admits only these; anything else (a pump without it) is not ours."""
    if record.event_name is not DynamoDBRecordEventName.REMOVE or record.dynamodb is None:
        return False
    return is_service_key(record.dynamodb.keys)


def record_handler(
    record: DynamoDBRecord,
    lambda_context: LambdaContext,
    *,
    table: Table,
    stores: tuple[tuple[str, IncarnationStore], ...] = (),
) -> None:
    if not _is_service_removal(record):
        logger.warning("ignoring a record that is not a service removal", extra={"event_id": record.event_id})
        metrics.add_metric(name="CleanupRecordsIgnored", unit=MetricUnit.Count, value=1)
        return
    assert record.dynamodb is not None  # checked by _is_service_removal
    log: dict[str, Any] = {"sequence_number": record.dynamodb.sequence_number}
    cleaner: Cleaner | None = None
    try:
        incarnation = Incarnation.from_old_image(record.dynamodb.old_image)
        # "service_name", not "service": that is Logger's own key (the function's service name).
        log.update(service_name=incarnation.name, uid=incarnation.uid)
        budget = Budget(remaining_ms=lambda_context.get_remaining_time_in_millis)
        # Every AWS call of the record (the re-read below included), botocore's retries included, ends
        # `reserve_ms` before the invocation does (fleetkeeper.aws.deadline): short of time, the record
        # fails and is redelivered.
        with aws.within(budget.deadline_seconds):
            # The record's word is not enough: anyone allowed lambda:InvokeFunction on this function can
            # hand it one, with the name and uid of a live service (both are in every GET). Deleting
            # starts only once the table says that incarnation's item is gone.
            if live_uid(table, incarnation.name) == incarnation.uid:
                logger.warning(
                    "the service item of this incarnation still exists: not a removal (a forged or replayed "
                    "record), nothing deleted",
                    extra=log,
                )
                metrics.add_metric(name="CleanupRecordsOfLiveServices", unit=MetricUnit.Count, value=1)
                return
            cleaner = Cleaner(children=ChildKeys(table, incarnation.name, incarnation.uid), budget=budget)
            progress = cleaner.run()
            # Then what the incarnation keeps outside the table: its versions' secrets (Parameter Store)
            # and workdir copies (the workdir store). Deleting is idempotent, so a redelivery redoes it.
            for what, store in stores:
                log[f"{what}_deleted"] = store.delete_incarnation(incarnation.name, incarnation.uid, incarnation.owner)
    except Exception as exc:
        # Any failure fails this record only; the stream delivers it again (then to the failure queue).
        deleted = cleaner.progress.deleted if cleaner else 0
        metrics.add_metric(name="CleanupItemsDeleted", unit=MetricUnit.Count, value=deleted)
        metrics.add_metric(name="CleanupRecordsIncomplete", unit=MetricUnit.Count, value=1)
        logger.warning(
            "cleanup incomplete; the stream will deliver this record again",
            extra={**log, "reason": f"{type(exc).__name__}: {exc}", "deleted": deleted},
        )
        raise
    metrics.add_metric(name="CleanupItemsDeleted", unit=MetricUnit.Count, value=progress.deleted)
    logger.info(
        "incarnation cleaned up",
        extra={
            **log,
            "deleted": progress.deleted,
            "batch_calls": progress.batch_calls,
            "retries": progress.retries,
        },
    )


@metrics.log_metrics
@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: LambdaContext) -> PartialItemFailureResponse:
    # Configuration is read once per invocation; the client behind the table is cached in fleetkeeper.aws.
    settings = Settings.from_env(os.environ)
    table = Table(settings.table_name)
    workdirs = store_from_settings(settings)
    stores: tuple[tuple[str, IncarnationStore], ...] = (("secrets", SecretStore.from_settings(settings)),)
    if workdirs is not None:
        stores += (("workdirs", workdirs),)
    return process_partial_response(
        event=event,
        record_handler=functools.partial(record_handler, table=table, stores=stores),
        processor=processor,
        context=context,
    )
