"""Real SkyPilot service YAMLs (tests/fixtures/skypilot/), brought as SkyPilot users bring them:
`fleetkeeper up -n NAME FILE` from the directory their `workdir` is relative to, with --env/--secret.

Each is accepted unchanged, its resources (cpus, memory, accelerators, disk_tier) resolved to EC2
instance types, or refused only because AWS has no instance type for what it asks (one A100): then
with a 400 that names the accelerator and what AWS has instead, and the same YAML with the suggested
accelerator is accepted, its workdir packed and stored.

In process: the CLI against the api handler over real HTTP (the embedded bridge with its local
workdir store), moto for DynamoDB and Parameter Store; no reconciler (tests/local/test_e2e.py runs
replicas).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from fleetkeeper.api.handler import lambda_handler
from fleetkeeper.cli.main import run
from fleetkeeper.replicas.workdirs import LocalWorkdirStore
from tests import TESTS_DIR
from tests.support.local_process import serving_bridge

if TYPE_CHECKING:
    from collections.abc import Iterator

FIXTURES = TESTS_DIR / "fixtures" / "skypilot"

ONE_A100 = "no AWS instance type has 1 A100; p4d.24xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1"
# A set of accelerators is candidates: what AWS has not is dropped with a note each, the rest kept.
# llm/qwen/serve-7b.yaml's {L4, A10g, A10, L40, A40, A100, A100-80GB} drops A10, L40, A40 (no AWS
# type has them), A100:1 and A100-80GB:1 (AWS has them by 8); llm/vllm's {L4:1, A10G:1, A10:1, A100:1,
# A100-80GB:1} (keys "L4:1" with null values, as YAML reads them) drops A10, A100:1, A100-80GB:1.
DROPPED = {"llm/qwen/serve-7b.yaml": 5, "llm/vllm/service.yaml": 3, "llm/vllm/service-with-auth.yaml": 3}

# Each YAML, the flags its README tells SkyPilot users to pass, and the first candidate instance type
# it gets, or (None) the refusal of an accelerator AWS has no instance type for.
CASES: dict[str, tuple[list[str], str | None]] = {
    "examples/serve/http_server/task.yaml": ([], "c6i.large"),  # cpus: 2+
    "examples/serve/minimal.yaml": ([], "c6i.large"),
    "examples/serve/authentication/task.yaml": ([], "c6i.large"),  # cpus: 2
    "examples/serve/misc/cancel/service.yaml": ([], "c6i.large"),
    "examples/serve/min_replicas_zero.yaml": ([], "c6i.large"),
    "examples/serve/load_balancing_policies_example.yaml": ([], "c6i.large"),
    # memory: 32+, T4:1, disk_size 1024, disk_tier best
    "examples/serve/llama2/llama2.yaml": (["--env", "HF_TOKEN"], "g4dn.2xlarge"),
    "llm/qwen/serve-7b.yaml": ([], "g6.xlarge"),
    "llm/vllm/service.yaml": ([], "g6.xlarge"),
    "llm/vllm/service-with-auth.yaml": (
        ["--secret", "HF_TOKEN", "--secret", "AUTH_TOKEN=auth_test_token"],
        "g6.xlarge",
    ),
    "examples/serve/gorilla/gorilla.yaml": ([], None),  # A100:1
    "examples/serve/tgi_coder.yaml": ([], None),
    "examples/serve/vllm.yaml": ([], None),
    "examples/serve/huggingface-tgi.yaml": ([], None),
}


@pytest.fixture
def api_url(table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The api over HTTP with the embedded mode's workdir store (uploads through the bridge)."""
    store = LocalWorkdirStore(tmp_path / "workdirs", "")
    options = {"on_kick": lambda _n: None, "logs_dir": tmp_path / "logs", "workdirs": store}
    with serving_bridge(lambda_handler, tmp_path / "state", **options) as server:
        monkeypatch.setenv("FLEETKEEPER_WORKDIR_DIR", str(store.root))
        monkeypatch.setenv("FLEETKEEPER_WORKDIR_UPLOAD_URL", server.url + "/_local/workdirs")
        yield server.url


