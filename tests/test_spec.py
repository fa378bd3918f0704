"""The service spec: SkyPilot's rules, unsupported fields named, and a lossless round trip."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from fleetkeeper.errors import InvalidRequest
from fleetkeeper.spec import ServiceSpec, parse_spec

SKYPILOT_YAML = """
name: llm
service:
  readiness_probe:
    path: /v1/models
    initial_delay_seconds: 600
    timeout_seconds: 10
    headers: {Authorization: Bearer x}
    post_data: {model: m, prompt: hi, max_tokens: 1}
  replica_policy:
    min_replicas: 2
    max_replicas: 4
    target_qps_per_replica: 2.5
  ports: 8000
resources:
  instance_type: g5.xlarge
  accelerators: A10G:1
  use_spot: true
  disk_size: 200
  image_id: ami-0123456789abcdef0
envs:
  MODEL: meta-llama/Llama-3-8B
  WORKERS: 2
  DEBUG: false
setup: pip install vllm
run: python -m vllm.entrypoints.openai.api_server --model $MODEL --port $PORT
update:
  mode: blue_green
  max_surge: 2
"""


def errors_of(data: Any) -> tuple[str, list[str]]:
    with pytest.raises(InvalidRequest) as caught:
        parse_spec(data)
    return caught.value.message, [d["field"] for d in caught.value.details]


def test_a_skypilot_service_yaml_round_trips_unchanged() -> None:
    spec = parse_spec(yaml.safe_load(SKYPILOT_YAML))
    again = ServiceSpec.model_validate_json(spec.model_dump_json())
    assert again == spec
    assert parse_spec(spec.to_json_dict()) == spec
    assert spec.port == 8000
    assert spec.target_replicas == 2
    assert spec.envs == {"MODEL": "meta-llama/Llama-3-8B", "WORKERS": "2", "DEBUG": "false"}
    assert spec.service.readiness_probe.post_data == {"model": "m", "prompt": "hi", "max_tokens": 1}


def test_probe_path_shorthand_and_defaults() -> None:
    spec = parse_spec({"service": {"readiness_probe": "/health", "replicas": 3}, "run": "serve"})
    probe = spec.service.readiness_probe
    assert (probe.path, probe.initial_delay_seconds, probe.timeout_seconds) == ("/health", 1200, 15)
    assert spec.target_replicas == 3
    assert spec.port == 8080
    assert (spec.update.mode, spec.update.max_surge, spec.update.max_unavailable) == ("rolling", 1, 0)


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"file_mounts": {"/a": "b"}}, "spec.file_mounts", "not supported"),
        ({"workdir": "."}, "spec.workdir", "is a local directory: `fleetkeeper up`"),
        ({"num_nodes": 2}, "spec.num_nodes", "multi-node"),
        ({"resources": {"accelerators": "A100:1"}}, "spec.resources", "instance_type"),
        ({"resources": {"cloud": "gcp"}}, "spec.resources.cloud", "AWS only"),
        ({"resources": {"instance_type": "t3.micro", "cpus": 4}}, "spec.resources.cpus", "instance_type"),
        (
            {"service": {"readiness_probe": "/h", "replicas": 1, "replica_policy": {"min_replicas": 1}}},
            "spec.service",
            "not both",
        ),
        (
            {"service": {"readiness_probe": "/h", "replica_policy": {"min_replicas": 3, "max_replicas": 2}}},
            "spec.service.replica_policy",
            "max_replicas (2) must be >= min_replicas (3)",
        ),
        (
            {"service": {"readiness_probe": "/h", "replica_policy": {"min_replicas": 1, "max_replicas": 3}}},
            "spec.service.replica_policy",
            "target_qps_per_replica",
        ),
        ({"service": {"readiness_probe": "health"}}, "spec.service.readiness_probe.path", "should match"),
        (
            {"service": {"readiness_probe": {"path": "/h", "timeout": 3}}},
            "spec.service.readiness_probe.timeout",
            "unknown field",
        ),
        ({"service": {"readiness_probe": "/h", "ports": 70000}}, "spec.service.ports", "65535"),
        ({"update": {"mode": "canary"}}, "spec.update.mode", "rolling"),
        ({"envs": {"1BAD": "x"}}, "spec.envs", "valid shell name"),
        ({"resources": {"image_id": "ubuntu"}}, "spec.resources.image_id", "expected an AMI id"),
    ],
)
def test_invalid_specs_name_the_field(patch: dict[str, Any], field: str, words: str) -> None:
    base: dict[str, Any] = {"service": {"readiness_probe": "/health"}, "run": "serve"}
    message, fields = errors_of({**base, **patch})
    assert field in fields, fields
    assert field in message and words in message, message


def test_missing_sections_are_named() -> None:
    message, fields = errors_of({"setup": "x"})
    assert set(fields) == {"spec.service", "spec.run"}
    assert "required" in message


def test_a_non_mapping_spec_is_refused() -> None:
    message, fields = errors_of(["service"])
    assert fields == ["spec"] and "expected" in message


def test_accelerators_are_accepted_next_to_an_instance_type() -> None:
    spec = parse_spec(
        {
            "service": {"readiness_probe": "/h"},
            "run": "x",
            "resources": {"instance_type": "g5.xlarge", "accelerators": {"A10G": 1}},
        }
    )
    assert spec.resources.accelerators == {"A10G": 1}
