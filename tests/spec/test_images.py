"""GPU and Neuron images: an accelerated instance type without `image_id` boots AWS's Deep Learning
AMI by its public SSM parameter (fleetkeeper.spec.images), sized on its own root device; what no DLAMI
drives and disks smaller than the image are refused when the spec is accepted.

Table tests of the pure choice over the whole catalogue; RunInstances' arguments as the ec2 driver
builds them (no AWS call for a parameter's image); the api for the 400s.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from typing import Any

import pytest

from fleetkeeper.errors import InvalidRequest
from fleetkeeper.reconciler.driver import LaunchRefused, LaunchRequest
from fleetkeeper.reconciler.drivers.ec2 import NO_IMAGE, Ec2Driver
from fleetkeeper.settings import DEFAULT_IMAGE_PARAMETER
from fleetkeeper.spec import catalogue, images
from fleetkeeper.spec.images import GPU_DLAMI_PARAMETER, NEURON_DLAMI_PARAMETER, NoImage, image_for
from fleetkeeper.spec.service import PUBLIC_PARAMETERS, ServiceSpec, parse_spec, root_device_of_parameter, stored_spec
from tests.support.handler_client import HandlerClient
from tests.support.public_images import publish_deep_learning_amis
from tests.support.reconciler_world import World, tags
from tests.support.specs import hello_spec

BASE: dict[str, Any] = {"service": {"readiness_probe": "/health"}, "run": "serve"}
DEFAULT = "/stack/default/ami"
AMI = "ami-0123456789abcdef0"


def _kind(t: catalogue.InstanceType) -> str | None:
    device = catalogue.accelerator(t.accelerator) if t.accelerator else None
    return device.kind if device is not None else None


# --- the choice, over the whole catalogue ----------------------------------------------------------


@pytest.mark.parametrize("t", catalogue.CATALOGUE, ids=lambda t: t.name)
def test_every_catalogue_type_boots_its_families_image_or_is_refused_by_name(t: catalogue.InstanceType) -> None:
    kind = _kind(t)
    if t.family == "p3dn":  # V100: not among the OSS-driver DLAMI's supported instances
        with pytest.raises(NoImage, match=r"p3dn\.24xlarge \(8 V100\).*give resources\.image_id"):
            image_for(t.name, None, DEFAULT)
    elif kind == catalogue.GPU:
        assert image_for(t.name, None, DEFAULT) == f"resolve:ssm:{GPU_DLAMI_PARAMETER}"
    elif kind == catalogue.NEURON:
        assert image_for(t.name, None, DEFAULT) == f"resolve:ssm:{NEURON_DLAMI_PARAMETER}"
    else:
        assert image_for(t.name, None, DEFAULT) == f"resolve:ssm:{DEFAULT}"
    # The spec's image always wins, an AMI id or a parameter, whatever the type.
    assert image_for(t.name, AMI, DEFAULT) == AMI
    assert image_for(t.name, "resolve:ssm:/aws/service/x", DEFAULT) == "resolve:ssm:/aws/service/x"


def test_only_the_v100_has_no_image_and_every_dlami_family_is_in_the_catalogue() -> None:
    refused = set()
    for t in catalogue.CATALOGUE:
        try:
            images.dlami_for(t.name)
        except NoImage:
            refused.add(t.name)
    assert refused == {"p3dn.24xlarge"}
    families = {t.family for t in catalogue.CATALOGUE}
    assert images.GPU_DLAMI.families <= families and images.NEURON_DLAMI.families <= families


def test_a_type_the_catalogue_does_not_know_boots_the_default() -> None:
    assert image_for("x9z.48xlarge", None, DEFAULT) == f"resolve:ssm:{DEFAULT}"
    assert images.dlami_for("x9z.48xlarge") is None


def test_the_default_image_is_canonicals_current_ubuntu_lts_its_arm64_build_for_graviton_types() -> None:
    # Canonical's parameter tree: .../ubuntu/<product>/<release>/stable/current/<arch>/hvm/<volume>/ami-id.
    assert DEFAULT_IMAGE_PARAMETER == images.UBUNTU_PARAMETER
    ubuntu = "/aws/service/canonical/ubuntu/server/24.04/stable/current/{}/hvm/ebs-gp3/ami-id"
    assert ubuntu.format("amd64") == DEFAULT_IMAGE_PARAMETER
    assert DEFAULT_IMAGE_PARAMETER.startswith(PUBLIC_PARAMETERS)
    arm = ubuntu.format("arm64")
    for graviton in ("m7g.large", "c7gn.xlarge", "t4g.small", "r8gd.2xlarge", "a1.large", "im4gn.large"):
        assert image_for(graviton, None, DEFAULT_IMAGE_PARAMETER) == f"resolve:ssm:{arm}"
    for x86 in ("t3.small", "c6i.large", "m7i-flex.large", "g4ad.xlarge", "u7i-12tb.224xlarge"):
        assert image_for(x86, None, DEFAULT_IMAGE_PARAMETER) == f"resolve:ssm:{DEFAULT_IMAGE_PARAMETER}"
    # Amazon Linux's public parameters have their arm64 build too; a stack's own parameter is one image.
    al2023 = "/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64"
    assert images.for_architecture(al2023, "m7g.large") == al2023.replace("-x86_64", "-arm64")
    assert images.for_architecture(DEFAULT, "m7g.large") == DEFAULT
    assert images.for_architecture(arm, "m7g.large") == arm


def test_the_graviton_rule_holds_for_every_instance_type_aws_lists() -> None:
    """EC2's names against DescribeInstanceTypes as moto captures it (ProcessorInfo.SupportedArchitectures)."""
    from moto.utilities.utils import load_resource

    listed = load_resource("ec2/resources/instance_types.json")
    assert len(listed) > 1000
    wrong = {
        name: info["ProcessorInfo"]["SupportedArchitectures"]
        for name, info in listed.items()
        if images.is_graviton(name) != ("arm64" in info["ProcessorInfo"]["SupportedArchitectures"])
    }
    assert wrong == {}
    assert sum(images.is_graviton(name) for name in listed) > 100


