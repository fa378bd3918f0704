"""A small world for reconciler tests: moto AWS, the table, a probe server on 127.0.0.1, a clock.

Also a pytest plugin (tests/conftest.py loads it): the `server` and `world` fixtures every
reconciler test file shares.

Replica addresses are resolved to 127.0.0.1 through the driver (FLEETKEEPER_REPLICA_HOST), so every
readiness probe goes to `ProbeServer`, never to the 10.x addresses moto invents. AWS calls are
counted (and can be made to fail) through botocore's event hooks on fleetkeeper's own clients.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import pytest

from fleetkeeper import aws
from fleetkeeper.api.services import ServiceCommands
from fleetkeeper.local.template import create_table
from fleetkeeper.model import Lifecycle, ReplicaStatus, ServiceState, to_iso
from fleetkeeper.reconciler.balancers.alb import AlbBalancer
from fleetkeeper.reconciler.driver import MANAGED_TAG, REPLICA_TAG, UID_TAG
from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver
from fleetkeeper.reconciler.plan import Policy
from fleetkeeper.reconciler.report import RunReport
from fleetkeeper.reconciler.run import Reconciler
from fleetkeeper.settings import AlbSettings, Ec2Settings
from fleetkeeper.spec.service import ServiceSpec
from fleetkeeper.store.commands import CommandStore
from fleetkeeper.store.runs import ReconcilerStore
from fleetkeeper.store.table import Table
from tests.strict_aws import active_controller
from tests.support import TABLE
from tests.support.specs import hello_spec

if TYPE_CHECKING:
    from collections.abc import Iterator

    from fleetkeeper.reconciler.balancer import LoadBalancer
    from fleetkeeper.reconciler.metrics import RequestRates

DYNAMODB_WRITES = {"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"}


def is_mutation(service: str, operation: str) -> bool:
    if service == "dynamodb":
        return operation in DYNAMODB_WRITES
    return not operation.startswith(("Describe", "Get", "List"))


class Crash(BaseException):
    """The reconciler process 'dies' here: not an Exception, so nothing in the shell catches it."""


class ProbeServer:
    """A real HTTP server on 127.0.0.1 answering readiness probes with a settable status code."""

    def __init__(self) -> None:
        self.status = 200
        self.delay = 0.0  # seconds before it answers (a slow model server)
        self.requests: list[tuple[str, str, bytes, dict[str, str]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                server.requests.append((self.command, self.path, body, dict(self.headers)))
                if server.delay:
                    time.sleep(server.delay)
                self.send_response(server.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            do_GET = _answer
            do_POST = _answer

            def log_message(self, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@dataclass
class CallLog:
    """Every AWS call fleetkeeper's clients make; optionally the k-th one 'crashes' the process."""

    calls: list[tuple[str, str]] = field(default_factory=list)
    crash_at: int | None = None
    crash_when: str = "before"  # "before": the call never happens; "after": it happens, the answer is lost
    crashed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def before(self, model: Any, **_: Any) -> None:
        with self.lock:
            self.calls.append((model.service_model.service_name, model.name))
            number = len(self.calls)
        self._maybe_crash(number, "before")

    def after(self, model: Any, **_: Any) -> None:
        with self.lock:
            number = len(self.calls)
        self._maybe_crash(number, "after")

    def _maybe_crash(self, number: int, when: str) -> None:
        if self.crash_at == number and self.crash_when == when and not self.crashed:
            self.crashed = True
            raise Crash(f"crash {when} AWS call {number}")

    def mark(self) -> int:
        return len(self.calls)

    def since(self, mark: int) -> list[tuple[str, str]]:
        return self.calls[mark:]

    def mutations(self, mark: int = 0) -> list[tuple[str, str]]:
        return [c for c in self.since(mark) if is_mutation(*c)]

    def by_api(self, mark: int = 0) -> Counter[str]:
        return Counter(f"{service}:{operation}" for service, operation in self.since(mark))


