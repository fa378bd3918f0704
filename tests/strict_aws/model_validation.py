"""Every request checked against its service model's constraints, as AWS's front ends check them.

botocore's client validates only types, required members and *minimum* lengths and counts
(`botocore.validate.ParamValidator`); AWS validates the rest of the same model on its side: maximum
lengths, patterns, enums, numeric ranges, list and map sizes. moto checks almost none of them, so a
parameter the product builds too long (a 2,048-character health check path where ELB takes 1,024)
passes every test and fails every call on AWS. This module closes that gap generically: it walks
each request's parameters against the operation's input shape, from the service model botocore
itself loads (`botocore/data/<service>/<version>/service-2.json`), for every service and operation,
with no per-call rule.

How it hooks in: a `before-parameter-build` handler (botocore's event with the caller's params and
the operation model, before botocore's own validation and serialisation) records the first
violation of the call in a context variable; the strict layer's `before-send` handler then answers
that attempt with the service's own validation error, in its wire format (`refusal`), so botocore
parses it and raises the modelled exception exactly as for AWS's answer. A request with no
violation goes on unchanged.

What counts as AWS's constraint, and the exceptions:

- `max` on strings (characters), blobs (bytes), lists and maps (entries); `min`/`max` on integers,
  longs, floats and doubles; `pattern` on strings (Java regular expressions, run with the `regex`
  module, which knows `\\p{L}`-style classes); `enum` on strings.
- EC2's enums are not checked: EC2 accepts values newer than a botocore release's model (instance
  types above all), and its query protocol is not validated by a Coral front end. EC2's few
  length and range constraints are.
- `min` is botocore's own check (client-side), so it is not repeated here.

AWS's message, for the JSON services, is Coral's: "1 validation error detected: Value 'x' at
'healthCheckPath' failed to satisfy constraint: Member must have length less than or equal to 1024".
The query services (ELBv2, IAM, STS) answer `ValidationError` with the same sentence; EC2 answers
`InvalidParameterValue`.
"""

from __future__ import annotations

import contextvars
import functools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import regex

from tests.strict_aws.wire import ec2_error, json_error, request_id

if TYPE_CHECKING:
    from botocore.model import OperationModel, Shape

    from tests.strict_aws.wire import Response


