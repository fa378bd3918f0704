"""`fleetkeeper doctor`'s step runner and its run as a whole when a step fails: FAIL with what was
expected and seen, exit 1, the clean-up run all the same; bounded waits on a clock of the test's own.

The whole run against a real control plane is tests/local/test_doctor_e2e.py."""

from __future__ import annotations

import io
import itertools
from typing import Any

import pytest

from fleetkeeper.cli.args import build_parser
from fleetkeeper.cli.doctor import Account, Answer, Doctor, doctor_spec
from fleetkeeper.cli.doctor_options import Options, options_from
from fleetkeeper.cli.http import ApiClient, ApiError, Response, Unreachable
from fleetkeeper.cli.main import run
from fleetkeeper.cli.steps import Deadline, StepFailed, StepRunner, StepSkipped, Verdict, wait_until

API = "https://abc123.execute-api.us-east-1.amazonaws.com/api"


class Clock:
    """A clock the test moves: sleeping advances it (no real waiting)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


# -- the step runner -----------------------------------------------------------------------------------


def test_each_step_prints_its_verdict_and_time_and_any_fail_makes_the_exit_code_1() -> None:
    clock = Clock()
    out = io.StringIO()
    runner = StepRunner(out, clock=clock)

    def slow(deadline: Deadline) -> str:
        clock.sleep(2.5)
        return "it answered"

    def wrong(deadline: Deadline) -> str:
        raise StepFailed("expected 200, saw 503")

    def cannot(deadline: Deadline) -> str:
        raise StepSkipped("no role given")

    assert runner.run("serve", 10, slow).verdict is Verdict.PASS
    assert runner.exit_code() == 0
    assert runner.run("update", 10, wrong).verdict is Verdict.FAIL
    assert runner.run("second owner", 10, cannot).verdict is Verdict.SKIP
    lines = out.getvalue().splitlines()
    assert lines[0].split() == ["PASS", "1", "serve", "2.5s", "it", "answered"]
    assert lines[1].startswith("FAIL  2 update") and lines[1].endswith("expected 200, saw 503")
    assert lines[2].startswith("SKIP  3 second owner") and lines[2].endswith("no role given")
    assert runner.exit_code() == 1
    assert runner.summary().startswith("1 passed, 1 failed, 1 skipped")


def test_an_unexpected_error_or_ctrl_c_is_the_steps_fail_and_the_runner_goes_on() -> None:
    out = io.StringIO()
    runner = StepRunner(out)

    def unreachable(deadline: Deadline) -> str:
        raise Unreachable("cannot reach the fleetkeeper API at https://x: timed out")

    def interrupted(deadline: Deadline) -> str:
        raise KeyboardInterrupt

    first = runner.run("create", 10, unreachable)
    assert (first.verdict, first.detail) == (
        Verdict.FAIL,
        "Unreachable: cannot reach the fleetkeeper API at https://x: timed out",
    )
    assert not runner.interrupted
    second = runner.run("serve", 10, interrupted)
    assert (second.verdict, second.detail, runner.interrupted) == (Verdict.FAIL, "interrupted (Ctrl-C)", True)
    assert runner.run("delete", 10, lambda d: "deleted").verdict is Verdict.PASS  # the clean-up still runs


def test_a_wait_ends_at_its_deadline_saying_what_was_expected_and_what_was_seen_last() -> None:
    clock = Clock()
    deadline = Deadline(30, clock)
    seen = itertools.count()

    with pytest.raises(StepFailed) as failed:
        wait_until(
            deadline,
            lambda: None,
            expected="a 200 from the endpoint",
            seen=lambda: f"503 (poll {next(seen)})",
            interval=4,
            sleep=clock.sleep,
        )
    assert str(failed.value).startswith("expected a 200 from the endpoint within 30s; last seen: 503 (poll ")
    # Polled every 4 s, the last sleep cut to what was left: it never waits past the deadline.
    assert clock.slept == [4, 4, 4, 4, 4, 4, 4, 2]
    assert clock.now - deadline.started == 30


def test_a_wait_returns_what_the_check_found() -> None:
    clock = Clock()
    answers = iter([None, None, "READY"])
    found = wait_until(Deadline(30, clock), lambda: next(answers), expected="x", seen=str, sleep=clock.sleep)
    assert found == "READY" and clock.slept == [1.0, 1.0]


# -- the doctor, when a step fails ---------------------------------------------------------------------


class FakeApi(ApiClient):
    """The API's service routes over a dict: a service is created, read, listed and deleted (gone at
    once). It never gets an endpoint: nothing runs its replicas."""

    def __init__(self, *, unreachable_create: bool = False, refuse_delete: bool = False) -> None:
        super().__init__(API)
        self.refuse_delete = refuse_delete
        self.blips: list[Exception] = []  # raised, in turn, by the next GETs of a service
        self.services: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.unreachable_create = unreachable_create
        self.uids = (f"{n:016x}" for n in itertools.count(1))

    def request(self, method: str, path: str, body: Any = None, *, raw: bool = False) -> Response:
        self.calls.append((method, path))
        name = path.removeprefix("/v1/services").strip("/").split("?")[0]
        if method == "POST" and not name:
            if self.unreachable_create:
                raise Unreachable("cannot reach the fleetkeeper API: the answer never came")
            view = {
                "name": body["name"],
                "uid": next(self.uids),
                "target_version": 1,
                "generation": 1,
                "status": "NO_REPLICA",
                "status_message": "waiting for the reconciler",
                "owner": "arn:aws:iam::111122223333:role/me",
                "replicas": [],
                "spec": body["spec"],
            }
            self.services[body["name"]] = view
            return Response(201, {}, view)
        if method == "GET" and not name:
            return Response(200, {}, {"services": list(self.services.values())})
        if method == "GET" and name and self.blips:
            raise self.blips.pop(0)
        if name not in self.services:
            raise ApiError(404, f"service '{name}' does not exist", None)
        if method == "DELETE" and self.refuse_delete:
            raise ApiError(403, f"you may read service '{name}' but not change it", None)
        if method == "DELETE":
            return Response(202, {}, {**self.services.pop(name), "status": "SHUTTING_DOWN"})
        return Response(200, {}, self.services[name])


def doctor(api: FakeApi, clock: Clock, out: io.StringIO, **options: Any) -> Doctor:
    timeouts = {"serve": 20.0, "update": 20.0, "zero": 20.0, "wake": 20.0, "second": 20.0, "delete": 20.0}
    return Doctor(
        api,
        Account(lambda service: None, None, None, embedded=False),
        Options(timeouts={**timeouts, "leftovers": 20.0}, **options),
        out=out,
        err=io.StringIO(),
        suffix="abc123",
        get=lambda url: Answer(None, error="no answer: connection refused"),
        sleep=clock.sleep,
        clock=clock,
    )


def test_a_service_that_never_serves_fails_serve_skips_the_rest_and_is_still_deleted() -> None:
    api, clock, out = FakeApi(), Clock(), io.StringIO()

    assert doctor(api, clock, out).run() == 1

    lines = out.getvalue().splitlines()
    assert lines[0] == f"fleetkeeper doctor: {API} (no --stack: no AWS resources to check); services fk-doctor-abc123"
    verdicts = [line.split()[:2] for line in lines[1:-1]]
    assert verdicts == [
        ["PASS", "1"],
        ["FAIL", "2"],
        ["SKIP", "3"],
        ["SKIP", "4"],
        ["SKIP", "5"],
        ["SKIP", "6"],
        ["PASS", "7"],
        ["PASS", "8"],
    ]
    serve = lines[2]
    assert "expected fk-doctor-abc123's endpoint to answer GET / with 200 'fk-doctor-abc123 v1' within 20s" in serve
    assert "last seen: NO_REPLICA v1 (0/1 ready), no endpoint yet: waiting for the reconciler" in serve
    assert "not run: an earlier step failed" in lines[3]
    assert ("DELETE", "/v1/services/fk-doctor-abc123") in api.calls and api.services == {}
    assert "deleted and gone: fk-doctor-abc123" in lines[7]
    assert "not the AWS resources: give --stack NAME" in lines[8]
    assert lines[-1].startswith("doctor FAILED: 3 passed, 1 failed, 4 skipped")


def test_a_create_whose_answer_never_came_is_deleted_all_the_same() -> None:
    api, clock, out = FakeApi(unreachable_create=True), Clock(), io.StringIO()

    assert doctor(api, clock, out).run() == 1

    lines = out.getvalue().splitlines()
    assert lines[1].startswith("FAIL  1 create") and "Unreachable: cannot reach the fleetkeeper API" in lines[1]
    # It may exist all the same: the DELETE is sent (and its 404 is fine).
    assert ("DELETE", "/v1/services/fk-doctor-abc123") in api.calls
    assert lines[7].startswith("PASS  7 delete") and "nothing to delete (never created)" in lines[7]
    assert lines[8].startswith("PASS  8 leftovers") and lines[8].endswith("nothing was created")


def test_without_a_second_role_the_second_owner_step_is_a_skip_that_says_why() -> None:
    api, clock, out = FakeApi(), Clock(), io.StringIO()
    subject = doctor(api, clock, out)

    result = subject.runner.run("second owner", 10, subject.second_owner)

    assert result.verdict is Verdict.SKIP
    assert result.detail.startswith("no --second-owner-role ARN")


def test_the_spec_is_valid_for_the_api_at_both_versions() -> None:
    from fleetkeeper.spec.service import ServiceSpec

    first = ServiceSpec.model_validate({"name": "fk-doctor-x", **doctor_spec("fk-doctor-x v1")})
    second = ServiceSpec.model_validate({"name": "fk-doctor-x", **doctor_spec("fk-doctor-x v2", to_zero_delay=0)})
    other = ServiceSpec.model_validate({"name": "fk-doctor-x-b", **doctor_spec("x", autoscaled=False)})
    assert first.service.replica_policy is not None and first.service.replica_policy.min_replicas == 1
    assert second.service.replica_policy is not None and second.service.replica_policy.min_replicas == 0
    assert second.service.replica_policy.downscale_to_zero_delay_seconds == 0
    assert other.service.replicas == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--second-owner-role", "team-b-ci"], "--second-owner-role 'team-b-ci': expected an IAM role ARN"),
        (["--serve-timeout", "0"], "0 seconds: must be a finite number above 0"),
        (["--to-zero-delay", "-1"], "'-1' is not a number of seconds from 0 to 86400"),
    ],
)
def test_bad_flags_are_usage_errors_before_anything_is_sent(argv: list[str], message: str) -> None:
    err = io.StringIO()
    api = FakeApi()

    code = run(["doctor", "--api-url", API, *argv], out=io.StringIO(), err=err, client_factory=lambda url: api)

    assert code == 2 and message in err.getvalue()
    assert api.calls == []


def test_the_timeouts_and_the_role_reach_the_doctor() -> None:
    args = build_parser().parse_args(
        ["doctor", "--serve-timeout", "60", "--second-owner-role", "arn:aws:iam::111122223333:role/ci/team-b"]
    )
    options = options_from(args)
    assert options.timeouts["serve"] == 60 and options.timeouts["delete"] == 900
    assert options.second_owner_role == "arn:aws:iam::111122223333:role/ci/team-b"
    # Zero may come only once the rollout's own requests reach the autoscaler: on AWS the ALB's
    # metric is read a minute behind, over a minute, once a run comes; in embedded mode, seconds.
    assert options.to_zero_delay == 180
    assert options_from(args, embedded=True).to_zero_delay == 30
    given = build_parser().parse_args(["doctor", "--to-zero-delay", "0"])
    assert options_from(given).to_zero_delay == options_from(given, embedded=True).to_zero_delay == 0


def test_a_stack_without_a_load_balancer_fails_serve_at_once_saying_why() -> None:
    api, clock, out = FakeApi(), Clock(), io.StringIO()
    subject = doctor(api, clock, out)
    subject.account = Account(lambda service: None, "0a1b2c3d4e5f", None, embedded=False)

    assert subject.run() == 1

    serve = out.getvalue().splitlines()[2]
    assert serve.startswith("FAIL  2 serve")
    assert "the stack has no LoadBalancerDnsName output (LoadBalancer=none)" in serve
    assert clock.slept == []  # said at the first look, not after the timeout


def test_the_stack_id_is_the_one_its_resources_carry(aws: None) -> None:
    import boto3

    from fleetkeeper.cli.doctor import _stack

    template = """
