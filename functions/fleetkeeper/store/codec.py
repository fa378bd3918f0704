"""Records <-> DynamoDB items, and the page tokens the api hands out. Pure: no client, no I/O.

DynamoDB's attribute-value format for the few types our items hold. boto3's TypeSerializer would
do the same, but importing it imports all of boto3 (~80 ms of every api cold start).
"""

from __future__ import annotations

import base64
import binascii
import json
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

from fleetkeeper.choices import LoadBalancingPolicy, UpdateMode
from fleetkeeper.model import (
    AccessGrant,
    AutoscalerState,
    BalancerState,
    EndpointConfig,
    EndpointRecord,
    FailureCause,
    Interruption,
    InterruptionKind,
    Lifecycle,
    Market,
    Recommendation,
    ReplicaRecord,
    ReplicaStatus,
    ServiceRecord,
    ServiceState,
    ServiceStatus,
    VersionRecord,
    VersionState,
)
from fleetkeeper.store.errors import CorruptItem, MalformedPageToken
from fleetkeeper.store.keys import (
    LIST_PK_ATTR,
    LIST_PK_VALUE,
    LIST_SK_ATTR,
    SERVICE_SK,
    child_prefixes,
    replica_sk,
    service_pk,
    version_sk,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from mypy_boto3_dynamodb.type_defs import AttributeValueTypeDef

Item = dict[str, Any]
_T = TypeVar("_T")
RawItem = dict[str, "AttributeValueTypeDef"]


# --- attribute values -------------------------------------------------------------------------------


def _marshal(value: Any) -> Any:
    if isinstance(value, bool):
        return {"BOOL": value}
    if isinstance(value, str):
        return {"S": value}
    if isinstance(value, int | Decimal):
        return {"N": str(value)}
    if value is None:
        return {"NULL": True}
    if isinstance(value, dict):
        return {"M": {str(k): _marshal(v) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return {"L": [_marshal(v) for v in value]}
    raise TypeError(f"cannot store {type(value).__name__} in DynamoDB (floats go in JSON text)")


def _unmarshal(value: Mapping[str, Any]) -> Any:
    for kind, data in value.items():  # the first (and only) type: a loop, the cheapest way to get it
        if kind == "S":
            return data
        if kind == "N":
            if type(data) is str and data.isdecimal():  # most numbers: generations, versions, counters
                return int(data)
            number = Decimal(data)
            return int(number) if number == number.to_integral_value() else number
        if kind == "BOOL":
            return bool(data)
        if kind == "NULL":
            return None
        if kind == "M":
            return {k: _unmarshal(v) for k, v in data.items()}
        if kind == "L":
            return [_unmarshal(v) for v in data]
        raise TypeError(f"unexpected DynamoDB type {kind!r}")
    raise ValueError("an attribute value without a type")


def to_raw(item: Mapping[str, Any]) -> RawItem:
    return {k: _marshal(v) for k, v in item.items() if v is not None}


def from_raw(raw: Mapping[str, Any]) -> Item:
    return {k: _unmarshal(v) for k, v in raw.items()}


def expression_values(**values: Any) -> dict[str, AttributeValueTypeDef]:
    """`ExpressionAttributeValues` for an expression that names them `:key`."""
    return {f":{k}": _marshal(v) for k, v in values.items()}


# --- records ------------------------------------------------------------------------------------------


def service_item(record: ServiceRecord) -> Item:
    return {
        "PK": service_pk(record.name),
        "SK": SERVICE_SK,
        LIST_PK_ATTR: LIST_PK_VALUE,
        LIST_SK_ATTR: record.name,
        "kind": "service",
        "name": record.name,
        "uid": record.uid,
        "generation": record.generation,
        "lifecycle": record.lifecycle.value,
        "target_version": record.target_version,
        "latest_version": record.latest_version,
        "status": record.status.value,
        "status_message": record.status_message,
        "observed_generation": record.observed_generation,
        "replica_seq": record.replica_seq,
        "endpoint": endpoint_item(record.endpoint) if record.endpoint is not None else None,
        "autoscaler": autoscaler_item(record.autoscaler) if record.autoscaler is not None else None,
        "followup_at": record.followup_at,
        "owner": record.owner,
        "access": access_item(record.access),
        "access_rev": record.access_rev,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    }


def access_item(access: tuple[AccessGrant, ...]) -> list[dict[str, str]]:
    """The service item's `access` list."""
    return [{"principal": grant.principal, "mode": grant.mode} for grant in access]


def access_from_item(value: Any) -> tuple[AccessGrant, ...]:
    grants = []
    for entry in value or ():
        mode = str(entry["mode"])
        if mode not in ("read", "write"):
            raise ValueError(f"access mode {mode!r}")
        grants.append(AccessGrant(principal=str(entry["principal"]), mode="write" if mode == "write" else "read"))
    return tuple(grants)


def endpoint_item(endpoint: EndpointRecord) -> Item:
    """The service item's `endpoint` map."""
    config = endpoint.config
    return {
        "url": endpoint.url,
        "port": config.port,
        "policy": config.policy,
        "drain_seconds": config.drain_seconds,
        "health_path": config.health_path,
        "health_codes": config.health_codes,
        "health_timeout_seconds": config.health_timeout_seconds,
        "health_interval_seconds": config.health_interval_seconds,
        "target_group": endpoint.target_group,
        "route": endpoint.route,
        "dimensions": dict(endpoint.dimensions),
        "waking_since": endpoint.waking_since,
        "load_balancer": endpoint.load_balancer,
    }


_OLD_CHECK = EndpointConfig(port=0, policy=LoadBalancingPolicy.LEAST_LOAD, drain_seconds=0, health_path="/")


def endpoint_from_item(item: Mapping[str, Any]) -> EndpointRecord:
    config = EndpointConfig(
        port=int(item["port"]),
        policy=LoadBalancingPolicy(str(item["policy"])),
        drain_seconds=int(item["drain_seconds"]),
        health_path=str(item["health_path"]),
        # Absent from endpoints recorded before the check followed the probe: what they were made with.
        health_codes=str(item.get("health_codes", _OLD_CHECK.health_codes)),
        health_timeout_seconds=int(item.get("health_timeout_seconds", _OLD_CHECK.health_timeout_seconds)),
        health_interval_seconds=int(item.get("health_interval_seconds", _OLD_CHECK.health_interval_seconds)),
    )
    dimensions = item.get("dimensions") or {}
    return EndpointRecord(
        url=str(item["url"]),
        config=config,
        target_group=str(item["target_group"]),
        route=str(item["route"]),
        dimensions=tuple(sorted((str(k), str(v)) for k, v in dimensions.items())),
        waking_since=str(item["waking_since"]) if item.get("waking_since") else None,
        # Absent from endpoints recorded before pools: the stack's template ALB.
        load_balancer=str(item["load_balancer"]) if item.get("load_balancer") else None,
    )


def autoscaler_item(state: AutoscalerState) -> Item:
    """The service item's `autoscaler` map. Rates go in as decimals (DynamoDB has no floats), the
    thousandths the autoscaler keeps them to, so a state reads back equal to what was written."""
    return {
        "target": state.target,
        "rev": state.rev,
        "history": [
            {"at": entry.at, "replicas": entry.replicas, "rate": Decimal(repr(float(entry.rate)))}
            for entry in state.history
        ],
    }


def autoscaler_from_item(item: Mapping[str, Any]) -> AutoscalerState:
    return AutoscalerState(
        target=int(item["target"]),
        rev=int(item.get("rev", 0)),
        history=tuple(
            Recommendation(at=str(entry["at"]), replicas=int(entry["replicas"]), rate=float(entry["rate"]))
            for entry in item.get("history") or ()
        ),
    )


def service_from_item(item: Mapping[str, Any]) -> ServiceRecord:
    return ServiceRecord(
        name=str(item["name"]),
        uid=str(item["uid"]),
        generation=int(item["generation"]),
        lifecycle=Lifecycle(item["lifecycle"]),
        target_version=int(item["target_version"]),
        latest_version=int(item["latest_version"]),
        status=ServiceStatus(item["status"]),
        status_message=str(item.get("status_message", "")),
        observed_generation=int(item.get("observed_generation", 0)),
        created_at=str(item["created_at"]),
        updated_at=str(item["updated_at"]),
        replica_seq=int(item.get("replica_seq", 0)),
        endpoint=endpoint_from_item(item["endpoint"]) if item.get("endpoint") else None,
        autoscaler=autoscaler_from_item(item["autoscaler"]) if item.get("autoscaler") else None,
        followup_at=int(item["followup_at"]) if isinstance(item.get("followup_at"), int) else None,
        # Items written before ownership existed: no owner (administrators only), no grants.
        owner=str(item.get("owner", "")),
        access=access_from_item(item.get("access")),
        access_rev=int(item.get("access_rev", 0)),
        # Written by the wake target only (never by the api's or the reconciler's service writes).
        wake_at=str(item["wake_at"]) if item.get("wake_at") else None,
    )


def version_item(record: VersionRecord) -> Item:
    return {
        "PK": service_pk(record.name),
        "SK": version_sk(record.uid, record.version),
        "kind": "version",
        "name": record.name,
        "uid": record.uid,
        "version": record.version,
        # Stored as JSON text: specs hold floats, which DynamoDB's number type would turn into Decimals.
        # As UTF-8 (ensure_ascii=False): a `\uXXXX` escape costs 6 bytes (12 for a surrogate pair)
        # of the 400 KB item where the character itself costs 1 to 4; older escaped items read alike.
        "spec": json.dumps(record.spec.to_json_dict(), separators=(",", ":"), sort_keys=True, ensure_ascii=False),
        "mode": record.mode,
        "state": record.state.value,
        "state_message": record.state_message,
        "secrets_ref": record.secrets_ref,
        "created_at": record.created_at,
    }


def version_from_item(item: Mapping[str, Any]) -> VersionRecord:
    from fleetkeeper.store.specs import specs

    return VersionRecord(
        name=str(item["name"]),
        uid=str(item["uid"]),
        version=int(item["version"]),
        # Validated once per text, not on every read of every version (store/specs.py).
        spec=specs.parsed(str(item["spec"])),
        mode=UpdateMode(str(item["mode"])),
        created_at=str(item["created_at"]),
        state=VersionState(item.get("state", VersionState.NEW.value)),
        state_message=str(item.get("state_message", "")),
        secrets_ref=str(item["secrets_ref"]) if item.get("secrets_ref") else None,
    )


def replica_item(record: ReplicaRecord) -> Item:
    return {
        "PK": service_pk(record.name),
        "SK": replica_sk(record.uid, record.replica_id),
        "kind": "replica",
        "name": record.name,
        "uid": record.uid,
        "replica_id": record.replica_id,
        "version": record.version,
        "status": record.status.value,
        "status_message": record.status_message,
        "failure_code": record.failure_code,
        "cause": record.cause.value if record.cause is not None else None,
        "instance_id": record.instance_id,
        "url": record.url,
        "ready_at": record.ready_at,
        "last_probe_ok_at": record.last_probe_ok_at,
        "probe_failures": record.probe_failures,
        "failing_since": record.failing_since,
        "probing_since": record.probing_since,
        "launch_attempts": record.launch_attempts,
        "refused_runs": record.refused_runs,
        "version_refusals": record.version_refusals,
        "next_attempt_at": record.next_attempt_at,
        "launched_at": record.launched_at,
        "balancer": record.balancer.value if record.balancer is not None else None,
        "drain_started_at": record.drain_started_at,
        "market": record.market.value,
        "instance_type": record.instance_type,
        "interruption": _interruption_map(record.interruption),
        "terminate_requested_at": record.terminate_requested_at,
        "rev": record.rev,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
    }


def replica_from_item(item: Mapping[str, Any]) -> ReplicaRecord:
    def opt(key: str) -> str | None:
        value = item.get(key)
        return None if value is None else str(value)

    status = ReplicaStatus(item["status"])
    cause = item.get("cause")
    balancer = item.get("balancer")
    attempts = int(item.get("launch_attempts", 0))
    return ReplicaRecord(
        name=str(item["name"]),
        uid=str(item["uid"]),
        replica_id=int(item["replica_id"]),
        version=int(item["version"]),
        status=status,
        status_message=str(item.get("status_message", "")),
        failure_code=opt("failure_code"),
        # Items written before causes were recorded: what their status implies, else UNRECORDED.
        cause=FailureCause(cause) if cause is not None else FailureCause.of_unrecorded(status),
        instance_id=opt("instance_id"),
        url=opt("url"),
        ready_at=opt("ready_at"),
        last_probe_ok_at=opt("last_probe_ok_at"),
        probe_failures=int(item.get("probe_failures", 0)),
        failing_since=opt("failing_since"),
        probing_since=opt("probing_since"),
        launch_attempts=attempts,
        # Items written before pools were walked made one attempt per refused run.
        refused_runs=int(item.get("refused_runs", attempts)),
        # Items written before: every refusal of a replica whose last one was the version's counted.
        version_refusals=int(item.get("version_refusals", attempts if cause == FailureCause.VERSION.value else 0)),
        next_attempt_at=opt("next_attempt_at"),
        launched_at=opt("launched_at"),
        balancer=BalancerState(balancer) if balancer is not None else None,
        drain_started_at=opt("drain_started_at"),
        # Items written before markets were recorded: on-demand (spot was the spec's, and rare).
        market=Market(item.get("market") or Market.ON_DEMAND.value),
        instance_type=opt("instance_type"),
        interruption=_interruption_of(item.get("interruption")),
        terminate_requested_at=opt("terminate_requested_at"),
        rev=int(item.get("rev", 0)),
        created_at=str(item["created_at"]),
        updated_at=str(item["updated_at"]),
    )


def _interruption_map(interruption: Interruption | None) -> dict[str, str] | None:
    if interruption is None:
        return None
    return {"kind": interruption.kind.value, "instance_id": interruption.instance_id, "at": interruption.at}


def _interruption_of(value: Any) -> Interruption | None:
    if not isinstance(value, dict):
        return None
    return Interruption(
        kind=InterruptionKind(value["kind"]), instance_id=str(value["instance_id"]), at=str(value["at"])
    )


def state_from_items(items: list[Item]) -> ServiceState | None:
    """Assemble a service from its partition's items, keeping only the current incarnation's children.

    Raises CorruptItem for an item that does not decode (a missing attribute, a value of another
    schema): the caller skips this service, not every service.
    """
    meta = next((i for i in items if i["SK"] == SERVICE_SK), None)
    if meta is None:
        return None
    service = _decoded(meta, service_from_item)
    versions: dict[int, VersionRecord] = {}
    replicas: dict[int, ReplicaRecord] = {}
    vprefix, rprefix, _ = child_prefixes(service.uid)
    for item in items:
        sk = str(item["SK"])
        if sk.startswith(vprefix):
            version = _decoded(item, version_from_item)
            versions[version.version] = version
        elif sk.startswith(rprefix):
            replica = _decoded(item, replica_from_item)
            replicas[replica.replica_id] = replica
    return ServiceState(service=service, versions=versions, replicas=replicas)


def _decoded(item: Item, decode: Callable[[Item], _T]) -> _T:
    try:
        return decode(item)
    except (KeyError, ValueError, TypeError, ArithmeticError) as exc:  # pydantic's errors are ValueErrors
        name = str(item.get("PK", "")).removeprefix("SVC#")
        problem = f"missing attribute {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        raise CorruptItem(name, str(item.get("SK", "")), "; ".join(problem.split("\n"))[:300]) from exc


# --- page tokens ----------------------------------------------------------------------------------------
# The api's `next_token` is a LastEvaluatedKey as URL-safe base64 JSON. A token is checked before it
# reaches DynamoDB, against the exact key this store would have issued (every attribute a non-empty
# string, the index's one partition value, a sort key inside the Query's condition): anything else
# would be DynamoDB's ValidationException ("The provided starting key is invalid"), a 500, not a 400.


def encode_token(last_key: Mapping[str, Any] | None) -> str | None:
    if not last_key:
        return None
    return base64.urlsafe_b64encode(json.dumps(from_raw(last_key), sort_keys=True).encode()).decode()


def _token_key(token: str, attributes: set[str]) -> dict[str, str]:
    """The token's key: exactly `attributes`, each a non-empty string."""
    try:
        key = json.loads(base64.urlsafe_b64decode(token.encode() + b"=" * (-len(token) % 4)))
    except (ValueError, binascii.Error, UnicodeError, RecursionError) as exc:
        # RecursionError: JSON nested deeper than the parser's stack (e.g. "[[[[..." in the token).
        raise MalformedPageToken("malformed") from exc
    if not isinstance(key, dict) or set(key) != attributes:
        raise MalformedPageToken("unknown token")
    if not all(isinstance(v, str) and v for v in key.values()):
        raise MalformedPageToken("unknown token")
    return key


def decode_token(token: str) -> RawItem:
    """A services-index page token, as the ExclusiveStartKey of the index's Query."""
    key = _token_key(token, {"PK", "SK", LIST_PK_ATTR, LIST_SK_ATTR})
    # A service item's key, and its index key: the index's one partition, list_sk = the name.
    if key[LIST_PK_ATTR] != LIST_PK_VALUE or key["SK"] != SERVICE_SK or key["PK"] != service_pk(key[LIST_SK_ATTR]):
        raise MalformedPageToken("unknown token")
    return to_raw(key)


def decode_version_token(token: str, name: str, uid: str) -> RawItem:
    """A versions page token of the incarnation `uid` of `name`, as the ExclusiveStartKey of its Query."""
    key = _token_key(token, {"PK", "SK"})
    prefix = child_prefixes(uid)[0]
    if key["PK"] != service_pk(name) or not key["SK"].startswith(prefix):
        # Another service's token, or one of an earlier incarnation of this name.
        raise MalformedPageToken("not a token of this service's versions")
    return to_raw(key)
