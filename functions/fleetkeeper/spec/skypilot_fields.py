"""SkyPilot's task and service fields fleetkeeper does not take, each with what to do instead: one table.

The fields are SkyPilot's own (sky/utils/schemas.py: get_task_schema, get_resources_schema,
get_service_schema; sky/serve/service_spec.py), plus a few a SkyPilot user reaches for that no
schema has (`service.https`). A field the spec models do not know is looked up here by its dotted
path (list indexes dropped; an `any_of`/`ordered` entry's field by its `resources.` path), so the
400 says what to do instead of "unknown field". Fields that belong in another section are found by
spec/service.py from the models themselves (`service.min_replicas` belongs under `service.replica_policy`).
Pure data, light enough for the CLI: no imports from fleetkeeper.
"""

from __future__ import annotations

import re

_DEPLOY = "docs/DEPLOY.md"
_TLS = (
    "TLS is the stack's ALB: deploy with CertificateArn (and DomainName for https://NAME.<domain>), "
    f'{_DEPLOY} "Endpoints"; replicas serve plain HTTP behind it'
)
_FILES = "put the files in `workdir`, bake them into the image, or fetch them in `setup` (e.g. `aws s3 sync`)"
_SPOT_PLACEMENT = (
    "spot placement is fleetkeeper's own: set `resources.use_spot: true`; replicas are spread over the "
    "stack's subnets (zones) and a refused spot launch walks the other instance types and zones; for "
    "on-demand fallback give service.replica_policy.base_ondemand_fallback_replicas or "
    "dynamic_ondemand_fallback"
)
_SPOT_ZONES = (
    "the zones are the stack's subnets (the ReplicaSubnetIds parameter, " + _DEPLOY + "): replicas, spot ones "
    "included, are spread over them; to keep a service in some, deploy a stack with those subnets"
)
_AUTH = (
    "an endpoint has no key of its own: check one in your app, given as a secret (`secrets: {API_KEY: null}` "
    "and --secret API_KEY); the fleetkeeper API itself is signed with your AWS credentials (SigV4)"
)
_INITIAL_COUNT = (
    "a service starts with its replica count: `service.replicas`, or `service.replica_policy.min_replicas` "
    "when it autoscales (the autoscaler moves from there); there is no separate initial count"
)

