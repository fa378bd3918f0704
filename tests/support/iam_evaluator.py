"""A small IAM policy evaluator: the subset of AWS's policy language this stack's policies use.

Why our own: the maintained Python tools are auditors (parliament, already a dev dependency, and
cloudsplaining look at a policy without a request) or compute an entity's effective action set from
account authorization details without a request context (iam-ape, judged from its description); none
decides one request with its condition keys, policy variables and a permissions boundary. So this
module does, for what the stack uses, and tests/strict_aws/test_iam_evaluator.py checks it against the
evaluation examples of AWS's IAM documentation before any stack policy is judged with it.

Semantics, from AWS's IAM User Guide:

- evaluation: an explicit Deny in any applicable policy wins; otherwise a request within one account is
  allowed when an identity-based policy *or* a resource-based policy allows it, and a permissions
  boundary, when the principal has one, must allow it too (identity policy AND boundary); anything
  else is an implicit deny.
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic_policy-eval-basics.html
  https://docs.aws.amazon.com/IAM/latest/UserGuide/access_policies_boundaries.html
  (Simplification: a resource-based policy's allow is also capped by the boundary; AWS exempts only
  grants naming a role *session* ARN, which no policy of this stack does.)
- a resource-based policy's Principal: "*" and {"AWS": "*"} are everyone, {"AWS": <account id or
  arn:aws:iam::<account>:root>} the account (it delegates to the account's IAM policies, which must
  allow too), {"AWS": <role or user ARN>} that principal, {"Service": <name>} that service principal.
  An identity-based policy has no Principal. A KMS key policy must allow by itself or delegate to
  the account: "Unless the key policy explicitly allows it, you cannot use IAM policies to allow
  access to a KMS key."
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_principal.html
  https://docs.aws.amazon.com/kms/latest/developerguide/key-policies.html
- the global keys AWS derives from the caller (aws:PrincipalArn, aws:PrincipalAccount,
  aws:PrincipalServiceName, aws:PrincipalIsAWSService) and aws:SecureTransport, always present
  ("true" unless the request says otherwise); see Request.
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-keys.html
- Action / NotAction match case-insensitively with `*` and `?`; Resource / NotResource match
  case-sensitively with `*` (any run of characters, `/` and `:` included) and `?`.
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_resource.html
- policy variables `${key}` in Resource and in condition values are replaced by the request's value
  of `key`; `${*}`, `${?}` and `${$}` are the literal characters. A variable whose key the request does
  not carry (or carries multi-valued) makes the element match nothing.
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html
- Condition: every operator block and every key in it must hold (AND); a key's several values are
  alternatives (OR) for positive operators, and for negated ones (StringNotEquals, StringNotLike,
  ArnNotEquals, ArnNotLike) the key must match none of them. A key the request does not carry fails a
  positive operator and satisfies a negated one; `...IfExists` is true for a missing key. `Null: true`
  holds when the key is missing. ForAnyValue: some request value matches (false when missing);
  ForAllValues: every request value matches (true when missing or empty). ArnEquals/ArnLike compare
  the six colon-separated parts of an ARN one by one.
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_condition_operators.html
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-single-vs-multi-valued-context-keys.html

- service control policies filter IAM principals of member accounts (the root user included), never
  service principals, service-linked roles or the management account; within them a request needs an
  Allow and no Deny, and they grant nothing by themselves.
  https://docs.aws.amazon.com/organizations/latest/userguide/orgs_manage_policies_scps_evaluation.html

Anything else (an operator, a prefix or a policy element it does not know) raises Unsupported:
a policy this evaluator cannot read is never judged "denied" by accident.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Unsupported(Exception):
    """A policy uses something this evaluator does not implement."""


class Decision(StrEnum):
    ALLOW = "Allow"
    EXPLICIT_DENY = "ExplicitDeny"
    IMPLICIT_DENY = "ImplicitDeny"


# A service principal's name (events.amazonaws.com, and the China partition's .amazonaws.com.cn).
_SERVICE_PRINCIPAL = re.compile(r"[a-z0-9][a-z0-9.-]*\.amazonaws\.com(\.cn)?")


@dataclass(frozen=True)
class Request:
    """One request: who (principal), what (action), on what (resource ARN), and its context keys.

    `principal` is an IAM principal's ARN (a role, a user, an account's root) or an AWS service
    principal's name (``events.amazonaws.com``: a service acting on its own, as EventBridge does when
    it delivers to a target). `context` maps condition keys (any case) to a string or a list of
    strings (a multivalued key).

    The global keys AWS derives from the principal are in the request context whatever `context`
    says (a caller cannot claim another's), reference_policies_condition-keys.html:
    - an IAM principal: aws:PrincipalArn (its ARN; "for all signed requests", for roles, users and
      the root user), aws:PrincipalAccount (its account), aws:PrincipalIsAWSService false;
    - a service principal: aws:PrincipalServiceName (its name; "present ... when the call is made by
      an AWS service principal", and in no other case), aws:PrincipalIsAWSService true, and no
      aws:PrincipalArn (not one of the principal types that key carries) nor aws:PrincipalAccount
      (the page does not say what it holds for a service principal).
    aws:SecureTransport is "always included in the request context": "true" (the SDKs' HTTPS)
    unless `context` gives it.
    https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-keys.html
    """

    principal: str
    action: str
    resource: str
    context: dict[str, str | list[str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.is_service or (self.principal.startswith("arn:") and self.principal.count(":") >= 5)):
            raise ValueError(f"principal {self.principal!r} is neither an IAM principal ARN nor a service principal")

    @property
    def is_service(self) -> bool:
        return _SERVICE_PRINCIPAL.fullmatch(self.principal) is not None

    @property
    def account(self) -> str | None:
        """The caller's account (None for a service principal)."""
        return None if self.is_service else self.principal.split(":")[4]

    @property
    def account_root(self) -> str | None:
        """The ARN a Principal element names the caller's account by (its partition's root)."""
        if self.is_service:
            return None
        partition, account = self.principal.split(":")[1], self.principal.split(":")[4]
        return f"arn:{partition}:iam::{account}:root"

    def _derived(self) -> dict[str, str]:
        if self.is_service:
            return {"aws:principalservicename": self.principal, "aws:principalisawsservice": "true"}
        return {
            "aws:principalarn": self.principal,
            "aws:principalaccount": self.principal.split(":")[4],
            "aws:principalisawsservice": "false",
        }

    def value(self, key: str) -> str | list[str] | None:
        lowered = key.lower()
        derived = self._derived()
        if lowered in derived:
            return derived[lowered]
        if lowered in ("aws:principalarn", "aws:principalaccount", "aws:principalservicename"):
            return None  # of the other kind of principal: absent, whatever `context` says
        for name, value in self.context.items():
            if name.lower() == lowered:
                return value
        if lowered == "aws:securetransport":
            return "true"
        return None


_KNOWN_ELEMENTS = {"Sid", "Effect", "Action", "NotAction", "Resource", "NotResource", "Condition", "Principal"}
_VARIABLE = re.compile(r"\$\{([^}]+)\}")


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def statements(policy: dict[str, Any]) -> list[dict[str, Any]]:
    found = as_list(policy.get("Statement", []))
    for statement in found:
        unknown = set(statement) - _KNOWN_ELEMENTS
        if unknown:
            raise Unsupported(f"statement elements {sorted(unknown)}")
        if statement.get("Effect") not in ("Allow", "Deny"):
            raise Unsupported(f"Effect {statement.get('Effect')!r}")
    return found


# The strict layer evaluates the same policies' patterns for every call it judges: each pattern is
# translated to a regular expression and compiled once, not at every evaluation.
@functools.lru_cache(maxsize=8192)
def _glob(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    parts = []
    for char in pattern:
        parts.append(".*" if char == "*" else "." if char == "?" else re.escape(char))
    return re.compile("".join(parts), re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def glob_match(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    return _glob(pattern, ignore_case=ignore_case).fullmatch(value) is not None


def substitute(text: str, request: Request) -> str | None:
    """`text` with its policy variables replaced; None when one has no (single) value."""
    missing = False

    def replace(match: re.Match[str]) -> str:
        nonlocal missing
        name = match.group(1)
        if name in ("*", "?", "$"):
            # A literal, escaped with a marker the glob cannot confuse with a wildcard.
            return {"*": "\x00STAR\x00", "?": "\x00QMARK\x00", "$": "$"}[name]
        value = request.value(name)
        if not isinstance(value, str):
            missing = True
            return ""
        # A value stands for itself: its own * and ? are not wildcards.
        return value.replace("*", "\x00STAR\x00").replace("?", "\x00QMARK\x00")

    result = _VARIABLE.sub(replace, text)
    return None if missing else result


def _literal_glob(pattern: str, value: str, *, ignore_case: bool) -> bool:
    """glob_match where \\x00STAR\\x00 / \\x00QMARK\\x00 are the literal characters."""
    return _literal_pattern(pattern, ignore_case=ignore_case).fullmatch(value) is not None


@functools.lru_cache(maxsize=8192)
def _literal_pattern(pattern: str, *, ignore_case: bool) -> re.Pattern[str]:
    regex = []
    index = 0
    while index < len(pattern):
        if pattern.startswith("\x00STAR\x00", index):
            regex.append(re.escape("*"))
            index += 6
        elif pattern.startswith("\x00QMARK\x00", index):
            regex.append(re.escape("?"))
            index += 7
        else:
            char = pattern[index]
            regex.append(".*" if char == "*" else "." if char == "?" else re.escape(char))
            index += 1
    flags = re.DOTALL | (re.IGNORECASE if ignore_case else 0)
    return re.compile("".join(regex), flags)


def _resource_matches(patterns: list[Any], request: Request) -> bool:
    for raw in patterns:
        pattern = substitute(str(raw), request)
        if pattern is not None and _literal_glob(pattern, request.resource, ignore_case=False):
            return True
    return False


def _action_matches(patterns: list[Any], action: str) -> bool:
    return _actions_match(tuple(str(p) for p in patterns), action)


@functools.lru_cache(maxsize=65536)
def _actions_match(patterns: tuple[str, ...], action: str) -> bool:
    # A statement's Action list against an action: the same few pairs for every call the layer judges.
    return any(glob_match(p, action, ignore_case=True) for p in patterns)


# --- conditions ---------------------------------------------------------------------------------

_ARN_PARTS = 6


def _arn_like(pattern: str, value: str) -> bool:
    pattern_parts = pattern.split(":", _ARN_PARTS - 1)
    value_parts = value.split(":", _ARN_PARTS - 1)
    if len(pattern_parts) != _ARN_PARTS or len(value_parts) != _ARN_PARTS:
        return False
    return all(_literal_glob(p, v, ignore_case=False) for p, v in zip(pattern_parts, value_parts, strict=True))


def _compare(base: str, pattern: str, value: str) -> bool:
    if base == "StringEquals":
        return pattern.replace("\x00STAR\x00", "*").replace("\x00QMARK\x00", "?") == value
    if base == "StringEqualsIgnoreCase":
        return pattern.replace("\x00STAR\x00", "*").replace("\x00QMARK\x00", "?").lower() == value.lower()
    if base == "StringLike":
        return _literal_glob(pattern, value, ignore_case=False)
    if base in ("ArnEquals", "ArnLike"):
        return _arn_like(pattern, value)
    if base == "Bool":
        return pattern.lower() == value.lower()
    raise Unsupported(f"condition operator {base}")


_NEGATED = {
    "StringNotEquals": "StringEquals",
    "StringNotEqualsIgnoreCase": "StringEqualsIgnoreCase",
    "StringNotLike": "StringLike",
    "ArnNotEquals": "ArnEquals",
    "ArnNotLike": "ArnLike",
}
_POSITIVE = {"StringEquals", "StringEqualsIgnoreCase", "StringLike", "ArnEquals", "ArnLike", "Bool"}


def _condition_holds(operator: str, key: str, wanted: Any, request: Request) -> bool:
    qualifier = None
    if ":" in operator:
        qualifier, operator = operator.split(":", 1)
        if qualifier not in ("ForAnyValue", "ForAllValues"):
            raise Unsupported(f"condition qualifier {qualifier}")
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    value = request.value(key)
    if base == "Null":
        if qualifier or if_exists:
            raise Unsupported(f"{qualifier or ''}{operator}")
        return any((value is None) == (str(w).lower() == "true") for w in as_list(wanted))
    negated = base in _NEGATED
    positive = _NEGATED.get(base, base)
    if positive not in _POSITIVE:
        raise Unsupported(f"condition operator {operator}")
    patterns = []
    for raw in as_list(wanted):
        pattern = substitute(str(raw), request)
        if pattern is not None:
            patterns.append(pattern)
    if value is None:
        if qualifier == "ForAllValues":
            return True
        if qualifier == "ForAnyValue":
            return False
        return True if if_exists else negated
    values = as_list(value)
    if qualifier is None and len(values) != 1:
        raise Unsupported(f"single-valued operator {operator} on multivalued key {key}")

    def matches(one: str) -> bool:
        hit = any(_compare(positive, p, one) for p in patterns)
        return not hit if negated else hit

    if qualifier == "ForAllValues":
        return all(matches(v) for v in values)
    return any(matches(v) for v in values)


def conditions_hold(condition: dict[str, Any] | None, request: Request) -> bool:
    for operator, block in (condition or {}).items():
        for key, wanted in block.items():
            if not _condition_holds(operator, key, wanted, request):
                return False
    return True


# --- statements and policies --------------------------------------------------------------------


def principal_match(principal: Any, request: Request) -> str | None:
    """How a resource-based statement's Principal names the caller: "direct" (the caller, or
    everyone), "account" (the caller's account: a grant to the account delegates to its IAM policies,
    so the caller's own identity policy must allow too), or None.

    "*" and {"AWS": "*"} are everyone; {"AWS": <account id or its root ARN>} the account;
    {"AWS": <role or user ARN>} that principal; {"Service": <name>} that service principal.
    https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_principal.html
    """
    if principal == "*":
        return "direct"
    if not isinstance(principal, dict):
        raise Unsupported(f"Principal {principal!r}")
    found = None
    for kind, names in principal.items():
        if kind not in ("AWS", "Service"):
            raise Unsupported(f"Principal type {kind}")
        for raw in as_list(names):
            name = str(raw)
            if kind == "Service":
                if request.is_service and name == request.principal:
                    return "direct"
            elif name == "*" or name == request.principal:
                return "direct"
            elif request.account is not None and name in (request.account, request.account_root):
                found = "account"
    return found


def statement_applies(statement: dict[str, Any], request: Request, *, resource_based: bool = False) -> bool:
    """Whether the statement's Action, Resource, Principal (of a resource-based policy; an
    identity-based policy or a boundary has none) and Condition all match the request."""
    if resource_based != ("Principal" in statement):
        raise Unsupported(
            "a resource-based statement without Principal"
            if resource_based
            else "Principal in an identity-based policy or a boundary"
        )
    if "Action" in statement:
        action_hit = _action_matches(as_list(statement["Action"]), request.action)
    elif "NotAction" in statement:
        action_hit = not _action_matches(as_list(statement["NotAction"]), request.action)
    else:
        raise Unsupported("a statement without Action or NotAction")
    if not action_hit:
        return False
    if "Resource" in statement and not _resource_matches(as_list(statement["Resource"]), request):
        return False
    if "NotResource" in statement and _resource_matches(as_list(statement["NotResource"]), request):
        return False
    if resource_based and principal_match(statement["Principal"], request) is None:
        return False
    return conditions_hold(statement.get("Condition"), request)


def policy_effects(policy: dict[str, Any], request: Request) -> set[str]:
    """The Effects of the policy's statements that apply to the request."""
    return {s["Effect"] for s in statements(policy) if statement_applies(s, request)}


def scps_apply(request: Request, *, management_account: bool = False) -> bool:
    """Whether service control policies filter this request: not for a service principal (no IAM
    principal of the account), a service-linked role (path aws-service-role/), nor any principal of
    the organization's management account. The account's root user is filtered like its roles.
    https://docs.aws.amazon.com/organizations/latest/userguide/orgs_manage_policies_scps.html
    """
    if request.is_service or management_account:
        return False
    return ":role/aws-service-role/" not in request.principal


def evaluate(
    request: Request,
    identity: list[dict[str, Any]],
    *,
    boundary: dict[str, Any] | None = None,
    resource: list[dict[str, Any]] | None = None,
    key_policy: bool = False,
    scps: list[dict[str, Any]] | None = None,
    management_account: bool = False,
) -> Decision:
    """The decision for a request within one account (no SCPs, no session policies).

    `identity`: the caller's identity-based policies (a service principal has none). `resource`:
    resource-based policies (a queue policy, a key policy); their statements must have a Principal.
    A statement naming the caller (its ARN, its service principal name, or everyone) allows by
    itself; one naming the caller's account allows only with the caller's identity policy allowing
    too. `key_policy`: `resource` is a KMS key's policy, which must allow: "Unless the key policy
    explicitly allows it, you cannot use IAM policies to allow access to a KMS key. Without
    permission from the key policy, IAM policies that allow permissions have no effect." An IAM
    policy's Deny still denies.
    https://docs.aws.amazon.com/kms/latest/developerguide/key-policies.html

    `scps`: the service control policies in force on the caller's account (one level: its own and its
    OU's together; list FullAWSAccess with them, as AWS attaches it). An SCP grants nothing: the request
    must be allowed by some SCP and denied by none, besides everything above; `scps_apply` says when
    they do not count at all. An SCP's Deny is an explicit deny.
    https://docs.aws.amazon.com/organizations/latest/userguide/orgs_manage_policies_scps_evaluation.html
    """
    if scps is not None and scps_apply(request, management_account=management_account):
        scp_effects = set().union(*(policy_effects(p, request) for p in scps)) if scps else set()
        if "Deny" in scp_effects:
            return Decision.EXPLICIT_DENY
        if "Allow" not in scp_effects:
            return Decision.IMPLICIT_DENY
    identity_effects = set().union(*(policy_effects(p, request) for p in identity)) if identity else set()
    boundary_effects = policy_effects(boundary, request) if boundary is not None else {"Allow"}
    resource_grants = [
        (s["Effect"], principal_match(s["Principal"], request))
        for p in resource or []
        for s in statements(p)
        if statement_applies(s, request, resource_based=True)
    ]
    if "Deny" in identity_effects | boundary_effects | {effect for effect, _ in resource_grants}:
        return Decision.EXPLICIT_DENY
    if "Allow" not in boundary_effects:
        return Decision.IMPLICIT_DENY
    identity_allows = "Allow" in identity_effects
    direct = any(effect == "Allow" and how == "direct" for effect, how in resource_grants)
    via_account = identity_allows and any(effect == "Allow" and how == "account" for effect, how in resource_grants)
    if direct or via_account or (identity_allows and not key_policy):
        return Decision.ALLOW
    return Decision.IMPLICIT_DENY


def allowed(request: Request, identity: list[dict[str, Any]], **kwargs: Any) -> bool:
    return evaluate(request, identity, **kwargs) is Decision.ALLOW
