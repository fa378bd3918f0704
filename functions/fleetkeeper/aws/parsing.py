"""botocore's response parsing with five shortcuts, each giving exactly what botocore's own gives.

A steady reconcile run is mostly botocore parsing responses (docs/PERFORMANCE.md): per service one
DynamoDB Query and, per replica, an instance of DescribeInstances. Generic steps cost most:

- Timestamps: botocore parses each with dateutil's general-purpose parser, about 0.2 ms apiece, and
  DescribeInstances carries three per instance (launch, volume and interface attach times). AWS's
  own format, `2026-01-31T12:34:56.000Z`, goes through `datetime.fromisoformat` instead.
- DynamoDB's attribute values: botocore walks every `{"S": "..."}` through the AttributeValue
  shape's ten members. The usual ones (S, N, BOOL, NULL and M or L of them) are already in the
  form botocore returns them once the JSON is decoded: they are copied as they are.
- EC2's XML: for every element of every instance botocore strips the namespace from each child's
  tag with a regular expression and works out again, for each of the structure's members, where
  its XML name comes from. Both are worked out once per response.
- What nobody reads: DescribeInstances describes 61 members of every instance (network interfaces,
  block devices...), the reconciler reads 8. A caller may name the members it reads (`only`); the
  others are not parsed at all, and those it names come out exactly as botocore makes them.
- The garbage collector: a page of DescribeInstances is an XML tree of some 80,000 elements, alive
  while botocore walks it. Built with the collector running, it is promoted to the oldest
  generation and sets off full collections (the process's whole heap, a few per 1,000 services, a
  tenth of a run's CPU). The tree holds no reference cycles (freed the moment the parse is done), so
  the collector is paused while an EC2 answer is parsed.

Anything else (other formats, binary values, sets, malformed values, error structures, tagged
unions, XML attributes) goes to botocore's own code. The handlers overridden are botocore's private
ones, not in its type stubs (hence the `type: ignore`s); tests/aws/test_parsing.py compares results
with botocore's own parsers, so a botocore release that changes them fails there.
"""

from __future__ import annotations

import contextlib
import gc
import re
import threading
import time
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any

from botocore.parsers import EC2QueryParser, JSONParser, ResponseParser, ResponseParserFactory
from botocore.utils import parse_timestamp as botocore_parse_timestamp

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Set

# ISO 8601 in UTC as AWS writes it; at most 6 fractional digits, which both parsers read alike.
_AWS_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,6})?Z")
# The tzinfo botocore gives a `...Z` timestamp depends on the machine's zone names (dateutil returns
# its `tzlocal()` where the local zone is called UTC, as on Lambda, else its `tzutc()`): ask botocore
# once per set of zone names, so the result is the very object type botocore would have returned.
_utc_by_zone_names: dict[tuple[str, str], tzinfo | None] = {}


def parse_timestamp(value: Any) -> datetime:
    """`botocore.utils.parse_timestamp(value)`, without dateutil for AWS's usual format."""
    if isinstance(value, str) and _AWS_UTC.fullmatch(value):
        zone_names = time.tzname
        utc = _utc_by_zone_names.get(zone_names)
        if utc is None:
            utc = _utc_by_zone_names[zone_names] = botocore_parse_timestamp("2000-01-01T00:00:00Z").tzinfo
        return datetime.fromisoformat(value[:-1]).replace(tzinfo=utc)
    return botocore_parse_timestamp(value)


_ATTRIBUTE_VALUE_MEMBERS = frozenset({"S", "N", "B", "SS", "NS", "BS", "M", "L", "NULL", "BOOL"})
_AS_DECODED = frozenset({"S", "N", "BOOL", "NULL"})


def _is_attribute_value(shape: Any) -> bool:
    return bool(shape.name == "AttributeValue" and shape.type_name == "structure") and (
        shape.members.keys() == _ATTRIBUTE_VALUE_MEMBERS
    )


class _Handlers:
    """botocore finds a node's handler by name (`getattr(self, f"_handle_{type}")`) for every node of
    a response; this looks each type's handler up once per response instead."""

    def _parse_shape(self, shape: Any, node: Any) -> Any:
        handlers: dict[str, Any] = self.__dict__.setdefault("_handlers", {})
        type_name: str = shape.type_name
        if type_name not in handlers:
            default = self._default_handle  # type: ignore[attr-defined]
            handlers[type_name] = getattr(self, f"_handle_{type_name}", default)
        return handlers[type_name](shape, node)


