"""Records the AWS calls fleetkeeper's clients make, with their parameters, for exact call-list tests.

    with AwsCalls() as calls:
        world.run()
    assert calls.brief() == [("dynamodb", "Query", {...}), ...]

It hooks botocore's `provide-client-params` event on the clients of `fleetkeeper.aws` (the event
fires with the parameters as the code passed them, before botocore validates or serializes them,
so a call AWS then refuses is recorded too) and unhooks on exit. It only records: it never changes
a call or an answer.

`brief()` keeps, per operation, the parameters that say what the call does (keys, conditions,
filters, tokens) and decodes DynamoDB attribute values, so a test states a call list that reads like
the design: timestamps, user data and other bulk stay out.
"""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fleetkeeper import aws
from fleetkeeper.store.codec import from_raw

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

_ids = itertools.count()


@dataclass(frozen=True)
class AwsCall:
    service: str
    operation: str
    params: dict[str, Any]


def _item(raw: Mapping[str, Any], *keep: str) -> dict[str, Any]:
    decoded = from_raw(raw)
    return {key: decoded[key] for key in keep if key in decoded}


def _conditioned(params: Mapping[str, Any], *keep: str) -> dict[str, Any]:
    out = {key: params[key] for key in keep if key in params}
    if "ExpressionAttributeValues" in params:
        out["values"] = from_raw(params["ExpressionAttributeValues"])
    return out


def _transaction(params: Mapping[str, Any]) -> dict[str, Any]:
    items = []
    for entry in params["TransactItems"]:
        [(kind, body)] = entry.items()
        key = body.get("Key") or body.get("Item") or {}
        sk = from_raw(key)["SK"]
        if sk.startswith("E#"):
            # A service event written with the change it reports: its reason says which.
            items.append({"kind": kind, "event": from_raw(body["ExpressionAttributeValues"])[":reason"]})
            continue
        summary: dict[str, Any] = {"kind": kind, "SK": sk}
        summary.update(_conditioned(body, "UpdateExpression", "ConditionExpression"))
        if kind == "Put":
            summary.update(_item(body["Item"], "status"))
        items.append(summary)
    return {"items": items}


def _run_instances(params: Mapping[str, Any]) -> dict[str, Any]:
    out = {key: params[key] for key in ("ClientToken", "ImageId", "InstanceType", "MinCount", "MaxCount")}
    for spec in params.get("TagSpecifications", []):
        if spec["ResourceType"] == "instance":
            out["tags"] = {tag["Key"]: tag["Value"] for tag in spec["Tags"]}
    return out


_BRIEF: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "Query": lambda p: _conditioned(p, "IndexName", "KeyConditionExpression", "ConsistentRead"),
    "PutItem": lambda p: {
        **_item(p["Item"], "SK", "status", "failure_code", "cause"),
        **_conditioned(p, "ConditionExpression"),
    },
    "UpdateItem": lambda p: {
        "SK": from_raw(p["Key"])["SK"],
        **_conditioned(p, "UpdateExpression", "ConditionExpression"),
    },
    "DeleteItem": lambda p: {"SK": from_raw(p["Key"])["SK"], **_conditioned(p, "ConditionExpression")},
    "TransactWriteItems": _transaction,
    "DescribeInstances": lambda p: {key: p[key] for key in ("Filters", "MaxResults", "NextToken") if key in p},
    "RunInstances": _run_instances,
    "TerminateInstances": lambda p: {"InstanceIds": list(p["InstanceIds"])},
    "GetParameter": lambda p: {"Name": p["Name"]},
    "SendMessage": lambda p: {"DelaySeconds": p.get("DelaySeconds", 0), "body": json.loads(p["MessageBody"])},
}


@dataclass
class AwsCalls:
    """Every call fleetkeeper's DynamoDB, EC2 and SSM clients make while the block runs (and, with
    `kicks`, its kick queue's SQS client)."""

    calls: list[AwsCall] = field(default_factory=list)
    kicks: bool = False
    _hooked: list[Any] = field(default_factory=list, repr=False)
    _unique_id: str = field(default_factory=lambda: f"tests.support.aws_calls.{next(_ids)}", repr=False)

    def __enter__(self) -> AwsCalls:
        self._hooked = [aws.dynamodb(), aws.ec2(), aws.ssm(), *([aws.sqs_for_kick()] if self.kicks else [])]
        for client in self._hooked:
            client.meta.events.register("provide-client-params", self._record, unique_id=self._unique_id)
        return self

    def __exit__(self, *exc: object) -> None:
        for client in self._hooked:
            client.meta.events.unregister("provide-client-params", unique_id=self._unique_id)
        self._hooked = []

    def _record(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        self.calls.append(AwsCall(model.service_model.service_name, model.name, copy.deepcopy(params)))

    def operations(self) -> list[tuple[str, str]]:
        return [(call.service, call.operation) for call in self.calls]

    def brief(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Each call as (service, operation, its key parameters); see the module docstring."""
        return [(call.service, call.operation, _BRIEF.get(call.operation, dict)(call.params)) for call in self.calls]
