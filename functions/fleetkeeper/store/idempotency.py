"""Where Powertools idempotency keeps its records: the table's own idempotency partition.

The records use the table's PK/SK under `IDEMPOTENCY_PARTITION` (never a service's partition, so
no service read sees them) and expire through the table's TTL attribute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.store.keys import IDEMPOTENCY_PARTITION, TTL_ATTR

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    from fleetkeeper.store.table import Table


def persistence_layer(table: Table) -> DynamoDBPersistenceLayer:
    # Imported on first use: Powertools' idempotency is not free to import, and only keyed requests need it.
    from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

    return DynamoDBPersistenceLayer(
        table_name=table.name,
        key_attr="PK",
        sort_key_attr="SK",
        static_pk_value=IDEMPOTENCY_PARTITION,
        expiry_attr=TTL_ATTR,
        boto3_client=table.raw_client,  # Powertools reads its own ClientErrors
    )
