"""Reads template.yaml so that tests and the embedded mode build the table the template declares.

The template stays the single source of the table's shape: keys, the sparse index, the stream and
the TTL attribute all come from it. Not used inside Lambda.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

import fleetkeeper

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_sqs import SQSClient

# From the package, not from this file: the module may sit anywhere in it.
TEMPLATE_PATH = Path(fleetkeeper.__file__).resolve().parents[2] / "template.yaml"


class _CfnLoader(yaml.SafeLoader):
    """SafeLoader that understands CloudFormation's short tags (!Ref, !Sub, !GetAtt...)."""


def _cfn_tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> dict[str, Any]:
    # !Ref and !Condition are the two short forms without the Fn:: prefix in their long form.
    name = suffix if suffix in ("Ref", "Condition") else f"Fn::{suffix}"
    value: Any
    if isinstance(node, yaml.ScalarNode):
        value = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = str(value).split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)  # type: ignore[arg-type]
    return {name: value}


_CfnLoader.add_multi_constructor("!", _cfn_tag)


# Parsed templates by path, with the file's (mtime, size) when parsed: parsing template.yaml takes
# ~150 ms, and the tests build a table from it hundreds of times.
_parsed: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}


def load_template(path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    """The template at `path` as a document of its own (the caller may change it)."""
    return copy.deepcopy(_parsed_template(path))


def load_resource(logical_id: str, path: Path = TEMPLATE_PATH) -> dict[str, Any]:
    """One resource of the template at `path`, as a document of its own: a copy of it alone, not of
    the whole template (a table per test would otherwise copy every resource each time)."""
    found: dict[str, Any] = copy.deepcopy(_parsed_template(path)["Resources"][logical_id])
    return found


def _parsed_template(path: Path) -> dict[str, Any]:
    """The template as parsed, shared: parsed again only when the file changed. Never hand it out."""
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run fleetkeeper from a checkout of the repository")
    stat = path.stat()
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _parsed.get(path)
    if cached is None or cached[0] != stamp:
        with path.open(encoding="utf-8") as handle:
            document: dict[str, Any] = yaml.load(handle, Loader=_CfnLoader)
        cached = _parsed[path] = (stamp, document)
    return cached[1]


def resource(template: dict[str, Any], logical_id: str) -> dict[str, Any]:
    found: dict[str, Any] = template["Resources"][logical_id]
    return found


def create_table_kwargs(template: dict[str, Any], table_name: str) -> dict[str, Any]:
    """CreateTable arguments from the template's `Table` resource (what moto models of it)."""
    props = resource(template, "Table")["Properties"]
    kwargs: dict[str, Any] = {
        "TableName": table_name,
        "AttributeDefinitions": props["AttributeDefinitions"],
        "KeySchema": props["KeySchema"],
        "BillingMode": props["BillingMode"],
    }
    if "GlobalSecondaryIndexes" in props:
        kwargs["GlobalSecondaryIndexes"] = props["GlobalSecondaryIndexes"]
    if "StreamSpecification" in props:
        kwargs["StreamSpecification"] = {"StreamEnabled": True, **props["StreamSpecification"]}
    return kwargs


def create_table(client: DynamoDBClient, table_name: str, template: dict[str, Any] | None = None) -> None:
    """Create the table as template.yaml declares it, with its TTL setting, and wait until it exists."""
    template = template or {"Resources": {"Table": load_resource("Table")}}
    client.create_table(**create_table_kwargs(template, table_name))
    client.get_waiter("table_exists").wait(TableName=table_name, WaiterConfig={"Delay": 1, "MaxAttempts": 30})
    ttl = resource(template, "Table")["Properties"].get("TimeToLiveSpecification")
    if ttl:
        client.update_time_to_live(TableName=table_name, TimeToLiveSpecification=ttl)


# The queue attributes of an AWS::SQS::Queue that SQS's CreateQueue takes as they are (as strings).
_QUEUE_ATTRIBUTES = ("MessageRetentionPeriod", "VisibilityTimeout", "MaximumMessageSize", "SqsManagedSseEnabled")


def create_queue(client: SQSClient, queue_name: str, logical_id: str, template: dict[str, Any] | None = None) -> str:
    """Create the queue `logical_id` of template.yaml (its attributes as declared); returns its URL."""
    template = template or {"Resources": {logical_id: load_resource(logical_id)}}
    props = resource(template, logical_id)["Properties"]
    attributes = {
        name: str(props[name]).lower() if isinstance(props[name], bool) else str(props[name])
        for name in _QUEUE_ATTRIBUTES
        if name in props
    }
    return client.create_queue(QueueName=queue_name, Attributes=attributes)["QueueUrl"]  # type: ignore[arg-type]
