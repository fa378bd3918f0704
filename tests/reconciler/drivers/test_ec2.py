"""The ec2 driver (fleetkeeper.reconciler.drivers.ec2): the replica's address, terminations, and its
selection by the settings (fleetkeeper.reconciler.drivers.make_driver)."""

from __future__ import annotations

import pytest

from fleetkeeper.reconciler.driver import MANAGED_TAG, STACK_TAG
from fleetkeeper.reconciler.drivers import make_driver
from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver
from fleetkeeper.settings import DEFAULT_STACK_ID, Ec2Settings, Settings


def test_replica_host_replaces_the_instance_address() -> None:
    from fleetkeeper.reconciler.driver import Instance, InstanceState

    instance = Instance("i-1", InstanceState.RUNNING, "svc", "u", 1, 0, private_ip="10.1.2.3")
    assert Ec2Driver.from_settings(Ec2Settings.from_env({})).base_url(instance, 8080) == "http://10.1.2.3:8080"
    replica_host = Ec2Settings.from_env({"FLEETKEEPER_REPLICA_HOST": "127.0.0.1"})
    assert Ec2Driver.from_settings(replica_host).base_url(instance, 9000) == "http://127.0.0.1:9000"
    assert Ec2Driver().base_url(Instance("i-2", InstanceState.PENDING, "svc", "u", 1, 1), 80) is None


def test_terminate_goes_on_when_one_instance_is_already_gone(aws: None) -> None:
    from fleetkeeper import aws as clients

    # The reconciler's role terminates only the stack's managed instances (template.yaml,
    # TerminateOnlyManaged): these carry the tags its own launches do.
    managed = [{"Key": MANAGED_TAG, "Value": "true"}, {"Key": STACK_TAG, "Value": DEFAULT_STACK_ID}]
    made = clients.ec2().run_instances(
        ImageId="ami-12345678",
        MinCount=2,
        MaxCount=2,
        TagSpecifications=[{"ResourceType": "instance", "Tags": managed}],
    )["Instances"]
    ids = [i["InstanceId"] for i in made]
    Ec2Driver().terminate([ids[0], "i-0123456789abcdef0", ids[1]])
    states = clients.ec2().describe_instances(InstanceIds=ids)["Reservations"][0]["Instances"]
    assert {i["State"]["Name"] for i in states} == {"terminated"}


def test_driver_selection() -> None:
    assert isinstance(make_driver(Settings.from_env({"TABLE_NAME": "t"})), Ec2Driver)
    with pytest.raises(ValueError, match="expected 'ec2' or 'process'"):
        Settings.from_env({"TABLE_NAME": "t", "FLEETKEEPER_DRIVER": "docker"})