@dataclass(frozen=True)
class Violation:
    """The first constraint a request breaks: where (AWS's member path) and which constraint."""

    service: str  # botocore's service id ("elastic-load-balancing-v2")
    protocol: str  # the model's protocol: json, query, ec2, rest-json, rest-xml, ...
    operation: str
    path: str  # "healthCheckPath", "tags.1.member.value"
    value: Any
    constraint: str  # "Member must have length less than or equal to 1024"

    @property
    def message(self) -> str:
        shown = str(self.value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return (
            f"1 validation error detected: Value '{shown}' at '{self.path}' "
            f"failed to satisfy constraint: {self.constraint}"
        )


_pending: contextvars.ContextVar[Violation | None] = contextvars.ContextVar("strict_aws_violation", default=None)
# Services whose enums AWS does not hold a request to (see the module docstring).
_OPEN_ENUMS = frozenset({"ec2"})


def before_parameter_build(params: dict[str, Any], model: OperationModel, **_: Any) -> None:
    """botocore handler: note the call's first violation (or none) for the attempt about to be sent."""
    from tests.strict_aws.core import active_controller

    if active_controller() is None:
        _pending.set(None)
        return
    service_model = model.service_model
    service = service_model.service_id.hyphenize()
    found = first_violation(model.input_shape, params, check_enums=service not in _OPEN_ENUMS)
    if found is None:
        _pending.set(None)
        return
    path, value, constraint = found
    _pending.set(Violation(service, service_model.protocol, model.name, path, value, constraint))


def take() -> Violation | None:
    """The violation noted for the call now being sent, if any (then cleared)."""
    violation = _pending.get()
    _pending.set(None)
    return violation


def first_violation(
    shape: Shape | None, value: Any, *, check_enums: bool = True, path: str = ""
) -> tuple[str, Any, str] | None:
    """(path, value, constraint) of the first constraint `value` breaks under `shape`, or None."""
    if shape is None or value is None:
        return None
    metadata = shape.metadata
    kind = shape.type_name
    if kind == "structure":
        for name, member in shape.members.items():  # type: ignore[attr-defined]
            if isinstance(value, dict) and name in value:
                found = first_violation(member, value[name], check_enums=check_enums, path=_join(path, name))
                if found:
                    return found
        return None
    if kind == "list":
        if isinstance(value, list | tuple):
            if "max" in metadata and len(value) > metadata["max"]:
                return path, f"[{len(value)} items]", f"Member must have length less than or equal to {metadata['max']}"
            for index, item in enumerate(value, 1):
                found = first_violation(
                    shape.member,  # type: ignore[attr-defined]
                    item,
                    check_enums=check_enums,
                    path=f"{path}.{index}.member",
                )
                if found:
                    return found
        return None
    if kind == "map":
        if isinstance(value, dict):
            if "max" in metadata and len(value) > metadata["max"]:
                return (
                    path,
                    f"{{{len(value)} entries}}",
                    f"Member must have length less than or equal to {metadata['max']}",
                )
            for key, item in value.items():
                found = first_violation(shape.key, key, check_enums=check_enums, path=f"{path}.key")  # type: ignore[attr-defined]
                found = found or first_violation(
                    shape.value,  # type: ignore[attr-defined]
                    item,
                    check_enums=check_enums,
                    path=f"{path}.{key}",
                )
                if found:
                    return found
        return None
    if kind == "string":
        if not isinstance(value, str):
            return None
        if "max" in metadata and len(value) > metadata["max"]:
            return path, value, f"Member must have length less than or equal to {metadata['max']}"
        enum = metadata.get("enum")
        if check_enums and enum and value not in enum:
            return path, value, f"Member must satisfy enum value set: [{', '.join(enum)}]"
        pattern = metadata.get("pattern")
        if pattern and not _matches(pattern, value):
            return path, value, f"Member must satisfy regular expression pattern: {pattern}"
        return None
    if kind == "blob":
        size = len(value) if isinstance(value, bytes | bytearray | str) else None
        if size is not None and "max" in metadata and size > metadata["max"]:
            return path, f"<{size} bytes>", f"Member must have length less than or equal to {metadata['max']}"
        return None
    if (
        kind in ("integer", "long", "float", "double")
        and isinstance(value, int | float)
        and not isinstance(value, bool)
    ):
        if "max" in metadata and value > metadata["max"]:
            return path, value, f"Member must have value less than or equal to {metadata['max']}"
        if "min" in metadata and value < metadata["min"]:
            return path, value, f"Member must have value greater than or equal to {metadata['min']}"
    return None


def _join(path: str, name: str) -> str:
    # Coral names members in lower camel case: "HealthCheckPath" -> "healthCheckPath".
    member = name[:1].lower() + name[1:]
    return f"{path}.{member}" if path else member


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> regex.Pattern[str] | None:
    try:
        return regex.compile(pattern)
    except regex.error:  # pragma: no cover - a model pattern regex cannot read: not checked
        return None


def _matches(pattern: str, value: str) -> bool:
    """Whether `value` satisfies a model pattern: Java's `matches()` semantics (the whole string)
    unless the pattern anchors itself."""
    compiled = _compiled(pattern)
    if compiled is None:
        return True
    return compiled.fullmatch(value) is not None if not pattern.startswith("^") else compiled.search(value) is not None


def refusal(violation: Violation) -> Response:
    """The service's answer to a request that breaks its model, in its own wire format."""
    if violation.protocol == "ec2":
        return ec2_error("InvalidParameterValue", violation.message)
    if violation.protocol == "query":
        body = (
            "<ErrorResponse><Error><Type>Sender</Type><Code>ValidationError</Code>"
            f"<Message>{_xml(violation.message)}</Message></Error><RequestId>{request_id()}</RequestId></ErrorResponse>"
        )
        return 400, {"Content-Type": "text/xml"}, body.encode()
    if violation.protocol == "rest-json":
        headers = {"Content-Type": "application/json", "x-amzn-ErrorType": "ValidationException"}
        return 400, headers, json.dumps({"message": violation.message}).encode()
    if violation.protocol == "rest-xml":
        body = f"<Error><Code>InvalidArgument</Code><Message>{_xml(violation.message)}</Message></Error>"
        return 400, {"Content-Type": "application/xml"}, body.encode()
    return json_error("ValidationException", violation.message)


def _xml(text: str) -> str:
    from xml.sax.saxutils import escape

    return escape(text)


def install() -> None:
    """Register the handler for every client made afterwards (botocore's BUILTIN_HANDLERS)."""
    from botocore.handlers import BUILTIN_HANDLERS

    entry = ("before-parameter-build", before_parameter_build)
    if entry not in BUILTIN_HANDLERS:
        BUILTIN_HANDLERS.append(entry)
