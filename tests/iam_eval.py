"""A small evaluator of IAM policies for one request in one account: enough to prove what a resource
policy of the template (a queue policy, a key policy) lets through, with the documented semantics
the template's statements rely on.

- An explicit Deny in any applicable policy wins; otherwise an Allow in the caller's identity policy
  or in the resource policy (same account) allows; otherwise the request is implicitly denied.
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic.html
- Conditions: operators AND, keys within an operator AND, values of a key OR, and NOR for a negated
  operator (ArnNotEquals, StringNotEquals...). A key absent from the request makes a positive
  operator false and a negated one true (except ...IfExists and Null).
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_multi-value-conditions.html
  https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_condition_operators.html
- Principal "*" is everyone; {"AWS": "arn:...:root"} (or an account id) is any principal of that
  account whose own policies allow the action; {"AWS": role ARN} that role; {"Service": name} that
  service principal.

Only the operators the template uses are implemented; any other raises, so a statement this cannot
judge fails its test instead of passing unjudged.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from tests.cfn import as_list


@dataclass(frozen=True)
class Request:
    action: str
    resource: str
    # The caller: a role (its ARN, the session's role), a service principal, or the account root.
    principal_arn: str | None = None
    service: str | None = None
    account: str = "123456789012"
    context: dict[str, str] = field(default_factory=dict)
    # The caller's identity policies' statements (a service principal has none).
    identity: tuple[dict[str, Any], ...] = ()

    def keys(self) -> dict[str, str]:
        keys = {"aws:securetransport": "true", **{k.lower(): v for k, v in self.context.items()}}
        if self.principal_arn is not None:
            keys["aws:principalarn"] = self.principal_arn
            keys["aws:principalaccount"] = self.account
        if self.service is not None:
            keys["aws:principalservicename"] = self.service
        return keys


def _like(pattern: str, value: str) -> bool:
    return fnmatch.fnmatchcase(value, pattern.replace("[", "[[]"))


def _matches_action(statement: dict[str, Any], action: str) -> bool:
    if "NotAction" in statement:
        return not any(_like(a.lower(), action.lower()) for a in as_list(statement["NotAction"]))
    return any(_like(str(a).lower(), action.lower()) for a in as_list(statement.get("Action", [])))


def _matches_resource(statement: dict[str, Any], resource: str) -> bool:
    return any(_like(str(r), resource) for r in as_list(statement.get("Resource", "*")))


def _principal_match(statement: dict[str, Any], request: Request) -> str | None:
    """ "direct" (the statement names the caller, or everyone), "account" (it names the caller's
    account: the caller's own policies must allow too), or None."""
    principal = statement.get("Principal")
    if principal == "*" or principal == {"AWS": "*"}:
        return "direct"
    if not isinstance(principal, dict):
        raise AssertionError(f"cannot judge Principal {principal!r}")
    found = None
    for kind, values in principal.items():
        for value in as_list(values):
            value = str(value)
            if kind == "Service" and request.service == value:
                return "direct"
            if kind == "AWS" and request.principal_arn is not None:
                if value == request.principal_arn:
                    return "direct"
                if value in (request.account, f"arn:aws:iam::{request.account}:root"):
                    found = "account"
    return found


_POSITIVE = {
    "ArnEquals": lambda want, have: want == have,
    "ArnLike": _like,
    "StringEquals": lambda want, have: want == have,
    "StringLike": _like,
    "Bool": lambda want, have: str(want).lower() == str(have).lower(),
}
_NEGATED = {"ArnNotEquals": "ArnEquals", "ArnNotLike": "ArnLike", "StringNotEquals": "StringEquals"}


def _condition_holds(statement: dict[str, Any], keys: dict[str, str]) -> bool:
    for operator, block in (statement.get("Condition") or {}).items():
        for key, wanted in block.items():
            have = keys.get(key.lower())
            values = [str(v) for v in as_list(wanted)]
            if operator in _POSITIVE:
                holds = have is not None and any(_POSITIVE[operator](v, have) for v in values)
            elif operator in _NEGATED:
                test = _POSITIVE[_NEGATED[operator]]
                holds = have is None or not any(test(v, have) for v in values)
            else:
                raise AssertionError(f"cannot judge condition operator {operator}")
            if not holds:
                return False
    return True


def _applies(statement: dict[str, Any], request: Request) -> bool:
    return (
        _matches_action(statement, request.action)
        and _matches_resource(statement, request.resource)
        and _condition_holds(statement, request.keys())
    )


def decide(resource_policy: dict[str, Any], request: Request, *, key_policy: bool = False) -> str:
    """ "Allow", "ExplicitDeny" or "ImplicitDeny" for `request` against a resource policy and the
    caller's identity statements (one account).

    With `key_policy` (a KMS key's), the key policy must allow: an identity policy counts only where
    the key policy gives the account (its root) the action, as AWS's default key policy does.
    https://docs.aws.amazon.com/kms/latest/developerguide/key-policy-default.html#key-policy-default-allow-root-enable-iam
    """
    resource = [(s, _principal_match(s, request)) for s in as_list(resource_policy["Statement"])]
    resource = [(s, how) for s, how in resource if how is not None and _applies(s, request)]
    identity = [s for s in request.identity if _applies(s, request)]
    if any(s["Effect"] == "Deny" for s, _ in resource) or any(s["Effect"] == "Deny" for s in identity):
        return "ExplicitDeny"
    identity_allows = any(s["Effect"] == "Allow" for s in identity)
    direct = any(s["Effect"] == "Allow" and how == "direct" for s, how in resource)
    through_account = any(s["Effect"] == "Allow" and how == "account" for s, how in resource) and identity_allows
    if direct or through_account or (identity_allows and not key_policy):
        return "Allow"
    return "ImplicitDeny"
