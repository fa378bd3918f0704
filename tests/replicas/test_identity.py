"""Replica identity on (strict) moto: the dispatcher makes the owners' roles idempotently and
crash-safely and records them; the reconciler makes no IAM call, launches only owners whose identity
is recorded, and takes a profile too young for EC2 (or one removed meanwhile) as an environment
refusal retried next run (never the version's fault); replicas are launched with their owner's
profile and names, and owners with no service left lose their role, record first. (What the roles
may do is proven in tests/template/test_replica_identity.py.)"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.model import FailureCause, ReplicaStatus
from fleetkeeper.reconciler.driver import LaunchRefused, LaunchRequest
from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver
from fleetkeeper.reconciler.plan import refusal_cause
from fleetkeeper.replicas.identity import (
    IDENTITY_UNAVAILABLE,
    PROFILE_NOT_READY,
    SCOPE_TAG,
    SWEEP_GRACE_SECONDS,
    IdentityError,
    IdentityKeeper,
    OwnerProfiles,
    ReplicaIdentities,
    owner_scope,
    role_name,
    role_path,
)
from fleetkeeper.spec.service import ServiceSpec
from fleetkeeper.store.identities import IdentityRecords
from fleetkeeper.store.table import Table
from tests.support import TABLE
from tests.support.reconciler_world import World, raw_client, spec_dict

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws

STACK = "0123456789ab"
OWNER_A = "arn:aws:iam::123456789012:role/team-a-ci"
OWNER_B = "arn:aws:iam::123456789012:role/team-b-ci"
DOCUMENT = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}


def owner_policy() -> str:
    """The stack's ReplicaOwnerPolicy, as moto's managed policy (its content is proven elsewhere)."""
    made = raw_client("iam").create_policy(PolicyName="ReplicaOwnerPolicy", PolicyDocument=json.dumps(DOCUMENT))
    return str(made["Policy"]["Arn"])


def keeper(policy: str, **kwargs: Any) -> IdentityKeeper:
    return IdentityKeeper(ReplicaIdentities(STACK, policy, **kwargs), IdentityRecords(Table(TABLE)))


def profiles(**kwargs: Any) -> OwnerProfiles:
    """The reconciler's view, as one run has it."""
    return OwnerProfiles(STACK, IdentityRecords(Table(TABLE)), **kwargs)


def request_of(owner: str) -> LaunchRequest:
    spec = ServiceSpec.model_validate(spec_dict(8080, replicas=1))
    return LaunchRequest(service="web", uid="0011223344556677", version=1, replica_id=1, spec=spec, owner=owner)


def scope(owner: str) -> str:
    found = owner_scope(owner)
    assert found is not None
    return found


def assert_whole(iam: Any, owner: str, policy: str) -> None:
    name = role_name(STACK, scope(owner))
    role = iam.get_role(RoleName=name)["Role"]
    assert role["Path"] == role_path(STACK)
    assert role["PermissionsBoundary"]["PermissionsBoundaryArn"] == policy
    assert {t["Key"]: t["Value"] for t in role["Tags"]}[SCOPE_TAG] == scope(owner)
    attached = iam.list_attached_role_policies(RoleName=name)["AttachedPolicies"]
    assert [p["PolicyArn"] for p in attached] == [policy]
    assert iam.list_role_policies(RoleName=name)["PolicyNames"] == []
    profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    assert profile["Path"] == role_path(STACK)
    assert [r["RoleName"] for r in profile["Roles"]] == [name]


def test_the_dispatcher_makes_an_owners_identity_once_records_it_then_only_reads(
    table: str, strict_aws: StrictAws
) -> None:
    policy = owner_policy()
    report = keeper(policy).ensure([OWNER_A, OWNER_A, ""])
    assert (report.made, report.recorded, report.refused) == ([scope(OWNER_A)], [scope(OWNER_A)], {})
    assert_whole(raw_client("iam"), OWNER_A, policy)
    record = IdentityRecords(Table(TABLE)).get(scope(OWNER_A))
    assert record is not None and record.profile == role_name(STACK, scope(OWNER_A)) and record.owner == OWNER_A
    # The next period finds it whole and recorded: two reads, no IAM write, no table write.
    writes = {op: strict_aws.attempts_of("iam", op) for op in ("CreateRole", "CreateInstanceProfile")}
    puts = strict_aws.attempts_of("dynamodb", "PutItem")
    again = keeper(policy).ensure([OWNER_A])
    assert (again.made, again.recorded) == ([], [])
    assert {op: strict_aws.attempts_of("iam", op) for op in writes} == writes
    assert strict_aws.attempts_of("dynamodb", "PutItem") == puts


