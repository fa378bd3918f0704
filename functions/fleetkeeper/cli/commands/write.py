"""`up`, `update` and `rollback`: the writes that roll out a version, and --wait for it.

The spec is read and given its values on this machine (fleetkeeper.cli.spec_input); its workdir is
packed and uploaded before the write, which carries its digest in its place.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetkeeper.cli.http import UsageError
from fleetkeeper.cli.spec_input import apply_values, derived_name, load_spec, overridden, resource_overrides
from fleetkeeper.spec.skypilot_fields import remote_workdir

if TYPE_CHECKING:
    from fleetkeeper.cli.invocation import Cli


def up(cli: Cli) -> int:
    spec = load_spec(cli.args.spec)
    if cli.args.name:
        spec.pop("name", None)  # --name overrides the spec's own name (one spec, many services)
    name = cli.args.name or spec.get("name")
    if not name:
        # As `sky serve up` without -n: a name is made up, here from the file's (see derived_name).
        name = derived_name(cli.args.spec)
        if name is None:
            raise UsageError(
                f"{cli.args.spec}: no service name can be made from this file's name; "
                "give one with --name (-n) or a `name:` in the spec"
            )
        cli.note(f"no name in {cli.args.spec}: the service is {name} (--name NAME chooses another)")
    spec = _prepared(cli, spec, str(name), existing=False)
    view = cli.client.request("POST", "/v1/services", {"name": name, "spec": spec}).body
    cli.said(f"created {name} (v{view['target_version']}, {view['status']})", view)
    return cli.maybe_wait(view)


def update(cli: Cli) -> int:
    body: dict[str, Any] = {"spec": _prepared(cli, load_spec(cli.args.spec), cli.args.name, existing=True)}
    if cli.args.mode:
        body["mode"] = cli.args.mode
    view = cli.client.request("PUT", f"/v1/services/{cli.name}", body).body
    if view.get("changed") is False:
        cli.said(
            f"{cli.args.name} is unchanged: v{view['target_version']} already runs this spec "
            "(same files, same values); nothing to roll out",
            view,
        )
    else:
        cli.said(f"updating {cli.args.name} to v{view['target_version']} ({view.get('mode')})", view)
    return cli.maybe_wait(view)


def _prepared(cli: Cli, spec: dict[str, Any], name: str, *, existing: bool) -> dict[str, Any]:
    """The spec as the API takes it: --env-file, --env and --secret applied, the workdir packed
    and uploaded (its digest in its place)."""
    spec = apply_values(spec, cli.args.env_file, cli.args.env, cli.args.secret, source=str(cli.args.spec))
    spec = overridden(spec, resource_overrides(cli.args), source=str(cli.args.spec))
    workdir = spec.get("workdir")
    if isinstance(workdir, str) and not remote_workdir(workdir):  # a URL: the API says what to do
        spec["workdir"] = {"digest": _upload_workdir(cli, Path(workdir), name if existing else None)}
    return spec


def _upload_workdir(cli: Cli, directory: Path, service: str | None) -> str:
    from fleetkeeper.cli.workdir import pack

    packed = pack(directory)
    try:
        body: dict[str, Any] = {"digest": packed.digest, "size": packed.size}
        if service is not None:
            body["service"] = service
        answer = cli.client.request("POST", "/v1/workdirs", body).body
        upload = answer.get("upload")
        rules = f", {packed.ignore_file} applied" if packed.ignore_file else ""
        if upload is None:
            cli.note(f"workdir {directory}: {packed.files} files, already stored ({packed.digest[:19]})")
        else:
            cli.client.upload(upload["url"], upload["method"], upload.get("headers") or {}, packed.path)
            cli.note(
                f"workdir {directory}: {packed.files} files, {_size(packed.size)} uploaded{rules} "
                f"({packed.digest[:19]})"
            )
        return packed.digest
    finally:
        packed.path.unlink(missing_ok=True)


def rollback(cli: Cli) -> int:
    body = None if cli.args.version is None else {"version": cli.args.version}
    view = cli.client.request("POST", f"/v1/services/{cli.name}/rollback", body).body
    cli.said(f"rolling {cli.args.name} back to v{view['target_version']}", view)
    return cli.maybe_wait(view)


def _size(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB" if size >= 1024 * 1024 else f"{max(1, size // 1024)} KiB"
