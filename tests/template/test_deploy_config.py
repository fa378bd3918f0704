"""The files `sam build` / `sam deploy` and `make cfn` read, beside template.yaml."""

from __future__ import annotations

import re
import tomllib

from tests import REPO_ROOT

ROOT = REPO_ROOT


def test_every_checkov_skip_says_why() -> None:
    lines = (ROOT / ".checkov.yaml").read_text(encoding="utf-8").splitlines()
    skips = [i for i, line in enumerate(lines) if re.match(r"\s*-\s*CKV", line)]
    assert skips, "no skip-check entries found"
    for i in skips:
        assert lines[i - 1].strip().startswith("#"), f"{lines[i].strip()} has no comment above it"


def test_samconfig_deploys_with_review_and_least_capabilities() -> None:
    config = tomllib.loads((ROOT / "samconfig.toml").read_text(encoding="utf-8"))
    deploy = config["default"]["deploy"]["parameters"]
    # CAPABILITY_IAM only: the template names no IAM resource, so CAPABILITY_NAMED_IAM is not needed.
    assert deploy["capabilities"] == "CAPABILITY_IAM"
    assert deploy["confirm_changeset"] is True
    assert deploy["resolve_s3"] is True


def requirement_names(lines: list[str]) -> set[str]:
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(re.split(r"[<>=!~\\[ ;]", line, maxsplit=1)[0].lower().replace("_", "-"))
    return names


def test_lambda_bundle_has_the_runtime_dependencies() -> None:
    """`sam build` installs functions/requirements.txt; it must match pyproject's dependencies
    less pyyaml (only the CLI and local/template.py read YAML) and pathspec (only the CLI packs
    workdirs), or a function fails at import in AWS only, plus botocore, pinned beside boto3 to the
    release the suite runs (the runtime's own SDK changes under the functions; tests/aws/test_parsing.py
    holds the pins to the installed versions). The lambda-bundle import contract keeps the functions
    from importing pyyaml and pathspec."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    wanted = (requirement_names(project["dependencies"]) - {"pyyaml", "pathspec"}) | {"botocore"}
    bundled = requirement_names((ROOT / "functions" / "requirements.txt").read_text().splitlines())
    assert bundled == wanted
