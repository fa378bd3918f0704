"""Settings: every variable the functions read, parsed in one place; bad configuration is refused clearly."""

from __future__ import annotations

import re

import pytest

from fleetkeeper.settings import (
    DEFAULT_IMAGE_PARAMETER,
    DEFAULT_INSTANCE_TYPE,
    AlbSettings,
    Ec2Settings,
    Settings,
    SettingsError,
)


def test_a_missing_table_is_a_clear_error() -> None:
    with pytest.raises(SettingsError, match="TABLE_NAME is not set"):
        Settings.from_env({})
    with pytest.raises(SettingsError, match="TABLE_NAME is not set"):
        Settings.from_env({"TABLE_NAME": ""})


def test_defaults_are_the_templates() -> None:
    settings = Settings.from_env({"TABLE_NAME": "t"})
    assert settings == Settings(table_name="t", ec2=Ec2Settings(secrets_prefix="/fleetkeeper/t", table_name="t"))
    assert (settings.driver, settings.probe_budget_seconds) == ("ec2", 20.0)
    assert (settings.kick_queue_url, settings.kick_url, settings.reconcile_queue_url) == (None, None, None)
    assert (settings.period_seconds, settings.shard_size, settings.read_concurrency) == (60, 100, 8)
    assert (settings.service_margin_seconds, settings.action_margin_seconds) == (10.0, 5.0)
    assert (settings.workdir_bucket, settings.workdir_dir, settings.workdir_upload_url) == (None, None, None)
    assert settings.ec2 == Ec2Settings(
        default_image_parameter=DEFAULT_IMAGE_PARAMETER,
        default_instance_type=DEFAULT_INSTANCE_TYPE,
        secrets_prefix="/fleetkeeper/t",
        table_name="t",
    )


def test_every_variable_is_read() -> None:
    settings = Settings.from_env(
        {
            "TABLE_NAME": "fleet",
            "FLEETKEEPER_DRIVER": "process",
            "FLEETKEEPER_PROBE_BUDGET_SECONDS": "27.5",
            "FLEETKEEPER_KICK_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/kicks",
            "FLEETKEEPER_RECONCILE_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/shards",
            "FLEETKEEPER_RECONCILE_SCHEDULE": "rate(5 minutes)",
            "FLEETKEEPER_SHARD_SIZE": "50",
            "FLEETKEEPER_READ_CONCURRENCY": "4",
            "FLEETKEEPER_SERVICE_MARGIN_SECONDS": "12.5",
            "FLEETKEEPER_ACTION_MARGIN_SECONDS": "3",
            "FLEETKEEPER_KICK_URL": "http://127.0.0.1:8080/_local/kick",
            "FLEETKEEPER_KICK_TOKEN": "t0ken",
            "FLEETKEEPER_SUBNET_IDS": "subnet-a, subnet-b,",  # an empty stack parameter joins to ""
            "FLEETKEEPER_SECURITY_GROUP_IDS": "",
            "FLEETKEEPER_INSTANCE_PROFILE_ARN": "arn:aws:iam::123456789012:instance-profile/replicas",
            "FLEETKEEPER_DEFAULT_IMAGE_PARAMETER": "/my/ami",
            "FLEETKEEPER_DEFAULT_INSTANCE_TYPE": "m7g.large",
            "FLEETKEEPER_REPLICA_HOST": "127.0.0.1",
            "FLEETKEEPER_LOAD_BALANCER": "alb",
            "FLEETKEEPER_ALB_ARN": "arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/app/fk/1",
            "FLEETKEEPER_ALB_DNS_NAME": "internal-fk-1.us-east-1.elb.amazonaws.com",
            "FLEETKEEPER_ALB_VPC_ID": "vpc-1",
            "FLEETKEEPER_ALB_LISTENER_ARN": "arn:listener",
            "FLEETKEEPER_ALB_LISTENER_PORTS": "20000-20009",
            "FLEETKEEPER_DOMAIN_NAME": "svc.example.com.",
            "FLEETKEEPER_CERTIFICATE_ARN": "arn:cert",
            "WORKDIR_BUCKET": "fk-workdirs",
            "FLEETKEEPER_WORKDIR_DIR": "/tmp/fk/workdirs",
            "FLEETKEEPER_WORKDIR_UPLOAD_URL": "http://127.0.0.1:8080/_local/workdirs",
        }
    )
    assert settings == Settings(
        table_name="fleet",
        driver="process",
        probe_budget_seconds=27.5,
        kick_queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/kicks",
        reconcile_queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/shards",
        period_seconds=300,
        shard_size=50,
        read_concurrency=4,
        service_margin_seconds=12.5,
        action_margin_seconds=3.0,
        kick_url="http://127.0.0.1:8080/_local/kick",
        kick_token="t0ken",
        ec2=Ec2Settings(
            subnet_ids=("subnet-a", "subnet-b"),
            security_group_ids=(),
            instance_profile_arn="arn:aws:iam::123456789012:instance-profile/replicas",
            default_image_parameter="/my/ami",
            default_instance_type="m7g.large",
            replica_host="127.0.0.1",
            workdir_bucket="fk-workdirs",
            secrets_prefix="/fleetkeeper/fleet",
            table_name="fleet",
        ),
        balancer="alb",
        alb=AlbSettings(
            arn="arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/app/fk/1",
            dns_name="internal-fk-1.us-east-1.elb.amazonaws.com",
            vpc_id="vpc-1",
            listener_arn="arn:listener",
            domain_name="svc.example.com",
            certificate_arn="arn:cert",
            listener_ports=(20000, 20009),
        ),
        workdir_bucket="fk-workdirs",
        workdir_dir="/tmp/fk/workdirs",
        workdir_upload_url="http://127.0.0.1:8080/_local/workdirs",
    )
    settings.alb.check()


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("FLEETKEEPER_DRIVER", "docker", "expected 'ec2' or 'process'"),
        ("FLEETKEEPER_PROBE_BUDGET_SECONDS", "soon", "expected a number of seconds"),
        ("FLEETKEEPER_RECONCILE_SCHEDULE", "cron(0 * * * ? *)", "expected a rate such as"),
        ("FLEETKEEPER_RECONCILE_SCHEDULE", "rate(0 minutes)", "expected a rate such as"),
        ("FLEETKEEPER_SHARD_SIZE", "200", "expected a whole number from 1 to 199"),
        ("FLEETKEEPER_SHARD_SIZE", "ten", "expected a whole number from 1 to 199"),
        ("FLEETKEEPER_READ_CONCURRENCY", "0", "expected a whole number from 1 to 64"),
        ("FLEETKEEPER_SERVICE_MARGIN_SECONDS", "a while", "expected a number of seconds"),
        ("FLEETKEEPER_LOAD_BALANCER", "nginx", "expected 'none', 'alb' or 'local'"),
        ("FLEETKEEPER_ALB_LISTENER_PORTS", "10000-", "expected FROM-TO"),
        ("FLEETKEEPER_ALB_LISTENER_PORTS", "10049-10000", "expected 1 <= FROM <= TO <= 65535"),
        ("FLEETKEEPER_ADOPT_UNTAGGED_REPLICAS", "yes", "expected 'true' or 'false'"),
    ],
)
def test_a_value_that_does_not_parse_names_the_variable(variable: str, value: str, problem: str) -> None:
    with pytest.raises(SettingsError, match=re.escape(f"{variable}=") + ".*" + re.escape(f": {problem}")):
        Settings.from_env({"TABLE_NAME": "t", variable: value})


