"""The strict layer's IAM (tests/strict_aws/iam.py): an instance profile is refused by RunInstances
until IAM has propagated it (after it is made, and again after it gets its role), as AWS does."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from botocore.exceptions import ClientError

from tests.strict_aws.iam import PROPAGATION_SECONDS
from tests.support.reconciler_world import raw_client

if TYPE_CHECKING:
    from tests.strict_aws import StrictAws


def _launch(profile: dict[str, str]) -> str:
    made = raw_client("ec2").run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, IamInstanceProfile=profile)
    return str(made["Instances"][0]["InstanceId"])


def test_a_new_profile_is_invalid_to_ec2_until_it_has_propagated(strict_aws: StrictAws) -> None:
    iam = raw_client("iam")
    iam.create_role(RoleName="r", AssumeRolePolicyDocument="{}")
    arn = iam.create_instance_profile(InstanceProfileName="young")["InstanceProfile"]["Arn"]
    iam.add_role_to_instance_profile(InstanceProfileName="young", RoleName="r")
    for profile in ({"Name": "young"}, {"Arn": arn}):
        with pytest.raises(ClientError) as refused:
            _launch(profile)
        assert refused.value.response["Error"]["Code"] == "InvalidParameterValue"
        assert "Invalid IAM Instance Profile" in refused.value.response["Error"]["Message"]
    strict_aws.clock.advance(PROPAGATION_SECONDS - 0.5)
    with pytest.raises(ClientError, match="InvalidParameterValue"):
        _launch({"Name": "young"})
    strict_aws.clock.advance(0.5)
    assert _launch({"Name": "young"}).startswith("i-")
    # Getting a role again is a change IAM propagates again.
    iam.remove_role_from_instance_profile(InstanceProfileName="young", RoleName="r")
    iam.add_role_to_instance_profile(InstanceProfileName="young", RoleName="r")
    with pytest.raises(ClientError, match="InvalidParameterValue"):
        _launch({"Name": "young"})
    strict_aws.iam.settle()
    assert _launch({"Name": "young"}).startswith("i-")
