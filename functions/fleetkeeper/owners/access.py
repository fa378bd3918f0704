"""Who may read or change a service: its owner, the stack's administrators, and the principals it names.

A caller is one canonical principal (fleetkeeper.owners.principals) and whether it is one of the stack's
administrators (the AdministratorPrincipals parameter). On a service it has:

- write (read and change it, its grants included): an administrator, the service's owner (the
  principal that created this incarnation), or a principal a `write` grant of it names;
- read (GET it, its versions and events; list it): a principal a `read` grant names;
- nothing otherwise: the service answers as if it did not exist (404, the same body as an unknown
  name), so that a name tells a caller nothing about another team's service.

Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetkeeper.model import AccessGrant
from fleetkeeper.owners.principals import PrincipalError, canonical_pattern, matches, matches_any

if TYPE_CHECKING:
    from fleetkeeper.model import AccessMode, ServiceRecord

# Grants a service may name: a few teams and their CI roles. Far below DynamoDB's item size.
MAX_GRANTS = 20


@dataclass(frozen=True)
class Caller:
    """The principal a request acts as (canonical), and whether it administers the stack."""

    principal: str
    admin: bool = False

    @classmethod
    def of(cls, principal: str, admin_patterns: tuple[str, ...]) -> Caller:
        return cls(principal, admin=matches_any(admin_patterns, principal))

    def mode_on(self, service: ServiceRecord) -> AccessMode | None:
        """What this caller may do with `service`: write, read, or nothing (None)."""
        if self.admin or (service.owner and service.owner == self.principal):
            return "write"
        modes = {grant.mode for grant in service.access if matches(grant.principal, self.principal)}
        if "write" in modes:
            return "write"
        return "read" if modes else None

    def may_read(self, service: ServiceRecord) -> bool:
        return self.mode_on(service) is not None

    def may_write(self, service: ServiceRecord) -> bool:
        return self.mode_on(service) == "write"


# What a caller acting for fleetkeeper itself is (commands built outside the api handler: tests, the
# CLI's dry checks): every service; what it creates has no owner.
SYSTEM = Caller("", admin=True)


def grant(principal: str, mode: str) -> AccessGrant:
    """A grant from a request: its principal canonical (PrincipalError if it is not a principal pattern)."""
    if mode not in ("read", "write"):
        raise PrincipalError(f"mode {mode!r} is not read or write")
    return AccessGrant(canonical_pattern(principal), "write" if mode == "write" else "read")


def changed_access(
    current: tuple[AccessGrant, ...], add: list[AccessGrant], remove: list[str]
) -> tuple[AccessGrant, ...]:
    """`current` with `remove` (canonical principals) taken out and `add` put in (a principal added
    again takes the new mode), in the order first granted."""
    gone = set(remove)
    added = {g.principal: g for g in add}
    kept = [added.pop(g.principal, g) for g in current if g.principal not in gone]
    return (*kept, *(g for g in added.values() if g.principal not in gone))


def describe_change(before: tuple[AccessGrant, ...], after: tuple[AccessGrant, ...]) -> list[str]:
    """What changed, in words: `granted write to X`, `revoked X`, `X: read -> write`."""
    old = {g.principal: g.mode for g in before}
    new = {g.principal: g.mode for g in after}
    words = []
    for principal, mode in new.items():
        if principal not in old:
            words.append(f"granted {mode} to {principal}")
        elif old[principal] != mode:
            words.append(f"{principal}: {old[principal]} -> {mode}")
    words += [f"revoked {principal}" for principal in old if principal not in new]
    return words