@pytest.mark.parametrize(
    "crashed_after", ["create_role", "attach_role_policy", "create_instance_profile", "add_role_to_instance_profile"]
)
def test_a_dispatch_that_crashed_between_any_two_calls_is_completed_by_the_next(
    table: str, strict_aws: StrictAws, crashed_after: str
) -> None:
    policy = owner_policy()
    iam = raw_client("iam")
    name = role_name(STACK, scope(OWNER_A))
    # What the crashed run got done, in the order ReplicaIdentities makes it (never its record).
    iam.create_role(
        RoleName=name,
        Path=role_path(STACK),
        AssumeRolePolicyDocument="{}",
        PermissionsBoundary=policy,
        Tags=[{"Key": SCOPE_TAG, "Value": scope(OWNER_A)}],
    )
    if crashed_after != "create_role":
        iam.attach_role_policy(RoleName=name, PolicyArn=policy)
    if crashed_after in ("create_instance_profile", "add_role_to_instance_profile"):
        iam.create_instance_profile(InstanceProfileName=name, Path=role_path(STACK))
    if crashed_after == "add_role_to_instance_profile":
        iam.add_role_to_instance_profile(InstanceProfileName=name, RoleName=name)
    report = keeper(policy).ensure([OWNER_A])
    assert report.recorded == [scope(OWNER_A)]
    # A whole identity without its record is recorded, not made again.
    assert report.made == ([] if crashed_after == "add_role_to_instance_profile" else [scope(OWNER_A)])
    assert_whole(iam, OWNER_A, policy)
    assert profiles().profile(scope(OWNER_A)) is not None


def test_names_over_iams_limits_are_refused_before_and_by_iam(strict_aws: StrictAws) -> None:
    with pytest.raises(IdentityError, match="64"):
        role_name("s" * 50, "0" * 16)
    with pytest.raises(IdentityError, match="512"):
        role_path("p" * 600)
    # IAM itself (the strict layer, from botocore's model): moto alone would take both.
    iam = raw_client("iam")
    with pytest.raises(ClientError, match="ValidationError"):
        iam.create_role(RoleName="r" * 65, AssumeRolePolicyDocument="{}")
    with pytest.raises(ClientError, match="ValidationError"):
        iam.create_instance_profile(InstanceProfileName="p", Path="/" + "x" * 512 + "/")


def test_an_owner_whose_identity_is_not_recorded_is_not_launched_and_it_is_the_environment(
    table: str, strict_aws: StrictAws
) -> None:
    driver = Ec2Driver(identities=profiles())
    with pytest.raises(LaunchRefused) as refused:
        driver.launch(request_of(OWNER_A))
    assert refused.value.code == IDENTITY_UNAVAILABLE
    assert OWNER_A in refused.value.message and "dispatcher" in refused.value.message
    assert refusal_cause(refused.value.code) is FailureCause.ENVIRONMENT
    # Nothing was asked of EC2 or IAM: the reconciler's network does not reach IAM at all.
    assert strict_aws.attempts_of("ec2", "RunInstances") == 0
    assert sum(strict_aws.attempts_of("iam", op) for op in ("GetInstanceProfile", "CreateRole")) == 0


def test_ec2_refuses_a_young_profile_which_is_the_environments_fault(table: str, strict_aws: StrictAws) -> None:
    policy = owner_policy()
    keeper(policy).ensure([OWNER_A])
    request = request_of(OWNER_A)
    with pytest.raises(LaunchRefused) as refused:
        Ec2Driver(identities=profiles()).launch(request)
    assert refused.value.code == PROFILE_NOT_READY
    assert refusal_cause(refused.value.code) is FailureCause.ENVIRONMENT
    # Once IAM has propagated it, the same launch (a new driver: the next run) goes through with it.
    strict_aws.iam.settle()
    instance = Ec2Driver(identities=profiles()).launch(request)
    described = raw_client("ec2").describe_instances(InstanceIds=[instance.instance_id])["Reservations"][0]
    profile_arn = described["Instances"][0]["IamInstanceProfile"]["Arn"]
    assert profile_arn.endswith(f"instance-profile{role_path(STACK)}{role_name(STACK, scope(OWNER_A))}")