def test_the_alb_says_what_it_lacks() -> None:
    assert Settings.from_env({"TABLE_NAME": "t"}).balancer == "none"
    alb = Settings.from_env({"TABLE_NAME": "t", "FLEETKEEPER_LOAD_BALANCER": "alb", "FLEETKEEPER_DOMAIN_NAME": "x.io"})
    with pytest.raises(
        SettingsError, match="needs FLEETKEEPER_ALB_ARN, FLEETKEEPER_ALB_VPC_ID, FLEETKEEPER_ALB_LISTENER_ARN"
    ):
        alb.alb.check()


def test_a_domain_too_long_for_the_albs_host_rules_is_refused() -> None:
    """NAME.<domain> must fit an ALB host-header value (128 characters) for a 63-character name."""
    environ = {
        "TABLE_NAME": "t",
        "FLEETKEEPER_LOAD_BALANCER": "alb",
        "FLEETKEEPER_ALB_ARN": "arn:aws:elasticloadbalancing:us-east-1:123456789012:loadbalancer/app/fk/0123",
        "FLEETKEEPER_ALB_VPC_ID": "vpc-0123456789abcdef0",
        "FLEETKEEPER_ALB_LISTENER_ARN": "arn:aws:elasticloadbalancing:us-east-1:123456789012:listener/app/fk/0/1",
    }
    fits = "d" * 61 + ".io"
    Settings.from_env({**environ, "FLEETKEEPER_DOMAIN_NAME": fits}).alb.check()
    with pytest.raises(SettingsError, match=r"65 characters: at most 64.*128-character host-header"):
        Settings.from_env({**environ, "FLEETKEEPER_DOMAIN_NAME": "d" + fits}).alb.check()


def test_each_handler_refuses_to_run_without_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetkeeper.api.handler import lambda_handler as api
    from fleetkeeper.aws.apigw import rest_event
    from fleetkeeper.cleanup.handler import lambda_handler as cleanup
    from fleetkeeper.reconciler.handler import dispatch_handler as dispatcher
    from fleetkeeper.reconciler.handler import lambda_handler as reconciler
    from tests.support.handler_client import FakeContext

    monkeypatch.delenv("TABLE_NAME", raising=False)
    for handler, event in (
        (api, rest_event("GET", "/v1/services")),
        (reconciler, {"source": "aws.events"}),
        (dispatcher, {"source": "aws.events"}),
        (cleanup, {"Records": []}),
    ):
        with pytest.raises(SettingsError, match="TABLE_NAME is not set"):
            handler(event, FakeContext())


def test_a_probe_budget_a_spec_s_longest_probe_cannot_finish_in_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"FLEETKEEPER_PROBE_BUDGET_SECONDS=19\.5: at least 20 seconds"):
        Settings.from_env({"TABLE_NAME": "t", "FLEETKEEPER_PROBE_BUDGET_SECONDS": "19.5"})
    assert Settings.from_env({"TABLE_NAME": "t", "FLEETKEEPER_PROBE_BUDGET_SECONDS": "20"}).probe_budget_seconds == 20