class Clock:
    """Real time at the start (moto stamps LaunchTime with it), then moved by hand: no sleeping.

    It starts 5 s into the next whole minute, whatever second the test starts at: windows aligned to
    the minute (the autoscaler's metrics) then fall the same way on every run. Started at the real
    second, a test's 61 s runs crossed an extra window boundary in about one start second of sixty
    (seen: a late data point read as a quiet minute)."""

    def __init__(self) -> None:
        now = datetime.now(UTC)
        self.moment = now.replace(second=0, microsecond=0) + timedelta(minutes=1, seconds=5)

    def __call__(self) -> datetime:
        return self.moment

    def advance(self, seconds: float = 61) -> None:
        self.moment += timedelta(seconds=seconds)


def spec_dict(port: int, replicas: int = 2, **overrides: Any) -> dict[str, Any]:
    data = hello_spec()
    data["service"] = {"readiness_probe": "/health", "replicas": replicas, "ports": port}
    data.update(overrides)
    return data


class _Hooks:
    """Routes the event hooks of fleetkeeper's clients to the current world's CallLog.

    Clients are cached across worlds (creating one costs ~0.2 s), so each is hooked once.
    """

    log: CallLog | None = None

    @classmethod
    def attach(cls, log: CallLog) -> None:
        cls.log = log
        for client in (aws.dynamodb(), aws.ec2(), aws.ssm(), aws.elbv2(), aws.cloudwatch()):
            # Marked on the client itself: an id() could be reused by a later client.
            if not getattr(client, "_fleetkeeper_test_hooks", False):
                client._fleetkeeper_test_hooks = True
                client.meta.events.register("before-call", cls.before)
                client.meta.events.register("after-call", cls.after)

    @classmethod
    def before(cls, **kwargs: Any) -> None:
        if cls.log is not None:
            cls.log.before(**kwargs)

    @classmethod
    def after(cls, **kwargs: Any) -> None:
        if cls.log is not None:
            cls.log.after(**kwargs)


_raw_clients: dict[str, Any] = {}


def raw_client(service: str) -> Any:
    """A client of the test's own (not counted, not fleetkeeper's), made once per process: making
    one loads its service model (~0.3 s), and moto intercepts it in every later mock too."""
    if service not in _raw_clients:
        import boto3

        _raw_clients[service] = boto3.client(service, region_name="us-east-1")
    return _raw_clients[service]


def ec2_driver() -> Ec2Driver:
    """A driver as the reconciler function builds it, from this process's environment."""
    return Ec2Driver.from_settings(Ec2Settings.from_env(os.environ))


