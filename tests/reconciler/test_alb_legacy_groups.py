"""A target group named before stacks had ids (`fk-<uid>`) that the table records is tagged with this
stack's id before anything changes it, and only while it has none: the grant that allows the tag
(template.yaml's AdoptUntaggedTargetGroups) carries `Null: aws:ResourceTag/fleetkeeper:stack`, so IAM
denies AddTags on a group that carries it, and tagging it at every registration would fail every
registration after the first (tests/stacks/test_isolation_iam.py pins the grant's condition)."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.reconciler.balancers.alb.target_groups import TargetGroups
from fleetkeeper.settings import AlbSettings

STACK = "0123456789ab"
LEGACY = "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/fk-00c0ffee00c0ffee/1111"
OWN = f"arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/fk-{STACK}-00c0ffee00c0ffee/2222"


class RecordingElb:
    """ELB's DescribeTags and AddTags over one dict of tags per group, every call recorded."""

    def __init__(self, tags: dict[str, dict[str, str]]) -> None:
        self.tags = tags
        self.calls: list[tuple[str, str]] = []

    def describe_tags(self, ResourceArns: list[str]) -> dict[str, Any]:
        (arn,) = ResourceArns
        self.calls.append(("DescribeTags", arn))
        return {
            "TagDescriptions": [
                {"ResourceArn": arn, "Tags": [{"Key": k, "Value": v} for k, v in self.tags[arn].items()]}
            ]
        }

    def add_tags(self, ResourceArns: list[str], Tags: list[dict[str, str]]) -> dict[str, Any]:
        (arn,) = ResourceArns
        self.calls.append(("AddTags", arn))
        self.tags[arn].update({t["Key"]: t["Value"] for t in Tags})
        return {}


@pytest.fixture
def elb(monkeypatch: pytest.MonkeyPatch) -> RecordingElb:
    fake = RecordingElb({LEGACY: {"fleetkeeper:managed": "true"}, OWN: {"fleetkeeper:stack": STACK}})
    monkeypatch.setattr(TargetGroups, "elbv2", property(lambda self: fake))
    return fake


def test_a_legacy_group_is_tagged_once_and_then_only_asked_about_once_a_run(elb: RecordingElb) -> None:
    groups = TargetGroups(AlbSettings(stack_id=STACK))

    groups._adopt_recorded(LEGACY)
    groups._adopt_recorded(LEGACY)  # the run's next registration: already known tagged
    groups.forget()  # the next run
    groups._adopt_recorded(LEGACY)
    groups._adopt_recorded(LEGACY)

    assert elb.calls == [("DescribeTags", LEGACY), ("AddTags", LEGACY), ("DescribeTags", LEGACY)]
    assert elb.tags[LEGACY] == {"fleetkeeper:managed": "true", "fleetkeeper:stack": STACK}


def test_a_group_named_with_this_stacks_id_is_never_asked_about(elb: RecordingElb) -> None:
    groups = TargetGroups(AlbSettings(stack_id=STACK))

    groups._adopt_recorded(OWN)

    assert elb.calls == []
