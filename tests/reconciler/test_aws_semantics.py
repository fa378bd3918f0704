"""The reconciler on AWS's semantics (the strict layer), where moto is kinder than AWS.

- a read may show half of a TransactWriteItems: a service without its target version is not
  observed, and the run writes nothing for it;
- one service whose items do not decode does not stop the run, and its instances are spared;
- an instance is fleetkeeper's by its ClientToken, not by tags anyone can copy;
- images named by SSM parameters are resolved by EC2 (no SSM call), and the root device of a
  disk_size launch is never a silent guess.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper import aws as aws_clients
from fleetkeeper.model import ReplicaStatus, ServiceStatus, to_iso
from fleetkeeper.reconciler.driver import (
    MANAGED_TAG,
    REPLICA_TAG,
    SERVICE_TAG,
    STACK_TAG,
    UID_TAG,
    VERSION_TAG,
    Instance,
    InstanceState,
    LaunchRefused,
    LaunchRequest,
)
from fleetkeeper.reconciler.drivers.ec2 import NO_INSTANCE_TYPE, UNKNOWN_ROOT_DEVICE, Ec2Driver
from fleetkeeper.reconciler.plan import launched_by_fleetkeeper, plan
from fleetkeeper.settings import DEFAULT_IMAGE_PARAMETER, DEFAULT_STACK_ID
from fleetkeeper.spec.service import ServiceSpec, stored_spec
from fleetkeeper.store.codec import state_from_items
from fleetkeeper.store.errors import CorruptItem
from fleetkeeper.store.keys import service_pk
from tests import REPO_ROOT
from tests.support import TABLE
from tests.support.public_images import publish_deep_learning_amis
from tests.support.reconciler_world import World, assert_converged, instance_state, run_tagged, spec_dict
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws
    from tests.support.handler_client import HandlerClient


def _version_items(item: Any) -> bool:
    return str(item.key_value("SK")).startswith("V#")


# === a. half of a transaction is not an observation ==========================================


def test_a_new_service_read_without_its_version_gets_nothing_written(strict_aws: StrictAws, world: World) -> None:
    world.create(replicas=1)
    # The run's reads: the services index (no version item there), then the service's partition.
    strict_aws.dynamodb.tear_next_read(_version_items, times=2)
    mark = world.log.mark()

    report = world.run()

    assert {t.stale for t in strict_aws.dynamodb.torn_reads} == {(1,)}  # the version item, unseen
    assert report.unobserved == ["svc"] and report.errors == []
    assert world.log.mutations(mark) == []  # no FAILED, no status, no claim, no launch
    state = world.store.require("svc")
    assert state.service.status is ServiceStatus.NO_REPLICA and state.replicas == {}
    world.converge()
    assert_converged(world, replicas=1)


def test_an_update_read_without_its_new_version_keeps_the_running_replicas(strict_aws: StrictAws, world: World) -> None:
    world.create(replicas=2)
    world.converge()
    before = world.store.require("svc")
    world.update(replicas=2, envs={"NEW": "1"})
    strict_aws.dynamodb.tear_next_read(_version_items, times=2)
    mark = world.log.mark()

    report = world.run()

    assert report.unobserved == ["svc"]
    assert world.log.mutations(mark) == []  # nothing drained, nothing terminated, no status
    assert world.store.require("svc").replicas == before.replicas
    world.converge()
    assert_converged(world, replicas=2, version=2)


def test_the_planner_plans_nothing_for_a_service_whose_target_version_is_not_visible(world: World) -> None:
    state = world.create(replicas=1)
    torn = type(state)(service=state.service, versions={}, replicas={})
    assert plan(torn, [], {}, world.clock()) == []


# === e. one bad service does not stop the run =================================================


def _put_raw(item: dict[str, Any]) -> None:
    from fleetkeeper.store.codec import to_raw

    aws_clients.dynamodb().put_item(TableName=TABLE, Item=to_raw(item))


@pytest.mark.parametrize("damage", ["replica of a newer schema", "version spec", "service item"])
def test_a_service_whose_items_do_not_decode_is_skipped_and_the_rest_proceed(world: World, damage: str) -> None:
    good = world.create("good", replicas=1)
    bad = world.create("bad", replicas=1)
    world.converge()
    bad_state = world.store.require("bad")
    replica_sk = f"R#{bad.service.uid}#{0:010d}"
    raw = aws_clients.dynamodb().get_item(TableName=TABLE, Key={"PK": {"S": service_pk("bad")}, "SK": {"S": "META"}})
    assert raw["Item"]
    if damage == "replica of a newer schema":
        item = aws_clients.dynamodb().get_item(
            TableName=TABLE, Key={"PK": {"S": service_pk("bad")}, "SK": {"S": replica_sk}}
        )["Item"]
        item["status"] = {"S": "HIBERNATING"}
        aws_clients.dynamodb().put_item(TableName=TABLE, Item=item)
    elif damage == "version spec":
        key = {"PK": {"S": service_pk("bad")}, "SK": {"S": f"V#{bad.service.uid}#{1:010d}"}}
        item = aws_clients.dynamodb().get_item(TableName=TABLE, Key=key)["Item"]
        item["spec"] = {"S": '{"service": 3}'}
        aws_clients.dynamodb().put_item(TableName=TABLE, Item=item)
    else:
        item = raw["Item"]
        del item["generation"]
        aws_clients.dynamodb().put_item(TableName=TABLE, Item=item)
    bad_instance = bad_state.replicas[0].instance_id
    world.update("good", replicas=2)
    world.clock.advance(3600)  # far past the orphan grace period

    report = world.run()

    assert list(report.unloadable) == ["bad"], report.as_dict()
    assert "does not decode" not in report.unloadable["bad"]  # the fact, not the log line
    assert report.errors == []
    live = {i["InstanceId"]: i for i in world.instances()}
    assert bad_instance in live  # neither a service's nor an orphan's to terminate
    world.converge()
    assert_converged(world, "good", replicas=2, version=2)
    assert world.store.require("good").service.uid == good.service.uid


def test_the_codec_names_the_item_that_does_not_decode() -> None:
    meta = {"PK": "SVC#x", "SK": "META", "name": "x", "uid": "u"}
    with pytest.raises(CorruptItem) as caught:
        state_from_items([meta])
    assert (caught.value.name, caught.value.sk) == ("x", "META")
    assert "generation" in caught.value.problem


# === f. ownership by ClientToken ==============================================================


def test_describe_instances_reports_the_client_token(world: World) -> None:
    made = run_tagged({MANAGED_TAG: "true", STACK_TAG: DEFAULT_STACK_ID}, client_token="fk-u-0")
    found = [i for i in Ec2Driver().list_instances() if i.instance_id == made]
    assert [i.client_token for i in found] == ["fk-u-0"]


def test_an_instance_with_copied_tags_is_neither_adopted_nor_terminated(world: World) -> None:
    state = world.create(replicas=1)
    uid = state.service.uid
    copied = {
        MANAGED_TAG: "true",
        STACK_TAG: DEFAULT_STACK_ID,
        SERVICE_TAG: "svc",
        UID_TAG: uid,
        VERSION_TAG: "1",
        REPLICA_TAG: "0",
    }
    # Someone with ec2:CreateTags makes instances that look like replica 0, a duplicate of it, and an
    # orphan of a service that is gone, before and after fleetkeeper launches.
    early = run_tagged(copied)
    orphan_like = run_tagged({**copied, UID_TAG: "gone", SERVICE_TAG: "gone"}, "fk-gone-0-x")
    world.converge()
    late = run_tagged(copied, client_token=f"fk-{uid}-0-01")
    world.clock.advance(3600)
    report = world.run()

    state = world.store.require("svc")
    assert state.service.status is ServiceStatus.READY
    record = state.replicas[0]
    assert record.instance_id not in {early, late, orphan_like}
    assert {instance_state(early), instance_state(late), instance_state(orphan_like)} == {"running"}
    assert sorted(report.foreign) == sorted([early, late, orphan_like])


@pytest.mark.parametrize(
    ("token", "ours"),
    [
        ("fk-u1-3", True),
        ("fk-u1-3-1", True),
        ("fk-u1-3-12", True),
        (None, False),
        ("", False),
        ("fk-u1-4", False),  # another replica's token
        ("fk-u2-3", False),  # another incarnation's
        ("fk-u1-3-0", False),  # fleetkeeper never appends -0
        ("fk-u1-3-01", False),
        ("fk-u1-3-x", False),
        ("fk-u1-31", False),
        ("copied-fk-u1-3", False),
    ],
)
def test_only_a_token_fleetkeeper_derives_for_the_tagged_replica_makes_it_ours(token: str | None, ours: bool) -> None:
    instance = Instance("i-1", InstanceState.RUNNING, "svc", "u1", 1, 3, client_token=token)
    assert launched_by_fleetkeeper(instance) is ours


# === g. images: EC2 resolves parameters, no root device is guessed =============================


def _request(**resources: Any) -> LaunchRequest:
    spec = ServiceSpec.model_validate(hello_spec(resources={"instance_type": "t3.micro", **resources}))
    return LaunchRequest(service="svc", uid="u1", version=1, replica_id=0, spec=spec)


def test_the_default_image_is_resolved_by_ec2_and_its_root_device_is_known(world: World) -> None:
    mark = world.log.mark()
    instance = Ec2Driver().launch(_request(disk_size=40))
    calls = world.log.by_api(mark)
    assert calls == {"ec2:RunInstances": 1}, calls  # no ssm:GetParameter, no DescribeImages
    raw = World._raw_ec2().describe_instances(InstanceIds=[instance.instance_id])["Reservations"][0]["Instances"][0]
    expected = aws_clients.ssm().get_parameter(Name=DEFAULT_IMAGE_PARAMETER)["Parameter"]["Value"]
    assert raw["ImageId"] == expected
    args = Ec2Driver()._run_instances_args(_request(disk_size=40))
    assert args["ImageId"] == f"resolve:ssm:{DEFAULT_IMAGE_PARAMETER}"
    assert args["BlockDeviceMappings"][0]["DeviceName"] == "/dev/sda1"  # Canonical's Ubuntu


def test_a_throttled_describe_images_is_not_a_silent_dev_xvda(strict_aws: StrictAws, world: World) -> None:
    image = World._raw_ec2().describe_images(Owners=["amazon"])["Images"][0]
    strict_aws.throttle("ec2", "DescribeImages", times=50)
    with pytest.raises(Exception, match="RequestLimitExceeded"):
        Ec2Driver().launch(_request(image_id=image["ImageId"], disk_size=40))
    assert world.instances() == []


def test_a_default_parameter_of_an_unknown_family_refuses_a_disk_size_launch(world: World) -> None:
    driver = Ec2Driver(default_image_parameter="/my/golden/ami")
    with pytest.raises(LaunchRefused) as refused:
        driver.launch(_request(disk_size=40))
    assert refused.value.code == UNKNOWN_ROOT_DEVICE
    assert world.instances() == []


def _placed_request(**resources: Any) -> LaunchRequest:
    spec = ServiceSpec.model_validate(hello_spec(resources=resources))
    return LaunchRequest(service="svc", uid="u1", version=1, replica_id=0, spec=spec)


def test_run_instances_gets_the_first_candidate_and_the_disk_tiers_root_volume(world: World) -> None:
    publish_deep_learning_amis()
    mark = world.log.mark()
    request = _placed_request(accelerators={"L4": None, "A10G": None}, disk_size=200, disk_tier="high")
    instance = Ec2Driver().launch(request)
    assert world.log.by_api(mark) == {"ec2:RunInstances": 1}  # the candidates were known at accept time
    args = Ec2Driver()._run_instances_args(request)
    assert args["InstanceType"] == "g6.xlarge"
    assert args["BlockDeviceMappings"] == [
        {
            "DeviceName": "/dev/sda1",  # its Deep Learning AMI's family (Ubuntu), known without a call
            "Ebs": {
                "VolumeSize": 200,
                "VolumeType": "gp3",
                "Iops": 16000,
                "Throughput": 1000,
                "DeleteOnTermination": True,
            },
        }
    ]
    ec2 = World._raw_ec2()
    raw = ec2.describe_instances(InstanceIds=[instance.instance_id])["Reservations"][0]["Instances"][0]
    assert raw["InstanceType"] == "g6.xlarge"
    volume_id = raw["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
    volume = ec2.describe_volumes(VolumeIds=[volume_id])["Volumes"][0]
    assert (volume["Size"], volume["VolumeType"]) == (200, "gp3")


def test_an_ultra_disk_is_io2_on_the_ami_ids_own_root_device(world: World) -> None:
    image = World._raw_ec2().describe_images(Owners=["amazon"])["Images"][0]
    mark = world.log.mark()
    request = _placed_request(image_id=image["ImageId"], cpus="4+", memory="32+", disk_tier="ultra")
    args = Ec2Driver()._run_instances_args(request)
    assert world.log.by_api(mark) == {"ec2:DescribeImages": 1}  # an AMI id's root device is looked up
    assert args["InstanceType"] == "r6i.xlarge"
    assert args["BlockDeviceMappings"] == [
        {
            "DeviceName": image["RootDeviceName"],
            "Ebs": {"VolumeSize": 256, "VolumeType": "io2", "Iops": 32000, "DeleteOnTermination": True},
        }
    ]


def test_an_explicit_instance_type_and_no_requirements_launch_as_before(world: World) -> None:
    assert Ec2Driver()._run_instances_args(_request())["InstanceType"] == "t3.micro"
    args = Ec2Driver(default_instance_type="m7i.large")._run_instances_args(_placed_request())
    assert args["InstanceType"] == "m7i.large"
    assert "BlockDeviceMappings" not in args


def test_a_stored_spec_no_instance_type_satisfies_is_refused_not_launched_as_the_default(world: World) -> None:
    spec = stored_spec('{"service": {"readiness_probe": "/h"}, "resources": {"cpus": 3}, "run": "x"}')
    request = LaunchRequest(service="svc", uid="u1", version=1, replica_id=0, spec=spec)
    with pytest.raises(LaunchRefused) as refused:
        Ec2Driver().launch(request)
    assert refused.value.code == NO_INSTANCE_TYPE
    assert "3 vCPUs" in str(refused.value)
    assert world.instances() == []


def test_a_stored_spec_no_instance_type_satisfies_is_a_refusal_the_version_is_blamed_for(world: World) -> None:
    """Through the shell (whose walk over the pools first asks how many there are): the replica is
    FAILED_PROVISION with the typed code, and the run reports no error."""
    spec = stored_spec('{"service": {"readiness_probe": "/h"}, "resources": {"cpus": 3}, "run": "x"}')
    world.store.create_service("svc", spec, "rolling", to_iso(world.clock()), status_message="created")
    report = world.run()
    assert report.errors == []
    [record] = world.store.require("svc").replicas.values()
    assert (record.status, record.failure_code, record.version_refusals) == (
        ReplicaStatus.FAILED_PROVISION,
        NO_INSTANCE_TYPE,
        1,
    )
    assert world.instances() == []


@pytest.mark.parametrize(
    ("resources", "field", "words"),
    [
        ({"image_id": "resolve:ssm:/my/golden/ami"}, "spec.resources.image_id", "public parameters"),
        (
            {"image_id": "resolve:ssm:/aws/service/bottlerocket/x/latest/image_id", "disk_size": 30},
            "spec.resources",
            "root device",
        ),
        ({"ports": 0}, "spec.resources.ports", "port 0 is not a port: give 1-65535"),
    ],
)
def test_the_api_refuses_what_the_reconciler_could_not_launch_or_reach(
    api: HandlerClient, resources: dict[str, Any], field: str, words: str
) -> None:
    answer = api.post("/v1/services", {"name": "img", "spec": hello_spec(resources=resources)})
    assert answer.status == 400, answer.body
    assert field in str(answer.body) and words in str(answer.body), answer.body
    ok = {"image_id": "resolve:ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/amd64/hvm/ebs-gp3/ami-id"}
    assert api.post("/v1/services", {"name": "ok", "spec": hello_spec(resources={**ok, "disk_size": 30})}).status == 201


def test_a_stored_spec_is_decoded_without_the_rules_for_new_specs() -> None:
    spec = stored_spec(
        '{"service": {"readiness_probe": "/h", "ports": 80}, "resources": {"image_id": "resolve:ssm:/my/ami"},'
        ' "run": "x"}'
    )
    assert (spec.port, spec.resources.image_id) == (80, "resolve:ssm:/my/ami")


# === h. examples work on EC2 unchanged =========================================================


def test_hello_binds_every_interface_unless_host_says_otherwise() -> None:

    import yaml

    root = REPO_ROOT
    run = yaml.safe_load((root / "examples/hello/service.yaml").read_text())["run"]
    assert 'os.environ.get("HOST", "0.0.0.0")' in run


def test_the_process_driver_binds_local_replicas_to_loopback(tmp_path: Any) -> None:
    from fleetkeeper.local.process_driver import ProcessDriver

    driver = ProcessDriver(tmp_path, grace_seconds=0.5)
    spec = ServiceSpec.model_validate(
        {**spec_dict(8080, replicas=1), "envs": {"HOST": "0.0.0.0"}, "run": 'echo "$HOST" > host; sleep 30'}
    )
    try:
        instance = driver.launch(LaunchRequest("svc", "u1", 1, 0, spec))
        assert instance.client_token == "fk-local-u1-0"  # the embedded mode's own stack id
        host = driver.work_dir("svc", "u1", 0) / "host"
        for _ in range(100):
            if host.exists() and host.read_text():
                break
            time.sleep(0.05)
        assert host.read_text().strip() == "127.0.0.1"
        assert driver.find_instance("u1", 0) == instance
    finally:
        driver.stop_all(timeout=2)
