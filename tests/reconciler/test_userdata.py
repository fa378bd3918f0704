"""The replica's user data (fleetkeeper.reconciler.userdata): the boot script, its files and units, gzip
when it would not fit, and what EC2 receives."""

from __future__ import annotations

import base64
import gzip
import random
import re
from typing import Any

from fleetkeeper import aws as aws_clients
from fleetkeeper.reconciler.driver import REPLICA_TAG
from fleetkeeper.reconciler.userdata import USER_DATA_LIMIT, environment_file, render, user_data
from fleetkeeper.spec import task_variables
from fleetkeeper.spec.service import ServiceSpec
from tests.support.reconciler_world import World, tags
from tests.support.specs import hello_spec


def _spec(**overrides: Any) -> ServiceSpec:
    return ServiceSpec.model_validate(hello_spec(**overrides))


def _files(script: str) -> dict[str, str]:
    """The files the boot script writes, decoded."""
    found = re.findall(r"echo '([A-Za-z0-9+/=]+)' \| base64 -d > (\S+)", script)
    return {path: base64.b64decode(encoded).decode() for encoded, path in found}


def test_user_data_runs_setup_once_then_run_as_a_restarting_service_with_envs_and_port() -> None:
    spec = _spec(setup="pip install x", run="serve --port $PORT", envs={"MODEL": 'a "quoted"\\value', "N": 1})
    files = _files(render(spec))
    assert files["/opt/fleetkeeper/setup.sh"].endswith("pip install x\n")
    assert files["/opt/fleetkeeper/run.sh"].endswith("serve --port $PORT\n")
    env = files["/opt/fleetkeeper/env"]
    assert env == environment_file(spec)
    assert 'MODEL="a \\"quoted\\"\\\\value"\n' in env and 'N="1"\n' in env and 'PORT="8080"\n' in env
    run_unit = files["/etc/systemd/system/fleetkeeper-replica.service"]
    assert "Restart=always" in run_unit and "Requires=fleetkeeper-setup.service" in run_unit
    assert "Type=oneshot" in files["/etc/systemd/system/fleetkeeper-setup.service"]


def test_user_data_is_gzipped_only_when_it_would_not_fit() -> None:
    small = user_data(_spec())
    assert small.startswith(b"#!/bin/bash")
    big = user_data(_spec(setup="echo " + "x" * 15_000))
    assert len(render(_spec(setup="echo " + "x" * 15_000))) > USER_DATA_LIMIT
    assert gzip.decompress(big).startswith(b"#!/bin/bash")


# Guards a regression found by review (commit 5faa8d0): gzipped user data was corrupted on its way to EC2
# (sent as UTF-8 text, not bytes).
def test_gzipped_user_data_reaches_ec2_byte_for_byte(world: World) -> None:
    rnd = random.Random(1)
    big = "\n".join(f"echo {rnd.getrandbits(64):x}" for _ in range(700))  # gzip path, under the limit
    created = world.create(setup=big)
    world.run()
    [launched, *_] = [i for i in world.instances() if tags(i).get("fleetkeeper:uid") == created.service.uid]
    replica_id = int(tags(launched)[REPLICA_TAG])
    task = task_variables.variables("svc", created.service.uid, 1, replica_id, launched["InstanceType"])
    expected = user_data(created.versions[1].spec, task=task)
    assert expected[:2] == b"\x1f\x8b" and len(expected) <= USER_DATA_LIMIT
    attribute = aws_clients.ec2().describe_instance_attribute(InstanceId=launched["InstanceId"], Attribute="userData")
    sent = base64.b64decode(attribute["UserData"]["Value"])
    assert sent == expected
    assert b"set -euo pipefail" in gzip.decompress(sent)


# Guards a regression found by review (commit 5faa8d0): newlines in envs did not reach the replica
# (test_env_values_reach_the_replica_unchanged).
_SYSTEMD_UNESCAPES = '"\\`$'


def _systemd_env_file(text: str) -> dict[str, str]:
    """The double-quoted-value states of systemd's EnvironmentFile parser (src/basic/env-file.c)."""
    out: dict[str, str] = {}
    key, value, mode = "", "", "PRE_KEY"
    for c in text:
        if mode == "PRE_KEY":
            if not c.isspace():
                key, mode = c, "KEY"
        elif mode == "KEY":
            if c == "=":
                mode, value = "PRE_VALUE", ""
            else:
                key += c
        elif mode == "PRE_VALUE":
            if c == "\n":
                out[key], mode = value, "PRE_KEY"
            elif c == '"':
                mode = "QUOTED"
        elif mode == "QUOTED":
            if c == '"':
                mode = "PRE_VALUE"
            elif c == "\\":
                mode = "ESCAPED"
            else:
                value += c
        elif mode == "ESCAPED":
            mode = "QUOTED"
            if c in _SYSTEMD_UNESCAPES:
                value += c
            elif c != "\n":
                value += "\\" + c
    if mode == "PRE_VALUE":
        out[key] = value
    return out


def test_env_values_reach_the_replica_unchanged() -> None:
    envs = {"PEM": "-----BEGIN KEY-----\nabc\n-----END KEY-----", "Q": 'a "b" \\ $HOME `x`'}
    parsed = _systemd_env_file(environment_file(ServiceSpec.model_validate(hello_spec(envs=envs))))
    assert parsed["PEM"] == envs["PEM"]
    assert parsed["Q"] == envs["Q"]
