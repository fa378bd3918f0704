"""Who calls the api, in one canonical form, and the principal patterns grants and administrators use.

API Gateway (REST API, AWS_IAM auth) hands the handler the caller's identity in
`requestContext.identity`: `userArn` is the ARN of the signing principal ("the Amazon Resource Name
(ARN) of the effective user identified after authentication"). Its shapes:

    IAM role session   arn:aws:sts::111122223333:assumed-role/ROLE-NAME/SESSION-NAME
    IAM user           arn:aws:iam::111122223333:user/PATH/USER-NAME   (PATH may be absent)
    federated user     arn:aws:sts::111122223333:federated-user/NAME
    root user          arn:aws:iam::111122223333:root

A federated user is refused, as a caller and in a pattern: NAME is whatever the caller of
sts:GetFederationToken chose (its `Name` parameter: any string of letters, digits and _=,.@-), so any
IAM user allowed that action signs as `federated-user/alice` for any alice, and the ARN identifies
nobody. The IAM user behind it is not in the request. (A role session's name is chosen by its caller
too, which is why a session acts as its role, never as its session name.)
https://docs.aws.amazon.com/STS/latest/APIReference/API_GetFederationToken.html

A service belongs to a *role*, not to the session that created it (the next CI run is another
session of the same role): a session's canonical principal is its role's ARN,
`arn:aws:iam::111122223333:role/ROLE-NAME`. The role's path is not in the session ARN (IAM's
identifiers page shows the assumed-role ARN as role name and session name only), so fleetkeeper
matches roles path-agnostically, by name: a role name is unique within an account whatever its
path (IAM: "names must be unique within the account"). A grant or administrator pattern that names
a role with a path is stored without it; one whose path holds a wildcard is refused, since dropping
that path would widen it (`role/teams/*` would become every role).

Patterns: a principal ARN where `*` matches any run of characters (as in IAM policies), e.g.
`arn:aws:iam::111122223333:role/team-a-*`. Matching is case-sensitive, like IAM's ARN matching.
The embedded mode's user is `local:<os-user>`.

Pure: no I/O.
"""

from __future__ import annotations

import re
from functools import lru_cache

LOCAL_PREFIX = "local:"
# IAM's own limit on an ARN (and STS's on an assumed-role ARN).
MAX_PRINCIPAL_LENGTH = 2048

_PARTITION = r"aws(?:-[a-z]+)*"
_ACCOUNT = r"[0-9]{12}"
# IAM names: letters, digits and _+=,.@- (CreateRole's RoleName pattern); session names the same.
_NAME = r"[\w+=,.@-]+"
_PATH_AND_NAME = r"(?:[\x21-\x7e]*/)?" + _NAME

_SESSION = re.compile(rf"arn:(?P<p>{_PARTITION}):sts::(?P<a>{_ACCOUNT}):assumed-role/(?P<role>{_NAME})/{_NAME}")
_CALLERS = (
    re.compile(rf"arn:{_PARTITION}:iam::{_ACCOUNT}:user/{_PATH_AND_NAME}"),
    re.compile(rf"arn:{_PARTITION}:iam::{_ACCOUNT}:root"),
    re.compile(rf"{LOCAL_PREFIX}[\w.@-]+"),
)
_FEDERATED = re.compile(rf"arn:{_PARTITION}:sts::(?:{_ACCOUNT}|\*):federated-user/[\w+=,.@*-]+")
FEDERATED_REFUSED = (
    "federated users (arn:aws:sts::ACCOUNT:federated-user/NAME) are refused: NAME is whatever the caller "
    "of sts:GetFederationToken chose, so it identifies nobody; call fleetkeeper as an IAM role session or "
    "an IAM user, and grant those"
)

