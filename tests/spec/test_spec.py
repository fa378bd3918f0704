"""The service spec: SkyPilot's rules, unsupported fields named, and a lossless round trip."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from fleetkeeper.errors import InvalidRequest
from fleetkeeper.spec.service import ServiceSpec, Workdir, parse_spec, stored_spec
from tests.support.specs import hello_spec

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
        ({"resources": {"accelerators": "A100:1"}}, "spec.resources.accelerators", "no AWS instance type has 1 A100"),
        ({"resources": {"cloud": "gcp"}}, "spec.resources.cloud", "AWS only"),
        ({"resources": {"cpus": "four"}}, "spec.resources.cpus", "expected a number of vCPUs"),
        ({"resources": {"region": "us-central1"}}, "spec.resources.region", "not an AWS region"),
        ({"resources": {"zone": "eastus-2"}}, "spec.resources.zone", "not an AWS availability zone"),
        ({"resources": {"any_of": [{"cloud": "gcp"}]}}, "spec.resources.any_of[0].cloud", "AWS only"),
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
        (
            {
                "service": {
                    "readiness_probe": "/h",
                    "replica_policy": {"min_replicas": 2, "dynamic_ondemand_fallback": True},
                }
            },
            "spec",
            "replica_policy.dynamic_ondemand_fallback is an on-demand fallback for spot replicas: "
            "set resources.use_spot: true",
        ),
        (
            {
                "service": {
                    "readiness_probe": "/h",
                    "replica_policy": {"min_replicas": 2, "base_ondemand_fallback_replicas": -1},
                }
            },
            "spec.service.replica_policy.base_ondemand_fallback_replicas",
            "-1 is too small: at least 0",
        ),
    ],
)
def test_invalid_specs_name_the_field(patch: dict[str, Any], field: str, words: str) -> None:
    base: dict[str, Any] = {"service": {"readiness_probe": "/health"}, "run": "serve"}
    message, fields = errors_of({**base, **patch})
    assert field in fields, fields
    assert field in message and words in message, message


@pytest.mark.parametrize(
    ("policy", "markets"),
    [
        ({}, (True, 0, False)),
        ({"base_ondemand_fallback_replicas": 1}, (True, 1, False)),
        ({"dynamic_ondemand_fallback": True}, (True, 0, True)),
        ({"base_ondemand_fallback_replicas": 1, "dynamic_ondemand_fallback": True}, (True, 1, True)),
    ],
)
def test_skypilots_spot_fallback_knobs_are_read(policy: dict[str, Any], markets: tuple[bool, int, bool]) -> None:
    """SkyPilot's examples/serve/spot_policy shapes (with AWS's values: its own name GCP zones)."""
    spec = parse_spec(
        {
            "service": {"readiness_probe": "/health", "replica_policy": {"min_replicas": 2, **policy}},
            "resources": {"ports": 8081, "cpus": "2+", "use_spot": True},
            "run": "python3 server.py",
        }
    )
    got = spec.markets
    assert (got.spot, got.base_ondemand, got.dynamic_fallback) == markets
    assert parse_spec({"service": {"readiness_probe": "/h"}, "run": "x"}).markets.spot is False


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


def test_load_balancing_policy_takes_skypilots_names_and_defaults_to_least_load() -> None:
    assert parse_spec(hello_spec()).load_balancing_policy == "least_load"
    assert parse_spec(hello_spec()).drain_seconds == 120  # SkyPilot's
    section = {**hello_spec()["service"], "load_balancing_policy": "round_robin", "drain_seconds": 0}
    spec = parse_spec(hello_spec(service=section))
    assert (spec.load_balancing_policy, spec.drain_seconds) == ("round_robin", 0)
    # A spec that does not set them stores and reads back without them.
    assert "load_balancing_policy" not in parse_spec(hello_spec()).to_json_dict()["service"]


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("load_balancing_policy", "random", "is not a load balancing policy: use least_load"),
        ("drain_seconds", 3601, "3601 is too large: at most 3600"),
        ("drain_seconds", -1, "-1 is too small: at least 0"),
    ],
)
def test_other_endpoint_values_are_a_400_naming_the_field(field: str, value: object, problem: str) -> None:
    section = {**hello_spec()["service"], field: value}
    with pytest.raises(InvalidRequest) as caught:
        parse_spec(hello_spec(service=section))
    assert [d["field"] for d in caught.value.details] == [f"spec.service.{field}"]
    assert problem in caught.value.details[0]["problem"]


# --- SkyPilot's habits ------------------------------------------------------------------------------


@pytest.mark.parametrize("ports", [8081, "8081", [8081], ["8081"]])
def test_ports_as_sky_writes_them(ports: Any) -> None:
    spec = parse_spec({"service": {"ports": ports}, "resources": {"ports": ports}, "run": "serve"})
    assert (spec.service.ports, spec.resources.ports, spec.port) == (8081, 8081, 8081)


@pytest.mark.parametrize(
    ("ports", "words"),
    [
        ([8080, 8081], "resources.ports opens 2 ports (8080, 8081): set service.ports"),
        ("10022-10040", "resources.ports opens 19 ports (10022-10040): set service.ports"),
        ([], "an empty list of ports"),
        (0, "port 0 is not a port: give 1-65535"),
        (65536, "port 65536 is not a port"),
        ("9000-8000", "port range 9000-8000 is not 1-65535, lowest first"),
        ("http", "'http' is not a port (8080) or a range of ports (10020-10040)"),
    ],
)
def test_several_ports_need_the_endpoints_and_bad_ports_are_refused(ports: Any, words: str) -> None:
    message, fields = errors_of({"service": {}, "resources": {"ports": ports}, "run": "serve"})
    assert fields == ["spec.resources.ports"] and words in message


def test_several_ports_with_the_one_the_endpoint_serves_are_taken_as_sky_does() -> None:
    """SkyPilot's rule: resources.ports opens them all, service.ports is the replica's service port."""
    data = {"service": {"ports": 8000}, "resources": {"ports": [8000, "8081", "9000-9002"]}, "run": "serve"}
    spec = parse_spec(data)
    assert (spec.port, spec.resources.opened_ports) == (8000, [8000, 8081, 9000, 9001, 9002])
    assert spec.to_json_dict()["resources"]["ports"] == [8000, 8081, "9000-9002"]


@pytest.mark.parametrize("port", [80, 443, 1, 1023, 65535])
def test_any_port_sky_takes_is_taken(port: int) -> None:
    """Before: below 1024 was a 400 (the network stack opened 1024-65535 only)."""
    assert parse_spec({"service": {"ports": port}, "run": "serve"}).port == port
    assert parse_spec({"service": {}, "resources": {"ports": port}, "run": "serve"}).port == port


def test_service_ports_is_one_port() -> None:
    message, fields = errors_of({"service": {"ports": [8080, 8081]}, "run": "serve"})
    assert fields == ["spec.service.ports"] and "the one port the endpoint serves; got 2" in message


def test_without_a_readiness_probe_sky_probes_slash() -> None:
    probe = parse_spec({"service": {"replicas": 1}, "run": "serve"}).service.readiness_probe
    assert (probe.path, probe.initial_delay_seconds) == ("/", 1200)


@pytest.mark.parametrize(
    ("data", "field", "problem"),
    [
        ({"service": {"replica": 2}}, "spec.service.replica", "unknown field; did you mean `replicas`?"),
        ({"service": {"readiness_probe": {"pth": "/"}}}, "spec.service.readiness_probe.pth", "did you mean `path`?"),
        ({"service": {}, "setpu": "x"}, "spec.setpu", "unknown field; did you mean `setup`?"),
        ({"service": {}, "resources": {"instance_typ": "t3.micro"}}, "spec.resources.instance_typ", "`instance_type`"),
        ({"service": {}, "zzz": 1}, "spec.zzz", "unknown field; fleetkeeper does not support it"),
    ],
)
def test_a_typo_gets_did_you_mean(data: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_spec({"run": "serve", **data})
    assert any(d["field"] == field and problem in d["problem"] for d in caught.value.details), caught.value.details


def test_the_name_rule_is_in_words() -> None:
    message, fields = errors_of({"name": "Llama_2", "service": {}, "run": "serve"})
    assert fields == ["spec.name"]
    assert (
        "'Llama_2' is not a service name: use 1 to 63 lower-case letters, digits and dashes, starting with a letter"
        in message
    )
    assert "^[a-z]" not in message


def test_envs_and_secrets_left_empty_say_how_to_fill_them() -> None:
    message, fields = errors_of({"service": {}, "run": "serve", "envs": {"HF_TOKEN": None, "B": None}})
    assert fields == ["spec.envs"]
    assert "B, HF_TOKEN have no value: pass it with `--env B`" in message
    message, fields = errors_of({"service": {}, "run": "serve", "secrets": {"API_KEY": None}})
    assert fields == ["spec.secrets"]
    assert "API_KEY has no value: pass it with `--secret API_KEY` (taken from your environment)" in message


def test_a_name_in_envs_and_secrets_is_refused() -> None:
    message, _ = errors_of({"service": {}, "run": "s", "envs": {"T": "1"}, "secrets": {"T": "2"}})
    assert "T is both in `envs` and in `secrets`" in message


def test_secrets_over_one_parameter_are_refused() -> None:
    message, fields = errors_of({"service": {}, "run": "s", "secrets": {"BIG": "x" * 5000}})
    assert fields == ["spec.secrets"] and "at most 4096 fit" in message
    assert "xxxx" not in message  # a value is never echoed


def test_stored_secrets_keep_names_only_and_reload() -> None:
    spec = parse_spec({"service": {}, "run": "s", "secrets": {"B": "2", "A": "1"}, "envs": {"E": "e"}})
    assert spec.secret_values() == {"A": "1", "B": "2"}
    stored = spec.without_secret_values()
    assert stored.secrets == {"A": None, "B": None}
    assert "1" not in json.dumps(stored.to_json_dict()["secrets"])
    assert stored_spec(json.dumps(stored.to_json_dict())) == stored  # a stored spec loads (nulls allowed)


def test_a_workdir_in_the_api_is_its_digest() -> None:
    digest = "sha256:" + "ab" * 32
    assert parse_spec({"service": {}, "run": "s", "workdir": {"digest": digest}}).workdir == Workdir(digest=digest)
    message, fields = errors_of({"service": {}, "run": "s", "workdir": {"digest": "md5:1"}})
    assert fields == ["spec.workdir.digest"] and "64 lower-case hex digits" in message


def test_probe_variables_are_filled_from_envs_and_secrets_as_sky_does() -> None:
    spec = parse_spec(
        {
            "service": {
                "readiness_probe": {
                    "path": "/v1/$ROUTE",
                    "headers": {"Authorization": "Bearer ${TOKEN}", "X-Other": "$UNKNOWN"},
                    "post_data": {"model": "$MODEL_NAME", "messages": [{"content": "$MODEL_NAME!"}]},
                }
            },
            "run": "s",
            "envs": {"MODEL_NAME": "qwen", "ROUTE": "chat"},
            "secrets": {"TOKEN": "t0k"},
        }
    )
    assert spec.probe_needs_secrets
    probe = spec.probe_for({"TOKEN": "t0k"})
    assert probe.path == "/v1/chat"
    assert probe.headers == {"Authorization": "Bearer t0k", "X-Other": "$UNKNOWN"}
    assert probe.post_data == {"model": "qwen", "messages": [{"content": "qwen!"}]}
    # The stored spec keeps the template: the value is filled only where the probe is made.
    assert spec.service.readiness_probe.headers["Authorization"] == "Bearer ${TOKEN}"
    assert not parse_spec({"service": {}, "run": "s"}).probe_needs_secrets


# --- readiness_probe.post_data as SkyPilot reads it --------------------------------------------------


def _probe_of(post_data: object) -> object:
    data = {"service": {"readiness_probe": {"path": "/v1/models", "post_data": post_data}}, "run": "x"}
    return parse_spec(data).service.readiness_probe.post_data


def test_post_data_as_json_text_is_the_object_it_holds() -> None:
    # SkyPilot's YAML reference: `post_data: '{"model_name": "my_model"}'` (service_spec.py json.loads it).
    assert _probe_of('{"model_name": "my_model"}') == {"model_name": "my_model"}
    assert _probe_of({"model_name": "my_model"}) == {"model_name": "my_model"}
    assert _probe_of("[1, 2]") == [1, 2]


def test_post_data_that_is_not_json_is_a_400_naming_it() -> None:
    with pytest.raises(InvalidRequest) as caught:
        _probe_of("model_name=my_model")
    (detail,) = caught.value.details
    assert detail["field"] == "spec.service.readiness_probe.post_data"
    assert "not JSON" in detail["problem"]


def test_a_stored_post_data_string_loads_as_the_object_it_holds() -> None:
    text = json.dumps({"service": {"readiness_probe": {"path": "/h", "post_data": '{"a": 1}'}}, "run": "x"})
    assert stored_spec(text).service.readiness_probe.post_data == {"a": 1}
    odd = json.dumps({"service": {"readiness_probe": {"path": "/h", "post_data": "not json"}}, "run": "x"})
    assert stored_spec(odd).service.readiness_probe.post_data == "not json"
    # Decoded once: a string value stored after decoding is not decoded again.
    kept = json.dumps({"service": {"readiness_probe": {"path": "/h", "post_data": "5"}}, "run": "x"})
    assert stored_spec(kept).service.readiness_probe.post_data == "5"


def test_the_failure_window_is_skypilots_unless_given() -> None:
    probe = parse_spec({"service": {"readiness_probe": "/h"}, "run": "x"}).service.readiness_probe
    assert probe.failure_window_seconds == 180
    data = {"service": {"readiness_probe": {"path": "/h", "consecutive_failure_threshold_timeout": 30}}, "run": "x"}
    assert parse_spec(data).service.readiness_probe.failure_window_seconds == 30
