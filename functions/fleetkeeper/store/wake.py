"""The wake target's one write: demand for a service that has no replica serving (fleetkeeper.wake.demand).

One conditional UpdateItem on the service item, setting `wake_at` to now, only when

- the item exists and its incarnation is ACTIVE (a request for a deleted service writes nothing, and
  never brings an item back), and
- no demand was recorded in the last WAKE_COALESCE_SECONDS (`wake_at` absent or older).

So whatever the request rate, and however many wake targets answer at once (Lambda instances), a
service gets at most one write, and one kick, per WAKE_COALESCE_SECONDS. A request that finds the
condition false writes nothing (and costs one write unit: DynamoDB bills a failed condition as a
write; the callers keep a per-process memo so that repeated requests rarely get that far).
The api's and the reconciler's writes never touch `wake_at`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from fleetkeeper.model import Lifecycle, to_iso
from fleetkeeper.store import keys
from fleetkeeper.store.codec import expression_values, to_raw
from fleetkeeper.store.table import error_code
from fleetkeeper.wake.demand import coalesce_before

if TYPE_CHECKING:
    from datetime import datetime

    from fleetkeeper.store.table import Table

WAKE_ATTR = "wake_at"


def record_demand(table: Table, name: str, now: datetime) -> bool:
    """Record that service `name`'s endpoint had a request it could not serve at `now`. True when
    this call wrote it (the caller kicks the reconciler); False when coalesced with a recent one, or
    the service does not exist or is being deleted."""
    try:
        table.client.update_item(
            TableName=table.name,
            Key=to_raw(keys.service_key(name)),
            UpdateExpression="SET #wake = :now",
            ConditionExpression=(
                "attribute_exists(PK) AND lifecycle = :active AND (attribute_not_exists(#wake) OR #wake < :since)"
            ),
            ExpressionAttributeNames={"#wake": WAKE_ATTR},
            ExpressionAttributeValues=expression_values(
                now=to_iso(now), since=to_iso(coalesce_before(now)), active=Lifecycle.ACTIVE.value
            ),
        )
    except ClientError as exc:
        if error_code(exc) == "ConditionalCheckFailedException":
            return False
        raise
    return True