def test_a_profile_removed_after_the_run_read_its_record_is_the_environments_fault(
    table: str, strict_aws: StrictAws
) -> None:
    policy = owner_policy()
    keeper(policy).ensure([OWNER_A])
    strict_aws.iam.settle()
    an_hour_on = time.time() + 3600  # the record is long past IAM's propagation
    run = profiles(now=lambda: an_hour_on)
    assert run.profile(scope(OWNER_A)) is not None  # the run has read the record
    # Meanwhile the dispatcher's sweep removes it (its owner's last service went): record, then identity.
    assert keeper(policy, now=lambda: an_hour_on + SWEEP_GRACE_SECONDS).sweep([]) == [scope(OWNER_A)]
    with pytest.raises(LaunchRefused) as refused:
        Ec2Driver(identities=run).launch(request_of(OWNER_A))
    assert refused.value.code == PROFILE_NOT_READY
    assert refusal_cause(refused.value.code) is FailureCause.ENVIRONMENT


def test_an_old_recorded_profile_ec2_refuses_is_not_explained_as_iams_delay(table: str, strict_aws: StrictAws) -> None:
    policy = owner_policy()
    keeper(policy).ensure([OWNER_A])
    an_hour_on = time.time() + 3600
    driver = Ec2Driver(identities=profiles(now=lambda: an_hour_on))
    profile = driver._owner_profile(request_of(OWNER_A))
    assert profile is not None
    # Same record, long settled: a refusal naming it is the version's (or the account's), not propagation.
    assert not driver._profile_unsettled(request_of(OWNER_A), profile)
    young = Ec2Driver(identities=profiles())
    young_profile = young._owner_profile(request_of(OWNER_A))
    assert young_profile is not None and young._profile_unsettled(request_of(OWNER_A), young_profile)


def test_a_replica_is_told_its_owners_scoped_names() -> None:
    from dataclasses import replace

    driver = Ec2Driver(secrets_prefix="/fleetkeeper/tbl", workdir_bucket="bucket", replica_log_group="/fk/replicas")
    spec = ServiceSpec.model_validate({**spec_dict(8080, replicas=1), "workdir": {"digest": "sha256:" + "ab" * 32}})
    request = LaunchRequest(
        service="web", uid="0011223344556677", version=1, replica_id=3, spec=spec, secrets_ref="ref0", owner=OWNER_B
    )
    source = driver._boot_source(request)
    assert source.parameter == f"/fleetkeeper/tbl/_o/{scope(OWNER_B)}/web/0011223344556677/ref0"
    assert source.workdir_key == f"services/_o/{scope(OWNER_B)}/web/0011223344556677/{'ab' * 32}.tar.gz"
    assert source.log_stream == f"_o/{scope(OWNER_B)}/web/0011223344556677/3"
    # A service without an owner (written before ownership existed) keeps the legacy names.
    legacy = driver._boot_source(replace(request, owner=""))
    assert legacy.parameter == "/fleetkeeper/tbl/web/0011223344556677/ref0"
    assert legacy.workdir_key == f"services/web/0011223344556677/{'ab' * 32}.tar.gz"
    assert legacy.log_stream == "web/0011223344556677/3"


def _dispatch(world: World, keeper_: IdentityKeeper) -> Any:
    from fleetkeeper import aws
    from fleetkeeper.reconciler.dispatcher import Dispatcher
    from fleetkeeper.reconciler.queue import ShardQueue

    queue = ShardQueue(aws.sqs().create_queue(QueueName="reconcile")["QueueUrl"])
    return Dispatcher(world.reconciler, queue, shard_size=100, period_seconds=60, identities=keeper_).run()


