"""tests/support/iam_evaluator.py checked against the evaluation examples of AWS's IAM documentation.

Each case cites the page it comes from; the policies are those pages' examples (names as AWS wrote
them), the expected decisions are what the pages say. Only then is the evaluator trusted with the
stack's own policies (tests/template/test_replica_identity.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.iam_evaluator import Decision, Request, Unsupported, evaluate

ACCOUNT = "123456789012"
CARLOS = f"arn:aws:iam::{ACCOUNT}:user/carlossalazar"

# https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_evaluation-logic_policy-eval-basics.html
# ("Example identity-based and resource-based policy evaluation"): the policy attached to carlossalazar.
CARLOS_POLICY: dict[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Sid": "AllowS3ListRead",
            "Effect": "Allow",
            "Action": [
                "s3:GetBucketLocation",
                "s3:GetAccountPublicAccessBlock",
                "s3:ListAccessPoints",
                "s3:ListAllMyBuckets",
            ],
            "Resource": "arn:aws:s3:::*",
        },
        {
            "Sid": "AllowS3Self",
            "Effect": "Allow",
            "Action": "s3:*",
            "Resource": [
                "arn:aws:s3:::amzn-s3-demo-bucket-carlossalazar/*",
                "arn:aws:s3:::amzn-s3-demo-bucket-carlossalazar",
            ],
        },
        {"Sid": "DenyS3Logs", "Effect": "Deny", "Action": "s3:*", "Resource": "arn:aws:s3:::*log*"},
    ],
}
# The same page: the -logs bucket's policy allows Carlos to put objects into it.
LOGS_BUCKET_POLICY: dict[str, Any] = {
    "Version": "2012-10-17",
    "Statement": [
        {
            "Sid": "AllowCarlosToPut",
            "Effect": "Allow",
            "Principal": {"AWS": CARLOS},
            "Action": "s3:PutObject",
            "Resource": "arn:aws:s3:::amzn-s3-demo-bucket-carlossalazar-logs/*",
        }
    ],
}


def test_carlos_cannot_save_to_the_logs_bucket_the_explicit_deny_wins_over_the_bucket_policy() -> None:
    request = Request(CARLOS, "s3:PutObject", "arn:aws:s3:::amzn-s3-demo-bucket-carlossalazar-logs/file.txt")
    assert evaluate(request, [CARLOS_POLICY], resource=[LOGS_BUCKET_POLICY]) is Decision.EXPLICIT_DENY


def test_carlos_may_use_his_own_bucket_and_list_others() -> None:
    own = Request(CARLOS, "s3:PutObject", "arn:aws:s3:::amzn-s3-demo-bucket-carlossalazar/file.txt")
    assert evaluate(own, [CARLOS_POLICY]) is Decision.ALLOW
    # Action names are case-insensitive (s3:getbucketlocation is s3:GetBucketLocation).
    other = Request(CARLOS, "s3:getbucketlocation", "arn:aws:s3:::someone-elses-bucket")
    assert evaluate(other, [CARLOS_POLICY]) is Decision.ALLOW
    read = Request(CARLOS, "s3:GetObject", "arn:aws:s3:::someone-elses-bucket/a")
    assert evaluate(read, [CARLOS_POLICY]) is Decision.IMPLICIT_DENY


def test_either_an_identity_or_a_resource_policy_allowing_is_enough_within_one_account() -> None:
    """Same page, "Important": if either allows and the other does not, the request is allowed."""
    bucket_policy = {
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": CARLOS},
                "Action": "s3:GetObject",
                "Resource": "arn:aws:s3:::shared-bucket/*",
            }
        ]
    }
    request = Request(CARLOS, "s3:GetObject", "arn:aws:s3:::shared-bucket/report.csv")
    assert evaluate(request, [CARLOS_POLICY], resource=[bucket_policy]) is Decision.ALLOW
    assert evaluate(request, [CARLOS_POLICY]) is Decision.IMPLICIT_DENY


# https://docs.aws.amazon.com/IAM/latest/UserGuide/access_policies_boundaries.html: ShirleyRodriguez's
# boundary allows S3, CloudWatch and EC2; a permissions policy allowing iam:CreateUser grants nothing.
SHIRLEY = f"arn:aws:iam::{ACCOUNT}:user/ShirleyRodriguez"
SHIRLEY_BOUNDARY = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["s3:*", "cloudwatch:*", "ec2:*"], "Resource": "*"}],
}
CREATE_USER = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "iam:CreateUser", "Resource": "*"}]}


def test_a_permissions_boundary_caps_what_the_identity_policy_allows() -> None:
    create = Request(SHIRLEY, "iam:CreateUser", f"arn:aws:iam::{ACCOUNT}:user/newuser")
    assert evaluate(create, [CREATE_USER]) is Decision.ALLOW
    assert evaluate(create, [CREATE_USER], boundary=SHIRLEY_BOUNDARY) is Decision.IMPLICIT_DENY
    # ...and grants nothing by itself: within the boundary, without a permissions policy, still denied.
    describe = Request(SHIRLEY, "ec2:DescribeInstances", "*")
    assert evaluate(describe, [], boundary=SHIRLEY_BOUNDARY) is Decision.IMPLICIT_DENY
    assert evaluate(describe, [SHIRLEY_BOUNDARY], boundary=SHIRLEY_BOUNDARY) is Decision.ALLOW


# https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_notaction.html:
# Allow with NotAction iam:* allows every action but IAM's (it does not deny IAM).
def test_notaction_allows_everything_but_the_named_actions() -> None:
    policy = {"Statement": [{"Effect": "Allow", "NotAction": "iam:*", "Resource": "*"}]}
    assert evaluate(Request(CARLOS, "s3:GetObject", "arn:aws:s3:::b/k"), [policy]) is Decision.ALLOW
    assert evaluate(Request(CARLOS, "iam:CreateUser", "*"), [policy]) is Decision.IMPLICIT_DENY


def test_notresource_applies_to_every_other_resource() -> None:
    """reference_policies_elements_notresource.html: Deny s3:* on NotResource <bucket> denies the rest."""
    policy = {
        "Statement": [
            {"Effect": "Allow", "Action": "s3:*", "Resource": "*"},
            {
                "Effect": "Deny",
                "Action": "s3:*",
                "NotResource": ["arn:aws:s3:::amzn-s3-demo-bucket", "arn:aws:s3:::amzn-s3-demo-bucket/*"],
            },
        ]
    }
    assert evaluate(Request(CARLOS, "s3:GetObject", "arn:aws:s3:::amzn-s3-demo-bucket/a"), [policy]) is Decision.ALLOW
    assert evaluate(Request(CARLOS, "s3:GetObject", "arn:aws:s3:::other/a"), [policy]) is Decision.EXPLICIT_DENY


# https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_variables.html: a user may reach
# only the keys under their own name (${aws:username}); with no value the statement matches nothing.
HOME_POLICY = {
    "Statement": [
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::amzn-s3-demo-bucket/${aws:username}/*"}
    ]
}


def test_a_policy_variable_is_the_requests_value_and_nothing_without_one() -> None:
    own = Request(
        SHIRLEY, "s3:GetObject", "arn:aws:s3:::amzn-s3-demo-bucket/David/notes.txt", {"aws:username": "David"}
    )
    assert evaluate(own, [HOME_POLICY]) is Decision.ALLOW
    other = Request(
        SHIRLEY, "s3:GetObject", "arn:aws:s3:::amzn-s3-demo-bucket/Maria/notes.txt", {"aws:username": "David"}
    )
    assert evaluate(other, [HOME_POLICY]) is Decision.IMPLICIT_DENY
    # A role session has no aws:username: the variable has no value and the statement matches nothing
    # (not even a key spelled with an empty segment).
    empty = Request(SHIRLEY, "s3:GetObject", "arn:aws:s3:::amzn-s3-demo-bucket//notes.txt")
    assert evaluate(empty, [HOME_POLICY]) is Decision.IMPLICIT_DENY
    # A value's own wildcard is a literal character, not a wildcard.
    star = Request(SHIRLEY, "s3:GetObject", "arn:aws:s3:::amzn-s3-demo-bucket/Maria/notes.txt", {"aws:username": "*"})
    assert evaluate(star, [HOME_POLICY]) is Decision.IMPLICIT_DENY


def test_the_special_variables_are_literal_characters() -> None:
    """Same page: ${*}, ${?} and ${$} stand for the characters themselves."""
    policy = {"Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/odd${*}name"}]}
    assert evaluate(Request(SHIRLEY, "s3:GetObject", "arn:aws:s3:::b/odd*name"), [policy]) is Decision.ALLOW
    assert evaluate(Request(SHIRLEY, "s3:GetObject", "arn:aws:s3:::b/oddXname"), [policy]) is Decision.IMPLICIT_DENY


# https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_condition-single-vs-multi-valued-context-keys.html
# ForAllValues / ForAnyValue with aws:TagKeys ["environment", "cost-center"], and the page's outcomes.
@pytest.mark.parametrize(
    ("keys", "for_all", "for_any"),
    [
        (["environment"], True, True),
        (["environment", "cost-center"], True, True),
        (["environment", "dept"], False, True),
        (["dept"], False, False),
        (None, True, False),  # no tags in the request: ForAllValues holds, ForAnyValue does not
    ],
)
def test_set_operators_on_a_multivalued_key(keys: list[str] | None, for_all: bool, for_any: bool) -> None:
    context: dict[str, str | list[str]] = {} if keys is None else {"aws:TagKeys": keys}
    request = Request(CARLOS, "ec2:CreateTags", "arn:aws:ec2:us-east-1:123456789012:instance/i-1", context)
    for qualifier, expected in (("ForAllValues", for_all), ("ForAnyValue", for_any)):
        policy = {
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "ec2:CreateTags",
                    "Resource": "*",
                    "Condition": {f"{qualifier}:StringEquals": {"aws:TagKeys": ["environment", "cost-center"]}},
                }
            ]
        }
        assert (evaluate(request, [policy]) is Decision.ALLOW) is expected, qualifier


# https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_condition_operators.html
def test_a_missing_key_fails_a_positive_operator_satisfies_a_negated_one_and_ifexists() -> None:
    def decision(operator: str, context: dict[str, str | list[str]]) -> Decision:
        policy = {
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": "ec2:RunInstances",
                    "Resource": "*",
                    "Condition": {operator: {"ec2:InstanceType": ["t2.micro", "t2.small"]}},
                }
            ]
        }
        return evaluate(Request(CARLOS, "ec2:RunInstances", "*", context), [policy])

    assert decision("StringEquals", {"ec2:InstanceType": "t2.small"}) is Decision.ALLOW
    assert decision("StringEquals", {}) is Decision.IMPLICIT_DENY
    assert decision("StringNotEquals", {}) is Decision.ALLOW
    assert decision("StringNotEquals", {"ec2:InstanceType": "t2.micro"}) is Decision.IMPLICIT_DENY
    assert decision("StringNotEquals", {"ec2:InstanceType": "m5.large"}) is Decision.ALLOW
    assert decision("StringEqualsIfExists", {}) is Decision.ALLOW
    assert decision("StringEqualsIfExists", {"ec2:InstanceType": "m5.large"}) is Decision.IMPLICIT_DENY
    assert decision("StringLike", {"ec2:InstanceType": "t2.*"}) is Decision.IMPLICIT_DENY  # the value is no pattern


def test_null_bool_and_the_tls_only_bucket_statement() -> None:
    """The condition operators page: Null true means the key is absent (aws:TokenIssueTime is absent
    for long-term credentials); the S3 user guide's TLS-only statement denies aws:SecureTransport false."""
    null_policy = {
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "s3:GetObject",
                "Resource": "*",
                "Condition": {"Null": {"aws:TokenIssueTime": "true"}},
            }
        ]
    }
    long_term = Request(CARLOS, "s3:GetObject", "arn:aws:s3:::b/k")
    session = Request(CARLOS, "s3:GetObject", "arn:aws:s3:::b/k", {"aws:TokenIssueTime": "2026-01-01T00:00:00Z"})
    assert evaluate(long_term, [null_policy]) is Decision.ALLOW
    assert evaluate(session, [null_policy]) is Decision.IMPLICIT_DENY
    tls_only = {
        "Statement": [
            {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::b/*"},
            {
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:*",
                "Resource": ["arn:aws:s3:::b", "arn:aws:s3:::b/*"],
                "Condition": {"Bool": {"aws:SecureTransport": "false"}},
            },
        ]
    }
    plain = Request(CARLOS, "s3:GetObject", "arn:aws:s3:::b/k", {"aws:SecureTransport": "false"})
    tls = Request(CARLOS, "s3:GetObject", "arn:aws:s3:::b/k", {"aws:SecureTransport": "true"})
    assert evaluate(plain, [], resource=[tls_only]) is Decision.EXPLICIT_DENY
    assert evaluate(tls, [], resource=[tls_only]) is Decision.ALLOW


def test_arnlike_compares_each_part_of_the_arn() -> None:
    """The condition operators page: ArnLike matches each of the six colon-separated parts."""
    policy = {
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "sqs:SendMessage",
                "Resource": "*",
                "Condition": {"ArnLike": {"aws:SourceArn": "arn:aws:sns:*:123456789012:*"}},
            }
        ]
    }

    def source(arn: str) -> Decision:
        return evaluate(Request(CARLOS, "sqs:SendMessage", "*", {"aws:SourceArn": arn}), [policy])

    assert source("arn:aws:sns:us-east-2:123456789012:topic") is Decision.ALLOW
    assert source("arn:aws:sns:us-east-2:999999999999:topic") is Decision.IMPLICIT_DENY
    assert source("arn:aws:sqs:us-east-2:123456789012:queue") is Decision.IMPLICIT_DENY


def test_what_it_cannot_read_it_refuses_to_judge() -> None:
    unknown_operator = {
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "*",
                "Resource": "*",
                "Condition": {"DateGreaterThan": {"aws:CurrentTime": "x"}},
            }
        ]
    }
    with pytest.raises(Unsupported):
        evaluate(Request(CARLOS, "s3:GetObject", "*", {"aws:CurrentTime": "y"}), [unknown_operator])
    with pytest.raises(Unsupported):
        evaluate(Request(CARLOS, "s3:GetObject", "*"), [{"Statement": [{"Effect": "Allow", "Resource": "*"}]}])


# https://docs.aws.amazon.com/kms/latest/developerguide/key-policies.html and key-policy-default.html:
# a key policy must allow; the default statement granting the account root "enables IAM policies".
def test_a_key_policy_must_allow_and_a_grant_to_the_account_delegates_to_iam() -> None:
    role = f"arn:aws:iam::{ACCOUNT}:role/app"
    key = f"arn:aws:kms:us-east-1:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    decrypt_anything = {"Statement": [{"Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*"}]}
    names_the_role = {
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": role}, "Action": "kms:Decrypt", "Resource": "*"}]
    }
    enables_iam = {
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"AWS": f"arn:aws:iam::{ACCOUNT}:root"},
                "Action": "kms:*",
                "Resource": "*",
            }
        ]
    }
    request = Request(role, "kms:Decrypt", key)
    # Only an identity policy: not enough for a key (it is for an S3 object of the same account).
    assert evaluate(request, [decrypt_anything], resource=[], key_policy=True) is Decision.IMPLICIT_DENY
    assert evaluate(request, [decrypt_anything], resource=[]) is Decision.ALLOW
    # The key policy naming the role is enough by itself.
    assert evaluate(request, [], resource=[names_the_role], key_policy=True) is Decision.ALLOW
    # Naming the account delegates to IAM: the identity policy decides.
    assert evaluate(request, [decrypt_anything], resource=[enables_iam], key_policy=True) is Decision.ALLOW
    assert evaluate(request, [], resource=[enables_iam], key_policy=True) is Decision.IMPLICIT_DENY


# --- resource-based policies: principals, the keys derived from the caller ---


def test_the_evaluator_follows_iams_documented_rules() -> None:
    """Negated operators and NOR on a queue policy's Deny, as the kick queue's policy relies on them.

    reference_policies_elements_condition_operators.html: a negated operator is true when the key is
    absent (a positive one false); reference_policies_multi-value-conditions.html: the several values
    of a negated operator's key are a NOR (the key must match none)."""
    arn = "arn:aws:sqs:us-east-1:123456789012:q"
    role = f"arn:aws:iam::{ACCOUNT}:role/r"
    allow_all = {"Statement": [{"Effect": "Allow", "Action": "sqs:*", "Resource": "*"}]}

    def deny_unless(operator: str) -> dict[str, Any]:
        condition = {operator: {"aws:SourceArn": "arn:aws:events:us-east-1:123456789012:rule/x"}}
        statement = {"Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage", "Resource": arn}
        return {"Statement": [{**statement, "Condition": condition}]}

    send = Request(role, "sqs:SendMessage", arn)
    # A negated operator is true when the key is absent; a positive one is false.
    assert evaluate(send, [allow_all], resource=[deny_unless("ArnNotEquals")]) is Decision.EXPLICIT_DENY
    assert evaluate(send, [allow_all], resource=[deny_unless("ArnEquals")]) is Decision.ALLOW
    # Several values of a negated operator: NOR.
    two = {"ArnNotEquals": {"aws:PrincipalArn": [role, f"arn:aws:iam::{ACCOUNT}:role/other"]}}
    statement = {"Effect": "Deny", "Principal": "*", "Action": "sqs:SendMessage", "Resource": arn, "Condition": two}
    assert evaluate(send, [allow_all], resource=[{"Statement": [statement]}]) is Decision.ALLOW
    stranger = Request(f"arn:aws:iam::{ACCOUNT}:role/stranger", "sqs:SendMessage", arn)
    assert evaluate(stranger, [allow_all], resource=[{"Statement": [statement]}]) is Decision.EXPLICIT_DENY
    # No Allow anywhere: implicitly denied; an operator it cannot judge fails loudly.
    assert evaluate(send, [], resource=[{"Statement": []}]) is Decision.IMPLICIT_DENY
    unknown = {**statement, "Condition": {"DateGreaterThan": {"aws:CurrentTime": "2020-01-01T00:00:00Z"}}}
    with pytest.raises(Unsupported, match="DateGreaterThan"):
        evaluate(send, [allow_all], resource=[{"Statement": [unknown]}])


# https://docs.aws.amazon.com/eventbridge/latest/userguide/eb-use-resource-based.html#eb-sqs-permissions (Amazon SQS
# permissions): a queue policy lets EventBridge's service principal deliver a rule's events, the rule
# named by aws:SourceArn.
RULE = f"arn:aws:events:us-east-1:{ACCOUNT}:rule/ruleName"
QUEUE = f"arn:aws:sqs:us-east-1:{ACCOUNT}:queueName"
EVENTBRIDGE_TO_SQS = {
    "Statement": [
        {
            "Sid": "events-policy",
            "Effect": "Allow",
            "Principal": {"Service": "events.amazonaws.com"},
            "Action": "sqs:SendMessage",
            "Resource": QUEUE,
            "Condition": {"ArnEquals": {"aws:SourceArn": RULE}},
        }
    ]
}


def test_a_service_principal_is_allowed_by_its_name_in_a_resource_policy() -> None:
    def deliver(principal: str, source: str | None) -> Decision:
        context: dict[str, str | list[str]] = {} if source is None else {"aws:SourceArn": source}
        return evaluate(Request(principal, "sqs:SendMessage", QUEUE, context), [], resource=[EVENTBRIDGE_TO_SQS])

    assert deliver("events.amazonaws.com", RULE) is Decision.ALLOW
    assert deliver("events.amazonaws.com", f"arn:aws:events:us-east-1:{ACCOUNT}:rule/other") is Decision.IMPLICIT_DENY
    assert deliver("events.amazonaws.com", None) is Decision.IMPLICIT_DENY
    assert deliver("sns.amazonaws.com", RULE) is Decision.IMPLICIT_DENY
    # {"Service": ...} names the service, not an IAM principal that claims the same source.
    assert deliver(f"arn:aws:iam::{ACCOUNT}:role/events", RULE) is Decision.IMPLICIT_DENY


def test_the_keys_aws_derives_from_the_caller() -> None:
    """reference_policies_condition-keys.html: aws:PrincipalArn and aws:PrincipalAccount for an IAM
    principal; aws:PrincipalServiceName only for a service principal (which has no aws:PrincipalArn);
    aws:PrincipalIsAWSService either way; aws:SecureTransport always present. A request cannot claim
    another principal's keys through its context."""
    role = Request(f"arn:aws:iam::{ACCOUNT}:role/r", "sqs:SendMessage", QUEUE, {"aws:PrincipalArn": "x"})
    assert role.value("AWS:PrincipalArn") == f"arn:aws:iam::{ACCOUNT}:role/r"
    assert role.value("aws:PrincipalAccount") == ACCOUNT
    assert role.value("aws:PrincipalIsAWSService") == "false"
    assert role.value("aws:PrincipalServiceName") is None
    assert role.value("aws:SecureTransport") == "true"
    service = Request("cloudtrail.amazonaws.com", "s3:PutObject", "arn:aws:s3:::b/k", {"aws:SecureTransport": "false"})
    assert service.value("aws:PrincipalServiceName") == "cloudtrail.amazonaws.com"
    assert service.value("aws:PrincipalIsAWSService") == "true"
    assert service.value("aws:PrincipalArn") is None
    assert service.value("aws:SecureTransport") == "false"
    # The same page's example: deny writes into the logs prefix unless from the VPC or by CloudTrail.
    # (Both keys of the IfExists block must hold for the Deny: an absent key holds.)
    bucket_policy = {
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": "*",
                "Action": "s3:PutObject",
                "Resource": f"arn:aws:s3:::amzn-s3-demo-bucket1/AWSLogs/{ACCOUNT}/*",
            },
            {
                "Sid": "ExpectedNetworkServicePrincipal",
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:PutObject",
                "Resource": f"arn:aws:s3:::amzn-s3-demo-bucket1/AWSLogs/{ACCOUNT}/*",
                "Condition": {
                    "StringNotEqualsIfExists": {
                        "aws:SourceVpc": "vpc-111bbb22",
                        "aws:PrincipalServiceName": "cloudtrail.amazonaws.com",
                    }
                },
            },
        ]
    }
    key = f"arn:aws:s3:::amzn-s3-demo-bucket1/AWSLogs/{ACCOUNT}/log.gz"

    def put(principal: str, context: dict[str, str | list[str]]) -> Decision:
        return evaluate(Request(principal, "s3:PutObject", key, context), [], resource=[bucket_policy])

    assert put("cloudtrail.amazonaws.com", {}) is Decision.ALLOW
    assert put(CARLOS, {"aws:SourceVpc": "vpc-111bbb22"}) is Decision.ALLOW
    assert put(CARLOS, {"aws:SourceVpc": "vpc-999"}) is Decision.EXPLICIT_DENY
    assert put(CARLOS, {}) is Decision.EXPLICIT_DENY


def test_principal_forms_of_a_resource_policy() -> None:
    """reference_policies_elements_principal.html: {"AWS": "*"} is everyone, an account id is the
    account as its root ARN is (delegating to the account's IAM policies), another account is not
    this one; a resource-based statement must name a Principal and an identity-based one must not."""
    key = f"arn:aws:kms:us-east-1:{ACCOUNT}:key/k"
    decrypt = Request(CARLOS, "kms:Decrypt", key)
    may_decrypt = {"Statement": [{"Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*"}]}

    def grant(principal: Any) -> dict[str, Any]:
        return {"Statement": [{"Effect": "Allow", "Principal": principal, "Action": "kms:Decrypt", "Resource": "*"}]}

    assert evaluate(decrypt, [], resource=[grant({"AWS": "*"})], key_policy=True) is Decision.ALLOW
    assert evaluate(decrypt, [], resource=[grant({"AWS": [ACCOUNT]})], key_policy=True) is Decision.IMPLICIT_DENY
    assert evaluate(decrypt, [may_decrypt], resource=[grant({"AWS": ACCOUNT})], key_policy=True) is Decision.ALLOW
    other = grant({"AWS": "arn:aws:iam::999999999999:root"})
    assert evaluate(decrypt, [may_decrypt], resource=[other], key_policy=True) is Decision.IMPLICIT_DENY
    # An IAM policy's Deny denies without the key policy (key-policies.html).
    deny = {"Statement": [{"Effect": "Deny", "Action": "kms:*", "Resource": "*"}]}
    assert evaluate(decrypt, [deny], resource=[grant("*")], key_policy=True) is Decision.EXPLICIT_DENY
    with pytest.raises(Unsupported, match="Principal type Federated"):
        evaluate(decrypt, [], resource=[grant({"Federated": "cognito-identity.amazonaws.com"})])
    no_principal = {"Statement": [{"Effect": "Allow", "Action": "kms:Decrypt", "Resource": "*"}]}
    with pytest.raises(Unsupported, match="without Principal"):
        evaluate(decrypt, [], resource=[no_principal])
    with pytest.raises(Unsupported, match="identity-based"):
        evaluate(decrypt, [grant("*")])
    with pytest.raises(ValueError, match="neither"):
        Request("carlossalazar", "kms:Decrypt", key)