# Patterns: the same shapes, `*` allowed in the account and in names.
_WILD_NAME = r"[\w+=,.@*-]+"
_WILD_ACCOUNT = r"(?:[0-9]{12}|\*)"
_ROLE_PATTERN = re.compile(
    rf"arn:(?P<p>{_PARTITION}):iam::(?P<a>{_WILD_ACCOUNT}):role/(?P<path>(?:[\x21-\x7e]*/)?)(?P<name>{_WILD_NAME})"
)
_PATTERNS = (
    re.compile(rf"arn:{_PARTITION}:iam::{_WILD_ACCOUNT}:user/(?:[\x21-\x7e]*/)?{_WILD_NAME}"),
    re.compile(rf"arn:{_PARTITION}:iam::{_WILD_ACCOUNT}:root"),
    re.compile(rf"{LOCAL_PREFIX}[\w.@*-]+"),
)
PATTERN_RULE = (
    "an IAM principal ARN: arn:aws:iam::ACCOUNT:role/NAME, arn:aws:iam::ACCOUNT:user/NAME or "
    "arn:aws:iam::ACCOUNT:root, where * matches any characters"
)


class PrincipalError(ValueError):
    """A principal or pattern fleetkeeper cannot use; the message says why, for a person."""


def canonical_caller(user_arn: str) -> str:
    """The principal a request acts as: a session's role, else the ARN itself.

    Raises PrincipalError for an ARN of no known shape (fleetkeeper then refuses the request).
    """
    if len(user_arn) > MAX_PRINCIPAL_LENGTH:
        raise PrincipalError("the caller's ARN is longer than IAM allows")
    session = _SESSION.fullmatch(user_arn)
    if session is not None:
        return f"arn:{session['p']}:iam::{session['a']}:role/{session['role']}"
    if any(shape.fullmatch(user_arn) for shape in _CALLERS):
        return user_arn
    if _FEDERATED.fullmatch(user_arn):
        raise PrincipalError(f"caller {user_arn!r}: {FEDERATED_REFUSED}")
    raise PrincipalError(f"caller {user_arn!r} is not an IAM role session, user or root user")


def canonical_pattern(text: str) -> str:
    """A grant's or an administrator's principal pattern as fleetkeeper stores and matches it.

    A role's path is dropped (roles match by name: the caller's session ARN has no path). Raises
    PrincipalError naming what is wrong.
    """
    pattern = text.strip()
    if not pattern:
        raise PrincipalError("a principal is empty")
    if len(pattern) > MAX_PRINCIPAL_LENGTH:
        raise PrincipalError(f"a principal is at most {MAX_PRINCIPAL_LENGTH} characters")
    if "**" in pattern:
        raise PrincipalError(f"{pattern!r}: write one * for any characters")
    role = _ROLE_PATTERN.fullmatch(pattern)
    if role is not None:
        path = role["path"]
        if path and ("*" in path or "*" in role["name"]):
            raise PrincipalError(
                f"{pattern!r}: a role's path is not part of a caller's identity (API Gateway sees "
                f"arn:aws:sts::ACCOUNT:assumed-role/NAME/SESSION), so roles are matched by name; "
                f"write arn:{role['p']}:iam::{role['a']}:role/NAME-PATTERN without the path"
            )
        return f"arn:{role['p']}:iam::{role['a']}:role/{role['name']}"
    if _SESSION.fullmatch(pattern) is not None:
        raise PrincipalError(
            f"{pattern!r} is one session of a role: name the role (arn:aws:iam::ACCOUNT:role/NAME), "
            "which every session of it acts as"
        )
    if any(shape.fullmatch(pattern) for shape in _PATTERNS):
        return pattern
    if _FEDERATED.fullmatch(pattern):
        raise PrincipalError(f"{pattern!r}: {FEDERATED_REFUSED}")
    raise PrincipalError(f"{pattern!r} is not {PATTERN_RULE}")


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def matches(pattern: str, principal: str) -> bool:
    """Whether the canonical `principal` is one `pattern` (canonical too) names."""
    if "*" not in pattern:
        return pattern == principal
    return _compiled(pattern).fullmatch(principal) is not None


def matches_any(patterns: tuple[str, ...] | list[str], principal: str) -> bool:
    return any(matches(pattern, principal) for pattern in patterns)
