"""Lambda event-filtering patterns (the subset fleetkeeper uses), evaluated the way Lambda does.

The cleanup function's event source mapping declares a FilterCriteria pattern in template.yaml. The
embedded mode's stream pump and the tests evaluate that same pattern here, so the filter that keeps
the cleanup's own deletes from re-triggering it is proved, not assumed.

Supported: exact values (a list of alternatives), {"prefix": ...}, {"exists": bool},
{"anything-but": [...]}, {"numeric": [op, n, ...]} and nested objects. A pattern matches a record
when every key it names matches; records are plain JSON (as Lambda sees them). As in AWS's Event
Ruler, which flattens a record into the paths of its leaves, `exists` is about a leaf (an object at
that path is no leaf), and a path under an object the record lacks is simply absent: only
`{"exists": false}` holds there. Arrays of objects are not supported.
"""

from __future__ import annotations

import json
from typing import Any

_MISSING = object()


def _numeric(conditions: list[Any], value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    ops = {
        "=": lambda a, b: a == b,
        "<": lambda a, b: a < b,
        "<=": lambda a, b: a <= b,
        ">": lambda a, b: a > b,
        ">=": lambda a, b: a >= b,
    }
    pairs = zip(conditions[0::2], conditions[1::2], strict=True)
    return all(ops[op](value, bound) for op, bound in pairs)


def _matches_rule(rule: Any, value: Any) -> bool:
    """One alternative of a leaf list against a value (_MISSING when the key is absent)."""
    if isinstance(rule, dict):
        (operator, operand), *rest = rule.items()
        if rest:
            raise ValueError(f"a filter rule has one operator, got {sorted(rule)}")
        if operator == "exists":
            return (value is not _MISSING and not isinstance(value, dict)) is bool(operand)
        if value is _MISSING:
            return False
        if operator == "prefix":
            return isinstance(value, str) and value.startswith(operand)
        if operator == "anything-but":
            excluded = operand if isinstance(operand, list) else [operand]
            return value not in excluded
        if operator == "numeric":
            return _numeric(operand, value)
        raise ValueError(f"unsupported filter operator {operator!r}")
    return value is not _MISSING and value == rule


def matches(pattern: dict[str, Any], record: Any) -> bool:
    """True when `record` satisfies every key of `pattern`."""
    for key, expected in pattern.items():
        value = record.get(key, _MISSING) if isinstance(record, dict) else _MISSING
        if isinstance(expected, dict):
            # Under a missing object every path is absent: only `exists: false` rules can hold.
            if not matches(expected, value if isinstance(value, dict) else {}):
                return False
        elif isinstance(expected, list):
            candidates = value if isinstance(value, list) else [value]
            if not any(_matches_rule(rule, candidate) for rule in expected for candidate in candidates):
                return False
        else:
            raise ValueError(f"filter values must be lists or objects, got {expected!r} at {key!r}")
    return True


def matches_any(patterns: list[dict[str, Any]], record: Any) -> bool:
    """Lambda delivers a record when any of the mapping's filters matches (none: everything)."""
    return not patterns or any(matches(p, record) for p in patterns)


def patterns_of(filter_criteria: dict[str, Any]) -> list[dict[str, Any]]:
    """The parsed patterns of a FilterCriteria block ({"Filters": [{"Pattern": "<json>"}]})."""
    return [json.loads(f["Pattern"]) for f in filter_criteria.get("Filters", [])]