class World:
    """Within an active moto mock: the table, counted clients, one reconciler, one unmanaged instance.

    `store` is the table as the api sees it (reads, and the writes `commands` makes); the reconciler
    has a store of its own.
    """

    def __init__(
        self,
        server: ProbeServer,
        *,
        policy: Policy | None = None,
        balancer: LoadBalancer | None = None,
        rates: RequestRates | None = None,
    ) -> None:
        self.server = server
        self.log = CallLog()
        create_table(aws.dynamodb(), TABLE)
        self.store = CommandStore(Table(TABLE))
        self.clock = Clock()
        self.commands = ServiceCommands(self.store, now=lambda: to_iso(self.clock()))
        _Hooks.attach(self.log)
        # Made with a client of our own, so it is neither counted nor managed.
        made = self._raw_ec2().run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)
        self.unmanaged = made["Instances"][0]["InstanceId"]
        self.reconciler = Reconciler(
            store=ReconcilerStore(Table(TABLE)),
            driver=ec2_driver(),
            now=self.clock,
            policy=policy or Policy(),
            probe_budget_seconds=5,
            balancer=balancer,
            rates=rates,
        )

    @staticmethod
    def _raw_ec2() -> Any:
        return raw_client("ec2")

    # -- acting --

    def create(self, name: str = "svc", **spec_overrides: Any) -> ServiceState:
        spec = ServiceSpec.model_validate(spec_dict(self.server.port, **spec_overrides))
        return self.commands.create(name, spec)

    def update(self, name: str = "svc", **spec_overrides: Any) -> ServiceState:
        spec = ServiceSpec.model_validate(spec_dict(self.server.port, **spec_overrides))
        return self.commands.update(name, spec, mode=None, expected_generation=None)

    def delete(self, name: str = "svc") -> ServiceState:
        return self.commands.delete(name)

    def run(self, name: str | None = None) -> RunReport:
        """One run (a kick for `name`, else the scheduled run), then the clock moves a minute."""
        try:
            return self.reconciler.run_one(name) if name else self.reconciler.run_all()
        finally:
            self.reconciler.driver = ec2_driver()  # a driver lives for one run
            self.clock.advance()

    def restart(self) -> None:
        """A new reconciler process: nothing of the last one's memory, the same table and AWS."""
        old = self.reconciler
        self.reconciler = Reconciler(
            store=ReconcilerStore(Table(TABLE)),
            driver=ec2_driver(),
            now=self.clock,
            policy=old.policy,
            probe_budget_seconds=old.probe_budget_seconds,
            balancer=old.balancer,
            rates=old.rates,
        )

    def converge(self, max_runs: int = 20) -> int:
        """Run until a run mutates nothing and nothing drains (a drain of the default 120 s outlasts a
        run or two that have nothing to do); returns the number of runs. Fails if it never settles."""
        for number in range(1, max_runs + 1):
            mark = self.log.mark()
            self.run()
            if not self.log.mutations(mark) and not self._draining():
                return number
        raise AssertionError(f"no steady state after {max_runs} runs: last calls {self.log.since(mark)}")

    def _draining(self) -> bool:
        """Whether a replica of some service is leaving its endpoint (its instance held for the drain)."""
        try:
            states = [self.store.load(service.name) for service in self.store.iter_services()]
        except Exception:
            return False
        replicas = [r for state in states if state is not None for r in state.replicas.values()]
        return any(r.status is ReplicaStatus.SHUTTING_DOWN and r.drain_started_at for r in replicas)

    # -- looking --

    def instances(self, *, live_only: bool = True) -> list[dict[str, Any]]:
        filters = [{"Name": "tag-key", "Values": [MANAGED_TAG]}]
        if live_only:
            filters.append({"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]})
        pages = self._raw_ec2().describe_instances(Filters=filters)["Reservations"]
        return [i for r in pages for i in r["Instances"]]

    def unmanaged_state(self) -> str:
        return instance_state(self.unmanaged)


def make_alb(
    *,
    domain: str | None = None,
    certificate: bool = False,
    ports: tuple[int, int] = (10000, 10049),
    name: str = "fk-test-alb",
) -> AlbBalancer:
    """The stack's ALB as template.yaml makes it, in this test's moto (made with clients of our own,
    so not counted): a VPC, two subnets, the load balancer and, with a domain, the shared listener
    that carries the host rules (HTTPS when `certificate`, with a certificate from moto's ACM)."""
    ec2 = World._raw_ec2()
    elbv2 = raw_client("elbv2")
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnets = [
        ec2.create_subnet(VpcId=vpc, CidrBlock=f"10.42.{n}.0/24", AvailabilityZone=f"us-east-1{zone}")["Subnet"][
            "SubnetId"
        ]
        for n, zone in ((1, "a"), (2, "b"))
    ]
    alb = elbv2.create_load_balancer(Name=name, Subnets=subnets, Scheme="internal", Type="application")
    arn, dns = alb["LoadBalancers"][0]["LoadBalancerArn"], alb["LoadBalancers"][0]["DNSName"]
    cert = None
    if certificate:
        cert = raw_client("acm").request_certificate(DomainName=f"*.{domain or 'example.com'}")["CertificateArn"]
    listener = None
    if domain:
        args: dict[str, Any] = {
            "LoadBalancerArn": arn,
            "Protocol": "HTTPS" if cert else "HTTP",
            "Port": 443 if cert else 80,
            "DefaultActions": [
                {
                    "Type": "fixed-response",
                    "FixedResponseConfig": {"StatusCode": "404", "ContentType": "application/json"},
                }
            ],
        }
        if cert:
            args["Certificates"] = [{"CertificateArn": cert}]
        listener = elbv2.create_listener(**args)["Listeners"][0]["ListenerArn"]
    return AlbBalancer(
        AlbSettings(
            arn=arn,
            dns_name=dns,
            vpc_id=vpc,
            listener_arn=listener,
            domain_name=domain,
            certificate_arn=cert,
            listener_ports=ports,
        )
    )


def make_pooled_alb(
    *,
    domain: str | None = None,
    zone: bool = False,
    wake: bool = True,
    stack: str = "0123456789ab",
    function: str = "arn:aws:lambda:us-east-1:123456789012:function:fk-wake",
) -> AlbBalancer:
    """The stack's ALB (make_alb) with what the template passes for pools: its subnets, its security
    group, the wake group and function, and with `zone` a hosted zone of the domain in moto."""
    alb = make_alb(domain=domain, name=f"tpl-{stack}")
    elbv2 = raw_client("elbv2")
    described = elbv2.describe_load_balancers(LoadBalancerArns=[alb.settings.arn])["LoadBalancers"][0]
    subnets = tuple(az["SubnetId"] for az in described["AvailabilityZones"])
    group = World._raw_ec2().create_security_group(
        GroupName=f"fk-alb-{stack}", Description="the stack's load balancers", VpcId=alb.settings.vpc_id
    )["GroupId"]
    wake_group = None
    if wake:
        wake_group = elbv2.create_target_group(Name=f"fkwake-{stack}", TargetType="lambda")["TargetGroups"][0][
            "TargetGroupArn"
        ]
        elbv2.register_targets(TargetGroupArn=wake_group, Targets=[{"Id": function}])
    hosted_zone = None
    if zone:
        assert domain is not None
        hosted_zone = raw_client("route53").create_hosted_zone(Name=domain, CallerReference=stack)["HostedZone"]["Id"]
        hosted_zone = hosted_zone.rsplit("/", 1)[-1]
        # Route 53 has no VPC endpoint: docs/DEPLOY.md requires a NAT of a stack with a hosted zone, and
        # the strict layer's reconciler reaches Route 53 only through one.
        controller = active_controller()
        if controller is not None:
            controller.nat_gateway = True
    settings = replace(
        alb.settings,
        stack_id=stack,
        subnet_ids=subnets,
        security_group_id=group,
        wake_target_group=wake_group,
        wake_function_arn=function if wake else None,
        hosted_zone_id=hosted_zone,
    )
    return AlbBalancer(settings)


def alb_resources(balancer: AlbBalancer) -> dict[str, list[str]]:
    """What the ALB carries now: target groups, listeners (but a domain's shared one), rules (but defaults)."""
    elbv2 = raw_client("elbv2")
    groups = [g["TargetGroupArn"] for g in elbv2.describe_target_groups()["TargetGroups"]]
    listeners = [
        listener["ListenerArn"]
        for listener in elbv2.describe_listeners(LoadBalancerArn=balancer.settings.arn)["Listeners"]
        if listener["ListenerArn"] != balancer.settings.listener_arn
    ]
    rules = []
    if balancer.settings.listener_arn:
        rules = [
            r["RuleArn"]
            for r in elbv2.describe_rules(ListenerArn=balancer.settings.listener_arn)["Rules"]
            if not r["IsDefault"]
        ]
    return {"target_groups": groups, "listeners": listeners, "rules": rules}


def target_health(group_arn: str) -> dict[str, str]:
    """Each registered (or draining) target's state: instance id -> healthy / draining / ..."""
    elbv2 = raw_client("elbv2")
    health = elbv2.describe_target_health(TargetGroupArn=group_arn)["TargetHealthDescriptions"]
    return {h["Target"]["Id"]: h["TargetHealth"]["State"] for h in health}


def run_tagged(tag_map: dict[str, str], client_token: str | None = None) -> str:
    """An instance made outside fleetkeeper's clients with these tags (and this ClientToken, if any):
    launched by fleetkeeper only when the token is one it derives."""
    extra = {"ClientToken": client_token} if client_token else {}
    made = World._raw_ec2().run_instances(
        ImageId="ami-12345678",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tag_map.items()]}],
        **extra,
    )
    return str(made["Instances"][0]["InstanceId"])


