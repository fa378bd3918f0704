"""Settings: every variable the functions read, parsed in one place; bad configuration is refused clearly."""

from __future__ import annotations

import pytest

from fleetkeeper.settings import DEFAULT_IMAGE_PARAMETER, DEFAULT_INSTANCE_TYPE, Ec2Settings, Settings, SettingsError


def test_a_missing_table_is_a_clear_error() -> None:
    with pytest.raises(SettingsError, match="TABLE_NAME is not set"):
        Settings.from_env({})
    with pytest.raises(SettingsError, match="TABLE_NAME is not set"):
        Settings.from_env({"TABLE_NAME": ""})


def test_defaults_are_the_templates() -> None:
    settings = Settings.from_env({"TABLE_NAME": "t"})
    assert settings == Settings(table_name="t", ec2=Ec2Settings(secrets_prefix="/fleetkeeper/t"))
    assert (settings.driver, settings.probe_budget_seconds) == ("ec2", 20.0)
    assert (settings.reconciler_function_name, settings.kick_url) == (None, None)
    assert (settings.workdir_bucket, settings.workdir_dir, settings.workdir_upload_url) == (None, None, None)
    assert settings.ec2 == Ec2Settings(
        default_image_parameter=DEFAULT_IMAGE_PARAMETER,
        default_instance_type=DEFAULT_INSTANCE_TYPE,
        secrets_prefix="/fleetkeeper/t",
    )


def test_every_variable_is_read() -> None:
    settings = Settings.from_env(
        {
            "TABLE_NAME": "fleet",
            "FLEETKEEPER_DRIVER": "process",
            "FLEETKEEPER_PROBE_BUDGET_SECONDS": "27.5",
            "RECONCILER_FUNCTION_NAME": "fk-reconciler",
            "FLEETKEEPER_KICK_URL": "http://127.0.0.1:8080/_local/kick",
            "FLEETKEEPER_SUBNET_IDS": "subnet-a, subnet-b,",  # an empty stack parameter joins to ""
            "FLEETKEEPER_SECURITY_GROUP_IDS": "",
            "FLEETKEEPER_INSTANCE_PROFILE_ARN": "arn:aws:iam::123456789012:instance-profile/replicas",
            "FLEETKEEPER_DEFAULT_IMAGE_PARAMETER": "/my/ami",
            "FLEETKEEPER_DEFAULT_INSTANCE_TYPE": "m7g.large",
            "FLEETKEEPER_REPLICA_HOST": "127.0.0.1",
            "WORKDIR_BUCKET": "fk-workdirs",
            "FLEETKEEPER_WORKDIR_DIR": "/tmp/fk/workdirs",
            "FLEETKEEPER_WORKDIR_UPLOAD_URL": "http://127.0.0.1:8080/_local/workdirs",
        }
    )
    assert settings == Settings(
        table_name="fleet",
        driver="process",
        probe_budget_seconds=27.5,
        reconciler_function_name="fk-reconciler",
        kick_url="http://127.0.0.1:8080/_local/kick",
        ec2=Ec2Settings(
            subnet_ids=("subnet-a", "subnet-b"),
            security_group_ids=(),
            instance_profile_arn="arn:aws:iam::123456789012:instance-profile/replicas",
            default_image_parameter="/my/ami",
            default_instance_type="m7g.large",
            replica_host="127.0.0.1",
            workdir_bucket="fk-workdirs",
            secrets_prefix="/fleetkeeper/fleet",
        ),
        workdir_bucket="fk-workdirs",
        workdir_dir="/tmp/fk/workdirs",
        workdir_upload_url="http://127.0.0.1:8080/_local/workdirs",
    )


@pytest.mark.parametrize(
    ("variable", "value", "problem"),
    [
        ("FLEETKEEPER_DRIVER", "docker", "expected 'ec2' or 'process'"),
        ("FLEETKEEPER_PROBE_BUDGET_SECONDS", "soon", "expected a number of seconds"),
    ],
)
def test_a_value_that_does_not_parse_names_the_variable(variable: str, value: str, problem: str) -> None:
    with pytest.raises(SettingsError, match=f"{variable}={value!r}: {problem}"):
        Settings.from_env({"TABLE_NAME": "t", variable: value})


def test_each_handler_refuses_to_run_without_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from fleetkeeper.api.handler import lambda_handler as api
    from fleetkeeper.apigw import rest_event
    from fleetkeeper.cleanup.handler import lambda_handler as cleanup
    from fleetkeeper.reconciler.handler import lambda_handler as reconciler
    from tests.conftest import FakeContext

    monkeypatch.delenv("TABLE_NAME", raising=False)
    for handler, event in (
        (api, rest_event("GET", "/v1/services")),
        (reconciler, {"source": "aws.events"}),
        (cleanup, {"Records": []}),
    ):
        with pytest.raises(SettingsError, match="TABLE_NAME is not set"):
            handler(event, FakeContext())


def test_a_probe_budget_a_spec_s_longest_probe_cannot_finish_in_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"FLEETKEEPER_PROBE_BUDGET_SECONDS=19\.5: at least 20 seconds"):
        Settings.from_env({"TABLE_NAME": "t", "FLEETKEEPER_PROBE_BUDGET_SECONDS": "19.5"})
    assert Settings.from_env({"TABLE_NAME": "t", "FLEETKEEPER_PROBE_BUDGET_SECONDS": "20"}).probe_budget_seconds == 20