Resources:
  Queue:
    Type: AWS::SQS::Queue
Outputs:
  LoadBalancerDnsName:
    Value: internal-fleetkeeper-123.us-east-1.elb.amazonaws.com
"""
    cloudformation = boto3.client("cloudformation", region_name="us-east-1")
    stack_arn = cloudformation.create_stack(StackName="fleetkeeper", TemplateBody=template)["StackId"]

    stack_id, dns = _stack(lambda service: boto3.client(service, region_name="us-east-1"), "fleetkeeper")

    # template.yaml: FLEETKEEPER_STACK_ID is the last group of the StackId's UUID.
    assert stack_id == stack_arn.rsplit("/", 1)[1].split("-")[4] and len(stack_id) == 12
    assert dns == "internal-fleetkeeper-123.us-east-1.elb.amazonaws.com"


def waking() -> Answer:
    body = '{"error": {"code": "waking", "message": "service fk-doctor-abc123 has no replica serving yet"}}'
    return Answer(503, body, {"retry-after": "5"})


def test_wake_passes_on_the_wake_targets_503_then_the_new_versions_reply() -> None:
    api, clock, out = FakeApi(), Clock(), io.StringIO()
    answers = iter([waking(), waking(), Answer(502, "bad gateway"), Answer(200, "fk-doctor-abc123 v2\n")])
    subject = doctor(api, clock, out)
    subject.get = lambda url: next(answers)
    subject.you.endpoints[subject.name] = "http://endpoint.example"

    result = subject.runner.run("wake", 60, subject.wake)

    assert result.verdict is Verdict.PASS, result.detail
    assert result.detail == (
        "503 waking (Retry-After 5s), then HTTP 200 'fk-doctor-abc123 v2' 2.0s after the first request (4 requests)"
    )


def test_wake_fails_when_the_service_was_not_at_zero_after_all() -> None:
    api, clock, out = FakeApi(), Clock(), io.StringIO()
    subject = doctor(api, clock, out)
    subject.get = lambda url: Answer(200, "fk-doctor-abc123 v2\n")
    subject.you.endpoints[subject.name] = "http://endpoint.example"

    result = subject.runner.run("wake", 60, subject.wake)

    assert result.verdict is Verdict.FAIL
    assert result.detail == (
        "expected the wake target's answer (503, error code `waking`, Retry-After) from http://endpoint.example "
        "at zero replicas; got HTTP 200 'fk-doctor-abc123 v2'"
    )


def test_scale_to_zero_times_out_on_its_own_timeout_saying_what_it_saw() -> None:
    api, clock, out = FakeApi(), Clock(), io.StringIO()
    subject = doctor(api, clock, out)
    subject.runner.run("create", 10, subject.create)
    api.services[subject.name]["autoscaling"] = {"target_replicas": 1, "request_rate": 0.5, "waking": False}
    api.services[subject.name]["replicas"] = [{"replica_id": 3, "version": 2, "status": "READY"}]

    result = subject.runner.run("scale to zero", 45, subject.scale_to_zero)

    assert result.verdict is Verdict.FAIL
    assert result.detail == (
        "expected fk-doctor-abc123 at 0 replicas with its route on the wake target (no request for 30s) within "
        "45s; last seen: target 1, replicas: 3 v2 READY, rate 0.5/s, waking False"
    )
    assert result.elapsed == 45


def test_a_refused_delete_fails_delete_and_leftovers_names_what_is_left_without_waiting() -> None:
    api, clock, out = FakeApi(refuse_delete=True), Clock(), io.StringIO()

    assert doctor(api, clock, out).run() == 1

    lines = out.getvalue().splitlines()
    assert lines[7] == (
        "FAIL  7 delete             0.0s  DELETE fk-doctor-abc123 as you: HTTP 403 you may read service "
        "'fk-doctor-abc123' but not change it"
    )
    assert lines[8].startswith("FAIL  8 leftovers          0.0s  expected nothing of the doctor's services left")
    assert "last seen: fk-doctor-abc123 still in the API (as you); fk-doctor-abc123 still listed" in lines[8]
    assert api.services  # it is there, and the doctor said so


def test_a_ready_service_whose_endpoint_does_not_answer_here_says_where_to_look() -> None:
    api, clock, out = FakeApi(), Clock(), io.StringIO()
    subject = doctor(api, clock, out)
    subject.runner.run("create", 10, subject.create)
    view = api.services[subject.name]
    view.update(status="READY", endpoint="http://internal-fk-1.us-east-1.elb.amazonaws.com:10000")
    view["replicas"] = [{"replica_id": 0, "version": 1, "status": "READY"}]

    result = subject.runner.run("serve", 30, subject.serve)

    assert result.verdict is Verdict.FAIL
    assert result.detail.endswith(
        "last seen: READY v1 (1/1 ready); GET http://internal-fk-1.us-east-1.elb.amazonaws.com:10000/ -> no answer: "
        "connection refused (READY, but its endpoint does not answer here: an internal load balancer answers inside "
        "its VPC only, and only LoadBalancerAllowedCidr; docs/DEPLOY.md, Smoke test)"
    )


def test_the_api_blipping_while_a_step_waits_is_no_verdict() -> None:
    api, clock, out = FakeApi(), Clock(), io.StringIO()
    subject = doctor(api, clock, out)
    subject.get = lambda url: Answer(200, "fk-doctor-abc123 v1\n")
    subject.runner.run("create", 10, subject.create)
    api.services[subject.name].update(status="READY", endpoint="http://endpoint.example")
    api.blips = [ApiError(503, "Service Unavailable", None), Unreachable("cannot reach the API: timed out")]

    result = subject.runner.run("serve", 30, subject.serve)

    assert result.verdict is Verdict.PASS, result.detail
    assert result.elapsed == 2  # two polls lost, one a second
    assert "the API answered 503: Service Unavailable" in subject.err.getvalue()  # type: ignore[attr-defined]


def test_serve_waits_for_the_replica_to_be_recorded_ready_after_its_endpoint_answered() -> None:
    # A replica can answer before the reconciler's next pass records it READY (a clean-clone run saw
    # "answered HTTP 200 ... (REPLICA_INIT v1)"): the step passes only on the promised status.
    api, clock, out = FakeApi(), Clock(), io.StringIO()
    subject = doctor(api, clock, out)
    subject.get = lambda url: Answer(200, "fk-doctor-abc123 v1\n")
    subject.runner.run("create", 10, subject.create)
    view = api.services[subject.name]
    view.update(status="REPLICA_INIT", status_message="1 replica starting", endpoint="http://endpoint.example")
    recorded_ready_at = clock.now + 3

    def request(method: str, path: str, body: Any = None, *, raw: bool = False) -> Response:
        if clock.now >= recorded_ready_at:
            view["status"] = "READY"
        return FakeApi.request(api, method, path, body, raw=raw)

    api.request = request  # type: ignore[method-assign]

    result = subject.runner.run("serve", 30, subject.serve)

    assert result.verdict is Verdict.PASS, result.detail
    assert result.detail.endswith("answered HTTP 200 'fk-doctor-abc123 v1' (READY v1)")
    assert result.elapsed == 3


def test_serve_fails_when_the_endpoint_answers_but_the_service_is_never_recorded_ready() -> None:
    api, clock, out = FakeApi(), Clock(), io.StringIO()
    subject = doctor(api, clock, out)
    subject.get = lambda url: Answer(200, "fk-doctor-abc123 v1\n")
    subject.runner.run("create", 10, subject.create)
    api.services[subject.name].update(
        status="REPLICA_INIT", status_message="1 replica starting", endpoint="http://endpoint.example"
    )

    result = subject.runner.run("serve", 30, subject.serve)

    assert result.verdict is Verdict.FAIL
    assert result.detail.endswith(
        "expected fk-doctor-abc123 to be recorded READY after its endpoint answered within 30s; "
        "last seen: REPLICA_INIT: 1 replica starting"
    )
