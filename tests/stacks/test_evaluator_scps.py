"""tests/support/iam_evaluator.py's service control policies, checked against AWS Organizations' documented
evaluation before the guardrail (infra/guardrails.yaml) is judged with them.

https://docs.aws.amazon.com/organizations/latest/userguide/orgs_manage_policies_scps_evaluation.html
https://docs.aws.amazon.com/organizations/latest/userguide/orgs_manage_policies_scps.html
"""

from __future__ import annotations

from tests.support.iam_evaluator import Decision, Request, evaluate

ACCOUNT = "111122223333"
FULL_AWS_ACCESS = {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
S3_ALL = {"Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
DENY_S3 = {"Statement": [{"Effect": "Deny", "Action": "s3:*", "Resource": "*"}]}
ONLY_EC2 = {"Statement": [{"Effect": "Allow", "Action": "ec2:*", "Resource": "*"}]}
USER = f"arn:aws:iam::{ACCOUNT}:user/alice"


def _get(who: str = USER) -> Request:
    return Request(who, "s3:GetObject", "arn:aws:s3:::bucket/key")


def test_a_deny_list_scp_denies_what_iam_allows() -> None:
    """The page's deny-list strategy: FullAWSAccess beside an SCP that denies S3; a user whose IAM
    policy allows S3 cannot use it."""
    assert evaluate(_get(), [S3_ALL], scps=[FULL_AWS_ACCESS]) is Decision.ALLOW
    assert evaluate(_get(), [S3_ALL], scps=[FULL_AWS_ACCESS, DENY_S3]) is Decision.EXPLICIT_DENY


def test_an_allow_list_scp_allows_only_what_it_names() -> None:
    """The page's allow-list strategy: FullAWSAccess removed, an SCP allowing EC2 only: S3 is denied
    though IAM allows it (implicitly: nothing allows it at that level)."""
    assert evaluate(_get(), [S3_ALL], scps=[ONLY_EC2]) is Decision.IMPLICIT_DENY


def test_an_scp_grants_nothing() -> None:
    """ "SCPs alone are not sufficient to granting permissions": without an IAM policy, nothing."""
    assert evaluate(_get(), [], scps=[FULL_AWS_ACCESS]) is Decision.IMPLICIT_DENY


def test_the_root_user_of_a_member_account_is_filtered_too() -> None:
    root = f"arn:aws:iam::{ACCOUNT}:root"
    assert evaluate(_get(root), [S3_ALL], scps=[FULL_AWS_ACCESS, DENY_S3]) is Decision.EXPLICIT_DENY


def test_scps_do_not_filter_service_linked_roles_service_principals_or_the_management_account() -> None:
    """Service-linked roles and the management account's principals are not affected by SCPs (the
    page's words), and a service principal is no principal of the account."""
    linked = (
        f"arn:aws:iam::{ACCOUNT}:role/aws-service-role/replication.dynamodb.amazonaws.com/AWSServiceRoleForDynamoDB"
    )
    assert evaluate(_get(linked), [S3_ALL], scps=[FULL_AWS_ACCESS, DENY_S3]) is Decision.ALLOW
    assert evaluate(_get(), [S3_ALL], scps=[DENY_S3], management_account=True) is Decision.ALLOW
    service = Request("events.amazonaws.com", "sqs:SendMessage", f"arn:aws:sqs:us-east-1:{ACCOUNT}:q")
    queue = {
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": "events.amazonaws.com"}, "Action": "sqs:*", "Resource": "*"}
        ]
    }
    deny_sqs = {"Statement": [{"Effect": "Deny", "Action": "sqs:*", "Resource": "*"}]}
    assert evaluate(service, [], resource=[queue], scps=[FULL_AWS_ACCESS, deny_sqs]) is Decision.ALLOW


def test_an_scp_deny_beats_a_resource_policy_naming_the_principal() -> None:
    bucket = {"Statement": [{"Effect": "Allow", "Principal": {"AWS": USER}, "Action": "s3:*", "Resource": "*"}]}
    assert evaluate(_get(), [], resource=[bucket]) is Decision.ALLOW
    assert evaluate(_get(), [], resource=[bucket], scps=[FULL_AWS_ACCESS, DENY_S3]) is Decision.EXPLICIT_DENY