def instance_state(instance_id: str) -> str:
    raw = World._raw_ec2().describe_instances(InstanceIds=[instance_id])
    return str(raw["Reservations"][0]["Instances"][0]["State"]["Name"])


def tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def assert_converged(world: World, name: str = "svc", *, replicas: int = 2, version: int | None = None) -> None:
    """The invariants after a run with no mutation: exactly the desired instances, all recorded."""
    state = world.store.load(name)
    assert state is not None
    assert state.service.lifecycle is Lifecycle.ACTIVE
    target = version or state.service.target_version
    assert state.service.target_version == target
    live = [i for i in world.instances() if tags(i).get(UID_TAG) == state.service.uid]
    ids = sorted(int(tags(i)[REPLICA_TAG]) for i in live)
    assert len(ids) == replicas == len(set(ids)), f"live replica ids {ids}"
    # No replica id was ever launched twice (terminated instances included): no double launch.
    ever = [
        int(tags(i)[REPLICA_TAG]) for i in world.instances(live_only=False) if tags(i).get(UID_TAG) == state.service.uid
    ]
    assert len(ever) == len(set(ever)), f"replica ids launched more than once: {sorted(ever)}"
    # Each instance runs the target: launched as it, or as a version the target took over in place
    # (its tag keeps the version it was launched with: fleetkeeper.spec.changes).
    from fleetkeeper.spec.changes import replica_visible

    wanted = state.versions[target]
    for i in live:
        launched_as = state.versions[int(tags(i)["fleetkeeper:version"])]
        same = launched_as.secrets_ref == wanted.secrets_ref
        assert launched_as is wanted or not replica_visible(launched_as.spec, wanted.spec, same_secrets=same), tags(i)
    assert sorted(state.replicas) == ids
    for replica in state.replicas.values():
        assert replica.status is ReplicaStatus.READY, replica
        assert replica.version == target
        assert replica.instance_id in {i["InstanceId"] for i in live}
    assert state.service.status.value == "READY", state.service.status_message
    assert state.service.observed_generation == state.service.generation
    assert world.unmanaged_state() == "running"
    # One more run: reads only.
    mark = world.log.mark()
    world.run()
    assert world.log.mutations(mark) == []


def assert_deleted(world: World, uid: str, name: str = "svc") -> None:
    assert world.store.load(name) is None
    assert [i for i in world.instances() if tags(i).get(UID_TAG) == uid] == []
    assert world.unmanaged_state() == "running"


# --- fixtures (a pytest plugin: tests/conftest.py lists this module in pytest_plugins) ---------------


@pytest.fixture(scope="module")
def server() -> Iterator[ProbeServer]:
    """One probe server per test module; each `world` resets what it answers and what it saw."""
    probe_server = ProbeServer()
    yield probe_server
    probe_server.close()


@pytest.fixture
def world(aws: None, server: ProbeServer, monkeypatch: pytest.MonkeyPatch) -> World:
    """A fresh world on this test's AWS (the strict-AWS layer by default), probes to `server`."""
    monkeypatch.setenv("FLEETKEEPER_REPLICA_HOST", "127.0.0.1")
    server.status = 200
    server.requests.clear()
    return World(server)
