"""SkyPilot's fields fleetkeeper does not take: each says what to do instead; misplaced ones say where
they belong (fleetkeeper.spec.skypilot_fields, spec._unknown_field)."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.errors import InvalidRequest
from fleetkeeper.spec.service import ReadinessProbe, ReplicaPolicy, Resources, ServiceSection, ServiceSpec, parse_spec
from fleetkeeper.spec.skypilot_fields import UNSUPPORTED
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec

BASE: dict[str, Any] = {"service": {"readiness_probe": "/health"}, "run": "serve"}

# Every field of SkyPilot's schemas (sky/utils/schemas.py: get_task_schema, get_resources_schema and
# its single-resources schema, get_service_schema), by section.
SKYPILOT_FIELDS: dict[str, tuple[str, ...]] = {
    "": (
        "name", "workdir", "event_callback", "num_nodes", "resources", "file_mounts", "service", "pool", "setup",
        "run", "envs", "secrets", "managed_secrets", "inputs", "outputs", "file_mounts_mapping", "config",
        "volumes", "volume_mounts", "api_server_access", "_metadata",
    ),
    "resources": (
        "cloud", "region", "zone", "infra", "cpus", "memory", "accelerators", "instance_type", "use_spot",
        "job_recovery", "spot_recovery", "volumes", "disk_size", "ephemeral_storage", "disk_tier", "network_tier",
        "local_disk", "max_hourly_cost", "ports", "labels", "accelerator_args", "image_id", "autostop", "priority",
        "priority_class", "_docker_login_config", "_is_image_managed", "_requires_fuse",
        "_cluster_config_overrides", "_no_missing_accel_warnings", "any_of", "ordered",
    ),
    "service": (
        "readiness_probe", "load_balancer", "pool", "replica_policy", "ports", "replicas", "workers",
        "load_balancing_policy", "tls",
    ),
    "service.readiness_probe": (
        "path", "initial_delay_seconds", "timeout_seconds", "endpoint_probe_interval_seconds",
        "consecutive_failure_threshold_timeout", "post_data", "headers",
    ),
    "service.replica_policy": (
        "min_replicas", "max_replicas", "num_overprovision", "target_qps_per_replica", "dynamic_ondemand_fallback",
        "base_ondemand_fallback_replicas", "spot_placer", "upscale_delay_seconds", "downscale_delay_seconds",
    ),
}  # fmt: skip
MODELS = {
    "": ServiceSpec,
    "resources": Resources,
    "service": ServiceSection,
    "service.readiness_probe": ReadinessProbe,
    "service.replica_policy": ReplicaPolicy,
}


def problems(data: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(InvalidRequest) as caught:
        parse_spec(data)
    return {d["field"]: d["problem"] for d in caught.value.details}


def with_field(path: str, value: Any) -> dict[str, Any]:
    """A valid spec with `value` at the dotted `path` (the sections around it filled in)."""
    data: dict[str, Any] = {
        "service": {"readiness_probe": {"path": "/health"}, "replica_policy": {"min_replicas": 1}},
        "resources": {"any_of": [{"cpus": 2}]},
        "run": "serve",
    }
    *sections, name = path.split(".")
    node = data
    for section in sections:
        node = node[section][0] if section == "any_of" else node.setdefault(section, {})
    node[name] = value
    return data


@pytest.mark.parametrize("section", sorted(SKYPILOT_FIELDS))
def test_every_skypilot_field_is_taken_or_has_a_reason(section: str) -> None:
    taken = MODELS[section].model_fields
    for name in SKYPILOT_FIELDS[section]:
        path = f"{section}.{name}".lstrip(".")
        assert name in taken or path in UNSUPPORTED, f"{path}: neither taken nor in skypilot_fields.UNSUPPORTED"


@pytest.mark.parametrize("path", sorted(UNSUPPORTED))
def test_each_unsupported_field_says_what_to_do_instead(path: str) -> None:
    found = problems(with_field(path, {"any": "value"}))
    assert found == {f"spec.{path}": f"unsupported field: {UNSUPPORTED[path]}"}


@pytest.mark.parametrize("name", ["labels", "autostop", "job_recovery", "network_tier"])
def test_an_any_of_entrys_unsupported_field_gets_the_same_reason(name: str) -> None:
    found = problems(with_field(f"resources.any_of.{name}", "x"))
    assert found == {f"spec.resources.any_of[0].{name}": f"unsupported field: {UNSUPPORTED[f'resources.{name}']}"}


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [
        # The issue's cases: TLS is the stack's load balancer; fallback knobs under `service:`.
        (
            {"service": {"readiness_probe": "/h", "https": True}},
            "spec.service.https",
            "unsupported field: TLS is the stack's ALB: deploy with CertificateArn (and DomainName for "
            'https://NAME.<domain>), docs/DEPLOY.md "Endpoints"; replicas serve plain HTTP behind it',
        ),
        (
            {"service": {"readiness_probe": "/h", "base_ondemand_fallback_replicas": 1}},
            "spec.service.base_ondemand_fallback_replicas",
            "misplaced field: `base_ondemand_fallback_replicas` belongs under `service.replica_policy`; move it there",
        ),
        (
            {"service": {"readiness_probe": "/h", "dynamic_ondemand_fallback": True}},
            "spec.service.dynamic_ondemand_fallback",
            "misplaced field: `dynamic_ondemand_fallback` belongs under `service.replica_policy`; move it there",
        ),
        (
            {"service": {"readiness_probe": "/h", "target_qps_per_replica": 2}},
            "spec.service.target_qps_per_replica",
            "misplaced field: `target_qps_per_replica` belongs under `service.replica_policy`; move it there",
        ),
        (
            {"service": {"readiness_probe": "/h", "min_replicas": 2}},
            "spec.service.min_replicas",
            "misplaced field: `min_replicas` belongs under `service.replica_policy`; move it there",
        ),
        (
            {"service": {"readiness_probe": "/h", "initial_delay_seconds": 60}},
            "spec.service.initial_delay_seconds",
            "misplaced field: `initial_delay_seconds` belongs under `service.readiness_probe`; move it there",
        ),
        (
            {"service": {"readiness_probe": "/h", "use_spot": True}},
            "spec.service.use_spot",
            "misplaced field: `use_spot` belongs under `resources`; move it there",
        ),
        (
            {**BASE, "replicas": 2},
            "spec.replicas",
            "misplaced field: `replicas` belongs under `service`; move it there",
        ),
        (
            {**BASE, "accelerators": "L4:1"},
            "spec.accelerators",
            "misplaced field: `accelerators` belongs under `resources`; move it there",
        ),
        (
            {**BASE, "ports": 8000},
            "spec.ports",
            "misplaced field: `ports` belongs under `service` or under `resources`; move it there",
        ),
        (
            {**BASE, "resources": {"envs": {"A": "1"}}},
            "spec.resources.envs",
            "misplaced field: `envs` belongs at the top level; move it there",
        ),
        (
            {"service": {"readiness_probe": "/h", "max_surge": 2}},
            "spec.service.max_surge",
            "misplaced field: `max_surge` belongs under `update`; move it there",
        ),
        # A typo of a field of another section is pointed there.
        (
            {"service": {"readiness_probe": "/h", "replica_policy": {"min_replicas": 1, "use_spott": True}}},
            "spec.service.replica_policy.use_spott",
            "unknown field; did you mean `resources.use_spot`?",
        ),
    ],
)
def test_a_misplaced_or_unsupported_field_says_where_it_belongs(data: dict[str, Any], field: str, problem: str) -> None:
    assert problems({"run": "serve", **data}) == {field: problem}


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"resources": {"cloud": "gcp"}}, "spec.resources.cloud", "fleetkeeper runs on AWS only: cloud 'gcp'"),
        ({"resources": {"infra": "gcp/us-central1"}}, "spec.resources.infra", "infra 'gcp/us-central1' is not AWS"),
        ({"resources": {"infra": "k8s/my-context"}}, "spec.resources.infra", "not AWS; remove `infra`"),
        ({"resources": {"infra": "aws/us-central1"}}, "spec.resources.infra", "'us-central1' in 'aws/us-central1'"),
        ({"resources": {"infra": "aws/us-east-1/us-east-1a"}}, "spec.resources.infra", "zones come from the stack"),
        ({"resources": {"region": "us-central1"}}, "spec.resources.region", "not an AWS region name"),
        ({"resources": {"zone": "us-east-1a"}}, "spec.resources.zone", "zones come from the stack's subnets"),
        ({"num_nodes": 2}, "spec.num_nodes", "a replica is one instance: multi-node replicas (num_nodes 2)"),
        ({"num_nodes": True}, "spec.num_nodes", "multi-node replicas"),
        (
            {"workdir": {"url": "https://github.com/org/app", "ref": "v1"}},
            "spec.workdir",
            "a remote workdir (https://github.com/org/app) is not supported: clone it in `setup` "
            "(git clone --branch v1 https://github.com/org/app app",
        ),
        ({"workdir": "git@github.com:org/app.git"}, "spec.workdir", "clone it in `setup`"),
        ({"workdir": "."}, "spec.workdir", "is a local directory: `fleetkeeper up`"),
        (
            {"resources": {"image_id": "docker:vllm/vllm-openai:latest"}},
            "spec.resources.image_id",
            "is a container image: fleetkeeper boots EC2 images (AMIs); run the container in `run`",
        ),
        (
            {"resources": {"image_id": {"us-east-1": "ami-0123456789abcdef0"}}},
            "spec.resources.image_id",
            "images per region are not supported",
        ),
        (
            {
                "service": {
                    "readiness_probe": "/h",
                    "replica_policy": {"min_replicas": 1, "max_replicas": 2, "target_qps_per_replica": {"H100": 5}},
                }
            },
            "spec.service.replica_policy.target_qps_per_replica",
            "a target per accelerator (H100: 5) has none for the stack's default instance type (no accelerator)",
        ),
        (
            {"service": {"readiness_probe": "/h", "load_balancing_policy": "power_of_two"}},
            "spec.service.load_balancing_policy",
            "use least_load (the default",
        ),
    ],
)
def test_values_fleetkeeper_cannot_honour_say_what_to_do(patch: dict[str, Any], field: str, words: str) -> None:
    found = problems({**BASE, **patch})
    assert field in found, found
    assert words in found[field], found[field]


@pytest.mark.parametrize(
    "resources", [{"infra": "aws"}, {"infra": "AWS/us-east-1"}, {"infra": "*/us-east-1"}, {"cloud": "aws"}]
)
def test_aws_in_skypilots_spellings_is_taken(resources: dict[str, Any]) -> None:
    spec = parse_spec({**BASE, "num_nodes": 1, "resources": resources})
    assert spec.to_json_dict()["resources"] == {"use_spot": False, **resources}
    assert spec.to_json_dict()["num_nodes"] == 1


def test_the_api_names_the_field_and_what_to_do(api: HandlerClient) -> None:
    spec = hello_spec()
    spec["service"] = {**spec["service"], "https": True, "dynamic_ondemand_fallback": True}
    response = api.post("/v1/services", {"name": "web", "spec": spec})
    assert response.status == 400, response.body
    details = {d["field"]: d["problem"] for d in response.body["error"]["details"]}
    assert details == {
        "spec.service.https": f"unsupported field: {UNSUPPORTED['service.https']}",
        "spec.service.dynamic_ondemand_fallback": (
            "misplaced field: `dynamic_ondemand_fallback` belongs under `service.replica_policy`; move it there"
        ),
    }


@pytest.mark.parametrize(
    ("resources", "field"),
    [
        ({"infra": "aws/eu-west-1"}, "spec.resources.infra"),
        ({"ordered": [{"region": "eu-west-1", "cpus": 2}]}, "spec.resources.ordered[0].region"),
    ],
)
def test_a_region_other_than_the_stacks_is_refused_by_the_api(
    api: HandlerClient, resources: dict[str, Any], field: str
) -> None:
    response = api.post("/v1/services", {"name": "web", "spec": hello_spec(resources=resources)})
    assert response.status == 400, response.body
    details = {d["field"]: d["problem"] for d in response.body["error"]["details"]}
    assert field in details and "the stack runs in us-east-1" in details[field], details