def cli(api_url: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run([*argv, "--api-url", api_url], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def refused_fields(message: str) -> set[str]:
    """The fields an API message names (`spec.<path>: problem; ...`), as `section.field`."""
    named = re.findall(r"(spec\.[A-Za-z_.\[\]0-9-]+):", message)
    return {".".join(m.removeprefix("spec.").split(".")[:2]) for m in named}


def assert_the_rest_is_kept(original: dict[str, Any], spec: dict[str, Any], err: str) -> None:
    assert spec["run"] == original["run"]
    assert spec.get("setup") == original.get("setup")
    probe = original["service"]["readiness_probe"]
    assert spec["service"]["readiness_probe"]["path"] == (probe if isinstance(probe, str) else probe["path"])
    if "workdir" in original:
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", spec["workdir"]["digest"])
        assert "files" in err and ("uploaded" in err or "already stored" in err)
    for env, value in (original.get("envs") or {}).items():
        assert spec["envs"][env] == ("hf_test_token" if value is None else str(value))
    for field, value in original.get("resources", {}).items():
        if field == "ports" and value == [spec["resources"][field]]:
            continue  # `ports: [8000]` is SkyPilot's list of one: a replica serves on one port
        assert spec["resources"][field] == value, field  # as written: candidates are shown beside it


@pytest.mark.parametrize("path", sorted(CASES))
def test_a_real_skypilot_yaml_is_accepted_or_refused_only_for_an_accelerator_aws_lacks(
    path: str, api_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags, first = CASES[path]
    monkeypatch.chdir(FIXTURES)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    original: dict[str, Any] = yaml.safe_load((FIXTURES / path).read_text())

    code, out, err = cli(api_url, "up", "-n", "as-published", path, *flags, "-o", "json")
    if first is not None:
        # As published, with the flags its users pass: accepted, its resources resolved.
        assert code == 0, err
        view = json.loads(out)
        assert_the_rest_is_kept(original, view["spec"], err)
        assert view["placement"]["instance_types"][0] == first
        notes = view["placement"]["notes"]
        dropped = [n for n in notes if n.startswith("dropped: no AWS instance type has")]
        assert len(dropped) == DROPPED.get(path, 0), notes
        if path in DROPPED:  # the rest of the set: L4 and A10G, smallest first
            kept = view["placement"]["instance_types"]
            assert kept[:2] == ["g6.xlarge", "g5.xlarge"], kept
        return

    # One A100: AWS has none (p4d.24xlarge has eight). Refused for that alone, saying what AWS has.
    assert code == 2, err
    assert refused_fields(err) == {"resources.accelerators"}, err
    assert f"spec.resources.accelerators: {ONE_A100}" in err, err
    # With an accelerator the message suggests, the rest is accepted as is.
    suggested = FIXTURES / Path(path).with_name(f".suggested-{Path(path).name}")
    suggested.write_text(yaml.safe_dump({**original, "resources": {**original["resources"], "accelerators": "L40S:1"}}))
    try:
        code, out, err = cli(api_url, "up", "-n", "svc", str(suggested.relative_to(FIXTURES)), *flags, "-o", "json")
    finally:
        suggested.unlink()
    assert code == 0, err
    view = json.loads(out)
    assert view["placement"] == {"instance_types": [f"g6e.{s}" for s in SIZES_OF_ONE_L40S], "notes": []}
    assert_the_rest_is_kept(
        {**original, "resources": {**original["resources"], "accelerators": "L40S:1"}}, view["spec"], err
    )


SIZES_OF_ONE_L40S = ["xlarge", "2xlarge", "4xlarge", "8xlarge", "16xlarge"]


def test_an_env_left_empty_is_a_400_that_says_how_to_fill_it(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(FIXTURES)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    data: dict[str, Any] = yaml.safe_load((FIXTURES / "examples/serve/llama2/llama2.yaml").read_text())
    code, _, err = cli(api_url, "up", "-n", "llama2", "examples/serve/llama2/llama2.yaml")
    assert code == 2
    assert (
        "spec.envs: HF_TOKEN has no value: pass it with `--env HF_TOKEN` (taken from your environment) or "
        "`--env HF_TOKEN=VALUE`, or give it a value in the spec"
    ) in err
    assert data["envs"]["HF_TOKEN"] is None

    code, _, err = cli(api_url, "up", "-n", "llama2", "examples/serve/llama2/llama2.yaml", "--env", "HF_TOKEN")
    assert code == 2
    assert err == (
        "fleetkeeper: --env HF_TOKEN: HF_TOKEN is not set in your environment; set it, or pass --env HF_TOKEN=VALUE\n"
    )


@pytest.mark.parametrize("workdir", ["https://github.com/org/app", {"url": "https://github.com/org/app", "ref": "v1"}])
def test_a_remote_workdir_is_not_packed_and_the_api_says_what_to_do(
    workdir: Any, api_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "service.yaml"
    path.write_text(yaml.safe_dump({"workdir": workdir, "service": {"readiness_probe": "/"}, "run": "x"}))
    code, _, err = cli(api_url, "up", "-n", "remote", str(path))
    assert code == 2, err
    assert "spec.workdir: a remote workdir (https://github.com/org/app) is not supported: clone it in `setup`" in err
    assert "does not exist" not in err  # the URL is not taken for a directory
