"""The table's data safety, as CloudFormation receives it."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.local.template import create_table_kwargs, load_template
from tests.support.cfn import resources_of_type, sam_template


@pytest.fixture(scope="module")
def table(translated: dict[str, Any]) -> dict[str, Any]:
    tables = resources_of_type(translated, "AWS::DynamoDB::Table")
    assert list(tables) == ["Table"], sorted(tables)
    return tables["Table"]


def test_the_table_the_embedded_mode_builds_has_the_templates_keys_index_stream_and_ttl(
    table: dict[str, Any],
) -> None:
    """Tests and `fleetkeeper local` create the table from template.yaml (fleetkeeper.local.template)."""
    kwargs = create_table_kwargs(load_template(), "t")
    assert [k["AttributeName"] for k in kwargs["KeySchema"]] == ["PK", "SK"]
    assert [i["IndexName"] for i in kwargs["GlobalSecondaryIndexes"]] == ["services"]
    assert kwargs["StreamSpecification"]["StreamViewType"] == "NEW_AND_OLD_IMAGES"
    assert table["Properties"]["TimeToLiveSpecification"] == {"AttributeName": "expiration", "Enabled": True}


def test_table_survives_stack_deletion_and_replacement(table: dict[str, Any]) -> None:
    assert table["DeletionPolicy"] == "Retain"
    assert table["UpdateReplacePolicy"] == "Retain"
    assert table["Properties"]["DeletionProtectionEnabled"] is True


def test_table_is_recoverable_and_encrypted(table: dict[str, Any]) -> None:
    props = table["Properties"]
    assert props["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
    assert props["SSESpecification"]["SSEEnabled"] is True


def test_stream_carries_both_images_for_cleanup(table: dict[str, Any]) -> None:
    """Cleanup reads the removed service's uid from the OLD image of its REMOVE record."""
    assert table["Properties"]["StreamSpecification"] == {"StreamViewType": "NEW_AND_OLD_IMAGES"}


def test_log_retention_parameter_only_allows_cloudwatch_values() -> None:
    """CloudFormation rejects other RetentionInDays values only at deploy time; fail here instead."""
    parameter = sam_template()["Parameters"]["LogRetentionDays"]
    assert parameter["Default"] in parameter["AllowedValues"]
    cloudwatch_values = {1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731}
    cloudwatch_values |= {1096, 1827, 2192, 2557, 2922, 3288, 3653}
    assert set(parameter["AllowedValues"]) <= cloudwatch_values
