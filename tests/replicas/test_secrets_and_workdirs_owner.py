"""An owned service's secrets and workdir copies live under its owner's scope (fleetkeeper.replicas.identity):
written there by the api, read there at launch, kept across updates, pruned and cleaned up there, and
a legacy service (no owner) keeps the old names."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import pytest

from fleetkeeper import aws
from fleetkeeper.api.services import ServiceCommands
from fleetkeeper.replicas.identity import owner_scope
from fleetkeeper.replicas.secrets import SecretStore, parameter_prefix
from fleetkeeper.replicas.workdirs import S3WorkdirStore, service_key, upload_key
from fleetkeeper.spec.service import ServiceSpec
from fleetkeeper.store.commands import CommandStore
from fleetkeeper.store.table import Table
from tests.support.specs import hello_spec

OWNER = "arn:aws:iam::123456789012:role/team-a-ci"
BUCKET = "fk-test-owner-workdirs"


def parameters(table: str) -> list[str]:
    pages = aws.ssm().get_paginator("get_parameters_by_path")
    return sorted(
        p["Name"] for page in pages.paginate(Path=parameter_prefix(table), Recursive=True) for p in page["Parameters"]
    )


@pytest.fixture
def commands(table: str) -> ServiceCommands:
    aws.s3().create_bucket(Bucket=BUCKET)
    return ServiceCommands(
        CommandStore(Table(table)), secrets=SecretStore(parameter_prefix(table)), workdirs=S3WorkdirStore(BUCKET)
    )


def _uploaded(data: bytes) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
    aws.s3().put_object(Bucket=BUCKET, Key=upload_key(digest), Body=data, ChecksumSHA256=checksum)
    return digest


def _spec(digest: str, secret: str) -> ServiceSpec:
    raw: dict[str, Any] = {**hello_spec(workdir={"digest": digest}), "secrets": {"TOKEN": secret}}
    return ServiceSpec.model_validate(raw)


def test_an_owned_services_secrets_and_workdir_are_under_its_owners_scope(
    table: str, commands: ServiceCommands
) -> None:
    scope = owner_scope(OWNER)
    first, second = _uploaded(b"one"), _uploaded(b"two")
    state = commands.create("web", _spec(first, "s1"), owner=OWNER)
    uid = state.service.uid
    assert state.service.owner == OWNER
    ref1 = state.versions[1].secrets_ref
    assert parameters(table) == [f"/fleetkeeper/{table}/_o/{scope}/web/{uid}/{ref1}"]
    aws.s3().head_object(Bucket=BUCKET, Key=f"services/_o/{scope}/web/{uid}/{first.removeprefix('sha256:')}.tar.gz")
    # The owner is read back with the service, and an update writes under the same scope.
    assert commands.store.require("web").service.owner == OWNER
    written = commands.update("web", _spec(second, "s2"), mode=None, expected_generation=None)
    ref2 = written.state.versions[2].secrets_ref
    assert ref2 is not None and ref2 != ref1
    assert f"/fleetkeeper/{table}/_o/{scope}/web/{uid}/{ref2}" in parameters(table)
    assert SecretStore(parameter_prefix(table)).get("web", uid, ref2, OWNER) == {"TOKEN": "s2"}
    aws.s3().head_object(Bucket=BUCKET, Key=service_key("web", uid, second, OWNER))
    # The cleanup of the incarnation (what the stream's REMOVE does) leaves nothing of either.
    assert SecretStore(parameter_prefix(table)).delete_incarnation("web", uid, OWNER) == 2
    assert S3WorkdirStore(BUCKET).delete_incarnation("web", uid, OWNER) == 2
    assert parameters(table) == []


def test_a_service_without_an_owner_keeps_the_legacy_names(table: str, commands: ServiceCommands) -> None:
    digest = _uploaded(b"legacy")
    state = commands.create("old", _spec(digest, "s"))
    uid, ref = state.service.uid, state.versions[1].secrets_ref
    assert state.service.owner == ""
    assert parameters(table) == [f"/fleetkeeper/{table}/old/{uid}/{ref}"]
    aws.s3().head_object(Bucket=BUCKET, Key=f"services/old/{uid}/{digest.removeprefix('sha256:')}.tar.gz")


def test_the_cleanup_reads_the_owner_from_the_removed_item(table: str) -> None:
    from fleetkeeper.cleanup.logic import Incarnation

    removed = Incarnation.from_old_image({"name": "web", "uid": "u1", "owner": OWNER})
    assert removed.owner == OWNER
    assert Incarnation.from_old_image({"name": "web", "uid": "u1"}).owner == ""
    secrets = SecretStore(parameter_prefix(table))
    secrets.put("web", "u1", "r1", {"A": "1"}, OWNER)
    secrets.put("web", "u1", "r0", {"A": "0"})  # written before the service had an owner: swept too
    secrets.put("web", "u2", "r2", {"A": "2"}, OWNER)  # a newer incarnation: untouched
    assert secrets.delete_incarnation(removed.name, removed.uid, removed.owner) == 2
    assert parameters(table) == [f"/fleetkeeper/{table}/_o/{owner_scope(OWNER)}/web/u2/r2"]
