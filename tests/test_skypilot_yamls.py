"""Real SkyPilot service YAMLs (tests/fixtures/skypilot/), brought as SkyPilot users bring them:
`fleetkeeper up -n NAME FILE` from the directory their `workdir` is relative to, with --env/--secret.

What fleetkeeper does not take yet belongs to other issues, and only that may be refused: resources
that need placement (cpus, memory, accelerators without an instance type, disk_tier) and, until
the endpoint lands, `load_balancing_policy`. Everything else in them is accepted unchanged: the same
YAML with only those fields taken out is created, its workdir packed and stored.

In process: the CLI against the api handler over real HTTP (the embedded bridge with its local
workdir store), moto for DynamoDB and Parameter Store; no reconciler (tests/test_local_e2e.py runs
replicas).
"""

from __future__ import annotations

import io
import json
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from fleetkeeper.api.handler import lambda_handler
from fleetkeeper.cli.main import run
from fleetkeeper.local.http_bridge import ApiBridge
from fleetkeeper.workdir_store import LocalWorkdirStore

if TYPE_CHECKING:
    from collections.abc import Iterator

FIXTURES = Path(__file__).parent / "fixtures" / "skypilot"

# Fields of other issues: placement (resources AWS cannot be asked for as written) and the endpoint.
PLACEMENT = {"resources.cpus", "resources.memory", "resources.disk_tier", "resources.accelerators", "resources"}
ENDPOINT = {"service.load_balancing_policy"}

# Each YAML, the flags its README tells SkyPilot users to pass, and the fields of other issues in it.
CASES: dict[str, tuple[list[str], set[str]]] = {
    "examples/serve/http_server/task.yaml": ([], {"resources.cpus", "service.load_balancing_policy"}),
    "examples/serve/minimal.yaml": ([], {"resources.cpus"}),
    "examples/serve/authentication/task.yaml": ([], {"resources.cpus"}),
    "examples/serve/misc/cancel/service.yaml": ([], {"resources.cpus", "service.load_balancing_policy"}),
    "examples/serve/min_replicas_zero.yaml": ([], {"resources.cpus"}),
    "examples/serve/llama2/llama2.yaml": (
        ["--env", "HF_TOKEN"],
        {"resources.memory", "resources.disk_tier", "resources.accelerators", "service.load_balancing_policy"},
    ),
    "examples/serve/gorilla/gorilla.yaml": (
        [],
        {"resources.disk_tier", "resources.accelerators", "service.load_balancing_policy"},
    ),
    "examples/serve/tgi_coder.yaml": ([], {"resources.accelerators"}),
    "llm/qwen/serve-7b.yaml": ([], {"resources.disk_tier", "resources.accelerators"}),
}


@pytest.fixture
def api_url(table: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The api over HTTP with the embedded mode's workdir store (uploads through the bridge)."""
    store = LocalWorkdirStore(tmp_path / "workdirs", "")
    server = ApiBridge(
        ("127.0.0.1", 0), lambda_handler, on_kick=lambda _n: None, logs_dir=tmp_path / "logs", workdirs=store
    )
    monkeypatch.setenv("FLEETKEEPER_WORKDIR_DIR", str(store.root))
    monkeypatch.setenv("FLEETKEEPER_WORKDIR_UPLOAD_URL", server.url + "/_local/workdirs")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.url
    server.shutdown()
    server.server_close()


def cli(api_url: str, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = run([*argv, "--api-url", api_url], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def refused_fields(message: str) -> set[str]:
    """The fields an API message names (`spec.<path>: problem; ...`), as `section.field` (the
    problems inside a field, e.g. each entry of an accelerators mapping, are that field's)."""
    named = re.findall(r"(spec\.[A-Za-z_.\[\]0-9-]+):", message)
    return {".".join(m.removeprefix("spec.").split(".")[:2]) for m in named}


def without(data: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """The YAML with only the other issues' fields taken out (what placement and the endpoint will take)."""
    data = json.loads(json.dumps(data))
    for field in fields:
        section, _, key = field.partition(".")
        if key and isinstance(data.get(section), dict):
            data[section].pop(key, None)
    if data.get("resources") == {}:
        data.pop("resources")
    return data


@pytest.mark.parametrize("path", sorted(CASES))
def test_a_real_skypilot_yaml_is_refused_only_for_what_other_issues_build_and_the_rest_is_accepted(
    path: str, api_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    flags, others = CASES[path]
    monkeypatch.chdir(FIXTURES)
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")

    # As published, with the flags its users pass: refused for placement and endpoint fields only.
    code, _, err = cli(api_url, "up", "-n", "as-published", path, *flags)
    assert code == 2, err
    refused = refused_fields(err)
    assert refused, err
    assert refused <= others | PLACEMENT | ENDPOINT, f"refused beyond placement and the endpoint: {err}"

    # Without those fields (what placement and the endpoint will take), the rest is accepted as is.
    original: dict[str, Any] = yaml.safe_load((FIXTURES / path).read_text())
    rest = FIXTURES / Path(path).with_name(f".rest-{Path(path).name}")
    rest.write_text(yaml.safe_dump(without(original, others)))
    try:
        code, out, err = cli(api_url, "up", "-n", "svc", str(rest.relative_to(FIXTURES)), *flags, "-o", "json")
    finally:
        rest.unlink()
    assert code == 0, err
    spec = json.loads(out)["spec"]
    assert spec["run"] == original["run"]
    assert spec.get("setup") == original.get("setup")
    probe = original["service"]["readiness_probe"]
    assert spec["service"]["readiness_probe"]["path"] == (probe if isinstance(probe, str) else probe["path"])
    if "workdir" in original:
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", spec["workdir"]["digest"])
        assert "files" in err and ("uploaded" in err or "already stored" in err)
    for env, value in (original.get("envs") or {}).items():
        assert spec["envs"][env] == ("hf_test_token" if value is None else str(value))


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