def test_a_new_owners_service_waits_for_the_dispatch_and_iam_without_counting_it_then_converges(
    world: World, strict_aws: StrictAws, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = owner_policy()
    monkeypatch.setenv("TABLE_NAME", TABLE)
    monkeypatch.setenv("FLEETKEEPER_REPLICA_IDENTITY", "owner")
    monkeypatch.setenv("FLEETKEEPER_REPLICA_POLICY_ARN", policy)
    monkeypatch.setenv("FLEETKEEPER_STACK_ID", STACK)
    world.restart()
    spec = ServiceSpec.model_validate(spec_dict(world.server.port, replicas=1))
    world.commands.create("web", spec, owner=OWNER_A)
    launches = strict_aws.attempts_of("ec2", "RunInstances")  # the world's own unmanaged instance
    # A kick's run before any dispatch: no identity yet, so no launch; the environment's delay.
    world.run("web")
    (replica,) = world.store.require("web").replicas.values()
    assert (replica.status, replica.cause) == (ReplicaStatus.FAILED_PROVISION, FailureCause.ENVIRONMENT)
    assert replica.failure_code == IDENTITY_UNAVAILABLE and replica.version_refusals == 0
    assert strict_aws.attempts_of("ec2", "RunInstances") == launches
    # The dispatch makes it (before it hands out the shards); the profile is seconds old to EC2.
    report = _dispatch(world, keeper(policy))
    assert report.identities_made == [scope(OWNER_A)]
    world.run()
    state = world.store.require("web")
    (replica,) = state.replicas.values()
    assert (replica.status, replica.cause) == (ReplicaStatus.FAILED_PROVISION, FailureCause.ENVIRONMENT)
    assert replica.failure_code == PROFILE_NOT_READY
    assert replica.launch_attempts >= 1 and replica.version_refusals == 0
    assert world.instances() == []
    strict_aws.iam.settle()
    world.converge()
    (instance,) = world.instances()
    assert instance["IamInstanceProfile"]["Arn"].endswith(role_name(STACK, scope(OWNER_A)))
    state = world.store.require("web")
    assert [r.version_refusals for r in state.replicas.values()] == [0]
    assert state.versions[1].state.value != "FAILED"
    # The reconciler itself never called IAM (its VPC does not reach it).
    assert strict_aws.attempts_of("iam", "GetInstanceProfile") == 0


def test_owners_with_no_service_left_lose_their_identity_record_first(table: str, strict_aws: StrictAws) -> None:
    policy = owner_policy()
    keeper(policy).ensure([OWNER_A, OWNER_B])
    records = IdentityRecords(Table(TABLE))
    # A role made a moment ago survives a sweep (the index may not list its new service yet).
    assert keeper(policy).sweep([OWNER_A]) == []
    later = keeper(policy, now=lambda: time.time() + SWEEP_GRACE_SECONDS + 1)
    assert later.sweep([OWNER_A, ""]) == [scope(OWNER_B)]
    iam = raw_client("iam")
    assert_whole(iam, OWNER_A, policy)
    assert records.get(scope(OWNER_A)) is not None and records.get(scope(OWNER_B)) is None
    with pytest.raises(ClientError, match="NoSuchEntity"):
        iam.get_role(RoleName=role_name(STACK, scope(OWNER_B)))
    with pytest.raises(ClientError, match="NoSuchEntity"):
        iam.get_instance_profile(InstanceProfileName=role_name(STACK, scope(OWNER_B)))
    # A removal that crashed midway (the record and profile gone, the role left) is finished by the next sweep.
    name_a = role_name(STACK, scope(OWNER_A))
    records.delete(scope(OWNER_A))
    iam.remove_role_from_instance_profile(InstanceProfileName=name_a, RoleName=name_a)
    iam.delete_instance_profile(InstanceProfileName=name_a)
    assert later.sweep([]) == [scope(OWNER_A)]
    assert later.identities.scopes() == {}
    # Roles of the path that are not an owner's (another name) are never touched.
    iam.create_role(RoleName="someone-elses", Path=role_path(STACK), AssumeRolePolicyDocument="{}")
    assert later.sweep([]) == []
    iam.get_role(RoleName="someone-elses")


def test_the_identity_settings_are_read_and_refused_clearly() -> None:
    from fleetkeeper.settings import Ec2Settings, SettingsError

    environ = {
        "TABLE_NAME": "t",
        "FLEETKEEPER_REPLICA_IDENTITY": "owner",
        "FLEETKEEPER_REPLICA_POLICY_ARN": "arn:aws:iam::123456789012:policy/p",
        "FLEETKEEPER_STACK_ID": STACK,
    }
    settings = Ec2Settings.from_env(environ)
    assert (settings.replica_identity, settings.replica_policy_arn, settings.stack_id, settings.table_name) == (
        "owner",
        "arn:aws:iam::123456789012:policy/p",
        STACK,
        "t",
    )
    identities = Ec2Driver.from_settings(settings).identities
    assert isinstance(identities, OwnerProfiles)
    assert (identities.stack_id, identities.records.table.name) == (STACK, "t")
    # Unset: the shared profile (tests, and stacks deployed before replica identity).
    assert Ec2Driver.from_settings(Ec2Settings.from_env({"TABLE_NAME": "t"})).identities is None
    with pytest.raises(SettingsError, match="FLEETKEEPER_REPLICA_POLICY_ARN"):
        Ec2Settings.from_env({**environ, "FLEETKEEPER_REPLICA_POLICY_ARN": ""})
    with pytest.raises(SettingsError, match="'per-service'"):
        Ec2Settings.from_env({**environ, "FLEETKEEPER_REPLICA_IDENTITY": "per-service"})
    with pytest.raises(SettingsError, match="FLEETKEEPER_STACK_ID"):
        Ec2Settings.from_env({**environ, "FLEETKEEPER_STACK_ID": "Has-Hyphens"})


def test_an_identity_iam_will_not_make_is_reported_and_its_owner_waits_as_the_environment(
    table: str, strict_aws: StrictAws
) -> None:
    # A boundary policy that does not exist: IAM refuses CreateRole (as it would a denied permission).
    report = keeper("arn:aws:iam::123456789012:policy/missing").ensure([OWNER_A])
    assert report.made == [] and list(report.refused) == [scope(OWNER_A)]
    assert "NoSuchEntity" in report.refused[scope(OWNER_A)]
    with pytest.raises(LaunchRefused) as refused:
        Ec2Driver(identities=profiles()).launch(request_of(OWNER_A))
    assert refused.value.code == IDENTITY_UNAVAILABLE
    assert refusal_cause(refused.value.code) is FailureCause.ENVIRONMENT


def test_a_dispatch_makes_at_most_its_bound_of_new_identities(table: str, strict_aws: StrictAws) -> None:
    policy = owner_policy()
    owners = [f"arn:aws:iam::123456789012:role/team-{n}" for n in range(5)]
    bounded = IdentityKeeper(ReplicaIdentities(STACK, policy), IdentityRecords(Table(TABLE)), max_made=2)
    first = bounded.ensure(owners)
    assert (len(first.made), first.deferred) == (2, 3)
    second = bounded.ensure(owners)
    assert (len(second.made), second.deferred) == (2, 1)
    assert len(bounded.ensure(owners).made) == 1
    assert bounded.ensure(owners).made == []


def test_a_service_without_an_owner_launches_with_the_shared_profile(table: str, strict_aws: StrictAws) -> None:
    shared = "arn:aws:iam::123456789012:instance-profile/fleetkeeper-replica"
    driver = Ec2Driver(instance_profile_arn=shared, identities=profiles())
    request = request_of("")
    assert driver._run_instances_args(request, driver._owner_profile(request))["IamInstanceProfile"] == {"Arn": shared}
    assert strict_aws.attempts_of("dynamodb", "GetItem") == 0


def test_the_dispatcher_removes_the_identity_of_an_owner_whose_services_are_gone(world: World) -> None:
    from fleetkeeper import aws
    from fleetkeeper.store import keys

    policy = owner_policy()
    keeper(policy).ensure([OWNER_A, OWNER_B])
    spec = ServiceSpec.model_validate(spec_dict(world.server.port, replicas=0))
    world.commands.create("kept", spec, owner=OWNER_A)  # B has no service left
    an_hour_on = keeper(policy, now=lambda: time.time() + SWEEP_GRACE_SECONDS + 1)

    # An index entry whose item cannot vouch for its owner: nothing is removed.
    table = world.store.table.name
    unreadable = {"PK": {"S": "SVC#odd"}, "SK": {"S": "META"}, keys.LIST_PK_ATTR: {"S": keys.LIST_PK_VALUE}}
    aws.dynamodb().put_item(TableName=table, Item={**unreadable, keys.LIST_SK_ATTR: {"S": "odd"}})
    report = _dispatch(world, an_hour_on)
    assert report.identities_removed == []
    aws.dynamodb().delete_item(TableName=table, Key={"PK": {"S": "SVC#odd"}, "SK": {"S": "META"}})

    report = _dispatch(world, an_hour_on)
    assert report.identities_removed == [scope(OWNER_B)]
    assert report.as_dict()["identities_removed"] == [scope(OWNER_B)]
    assert report.identities_made == []  # A's was whole and recorded: nothing to make
    assert set(an_hour_on.identities.scopes()) == {scope(OWNER_A)}