def test_the_parameters_are_aws_public_ones_in_their_documented_formats() -> None:
    # find-dlami-id.html: /aws/service/deeplearning/ami/$architecture/$ami_type/latest/ami-id, the type
    # being the AMI's name without "Deep", "Learning" and "AMI".
    name = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)"
    ami_type = "-".join(w for w in re.split(r"[ ()]+", name.lower()) if w and w not in ("deep", "learning", "ami"))
    assert f"/aws/service/deeplearning/ami/x86_64/{ami_type}/latest/ami-id" == GPU_DLAMI_PARAMETER
    assert images.GPU_DLAMI.name == name
    # The Neuron DLAMI User Guide: <prefix>/latest/image_id, the multi-framework Ubuntu 24.04 prefix.
    assert NEURON_DLAMI_PARAMETER == "/aws/service/neuron/dlami/multi-framework/ubuntu-24.04/latest/image_id"
    for parameter in (GPU_DLAMI_PARAMETER, NEURON_DLAMI_PARAMETER):
        assert parameter.startswith(PUBLIC_PARAMETERS)  # what the reconciler may have EC2 resolve


@pytest.mark.parametrize(
    ("parameter", "device"),
    [
        (GPU_DLAMI_PARAMETER, "/dev/sda1"),
        (NEURON_DLAMI_PARAMETER, "/dev/sda1"),
        ("/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id", "/dev/sda1"),
        (
            "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-amazon-linux-2023/latest/ami-id",
            "/dev/xvda",
        ),
        ("/aws/service/neuron/dlami/multi-framework/amazon-linux-2023/latest/image_id", "/dev/xvda"),
        ("resolve:ssm:/aws/service/neuron/dlami/base/ubuntu-24.04/latest/image_id", "/dev/sda1"),
        # A DLAMI of another OS is not known: no device is guessed.
        ("/aws/service/deeplearning/ami/x86_64/base-proprietary-amazon-linux-2/latest/ami-id", None),
        ("/aws/service/neuron/dlami/x/latest/image_id", None),
        # The families known before: the default image is Canonical's Ubuntu (its arm64 build too).
        (DEFAULT_IMAGE_PARAMETER, "/dev/sda1"),
        (images.for_architecture(DEFAULT_IMAGE_PARAMETER, "m7g.large"), "/dev/sda1"),
        ("/aws/service/ami-amazon-linux-latest/al2023-ami-kernel-default-x86_64", "/dev/xvda"),
    ],
)
def test_deep_learning_amis_root_devices_follow_their_os(parameter: str, device: str | None) -> None:
    assert root_device_of_parameter(parameter) == device


# --- accepting a spec --------------------------------------------------------------------------------


