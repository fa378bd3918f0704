"""A spec as `up` and `update` send it: read from its file, named, and given the command line's
values (--env-file, --env, --secret) and resource overrides (--cpus, --gpus...), as SkyPilot
applies them. The API validates the result and names any field at fault.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any

import yaml

from fleetkeeper.cli.http import UsageError
from fleetkeeper.spec import yaml_errors

if TYPE_CHECKING:
    import argparse
    from pathlib import Path

# Spec file names that say nothing about the service (`sky serve up task.yaml`): the folder names it.
GENERIC_SPEC_NAMES = frozenset({"task", "service", "serve", "spec", "sky", "skypilot", "config", "fleetkeeper"})


def load_spec(path: Path) -> dict[str, Any]:
    """A spec file as a mapping; the API validates its fields (and names the bad ones)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise UsageError(yaml_errors.describe(exc, str(path), text)) from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a spec is a mapping with `service`, `resources`, `run`...")
    return data


def derived_name(path: Path) -> str | None:
    """The service name `up` gives a spec without one, from its file: the file's name without its
    extension, or its folder's when the file's is generic (task.yaml, service.yaml...), lower-cased,
    each run of other characters than letters and digits made one dash, at most 63 characters, and
    `svc-` in front when it does not start with a letter. None when nothing is left."""
    stem = path.stem
    if stem.lower() in GENERIC_SPEC_NAMES:
        stem = path.resolve().parent.name
    name = re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")
    if not name:
        return None
    if not name[0].isalpha():
        name = f"svc-{name}"
    return name[:63].rstrip("-")


def _assignment(text: str, flag: str, environ: dict[str, str] | os._Environ[str]) -> tuple[str, str]:
    """NAME=VALUE, or NAME with the value from the caller's environment (as `sky` does)."""
    name, has_value, value = text.partition("=")
    name = name.strip()
    if not name:
        raise UsageError(f"{flag} {text!r}: expected NAME=VALUE or NAME")
    if has_value:
        return name, value
    if name not in environ:
        raise UsageError(f"{flag} {name}: {name} is not set in your environment; set it, or pass {flag} {name}=VALUE")
    return name, environ[name]


def read_env_file(path: Path) -> dict[str, str]:
    """A dotenv file: NAME=VALUE lines; blank lines, # comments and an `export ` prefix allowed;
    a value in matching single or double quotes is taken without them."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    values: dict[str, str] = {}
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, has_value, value = line.removeprefix("export ").partition("=")
        if not has_value or not name.strip():
            raise UsageError(f"{path}, line {number}: expected NAME=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[name.strip()] = value
    return values


# The flags of `fleetkeeper.cli.args._resource_overrides`, by the `resources` field each sets.
_OVERRIDES = {"cpus": "cpus", "memory": "memory", "gpus": "accelerators", "instance_type": "instance_type"}


def resource_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The `resources` fields the command line sets (`--gpus` is `accelerators`, as in SkyPilot)."""
    fields = {field: getattr(args, flag) for flag, field in _OVERRIDES.items() if getattr(args, flag, None) is not None}
    if getattr(args, "use_spot", None) is not None:
        fields["use_spot"] = args.use_spot
    return fields


def overridden(spec: dict[str, Any], fields: dict[str, Any], *, source: str) -> dict[str, Any]:
    """The spec with `fields` set in `resources`, as SkyPilot's overrides: over every alternative too
    (an `any_of` or `ordered` entry's own value for a field given here is dropped), so the flag is what
    every candidate gets. The API validates the values and names the field at fault."""
    if not fields:
        return spec
    resources = spec.get("resources")
    if resources is None:
        resources = {}
    if not isinstance(resources, dict):
        raise UsageError(f"{source}: `resources` must be a mapping to take --cpus, --memory, --gpus... overrides")
    resources = {**resources, **fields}
    for key in ("any_of", "ordered"):
        entries = resources.get(key)
        if isinstance(entries, list):
            kept = [{k: v for k, v in e.items() if k not in fields} if isinstance(e, dict) else e for e in entries]
            if all(entry == {} for entry in kept):
                del resources[key]  # nothing left to choose between: the overrides are the one choice
            else:
                resources[key] = kept
    return {**spec, "resources": resources}


def apply_values(
    spec: dict[str, Any],
    env_files: list[Path],
    envs: list[str],
    secrets: list[str],
    *,
    source: str,
    environ: dict[str, str] | os._Environ[str] | None = None,
) -> dict[str, Any]:
    """`envs` and `secrets` of the spec, filled and overridden as SkyPilot does: the spec's own
    values, then each --env-file, then each --env; the spec's secrets, then each --secret."""
    environ = os.environ if environ is None else environ
    spec = dict(spec)
    for key, flag_values in (("envs", envs), ("secrets", secrets)):
        current = spec.get(key)
        if current is not None and not isinstance(current, dict):
            if flag_values or (key == "envs" and env_files):
                raise UsageError(f"{source}: `{key}` must be a mapping of names to values to take --{key[:-1]}")
            continue
    merged_envs = dict(spec.get("envs") or {})
    for path in env_files:
        merged_envs.update(read_env_file(path))
    merged_envs.update(_assignment(text, "--env", environ) for text in envs)
    if merged_envs or "envs" in spec:
        spec["envs"] = merged_envs
    if secrets:
        merged = dict(spec.get("secrets") or {})
        merged.update(_assignment(text, "--secret", environ) for text in secrets)
        spec["secrets"] = merged
    return spec
