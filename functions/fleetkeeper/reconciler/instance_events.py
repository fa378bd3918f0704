"""EC2's events about one instance, acted on at once: a spot warning, a change of state.

EventBridge delivers them to the kick queue (template.yaml's InterruptionRule and InstanceStateRule;
parsed by fleetkeeper.reconciler.interruptions and .state_changes). Each names an instance only: its
tags and ClientToken say whose it is, and an instance fleetkeeper did not launch, or another stack
launched, is ignored, as every unmanaged one in the account is (EC2's rule sends every stack every
event). A replica's event ends in a run of its service (`Reconciler.run_one`).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from fleetkeeper.model import to_iso
from fleetkeeper.reconciler import legacy
from fleetkeeper.reconciler.plan import drain_due, launched_by_fleetkeeper, warned
from fleetkeeper.reconciler.report import RunReport
from fleetkeeper.service_events import replica_changed
from fleetkeeper.store.errors import Superseded

if TYPE_CHECKING:
    from fleetkeeper.model import Interruption, ReplicaRecord, ServiceState
    from fleetkeeper.reconciler.driver import Instance
    from fleetkeeper.reconciler.run import Reconciler
    from fleetkeeper.reconciler.state_changes import StateChange

logger = logging.getLogger(__name__)
# Reads and writes of a warned replica before giving up on recording its warning (each retry follows a
# concurrent write of the same replica, which a reconcile run makes at most a few times).
_WARNING_WRITE_TRIES = 5


def interrupt(reconciler: Reconciler, interruption: Interruption) -> RunReport:
    """EC2 warned about an instance (fleetkeeper.reconciler.interruptions): record the warning on
    the replica whose instance it is, then reconcile that service at once (the plan drains and
    replaces it, fleetkeeper.reconciler.plan.spot_warnings._plan_warned).

    The write is conditioned on the replica's revision: a run that changed the replica meanwhile
    makes this read it again, so the warning is never lost to a concurrent write.
    """
    instance = managed_instance(reconciler, interruption.instance_id)
    if instance is None:
        logger.info("%s for %s: not a managed instance, ignored", interruption.kind, interruption.instance_id)
        return RunReport()
    if instance.stack and instance.stack != reconciler.driver.stack_id:
        logger.info("%s for %s: another stack's instance, ignored", interruption.kind, interruption.instance_id)
        return RunReport()
    if not instance.spot:
        # EC2 sends both warnings for spot instances only (its InstanceLifecycle, as described now,
        # is the truth): one about an on-demand replica is forged or misrouted, and acting on it
        # would drain a healthy replica; repeated, every replica of the service.
        logger.warning(
            "%s for %s: replica %d of service %s is not a spot instance, warning ignored",
            interruption.kind,
            interruption.instance_id,
            instance.replica_id,
            instance.service,
        )
        return RunReport()
    _record_warning(reconciler, instance, interruption)
    if not instance.stack and not legacy.of_its_service(instance, reconciler.load(instance.service, RunReport())):
        # From before stacks had ids: this stack's only if its service here has the instance's uid.
        logger.info("%s for %s: not this stack's instance, ignored", interruption.kind, interruption.instance_id)
        return RunReport()
    return reconciler.run_one(instance.service)


def _record_warning(reconciler: Reconciler, instance: Instance, interruption: Interruption) -> None:
    """The warning on the replica whose instance it is (none: nothing recorded), retried after a
    concurrent write of the replica, and a run of its service asked for when its drain must start."""
    stamp = to_iso(reconciler.now())
    for _ in range(_WARNING_WRITE_TRIES):
        state = reconciler.load(instance.service, RunReport())
        record = state.replicas.get(instance.replica_id) if state and state.service.uid == instance.uid else None
        after = warned(record, interruption) if record is not None else None
        if record is None or after is None:
            return
        try:
            reconciler.store.put_replica(record, after, replica_changed(record, after), stamp)
        except Superseded:
            continue  # the replica changed since it was read: read it again
        logger.warning(
            "service %s: replica %d warned: %s for %s",
            record.name,
            record.replica_id,
            interruption.kind,
            interruption.instance_id,
        )
        _wake_for_drain(reconciler, state, after)
        return


def instance_changed(reconciler: Reconciler, change: StateChange) -> RunReport:
    """EC2 says an instance is stopping, stopped or going (fleetkeeper.reconciler.state_changes):
    when it is one of this stack's replicas, reconcile its service at once (the plan replaces a
    replica whose instance is gone, and probes one that stopped), instead of at the next
    scheduled run. Any other instance of the account costs this one DescribeInstances."""
    instance = managed_instance(reconciler, change.instance_id)
    if instance is None:
        logger.debug("instance %s is %s: not a managed instance, ignored", change.instance_id, change.state)
        return RunReport()
    logger.info(
        "service %s: instance %s of replica %d is %s",
        instance.service,
        change.instance_id,
        instance.replica_id,
        change.state,
    )
    return reconciler.run_one(instance.service)


def managed_instance(reconciler: Reconciler, instance_id: str) -> Instance | None:
    """The instance, when it is one fleetkeeper launched for this stack (the check every event
    about an instance goes through before anything is done about it), else None. One without a
    stack id (launched before stacks had ids) is passed on only while the adoption is on: the run
    of its service adopts it only if the service's uid is its own (fleetkeeper.reconciler.legacy)."""
    instance = reconciler.driver.instance(instance_id)
    if instance is None or not launched_by_fleetkeeper(instance):
        return None
    if instance.stack and instance.stack != reconciler.driver.stack_id:
        return None
    return instance if legacy.passed_on(instance, adopt=reconciler.adopt_untagged_replicas) else None


def _wake_for_drain(reconciler: Reconciler, state: ServiceState | None, record: ReplicaRecord) -> None:
    """Ask for a run of the service when the warned replica's drain must start (plan.drain_due),
    which is mostly between two scheduled runs."""
    if state is None or record.interruption is None or reconciler.kick is None:
        return
    due = drain_due(record.interruption, state.target, reconciler.policy)
    if due is None:
        return
    delay = math.ceil((due - reconciler.now()).total_seconds())
    if delay > 0:
        reconciler.kick(state.service.name, delay)