def refusal(resources: dict[str, Any]) -> str:
    with pytest.raises(InvalidRequest) as caught:
        parse_spec({**BASE, "resources": resources})
    return str(caught.value)


def test_a_v100_without_image_id_is_refused_and_with_one_accepted() -> None:
    text = refusal({"accelerators": "V100:8"})
    assert "spec.resources" in text and "p3dn.24xlarge (8 V100) has no Deep Learning AMI" in text, text
    assert "give resources.image_id" in text, text
    assert refusal({"accelerators": {"V100": 8, "A100": 8}})  # any candidate without an image
    spec = parse_spec({**BASE, "resources": {"accelerators": "V100:8", "image_id": AMI}})
    assert spec.resources.placement.instance_types == ("p3dn.24xlarge",)
    # A stored one still loads (its launch is refused, below).
    stored = stored_spec(json.dumps({**BASE, "resources": {"accelerators": "V100:8"}}))
    assert stored.resources.placement.instance_types == ("p3dn.24xlarge",)


@pytest.mark.parametrize(
    ("resources", "least"),
    [
        ({"accelerators": "A10G:1", "disk_size": 50}, 75),
        ({"accelerators": {"L4": 1, "Inferentia2": 1}, "disk_size": 80}, 100),
        ({"instance_type": "trn1.2xlarge", "disk_size": 99}, 100),
        ({"accelerators": "H100:8", "disk_size": 74, "disk_tier": "high"}, 75),
    ],
)
def test_a_disk_smaller_than_the_deep_learning_ami_is_refused_with_the_size_to_give(
    resources: dict[str, Any], least: int
) -> None:
    text = refusal(resources)
    assert f"disk_size {resources['disk_size']} is smaller than the root volume" in text, text
    assert f"give disk_size {least} or more, or leave it out" in text, text


@pytest.mark.parametrize(
    "resources",
    [
        {"accelerators": "A10G:1", "disk_size": 75},
        {"accelerators": "A10G:1"},  # the image's own root volume
        {"accelerators": "A10G:1", "disk_tier": "best"},  # 256 GB
        {"instance_type": "inf2.xlarge", "disk_size": 100},
        {"accelerators": "A10G:1", "disk_size": 30, "image_id": AMI},  # the spec's image: its own business
        {"cpus": 2, "disk_size": 8},  # the default image: no floor
    ],
)
def test_disks_the_image_fits_on_are_accepted(resources: dict[str, Any]) -> None:
    parse_spec({**BASE, "resources": resources})


def test_the_api_answers_the_refusals_as_400s_naming_spec_resources(api: HandlerClient) -> None:
    for name, resources, words in [
        ("v100", {"accelerators": "V100:8"}, "has no Deep Learning AMI"),
        ("small", {"accelerators": "L4:1", "disk_size": 40}, "give disk_size 75 or more"),
    ]:
        answer = api.post("/v1/services", {"name": name, "spec": hello_spec(resources=resources)})
        assert answer.status == 400, answer.body
        details = answer.body["error"]["details"]
        assert [d["field"] for d in details] == ["spec.resources"], details
        assert words in details[0]["problem"], details
        assert api.get(f"/v1/services/{name}").status == 404
    ok = hello_spec(resources={"accelerators": "L4:1", "disk_size": 100})
    assert api.post("/v1/services", {"name": "ok", "spec": ok}).status == 201


# --- RunInstances ------------------------------------------------------------------------------------


def _request(resources: dict[str, Any], replica_id: int = 0, stored: bool = False) -> LaunchRequest:
    data = hello_spec(resources=resources)
    spec = ServiceSpec.model_validate(data, context={"fleetkeeper.stored": True} if stored else None)
    return LaunchRequest(service="svc", uid="u1", version=3, replica_id=replica_id, spec=spec)


