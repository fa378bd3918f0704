"""Whose an instance is: this stack's, this stack's from before stacks had ids, or not this stack's.

Many stacks of this template share an account and Region (invariant 11, docs/architecture/invariants.md). Each has an id
(Settings.stack_id) that every instance it launches carries twice: as the tag `fleetkeeper:stack`
(what its IAM policy keys on: it terminates only instances tagged with its own id) and inside the
ClientToken (`fk-<stack>-<uid>-<replica>`), which only the launcher could set, so copying the tags
onto another instance makes nothing any stack's (plan.launched_by_fleetkeeper).

A stack upgraded in place still runs replicas launched before stacks had ids: no stack tag, the old
token `fk-<uid>-<replica>`. Such an instance is LEGACY when its uid is one of this stack's own
services' (fleetkeeper.reconciler.legacy, which adopts it only while the stack's setting says so,
and is removed with it). One whose uid this stack does not know is never adopted, and never swept
as an orphan either: without the tag nothing proves it is this stack's
(docs/architecture/stacks-and-security.md, "A stack upgraded in place", says what an operator does
with the leftovers of services deleted before the upgrade).

Every part of the reconciler that acts on an instance asks `ownership` (or `is_ours`) first: the
shell's runs and sweep, a spot warning's handling, and any later worker that acts on one instance.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from fleetkeeper.reconciler.legacy import is_legacy
from fleetkeeper.reconciler.plan import launched_by_fleetkeeper

if TYPE_CHECKING:
    from collections.abc import Set

    from fleetkeeper.reconciler.driver import Instance


class Ownership(StrEnum):
    # Tagged with this stack's id, launched by fleetkeeper with a token for it (or adopted earlier).
    OURS = "ours"
    # Launched by this stack before stacks had ids: ours once tagged (fleetkeeper.reconciler.legacy).
    LEGACY = "legacy"
    # Another stack's, or launched by something other than fleetkeeper: never touched.
    FOREIGN = "foreign"


def ownership(instance: Instance, stack_id: str, own_uids: Set[str] = frozenset()) -> Ownership:
    """Whose `instance` is, for the stack `stack_id` whose services' uids are `own_uids`.

    `own_uids` matters only for an instance without a stack tag: pass the uids of the services this
    stack's table holds (those a run loaded or the index listed), never uids learnt elsewhere.
    """
    if not launched_by_fleetkeeper(instance):
        return Ownership.FOREIGN
    if instance.stack:
        return Ownership.OURS if instance.stack == stack_id else Ownership.FOREIGN
    if is_legacy(instance, own_uids):
        return Ownership.LEGACY
    return Ownership.FOREIGN


def is_ours(instance: Instance, stack_id: str, own_uids: Set[str] = frozenset()) -> bool:
    """Whether this stack may act on `instance` (adopting it first when it is LEGACY)."""
    return ownership(instance, stack_id, own_uids) is not Ownership.FOREIGN
