"""Replicas launched before stacks had ids ("legacy"): told apart, and adopted only when the stack says so.

A stack upgraded in place from a release without stack ids still runs the replicas that release
launched: no `fleetkeeper:stack` tag, the ClientToken `fk-<uid>-<replica>` (fleetkeeper.reconciler.driver,
`client_token` without a stack). One is this stack's only if its uid is one of this stack's own
services' (read from its own table: uids are random per incarnation, so another stack's table never
holds it); `is_legacy` says so, and fleetkeeper.reconciler.ownership answers LEGACY for it.

The switch: `Settings.adopt_untagged_replicas` (FLEETKEEPER_ADOPT_UNTAGGED_REPLICAS, set from
template.yaml's AdoptUntaggedReplicas, "false" by default; the IAM grant the adoption needs,
ReconcilerAdoptionPolicy, exists only while it is "true").
- On: the runs that list by uid (a shard's, a kick's) tag such a replica with this stack's id
  (`ReplicaDriver.adopt`), then treat it as any other of its instances (`take`); an EC2 event
  about one is acted on when its service here has its uid (`passed_on`, `of_its_service`).
- Off (a new stack, or an upgraded one whose runs report no more `adopted_instances`): such an
  instance is neither adopted nor terminated, reported with the foreign ones, and an EC2 event
  about it is ignored. Its service's run does not count it: it launches a replacement.
An untagged instance whose uid this stack does not know is never adopted nor swept either way
(docs/architecture/stacks-and-security.md, "A stack upgraded in place").

Removed in 0.2.0 (docs/DEPLOY.md, "Upgrading in place to stack ids"), with what is left of the legacy
path elsewhere, which goes with it:
- reconciler/ownership.py: `Ownership.LEGACY` and the `own_uids` it is decided on;
- reconciler/driver.py: `client_token` without a stack, `ReplicaDriver.adopt` (and the drivers' `adopt`);
- reconciler/plan/observe.py: `launched_by_fleetkeeper` accepting the token without a stack;
- reconciler/drivers/ec2.py: the listing by uid without the stack filter, `find_instance`'s own uid;
- reconciler/balancers/alb/: target groups named `fk-<uid>` (`_find_target_group`, `_legacy`,
  `_adopt_recorded`), which do not read the switch;
- uninstall/cleanup.py: `_LEGACY_GROUP`;
- template.yaml: AdoptUntaggedReplicas, the AdoptsUntagged condition, ReconcilerAdoptionPolicy.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from fleetkeeper.aws import DeadlineReached
from fleetkeeper.reconciler.driver import client_token

if TYPE_CHECKING:
    from collections.abc import Sequence, Set

    from fleetkeeper.model import ServiceState
    from fleetkeeper.reconciler.driver import Instance, ReplicaDriver
    from fleetkeeper.reconciler.report import RunReport

logger = logging.getLogger(__name__)

# What turns the adoption on, in the words of a deployment (docs/DEPLOY.md).
SWITCH = "the stack parameter AdoptUntaggedReplicas=true"


def is_legacy_token(instance: Instance) -> bool:
    """Whether the instance's ClientToken is one a launch made before stacks had ids."""
    token = instance.client_token or ""
    base = client_token(instance.uid, instance.replica_id)
    return token == base or token.startswith(base + "-")


def is_legacy(instance: Instance, own_uids: Set[str]) -> bool:
    """Whether `instance` (launched by fleetkeeper, plan.launched_by_fleetkeeper) is this stack's from
    before stacks had ids: no stack tag, the token of then, and a uid of this stack's own services."""
    return not instance.stack and instance.uid in own_uids and is_legacy_token(instance)


def take(legacy: Sequence[Instance], driver: ReplicaDriver, report: RunReport, *, adopt: bool) -> list[Instance]:
    """This stack's replicas from before stacks had ids, as the run counts them: with the adoption on,
    tagged with its id and kept; off, none (each left alone, as a foreign instance is)."""
    if not legacy:
        return []
    if adopt:
        return _adopt(legacy, driver, report)
    for instance in legacy:
        logger.warning(
            "instance %s (service %r, uid %s) was launched by this stack before stacks had ids: neither "
            "adopted nor terminated, the adoption is off (%s adopts it; docs/DEPLOY.md)",
            instance.instance_id,
            instance.service,
            instance.uid,
            SWITCH,
        )
        report.foreign.append(instance.instance_id)
    return []


def _adopt(legacy: Sequence[Instance], driver: ReplicaDriver, report: RunReport) -> list[Instance]:
    """Tag this stack's replicas from before stacks had ids with its id, so that its sweep and its
    IAM policy (which terminates only instances tagged with its id) know them from now on.

    A failed tagging is logged and the instances still count as this stack's in this run (they are
    its own services' replicas: not counting them would launch duplicates); the next run tags again.
    """
    ids = [instance.instance_id for instance in legacy]
    try:
        driver.adopt(ids)
    except DeadlineReached:
        raise
    except Exception:
        logger.exception("could not tag this stack's earlier replicas %s with its id; the next run retries", ids)
        report.errors.append("adopt")
        return list(legacy)
    logger.info("adopted this stack's replicas launched before stacks had ids: %s", ", ".join(ids))
    report.adopted.extend(ids)
    return [replace(instance, stack=driver.stack_id) for instance in legacy]


def passed_on(instance: Instance, *, adopt: bool) -> bool:
    """Whether an EC2 event about `instance` (launched by fleetkeeper, with no other stack's tag) may
    go on to its service's run: always when it carries this stack's id; one without a stack id only
    while the adoption is on (that run then adopts it if the service's uid is its own)."""
    return bool(instance.stack) or adopt


def of_its_service(instance: Instance, state: ServiceState | None) -> bool:
    """Whether an instance without a stack id is this stack's: its service here has the instance's uid."""
    return state is not None and state.service.uid == instance.uid