@pytest.mark.parametrize(
    ("resources", "instance_type", "image", "device"),
    [
        ({"accelerators": "A10G:1", "disk_size": 200}, "g5.xlarge", f"resolve:ssm:{GPU_DLAMI_PARAMETER}", "/dev/sda1"),
        (
            {"accelerators": "H100:8", "disk_tier": "high"},
            "p5.48xlarge",
            f"resolve:ssm:{GPU_DLAMI_PARAMETER}",
            "/dev/sda1",
        ),
        (
            {"instance_type": "inf2.xlarge", "disk_size": 120},
            "inf2.xlarge",
            f"resolve:ssm:{NEURON_DLAMI_PARAMETER}",
            "/dev/sda1",
        ),
        ({"cpus": 2, "disk_size": 40}, "c6i.large", f"resolve:ssm:{DEFAULT_IMAGE_PARAMETER}", "/dev/sda1"),
        (
            {"instance_type": "m7g.large", "disk_size": 40},
            "m7g.large",
            "resolve:ssm:/aws/service/canonical/ubuntu/server/24.04/stable/current/arm64/hvm/ebs-gp3/ami-id",
            "/dev/sda1",
        ),
    ],
)
def test_run_instances_boots_the_launched_types_image_and_sizes_its_root_device(
    resources: dict[str, Any], instance_type: str, image: str, device: str
) -> None:
    args = Ec2Driver()._run_instances_args(_request(resources))
    assert (args["InstanceType"], args["ImageId"]) == (instance_type, image)
    [mapping] = args["BlockDeviceMappings"]
    assert mapping["DeviceName"] == device


def test_without_a_disk_the_deep_learning_ami_keeps_its_own_root_volume() -> None:
    args = Ec2Driver()._run_instances_args(_request({"accelerators": "L4:1"}))
    assert args["ImageId"] == f"resolve:ssm:{GPU_DLAMI_PARAMETER}"
    assert "BlockDeviceMappings" not in args


def test_the_specs_image_wins_over_the_deep_learning_ami() -> None:
    args = Ec2Driver()._run_instances_args(_request({"accelerators": "L4:1", "image_id": "resolve:ssm:/aws/service/x"}))
    assert args["ImageId"] == "resolve:ssm:/aws/service/x"


def test_a_stored_v100_spec_without_image_id_is_refused_not_launched_on_a_driverless_image() -> None:
    with pytest.raises(LaunchRefused) as refused:
        Ec2Driver()._run_instances_args(_request({"accelerators": "V100:8"}, stored=True))
    assert refused.value.code == NO_IMAGE
    assert "p3dn.24xlarge" in str(refused.value)


def test_the_same_launch_renders_byte_identical_arguments() -> None:
    """The ClientToken finds the first launch only when a retry sends the same request: the image and
    the task variables derive from the request and the instance type alone."""
    request = _request({"accelerators": {"L4": 1, "A10G": 1}, "disk_size": 100}, replica_id=4)
    first, again = Ec2Driver()._run_instances_args(request), Ec2Driver()._run_instances_args(request)
    assert first == again
    data = bytes(first["UserData"])  # type: ignore[arg-type]
    script = (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()
    assert "SKYPILOT_NUM_GPUS_PER_NODE" in _files(script)["/opt/fleetkeeper/task.env"]


def _files(script: str) -> dict[str, str]:
    found = re.findall(r"^echo '([A-Za-z0-9+/=]+)' \| base64 -d > (\S+)$", script, flags=re.MULTILINE)
    return {path: base64.b64decode(encoded).decode() for encoded, path in found}


# --- a reconcile run, on the strict-AWS layer (EC2 resolves the parameter from SSM) ---------------------


def test_a_gpu_service_boots_the_deep_learning_ami_ec2_resolves(world: World) -> None:
    published = publish_deep_learning_amis()
    created = world.create(resources={"accelerators": "L4:1", "disk_size": 100})
    world.run()
    launched = [i for i in world.instances() if tags(i).get("fleetkeeper:uid") == created.service.uid]
    assert len(launched) == 2
    ec2 = World._raw_ec2()
    for instance in launched:
        assert instance["InstanceType"] == "g6.xlarge"
        assert instance["ImageId"] == published[GPU_DLAMI_PARAMETER]
        [root] = [m for m in instance["BlockDeviceMappings"] if m["DeviceName"] == "/dev/sda1"]
        assert ec2.describe_volumes(VolumeIds=[root["Ebs"]["VolumeId"]])["Volumes"][0]["Size"] == 100
        attribute = ec2.describe_instance_attribute(InstanceId=instance["InstanceId"], Attribute="userData")
        data = base64.b64decode(attribute["UserData"]["Value"])
        task = _files((gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode())[
            "/opt/fleetkeeper/task.env"
        ]
        replica_id = int(tags(instance)["fleetkeeper:replica-id"])
        assert 'SKYPILOT_NUM_GPUS_PER_NODE="1"\n' in task
        assert f'SKYPILOT_SERVE_REPLICA_ID="{replica_id + 1}"\n' in task
