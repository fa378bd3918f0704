"""Table tests of plan/orphans.py (`plan_orphans`, the scheduled sweep): which managed instances belong
to no live service and are terminated.

Every case asserts the WHOLE action list `plan` returns, in order: an extra, missing, reordered or
differently stamped action fails it. Expected records are built from the input records with
`replace`, never read back from the output (the builders: tests/support/builders.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.reconciler.driver import InstanceState, client_token
from fleetkeeper.reconciler.plan import plan_orphans
from tests.support.builders import NOW, UID, ago, instance, terminate


def test_orphans_are_terminated_after_the_grace_period_only() -> None:
    old = instance(0, uid="dead", instance_id="i-old", launched_at=ago(3600))
    young = instance(1, uid="dead", instance_id="i-young", launched_at=ago(60))
    live = instance(2, instance_id="i-live", launched_at=ago(3600))
    gone = instance(3, uid="dead", instance_id="i-gone", state=InstanceState.TERMINATED, launched_at=ago(3600))
    assert plan_orphans({UID}, [old, young, live, gone], NOW) == terminate(
        ("i-old", "orphan: service svc (uid dead) no longer exists")
    )
    assert plan_orphans({UID, "dead"}, [old], NOW) is None


@pytest.mark.parametrize(
    "fields",
    [{"uid": "", "client_token": client_token("", 0)}, {"replica_id": -1, "client_token": client_token(UID, -1)}],
    ids=["no uid", "no replica id"],
)
def test_an_instance_without_a_uid_or_replica_id_is_never_an_orphan(fields: dict[str, Any]) -> None:
    assert plan_orphans({"u9"}, [instance(0, launched_at=ago(3600), **fields)], NOW) is None


def test_orphans_one_by_one_whatever_comes_before_them() -> None:
    # Each instance that is not an orphan (live service, spared service, young) comes before one that is.
    live = instance(2, instance_id="i-live", launched_at=ago(3600))
    spared = instance(4, uid="gone", service="broken", instance_id="i-spared", launched_at=ago(3600))
    young = instance(1, uid="dead", instance_id="i-young", launched_at=ago(599))
    at_grace = instance(0, uid="dead", instance_id="i-at-grace", launched_at=ago(600))
    nameless = instance(5, uid="dead", service="", instance_id="i-nameless", launched_at=ago(3600))
    undated = instance(6, uid="dead", instance_id="i-undated", launched_at=None)
    assert plan_orphans(
        {UID}, [live, at_grace, spared, nameless, young, undated], NOW, spared_services={"broken"}
    ) == terminate(
        ("i-at-grace", "orphan: service svc (uid dead) no longer exists"),
        ("i-nameless", "orphan: service ? (uid dead) no longer exists"),
        ("i-undated", "orphan: service svc (uid dead) no longer exists"),
    )