# dotted path (without `spec.`) -> what to do instead.
UNSUPPORTED: dict[str, str] = {
    # --- the task ----------------------------------------------------------------------------------
    "file_mounts": f"file mounts and bucket mounts are not supported: {_FILES}",
    "file_mounts_mapping": "SkyPilot's internal field; remove it",
    "volumes": f"volumes are not supported: a replica has its root volume (`resources.disk_size`); {_FILES}",
    "volume_mounts": f"volumes are not supported: a replica has its root volume (`resources.disk_size`); {_FILES}",
    "event_callback": "job callbacks are not supported: watch a service with `fleetkeeper events NAME` instead",
    "pool": "SkyPilot's worker pools are not supported: fleetkeeper runs services (`service:`), not job pools",
    "managed_secrets": "SkyPilot's managed secrets are not supported: give `secrets` (names to values) and fill "
    "them with --secret NAME",
    "inputs": "SkyPilot's experimental inputs are not supported: remove them",
    "outputs": "SkyPilot's experimental outputs are not supported: remove them",
    "config": (
        "SkyPilot's config overrides are not supported: the network, role and load balancer are the stack's "
        f"parameters ({_DEPLOY})"
    ),
    "api_server_access": (
        "there is no SkyPilot API server here: a replica reaches AWS with the replica role you deployed with "
        f'({_DEPLOY}, "A role for the replicas")'
    ),
    "_metadata": "SkyPilot's internal field; remove it",
    "experimental": "SkyPilot's experimental settings are not supported: remove them",
    # --- resources ---------------------------------------------------------------------------------
    "resources.job_recovery": (
        "managed-job recovery does not apply to a service: fleetkeeper replaces a preempted or failed replica "
        "itself; remove it"
    ),
    "resources.spot_recovery": (
        "managed-job recovery does not apply to a service: fleetkeeper replaces a preempted replica itself "
        "(spot fallback: service.replica_policy.base_ondemand_fallback_replicas / dynamic_ondemand_fallback)"
    ),
    "resources.volumes": f"volumes are not supported: size the root volume with `disk_size`; {_FILES}",
    "resources.ephemeral_storage": "size the root volume with `disk_size` (GB) instead",
    "resources.network_tier": (
        "network tiers are not supported: an instance's network is its type's; choose a larger `instance_type` "
        "for more bandwidth"
    ),
    "resources.local_disk": "local (instance store) disks are not supported: size the root volume with `disk_size`",
    "resources.max_hourly_cost": (
        "a price cap is not supported: candidates are the smallest instance types that fit, cheapest first; "
        "narrow `cpus`, `memory` or `accelerators`, or name `instance_type`"
    ),
    "resources.labels": (
        "labels are not supported: replicas carry fleetkeeper's tags (service, version, replica id); remove it"
    ),
    "resources.accelerator_args": "accelerator_args configure TPUs, which AWS has not: remove it",
    "resources.autostop": (
        "autostop is for clusters: a service's replicas stay up; to stop them when idle, use "
        "service.replica_policy with min_replicas: 0 (scale to zero)"
    ),
    "resources.priority": "SkyPilot's job priority is not supported: remove it",
    "resources.priority_class": "Kubernetes priority classes do not apply on EC2: remove it",
    "resources.hooks": "lifecycle hooks are not supported: put start-up work in `setup` and `run`",
    "resources._docker_login_config": "SkyPilot's internal field; log in to your registry in `setup` instead",
    "resources._is_image_managed": "SkyPilot's internal field; remove it",
    "resources._requires_fuse": "SkyPilot's internal field; remove it",
    "resources._cluster_config_overrides": "SkyPilot's internal field; remove it",
    "resources._no_missing_accel_warnings": "SkyPilot's internal field; remove it",
    # --- service -----------------------------------------------------------------------------------
    "service.tls": _TLS,
    "service.https": _TLS,
    "service.certificate": _TLS,
    "service.domain": (
        f"the domain is the stack's: deploy with DomainName and service NAME is https://NAME.<domain> ({_DEPLOY})"
    ),
    "service.load_balancer": (
        "the endpoint is the stack's ALB: its idle timeout (the LoadBalancerIdleTimeout parameter, 300 s by "
        f"default) bounds a streamed answer's pauses; deploy with another value ({_DEPLOY})"
    ),
    "service.pool": "SkyPilot's worker pools are not supported: give `replicas` or `replica_policy`",
    "service.workers": "SkyPilot's worker pools are not supported: give `replicas` or `replica_policy`",
    "service.controller": "there is no serve controller to size: fleetkeeper's control plane is serverless",
    "service.readiness_probe.endpoint_probe_interval_seconds": (
        "the reconciler probes a replica every 10 s while it boots or fails (SkyPilot's default interval) "
        f"and once a run when it is steady (the stack's ReconcileSchedule, every minute by default; {_DEPLOY}); "
        "remove it"
    ),
    "service.replica_policy.spot_placer": (
        "spot placement is fleetkeeper's own: replicas are spread over the stack's subnets (zones), and a "
        "refused spot launch walks the other instance types and zones; remove it"
    ),
    "service.replica_policy.qps_upper_threshold": "an old SkyPilot field: give target_qps_per_replica instead",
    "service.replica_policy.qps_lower_threshold": "an old SkyPilot field: give target_qps_per_replica instead",
    "service.replica_policy.auto_restart": "replicas are always replaced when they fail: remove it",
    # Fields of SkyServe's earlier specs (and of other tools' services) a SkyPilot user still writes.
    "service.spot_policy": _SPOT_PLACEMENT,
    "service.replica_policy.spot_policy": _SPOT_PLACEMENT,
    "service.spot_zones": _SPOT_ZONES,
    "service.replica_policy.spot_zones": _SPOT_ZONES,
    "service.auth_key": _AUTH,
    "service.replica_policy.init_replicas": _INITIAL_COUNT,
    "service.init_replicas": _INITIAL_COUNT,
}


def unsupported(path: str) -> str | None:
    """What to do instead of the field at `path` (`resources.any_of[0].labels`), if the table says."""
    parts = [p.split("[", 1)[0] for p in path.split(".")]
    dotted = ".".join(parts)
    if dotted in UNSUPPORTED:
        return UNSUPPORTED[dotted]
    if len(parts) == 3 and parts[0] == "resources" and parts[1] in {"any_of", "ordered"}:
        return UNSUPPORTED.get(f"resources.{parts[2]}")
    return None


_REMOTE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://|git@)")


def remote_workdir(value: str) -> bool:
    """Whether a workdir is a repository's URL (SkyPilot's `workdir: {url: ...}`), not a directory."""
    return _REMOTE.match(value.strip()) is not None
