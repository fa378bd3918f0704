"""Placement: SkyPilot's cpus/memory/accelerators/any_of as candidate EC2 instance types, disk tiers
as root volumes (fleetkeeper.spec.placement, fleetkeeper.spec.catalogue), and how the api shows and refuses them.

Table tests of the pure mapping; the api against moto for the 400s, the notes and the views.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.errors import InvalidRequest
from fleetkeeper.spec import catalogue
from fleetkeeper.spec.placement import MAX_CANDIDATES, RootVolume, parse_accelerators, root_volume
from fleetkeeper.spec.service import ServiceSpec, parse_spec, stored_spec
from tests.support.handler_client import HandlerClient
from tests.support.specs import hello_spec

BASE: dict[str, Any] = {"service": {"readiness_probe": "/health"}, "run": "serve"}


def placed(resources: dict[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    spec = parse_spec({**BASE, "resources": resources})
    placement = spec.resources.placement
    return placement.instance_types, placement.notes


def refusal(resources: dict[str, Any]) -> str:
    with pytest.raises(InvalidRequest) as caught:
        parse_spec({**BASE, "resources": resources})
    return str(caught.value)


# --- the catalogue agrees with AWS ---------------------------------------------------------------


def test_every_catalogue_row_is_what_describe_instance_types_says(aws: None) -> None:
    """Against DescribeInstanceTypes as moto ships it (a capture of AWS's answer): vCPUs, memory, and
    the accelerators' name and count (AWS names p4de's GPU A100; SkyPilot, and the table, A100-80GB)."""
    import boto3

    ec2 = boto3.client("ec2", region_name="us-east-1")
    names = [t.name for t in catalogue.CATALOGUE]
    described: dict[str, Any] = {}
    for start in range(0, len(names), 100):
        for item in ec2.describe_instance_types(InstanceTypes=names[start : start + 100])["InstanceTypes"]:
            described[item["InstanceType"]] = item
    assert sorted(described) == sorted(names)
    aws_names = {"A100-80GB": "A100"}
    for t in catalogue.CATALOGUE:
        item = described[t.name]
        devices = item.get("GpuInfo", {}).get("Gpus", []) + item.get("NeuronInfo", {}).get("NeuronDevices", [])
        found = (item["VCpuInfo"]["DefaultVCpus"], item["MemoryInfo"]["SizeInMiB"] / 1024)
        assert found == (t.vcpus, t.memory_gib), t.name
        expected = [] if t.accelerator is None else [(aws_names.get(t.accelerator, t.accelerator), t.accelerator_count)]
        assert [(d["Name"], d["Count"]) for d in devices] == expected, t.name
        assert item.get("BurstablePerformanceSupported", False) == t.burstable, t.name


# --- accelerators: SkyPilot's spellings over AWS's families ------------------------------------


@pytest.mark.parametrize(
    ("accelerators", "first", "family"),
    [
        ("T4:1", "g4dn.xlarge", "g4dn"),
        ("t4", "g4dn.xlarge", "g4dn"),  # no count: one; any case
        ("T4:4", "g4dn.12xlarge", "g4dn"),
        ("A10G:1", "g5.xlarge", "g5"),
        ("a10g:4", "g5.12xlarge", "g5"),
        ("A10G:8", "g5.48xlarge", "g5"),
        ("L4:1", "g6.xlarge", "g6"),
        ("L4:8", "g6.48xlarge", "g6"),
        ("L40S:1", "g6e.xlarge", "g6e"),
        ("l40s:4", "g6e.12xlarge", "g6e"),
        ("V100:8", "p3dn.24xlarge", "p3dn"),
        ("A100:8", "p4d.24xlarge", "p4d"),
        ("A100-80GB:8", "p4de.24xlarge", "p4de"),
        ("a100-80gb:8", "p4de.24xlarge", "p4de"),
        ("H100:8", "p5.48xlarge", "p5"),
        ("Inferentia2:1", "inf2.xlarge", "inf2"),
        ("Inferentia2:6", "inf2.24xlarge", "inf2"),
        ("inf2:12", "inf2.48xlarge", "inf2"),
        ("Trainium:1", "trn1.2xlarge", "trn1"),
        ("Trainium:16", "trn1.32xlarge", "trn1"),
        ({"A10G": 1}, "g5.xlarge", "g5"),
        ({"L4": None}, "g6.xlarge", "g6"),  # YAML's `{L4}`: a key with a null value
    ],
)
def test_an_accelerator_becomes_the_instance_types_with_exactly_that_many(
    accelerators: Any, first: str, family: str
) -> None:
    # V100 has no Deep Learning AMI fleetkeeper boots: its specs name their image (tests/spec/test_images.py).
    image = {"image_id": "ami-0123456789abcdef0"} if family == "p3dn" else {}
    types, notes = placed({"accelerators": accelerators, **image})
    assert types[0] == first
    assert notes == ()
    name, count = parse_accelerators(accelerators)[0]
    device = catalogue.accelerator(name)
    assert device is not None
    for t in types:  # every candidate carries exactly what was asked for, nothing else
        entry = catalogue.BY_NAME[t]
        assert (entry.accelerator, entry.accelerator_count) == (device.name, count)
        assert entry.family == family


def test_a_set_of_accelerators_is_alternatives_smallest_first() -> None:
    types, notes = placed({"accelerators": {"L4": 1, "A10G": 1}})
    assert notes == ()
    assert types[:4] == ("g6.xlarge", "g5.xlarge", "g6.2xlarge", "g5.2xlarge")
    assert {catalogue.BY_NAME[t].accelerator for t in types} == {"L4", "A10G"}
    sizes = [(catalogue.BY_NAME[t].vcpus, catalogue.BY_NAME[t].memory_gib) for t in types]
    assert sizes == sorted(sizes)


def test_choices_aws_cannot_satisfy_are_dropped_with_a_note_each() -> None:
    # llm/qwen/serve-7b.yaml's set, as YAML reads `{L4, A10g, A10, L40, A40, A100, A100-80GB}`.
    wanted = dict.fromkeys(["L4", "A10g", "A10", "L40", "A40", "A100", "A100-80GB"])
    types, notes = placed({"accelerators": wanted})
    assert {catalogue.BY_NAME[t].accelerator for t in types} == {"L4", "A10G"}
    assert len(types) == MAX_CANDIDATES
    assert notes == (
        "dropped: no AWS instance type has A10",  # A10G is in the set too: A10 is not its typo
        "dropped: no AWS instance type has L40 (did you mean L40S?)",  # L40S is not in the set
        "dropped: no AWS instance type has A40",
        "dropped: no AWS instance type has 1 A100; p4d.24xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1",
        "dropped: no AWS instance type has 1 A100-80GB; p4de.24xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1",
    )


@pytest.mark.parametrize(
    ("accelerators", "message"),
    [
        ("A100:1", "no AWS instance type has 1 A100; p4d.24xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1"),
        ("H100:1", "no AWS instance type has 1 H100; p5.48xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1"),
        ("A10G:2", "no AWS instance type has 2 A10G; g5.xlarge has 1, g5.12xlarge has 4, g5.48xlarge has 8"),
        ("A100:4", "no AWS instance type has 4 A100; p4d.24xlarge has 8; for 4 GPUs use A10G:4, L4:4 or L40S:4"),
        (
            "Inferentia2:2",
            "no AWS instance type has 2 Inferentia2; inf2.xlarge has 1, inf2.24xlarge has 6, inf2.48xlarge has 12",
        ),
        ("V100:1", "no AWS instance type has 1 V100; p3dn.24xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1"),
        ("TPU-v4:8", "no AWS instance type has TPU-v4"),
        ("RTX4090:1", "no AWS instance type has RTX4090"),
        ("A10:1", "no AWS instance type has A10 (did you mean A10G?)"),
    ],
)
def test_a_spec_none_of_whose_choices_aws_has_is_refused_with_what_it_has(accelerators: str, message: str) -> None:
    text = refusal({"accelerators": accelerators})
    # The field at fault, the reason, and every accelerator AWS has with the counts it comes in.
    assert f"spec.resources.accelerators: {message}; {AWS_HAS}" in text, text


AWS_HAS = (
    "AWS has T4 (1 or 4), A10G (1, 4 or 8), L4 (1, 4 or 8), L40S (1, 4 or 8), V100 (8), A100 (8), A100-80GB (8), "
    "H100 (8), Inferentia2 (1, 6 or 12) and Trainium (1 or 16)"
)


def test_requirements_with_no_fitting_size_name_the_nearest() -> None:
    text = refusal({"accelerators": "T4:1", "memory": "512+"})
    nearest = "AWS has e.g. g4dn.16xlarge (64 vCPUs, 256 GiB)"
    assert f"no AWS instance type has 1 T4 with 512+ GiB of memory; {nearest}" in text, text
    text = refusal({"cpus": 3})
    assert "no AWS instance type without accelerators has 3 vCPUs; AWS has e.g." in text


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("A10G:x", "expected NAME or NAME:COUNT"),
        ({"A10G": 0}, "from 1 to 64"),
        ({"A10G": "one"}, "the count must be a whole number from 1 to 64, got 'one'"),
        ({}, "at least one accelerator"),
        ([], "at least one accelerator"),
        ([["A10G:1"]], "each item of an accelerators list is NAME or NAME:COUNT"),
        (5, "expected NAME:COUNT (e.g. A10G:1), a set of alternatives ({L4:1, A10G:1}) or a list"),
    ],
)
def test_malformed_accelerators_name_the_field(value: Any, problem: str) -> None:
    text = refusal({"accelerators": value})
    assert "spec.resources.accelerators" in text and problem in text, text


# --- cpus and memory ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        # `2+` without memory: at least 2 GiB a vCPU, smallest first, fixed-performance before burstable.
        ({"cpus": "2+"}, ("c6i.large", "c7i.large", "t3.medium", "m6i.large", "m7i.large")),
        ({"cpus": 2}, ("c6i.large", "c7i.large", "t3.medium", "m6i.large", "m7i.large")),
        ({"cpus": "4", "memory": "32"}, ("r6i.xlarge", "r7i.xlarge")),
        ({"cpus": "4+", "memory": "32+"}, ("r6i.xlarge", "r7i.xlarge", "m6i.2xlarge", "m7i.2xlarge", "t3.2xlarge")),
        ({"memory": "32+"}, ("r6i.xlarge", "r7i.xlarge", "m6i.2xlarge", "m7i.2xlarge", "t3.2xlarge")),
        ({"memory": 16}, ("r6i.large", "r7i.large", "m6i.xlarge", "m7i.xlarge", "t3.xlarge", "c6i.2xlarge")),
        ({"cpus": "0.5+", "memory": "0.5"}, ("t3.nano",)),
        ({"cpus": 192, "memory": 1536}, ("r7i.48xlarge",)),
    ],
)
def test_cpus_and_memory_become_cpu_only_instance_types_smallest_first(
    resources: dict[str, Any], expected: tuple[str, ...]
) -> None:
    types, _ = placed(resources)
    assert types[: len(expected)] == expected
    for t in types:
        assert catalogue.BY_NAME[t].accelerator is None
    ranks = [catalogue.rank(catalogue.BY_NAME[t]) for t in types]
    assert ranks == sorted(ranks)


def test_an_open_ended_request_keeps_the_smallest_candidates_and_says_so() -> None:
    types, notes = placed({"cpus": "2+"})
    assert len(types) == MAX_CANDIDATES
    assert len(notes) == 1 and f"the {MAX_CANDIDATES} smallest are the candidates" in notes[0]


def test_accelerators_with_memory_narrow_to_the_sizes_that_have_it() -> None:
    # examples/serve/llama2/llama2.yaml: memory 32+, T4:1.
    types, notes = placed({"memory": "32+", "accelerators": "T4:1"})
    assert types == ("g4dn.2xlarge", "g4dn.4xlarge", "g4dn.8xlarge", "g4dn.16xlarge")
    assert notes == ()


@pytest.mark.parametrize("value", ["four", "4++", "-1", "0", "1e3", True, "\uff14"])  # a full-width 4
def test_malformed_cpus_are_a_400_naming_the_field(value: Any) -> None:
    text = refusal({"cpus": value})
    assert "spec.resources.cpus" in text, text


# --- instance_type and any_of -------------------------------------------------------------------


def test_an_instance_type_wins_over_requirements_beside_it() -> None:
    assert placed({"instance_type": "g5.2xlarge", "accelerators": "A10G:1", "cpus": "4+"}) == (("g5.2xlarge",), ())
    # Even one the catalogue does not know: it is launched as written.
    assert placed({"instance_type": "m8g.medium"}) == (("m8g.medium",), ())
    assert placed({"instance_type": "m8g.medium", "accelerators": "A10G:1"}) == (("m8g.medium",), ())
    # One of a set of accelerators is enough; one it does not carry is a note, and it still wins.
    assert placed({"instance_type": "g5.xlarge", "accelerators": {"L4": None, "A10G": None}}) == (("g5.xlarge",), ())
    assert placed({"instance_type": "t3.micro", "accelerators": "A10G:1", "cpus": "4+"}) == (
        ("t3.micro",),
        (
            "instance_type t3.micro wins over accelerators A10G:1, cpus 4+ beside it: "
            "it has 2 vCPUs, 1 GiB and no accelerators",
        ),
    )
    # An instance_type wins even over an accelerator AWS does not have: nothing is refused.
    assert placed({"instance_type": "p4d.24xlarge", "accelerators": "A100:1"})[0] == ("p4d.24xlarge",)


def test_no_requirements_is_the_stacks_default_instance_type() -> None:
    assert placed({}) == ((), ())
    assert placed({"cloud": "aws", "region": "us-east-1"}) == ((), ())


def test_any_of_entries_are_alternatives_over_the_top_level_fields() -> None:
    types, notes = placed(
        {
            "memory": "32+",
            "any_of": [{"accelerators": "L4:1"}, {"accelerators": "A10G:1"}, {"accelerators": "A100:1"}],
        }
    )
    assert types[:4] == ("g6.2xlarge", "g5.2xlarge", "g6.4xlarge", "g5.4xlarge")
    assert notes == (
        "dropped: no AWS instance type has 1 A100; p4d.24xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1",
    )
    # An entry with an instance_type is that type, first.
    types, _ = placed({"any_of": [{"accelerators": "L4:1"}, {"instance_type": "g5.xlarge"}]})
    assert types[:2] == ("g5.xlarge", "g6.xlarge")


def test_any_of_entries_are_checked_field_by_field() -> None:
    text = refusal({"any_of": [{"accelerators": "L4:1", "disk_size": 100}]})
    assert (
        "spec.resources.any_of[0].disk_size: unsupported field: an `any_of` or `ordered` entry chooses the "
        "instance type (cloud, region, zone, infra, instance_type, cpus, memory, accelerators); give `disk_size` "
        "once, beside them in `resources`"
    ) in text, text
    text = refusal({"any_of": [{"acelerators": "L4:1"}]})
    assert "spec.resources.any_of[0].acelerators: unknown field; did you mean `accelerators`?" in text, text
    text = refusal({"any_of": []})
    assert "spec.resources.any_of" in text, text


# --- cloud, region, zone ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("resources", "field", "words"),
    [
        ({"cloud": "gcp"}, "spec.resources.cloud", "fleetkeeper runs on AWS only: cloud 'gcp' is not AWS"),
        ({"cloud": "kubernetes"}, "spec.resources.cloud", "runs on AWS only"),
        ({"region": "us-central1"}, "spec.resources.region", "'us-central1' is not an AWS region name"),
        ({"region": "eastus"}, "spec.resources.region", "not an AWS region name"),
        ({"zone": "us-central1-a"}, "spec.resources.zone", "'us-central1-a' is not an AWS availability zone name"),
        ({"zone": "us-east-1a"}, "spec.resources.zone", "zones come from the stack's subnets"),
    ],
)
def test_clouds_regions_and_zones_that_are_not_aws_are_refused_with_that_reason(
    resources: dict[str, Any], field: str, words: str
) -> None:
    text = refusal(resources)
    assert f"{field}: " in text and words in text, text


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-3", "ap-southeast-7", "us-gov-west-1", "il-central-1"])
def test_aws_region_names_are_aws_regions(region: str) -> None:
    assert catalogue.REGION.match(region)
    assert catalogue.ZONE.match(region + "b")
    assert not catalogue.REGION.match(region + "a")


def test_aws_in_any_case_is_aws() -> None:
    assert placed({"cloud": "AWS", "cpus": 2})[0][0] == "c6i.large"


# --- disks --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "tier", "volume"),
    [
        (None, None, None),
        (100, None, RootVolume(100, "gp3")),  # gp3's own baseline, as before tiers
        (100, "low", RootVolume(100, "gp3", 3000, 125)),
        (100, "medium", RootVolume(100, "gp3", 6000, 250)),
        (100, "high", RootVolume(100, "gp3", 16000, 1000)),
        (100, "best", RootVolume(100, "gp3", 16000, 1000)),
        (100, "ultra", RootVolume(100, "io2", 32000, None)),
        (None, "best", RootVolume(256, "gp3", 16000, 1000)),  # SkyPilot's default disk size
        (1024, "ultra", RootVolume(1024, "io2", 32000, None)),
        # EBS's ratios: gp3 at most 500 IOPS a GiB (never under 3,000), 0.25 MiB/s an IOPS; io2 500 a GiB.
        (8, "medium", RootVolume(8, "gp3", 4000, 250)),
        (8, "high", RootVolume(8, "gp3", 4000, 1000)),
        (8, "ultra", RootVolume(8, "io2", 4000, None)),
        (20, "high", RootVolume(20, "gp3", 10000, 1000)),
    ],
)
def test_disk_tiers_map_to_root_volumes_within_ebs_limits(size: int | None, tier: str | None, volume: Any) -> None:
    assert root_volume(size, tier) == volume
    if volume is not None and volume.volume_type == "gp3" and volume.iops is not None:
        assert 3000 <= volume.iops <= min(16000, 500 * volume.size_gib)
        assert volume.throughput is not None and 125 <= volume.throughput <= min(1000, volume.iops // 4)


def test_an_unknown_disk_tier_names_the_tiers() -> None:
    text = refusal({"disk_tier": "fast"})
    assert "spec.resources.disk_tier" in text and "'low', 'medium', 'high', 'ultra' or 'best'" in text, text


def test_a_disk_tier_with_an_image_parameter_of_unknown_root_device_is_refused() -> None:
    text = refusal({"disk_tier": "high", "image_id": "resolve:ssm:/aws/service/bottlerocket/x/latest/image_id"})
    assert "`disk_tier` with image_id" in text, text


# --- stored specs -------------------------------------------------------------------------------


def test_a_stored_spec_aws_no_longer_satisfies_still_loads_with_no_candidates() -> None:
    text = ServiceSpec.model_validate({**BASE, "resources": {"cpus": 2}}).model_dump_json()
    text = text.replace('"cpus":2', '"cpus":3')
    spec = stored_spec(text)
    assert spec.resources.placement.instance_types == ()
    assert "no AWS instance type without accelerators has 3 vCPUs" in spec.resources.placement.notes[0]


# --- the api ------------------------------------------------------------------------------------


def test_the_api_shows_the_candidates_and_the_notes_of_a_created_version(api: HandlerClient) -> None:
    resources = {"accelerators": {"L4": None, "A100": None}, "disk_tier": "best"}
    response = api.post("/v1/services", {"name": "gpu", "spec": hello_spec(resources=resources)})
    assert response.status == 201, response.body
    placement = response.body["placement"]
    assert placement["instance_types"][0] == "g6.xlarge"
    assert placement["notes"] == [
        "dropped: no AWS instance type has 1 A100; p4d.24xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1"
    ]
    # The spec is kept as written: the candidates are derived, never stored in it.
    assert response.body["spec"]["resources"] == {**resources, "use_spot": False}
    assert api.get("/v1/services/gpu").body["placement"] == placement
    assert api.get("/v1/services/gpu/versions").body["versions"][0]["placement"] == placement


def test_the_api_shows_an_explicit_instance_type_and_the_default_as_none(api: HandlerClient) -> None:
    assert api.post("/v1/services", {"name": "a", "spec": hello_spec()}).body["placement"] == {
        "instance_types": ["t3.micro"],
        "notes": [],
    }
    body = api.post("/v1/services", {"name": "b", "spec": hello_spec(resources={})}).body
    assert body["placement"] == {"instance_types": [], "notes": []}


def test_the_api_refuses_a_spec_aws_cannot_satisfy_and_writes_nothing(api: HandlerClient) -> None:
    response = api.post("/v1/services", {"name": "gpu", "spec": hello_spec(resources={"accelerators": "A100:1"})})
    assert response.status == 400, response.body
    error = response.body["error"]
    assert error["details"] == [
        {
            "field": "spec.resources.accelerators",
            "problem": "no AWS instance type has 1 A100; p4d.24xlarge has 8; for one GPU use A10G:1, L4:1 or L40S:1; "
            + AWS_HAS,
        }
    ]
    assert api.get("/v1/services/gpu").status == 404


@pytest.mark.parametrize(
    ("resources", "field", "words"),
    [
        ({"cloud": "gcp"}, "spec.resources.cloud", "runs on AWS only"),
        ({"region": "us-central1"}, "spec.resources.region", "not an AWS region name"),
        ({"zone": "us-central1-a"}, "spec.resources.zone", "not an AWS availability zone name"),
        ({"region": "eu-west-1"}, "spec.resources.region", "the stack runs in us-east-1"),
        ({"any_of": [{"region": "eu-west-1", "cpus": 2}]}, "spec.resources.any_of[0].region", "runs in us-east-1"),
    ],
)
def test_the_api_refuses_places_that_are_not_the_stacks_with_the_reason(
    api: HandlerClient, resources: dict[str, Any], field: str, words: str
) -> None:
    response = api.post("/v1/services", {"name": "web", "spec": hello_spec(resources=resources)})
    assert response.status == 400, response.body
    details = response.body["error"]["details"]
    assert [d["field"] for d in details] == [field], details
    assert words in details[0]["problem"], details
    assert api.get("/v1/services/web").status == 404


def test_the_stacks_own_region_is_accepted_and_an_update_is_checked_too(api: HandlerClient) -> None:
    created = api.post("/v1/services", {"name": "web", "spec": hello_spec(resources={"region": "us-east-1"})})
    assert created.status == 201, created.body
    updated = api.put("/v1/services/web", {"spec": hello_spec(resources={"region": "eu-west-1"})})
    assert updated.status == 400, updated.body
    assert "the stack runs in us-east-1" in updated.body["error"]["message"]