class _JSONParser(_Handlers, JSONParser):
    def _handle_map(self, shape: Any, value: Any) -> Any:
        item = shape.value
        if type(value) is dict and _is_attribute_value(item):
            return {key: self._attribute_value(item, attribute) for key, attribute in value.items()}
        return super()._handle_map(shape, value)  # type: ignore[misc]

    def _handle_structure(self, shape: Any, value: Any) -> Any:
        if _is_attribute_value(shape):
            return self._attribute_value(shape, value)
        return super()._handle_structure(shape, value)  # type: ignore[misc]

    def _attribute_value(self, shape: Any, value: Any) -> Any:
        # Exactly one member, set (botocore refuses or reports anything else, so it decides those).
        if type(value) is dict and len(value) == 1:
            ((kind, data),) = value.items()
            if data is not None:
                if kind in _AS_DECODED:
                    return {kind: data}
                if kind == "M" and type(data) is dict:
                    return {"M": {key: self._attribute_value(shape, inner) for key, inner in data.items()}}
                if kind == "L" and type(data) is list:
                    return {"L": [self._attribute_value(shape, inner) for inner in data]}
        return super()._handle_structure(shape, value)  # type: ignore[misc]


# Per thread, the members the calls it makes in `only(...)` read, by structure shape name.
_reads = threading.local()


@contextlib.contextmanager
def only(members: Mapping[str, Set[str]]) -> Iterator[None]:
    """Within this block, this thread's EC2 responses are parsed to `members` of the structures
    named (shape name -> member names): a structure named keeps only those members, each exactly as
    botocore parses it; every other structure is parsed whole. For a caller that reads a few fields
    of a large answer (the driver's DescribeInstances); its tests compare what it reads both ways."""
    before = getattr(_reads, "members", None)
    _reads.members = members
    try:
        yield
    finally:
        _reads.members = before


class _CollectorPause:
    """The garbage collector off while any thread is inside `paused()`, on again after the last one
    leaves if it was on when the first came in."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._resume = False

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            if self._inside == 0:
                self._resume = gc.isenabled()
                gc.disable()
            self._inside += 1
        try:
            yield
        finally:
            with self._lock:
                self._inside -= 1
                if self._inside == 0 and self._resume:
                    gc.enable()


_collector = _CollectorPause()


class _EC2Parser(_Handlers, EC2QueryParser):
    def __init__(self, timestamp_parser: Any = None, blob_parser: Any = None) -> None:
        super().__init__(timestamp_parser, blob_parser)
        self._local_names: dict[str, str] = {}
        self._members: dict[Any, list[tuple[str, Any, str, bool]]] = {}

    def parse(self, response: Any, shape: Any) -> Any:
        with _collector.paused():
            return super().parse(response, shape)

    def _node_tag(self, node: Any) -> str:
        tag: str = node.tag
        local = self._local_names.get(tag)
        if local is None:
            local = self._local_names[tag] = super()._node_tag(node)  # type: ignore[misc]
        return local

    def _handle_structure(self, shape: Any, node: Any) -> Any:
        if shape.metadata.get("exception", False) or shape.is_tagged_union:
            return super()._handle_structure(shape, node)  # type: ignore[misc]
        children = self._build_name_to_xml_node(node)  # type: ignore[attr-defined]
        parsed = {}
        for name, member, xml_name, xml_attribute in self._members_of(shape):
            child = children.get(xml_name)
            if child is not None:
                parsed[name] = self._parse_shape(member, child)
            elif xml_attribute:
                return super()._handle_structure(shape, node)  # type: ignore[misc]
        return parsed

    def _members_of(self, shape: Any) -> list[tuple[str, Any, str, bool]]:
        """What botocore's _handle_structure works out per member: (name, shape, XML name, whether it
        is an XML attribute), without the members it skips (those with a location elsewhere)."""
        members = self._members.get(shape)
        if members is None:
            members = self._members[shape] = []
            wanted = (getattr(_reads, "members", None) or {}).get(shape.name)
            for name, member in shape.members.items():
                serialization = member.serialization
                if serialization.get("location") in self.KNOWN_LOCATIONS or serialization.get("eventheader"):
                    continue
                if wanted is not None and name not in wanted:
                    continue  # a member the caller does not read (`only`)
                xml_name = self._member_key_name(member, name)  # type: ignore[attr-defined]
                members.append((name, member, xml_name, bool(serialization.get("xmlAttribute"))))
        return members


# The botocore release these overrides were compared with botocore's own parsers on
# (tests/aws/test_parsing.py), and the one functions/requirements.txt bundles into every function (a
# test holds the three equal). Lambda's runtime brings a botocore of its own, upgraded by AWS at any
# time: the bundle pins ours so the functions run the code that was tested.
CHECKED_BOTOCORE = "1.44.8"


def checked_against(version: str) -> bool:
    """Whether botocore `version` is the one the overrides were checked against."""
    return version == CHECKED_BOTOCORE


class ResponseParsers(ResponseParserFactory):
    """The session component botocore makes each response's parser with (`response_parser_factory`)."""

    def __init__(self) -> None:
        super().__init__()
        self.set_parser_defaults(timestamp_parser=parse_timestamp)

    def create_parser(self, protocol_name: str) -> ResponseParser:
        if protocol_name == "json":
            return _JSONParser(timestamp_parser=parse_timestamp)
        if protocol_name == "ec2":
            return _EC2Parser(timestamp_parser=parse_timestamp)
        parser: ResponseParser = super().create_parser(protocol_name)
        return parser
