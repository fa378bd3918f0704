"""A reconciler run may fail in the simulation only on a fault the simulation injected.

The schedule retries a run that AWS's contention failed (a throttle burst, a cancelled transaction,
a capacity refusal: the strict layer's faults), so the simulation takes such a run as done and goes
on. Any other exception (a TypeError, a refusal nobody injected) is a bug and fails the seed with
its traceback (tests/simulation/sim.py, `injected_fault`).
"""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.reconciler import run as reconciler_run
from fleetkeeper.reconciler.drivers.ec2 import Ec2Driver
from fleetkeeper.store.errors import Contention
from tests.simulation.sim import Simulation, SimulationFailure, Violation, injected_fault
from tests.strict_aws import Fault
from tests.support.specs import hello_spec

INVARIANT = "fails-only-on-injected-faults"


def _client_error(code: str, operation: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "..."}}, operation)


def _broken_listing(self: Ec2Driver, uids: Any = None) -> Any:
    raise TypeError("list_instances() got an unexpected keyword argument (planted by the test)")


def test_an_error_of_an_injected_fault_is_recognised_through_the_chain() -> None:
    throttle = Fault("ec2", "DescribeInstances", "RequestLimitExceeded")
    conflict = Fault("dynamodb", "TransactWriteItems", "TransactionConflict")
    assert injected_fault(_client_error("RequestLimitExceeded", "DescribeInstances"), [throttle]) == throttle
    cancelled = _client_error("TransactionCanceledException", "TransactWriteItems")
    assert injected_fault(cancelled, [throttle, conflict]) == conflict
    # Raised from (or while handling) the AWS error: the store's own exception wraps it.
    try:
        try:
            raise cancelled
        except ClientError as error:
            raise Contention("TransactWriteItems") from error
    except Contention as wrapped:
        assert injected_fault(wrapped, [conflict]) == conflict
    try:
        try:
            raise cancelled
        except ClientError:
            raise KeyError("raised while handling it") from None
    except KeyError as suppressed:  # `from None` still keeps __context__
        assert injected_fault(suppressed, [conflict]) == conflict


def test_an_error_no_fault_explains_is_a_bug() -> None:
    throttle = Fault("ec2", "DescribeInstances", "RequestLimitExceeded")
    assert injected_fault(TypeError("planted"), [throttle]) is None
    assert injected_fault(_client_error("RequestLimitExceeded", "RunInstances"), [throttle]) is None  # another call
    assert injected_fault(_client_error("InvalidParameterValue", "DescribeInstances"), [throttle]) is None
    assert injected_fault(_client_error("RequestLimitExceeded", "DescribeInstances"), []) is None  # not this run's
    # IAM's and the service model's refusals are findings about fleetkeeper, not AWS's bad luck.
    denied = Fault("ec2", "DescribeInstances", "denied:ec2:DescribeInstances")
    assert injected_fault(_client_error("UnauthorizedOperation", "DescribeInstances"), [denied]) is None


def test_a_run_failed_by_an_injected_throttle_is_tolerated() -> None:
    simulation = Simulation(6)
    with simulation._world():
        simulation.strict.ec2.throttle(None, times=50)  # more than botocore's retries
        assert simulation._one_run(None) == ("failed (ClientError)", None)


def test_a_type_error_inside_a_reconciler_run_fails_with_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    simulation = Simulation(6)
    with simulation._world():
        monkeypatch.setattr(Ec2Driver, "list_instances", _broken_listing)
        with pytest.raises(Violation) as raised:
            simulation._one_run(None)
    assert raised.value.invariant == INVARIANT
    assert "TypeError: list_instances() got an unexpected keyword argument" in raised.value.detail
    assert "Traceback (most recent call last)" in raised.value.detail
    assert "_broken_listing" in raised.value.detail  # where it was raised


def test_a_type_error_inside_a_reconciler_run_fails_the_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Ec2Driver, "list_instances", _broken_listing)
    with pytest.raises(SimulationFailure) as raised:
        Simulation(6).run(40)
    assert raised.value.violation.invariant == INVARIANT
    assert raised.value.known is None  # no known defect excuses it: the test fails, it is no xfail
    assert "SIM_SEED=6" in str(raised.value)


def test_a_torn_read_is_recognised_by_the_store_s_contention() -> None:
    torn = Contention("torn read: the service's target version stayed invisible")
    fault = Fault("dynamodb", "Query", "TornRead")
    assert injected_fault(torn, [fault]) == fault
    assert injected_fault(torn, []) is None


def test_a_type_error_the_shell_catches_and_logs_fails_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shell catches one service's failure (it must not starve the others) and logs it: a bug in
    the planner never leaves the run, and must fail the seed all the same."""

    def broken_plan(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("plan() planted by the test")

    simulation = Simulation(6)
    with simulation._world():
        assert simulation._call_api("create", "POST", "/v1/services", _created()).status == 201
        monkeypatch.setattr(reconciler_run, "plan", broken_plan)
        with pytest.raises(Violation) as raised:
            simulation._one_run(None)
    assert raised.value.invariant == INVARIANT
    assert "caught and logged" in raised.value.detail
    assert "TypeError: plan() planted by the test" in raised.value.detail


def _created() -> dict[str, Any]:
    return {"name": "alpha", "spec": hello_spec()}
