"""Which changes between two versions a running replica sees: the one place that decides whether an
update must replace replicas or may take effect on them in place.

A replica runs its version's `setup` and `run`, with its envs and secrets, its workdir, on its
instance (resources, image) and serving on its port. Everything else in a spec is the control
plane's: how many replicas there are (replicas, autoscaling), how they are probed, updated, drained
and balanced. A change that touches only the control plane's part takes effect on the READY replicas
in place: no launch, no termination, the new version recorded on each (fleetkeeper.reconciler.plan).
SkyPilot Serve does the same: `SkyPilotReplicaManager.update_version` (sky/serve/replica_managers.py)
bumps the version of every replica whose task config, `service` section aside, is unchanged.

Every field of the spec is classified here, section by section; tests/spec/test_changes.py fails when
a field is added to the spec without being classified, so no new field is silently in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetkeeper.spec.service import ServiceSpec

# True: a replica runs it (a change replaces replicas). False: the control plane's (in place).
TOP_LEVEL: dict[str, bool] = {
    "name": False,  # the service's name, the same for every version (the api holds it)
    "num_nodes": True,  # nodes per replica (only 1 is taken)
    "resources": True,  # the instance: its types, image, disk, market, ports
    "workdir": True,  # the code the replica runs (content-addressed: the same digest is the same code)
    "setup": True,
    "run": True,
    "envs": True,
    "secrets": True,  # the names; whether the values changed is `same_secrets` (their ref)
    "update": False,  # how an update proceeds: rolling or blue-green, surge, unavailability
    "service": False,  # the section below, field by field
}
# The `service:` section: the control plane's, but for the port a replica serves on.
SERVICE: dict[str, bool] = {
    "readiness_probe": False,
    "replicas": False,
    "replica_policy": False,  # autoscaling bounds and targets, spot fallback
    "ports": True,  # the replica binds it (its $PORT): compared as the port it makes, `ServiceSpec.port`
    "load_balancing_policy": False,
    "drain_seconds": False,
}


def replica_visible(before: ServiceSpec, after: ServiceSpec, *, same_secrets: bool = True) -> bool:
    """Whether a replica running `before` would run something else under `after`: then an update
    replaces it; else it takes `after` in place. `same_secrets`: the two versions' secret values are
    the same (the api reuses a version's secrets ref when an update sends the same values, so the
    planner passes whether the refs are equal): values are never in a spec."""
    if not same_secrets or before.port != after.port:
        return True
    old, new = _fields(before), _fields(after)
    if any(old[name] != new[name] for name, runs in TOP_LEVEL.items() if runs):
        return True
    old_service, new_service = _fields(before.service), _fields(after.service)
    return any(old_service[name] != new_service[name] for name, runs in SERVICE.items() if runs)


def _fields(model: Any) -> dict[str, Any]:
    """A model's fields as compared: a port as the port a replica binds (`ServiceSpec.port`: the
    service's, else the resources', else the default), compared once above, never as written."""
    fields = {name: getattr(model, name) for name in type(model).model_fields}
    if "ports" in fields:
        fields["ports"] = None
    if "resources" in fields:
        fields["resources"] = fields["resources"].model_copy(update={"ports": None})
    return fields
