"""fleetkeeper.aws.eventfilter agrees with moto's own event-pattern matcher, a third opinion.

tests/template/test_cleanup.py checks eventfilter against a matcher written there the way AWS's Event
Ruler works; both are this project's. moto's EventBridge matcher (`moto.events.models.EventPattern`)
is written by others, to the same AWS documentation, so here every pattern and record those tests
use, and a few records chosen for the operators' edges, go through eventfilter and moto both, and
the verdicts must be the same.

Where moto is known to part from AWS, the case is listed (MOTO_DIFFERS) with the AWS documentation's
reason: it is checked to still differ (so the list cannot go stale) and eventfilter is checked to
give AWS's verdict there, through the independent matcher.

`EventPattern` is a private moto internal: if it moves, the import below says so rather than every
case failing with an unrelated error.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper.aws.eventfilter import matches, patterns_of
from tests.support.cfn import refers_to, resources_of_type
from tests.support.cleanup_support import EVENT_PATH, stream_records
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec
from tests.template.test_cleanup import EXTRA_PATTERNS, ruler_matches, synthetic_record

if TYPE_CHECKING:
    from collections.abc import Callable

try:
    from moto.events.models import EventPattern
except ImportError as error:  # pragma: no cover - only when moto reorganises
    raise ImportError(
        "moto moved EventPattern: tests/aws/test_eventfilter_moto.py cross-checks fleetkeeper's event "
        f"filter against moto.events.models.EventPattern (moto's EventBridge matcher); find its new home ({error})"
    ) from error


def moto_matches(pattern: dict[str, Any], record: dict[str, Any]) -> bool:
    return bool(EventPattern.load(json.dumps(pattern)).matches_event(record))


# Edge records: each operator on each kind of JSON value, a missing key, a missing parent object,
# a list of values. The patterns of the edge cases name these fields.
EDGE_RECORDS: list[dict[str, Any]] = [
    {"eventName": "REMOVE", "dynamodb": {"SizeBytes": 0, "Keys": {"SK": {"S": "META"}}}},
    {"eventName": "MODIFY", "dynamodb": {"SizeBytes": 400_000, "Keys": {"SK": {"S": "V#x"}}}},
    {"eventName": "INSERT", "dynamodb": {"SizeBytes": 400_001.5, "Keys": {"SK": {"S": "R#x"}}}},
    {"eventName": ["REMOVE", "MODIFY"], "dynamodb": {"SizeBytes": [3, 500_000]}},
    {"eventName": "REMOVE", "dynamodb": {"SizeBytes": "12", "OldImage": {"uid": {"S": "u1"}, "n": None}}},
    {"eventName": None, "eventSource": "aws:dynamodb"},
    {"eventSource": "aws:dynamodb:other"},
    {},
]
EDGE_PATTERNS: list[dict[str, Any]] = [
    {"eventName": ["REMOVE"]},
    {"eventName": [None]},
    {"eventName": [{"exists": False}]},
    {"eventName": [{"prefix": "RE"}]},
    {"eventName": [{"anything-but": ["REMOVE", "INSERT"]}]},
    {"eventSource": [{"prefix": "aws:dynamodb"}], "eventName": [{"exists": True}]},
    {"dynamodb": {"SizeBytes": [{"numeric": ["<", 10]}]}},
    {"dynamodb": {"SizeBytes": [{"numeric": [">=", 400_000]}]}},
    {"dynamodb": {"SizeBytes": [{"numeric": ["=", 0]}]}},
    {"dynamodb": {"SizeBytes": [12, 3]}},
    {"dynamodb": {"Keys": {"SK": {"S": ["META", {"prefix": "V#"}]}}}},
    {"dynamodb": {"Keys": {"SK": {"S": [{"exists": False}]}}}},
    {"dynamodb": {"OldImage": {"n": [None]}}},
    {"dynamodb": {"OldImage": {"uid": [{"exists": True}]}}},  # an object is no leaf
]

# Where moto's matcher is known to part from AWS's: (pattern, record, why AWS decides otherwise).
# For each, moto must still differ from eventfilter, and eventfilter must agree with the Event Ruler
# matcher of tests/template/test_cleanup.py.
MOTO_DIFFERS: list[tuple[dict[str, Any], dict[str, Any], str]] = [
    (
        {"flag": [{"numeric": [">", 0]}]},
        {"flag": True},
        "AWS: numeric matching works on JSON numbers only (EventBridge user guide, 'Numeric matching');"
        " moto tests isinstance(value, (int, float)), which a Python bool passes",
    ),
]


def _mapping_patterns(translated: dict[str, Any]) -> list[dict[str, Any]]:
    (mapping,) = [
        body["Properties"]
        for body in resources_of_type(translated, "AWS::Lambda::EventSourceMapping").values()
        if refers_to(body["Properties"]["FunctionName"], "CleanupFunction")
    ]
    found = patterns_of(mapping["FilterCriteria"])
    assert found, "the cleanup's mapping has no filter"
    return found


def _disagreements(
    patterns: list[dict[str, Any]], records: list[dict[str, Any]], other: Callable[[dict[str, Any], Any], bool]
) -> list[tuple[str, str, bool]]:
    return [
        (json.dumps(pattern), json.dumps(record), verdict)
        for pattern in patterns
        for record in records
        if (verdict := matches(pattern, record)) != other(pattern, record)
    ]


def test_moto_agrees_on_the_template_and_extra_patterns_over_synthetic_and_edge_records(
    translated: dict[str, Any],
) -> None:
    records = [
        synthetic_record(event_name, sk)
        for event_name in ("INSERT", "MODIFY", "REMOVE")
        for sk in ("META", "V#u1#0000000001", "R#u1#0000000001", "E#u1#0000000001")
    ]
    records += json.loads(EVENT_PATH.read_text())["Records"]
    records += EDGE_RECORDS
    patterns = [*_mapping_patterns(translated), *EXTRA_PATTERNS, *EDGE_PATTERNS]
    assert _disagreements(patterns, records, moto_matches) == []
    # Not vacuous: moto admits some records and refuses others under these patterns.
    verdicts = {moto_matches(p, r) for p in patterns for r in records}
    assert verdicts == {True, False}


def test_moto_agrees_on_the_records_moto_s_stream_really_produced(
    api: HandlerClient, table: str, translated: dict[str, Any]
) -> None:
    created = api.post("/v1/services", {"name": "web", "spec": hello_spec()})
    assert created.status == 201
    update = {"spec": hello_spec(run="python3 -m http.server $PORT --bind 0.0.0.0")}
    assert api.put("/v1/services/web", update).status == 200
    assert api.delete("/v1/services/web").status == 202
    records = stream_records(table)
    assert {r["eventName"] for r in records} >= {"INSERT", "MODIFY"}
    patterns = [*_mapping_patterns(translated), *EXTRA_PATTERNS, *EDGE_PATTERNS]
    assert _disagreements(patterns, records, moto_matches) == []


@pytest.mark.parametrize(("pattern", "record", "reason"), MOTO_DIFFERS, ids=[c[2][:40] for c in MOTO_DIFFERS])
def test_where_moto_parts_from_aws_eventfilter_gives_aws_s_verdict(
    pattern: dict[str, Any], record: dict[str, Any], reason: str
) -> None:
    assert moto_matches(pattern, record) != matches(pattern, record), f"moto now agrees; drop the case: {reason}"
    assert matches(pattern, record) == ruler_matches(pattern, record), reason
