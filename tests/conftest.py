"""Shared fixtures: an in-process moto AWS with the table template.yaml declares, and an api client.

Only fixtures and hooks live here; what tests import is in tests/support/."""

from __future__ import annotations

import contextlib
import os
import tempfile
import zlib
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings

from tests import strict_aws as strict_layer
from tests.support import TABLE, moto_tuning, public_images
from tests.support.handler_client import HandlerClient

if TYPE_CHECKING:
    from collections.abc import Iterator

# Fake credentials and a region before anything creates a boto3 client; never real AWS.
os.environ.update(
    {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
        "POWERTOOLS_SERVICE_NAME": "fleetkeeper-tests",
        "POWERTOOLS_LOG_LEVEL": "WARNING",
        "POWERTOOLS_METRICS_NAMESPACE": "fleetkeeper-tests",
        "AWS_ACCOUNT_ID_ENDPOINT_MODE": "disabled",
        # Belt and braces: no credential lookup may ever reach the instance metadata address.
        "AWS_EC2_METADATA_DISABLED": "true",
    }
)
for _var in ("FLEETKEEPER_AWS_ENDPOINT_URL", "FLEETKEEPER_KICK_QUEUE_URL", "FLEETKEEPER_KICK_URL"):
    os.environ.pop(_var, None)
# Where `fleetkeeper local` lists itself for the CLI (fleetkeeper.local.auth): a directory of this
# test run's own, so that a developer's running `make local` is never found, nor touched.
os.environ["FLEETKEEPER_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="fleetkeeper-run-")

# Before any mock starts (moto reads MOTO_AMIS_PATH when its EC2 models are imported): see
# tests/support/moto_tuning.py. FLEETKEEPER_MOTO_TUNING=0 runs moto's own code paths instead (the same
# answers, slower: bench/simulation_speed.py compares the two), to tell a tuning's fault from the code's.
os.environ.setdefault("MOTO_AMIS_PATH", moto_tuning.amis_file())
if os.environ.get("FLEETKEEPER_MOTO_TUNING", "1") != "0":
    moto_tuning.install()
# The public image parameters fleetkeeper launches with (Ubuntu, the Deep Learning AMIs): AWS has them,
# moto does not (tests/support/public_images.py).
public_images.install()

# Property tests: `make test` runs the "ci" profile, the same examples on every run and machine (no
# random seed, no example database), so a red build is the code's fault, never the draw's. `make
# fuzz` runs "fuzz": a random search, longer (FUZZ_EXAMPLES per test), remembering what it found in
# .hypothesis/. Whatever a search finds is kept as an @example of its test, so CI runs it forever.
# A property's examples share its function-scoped fixtures (the api's table): they must not need a fresh one.
_SUPPRESS = [HealthCheck.function_scoped_fixture]
settings.register_profile(
    "ci", derandomize=True, database=None, max_examples=200, deadline=None, suppress_health_check=_SUPPRESS
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "3000")),
    deadline=None,
    suppress_health_check=_SUPPRESS,
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The translated template's fixture lives with the template helpers it is built from; the reconciler
# tests' `server` and `world` with the world they build.
pytest_plugins = ["tests.support.cfn", "tests.support.reconciler_world"]

# The longest tests, run first. `make test` hands tests to its two workers one at a time, in collection
# order (`--dist load --maxschedchunk 1`): long tests left for the end would keep one worker busy
# while the other idles; started first, the rest fills in around them and both workers end within a
# short test of each other. The e2e modules wait on processes and clocks more than they compute (a
# worker on them leaves the CPU to the other), so they alternate with CPU-bound entries: while one
# worker waits on an e2e test, the other computes. Each module's tests stay next to each other, so a
# worker starts its `fleetkeeper local` once. The rest are CPU-bound on moto. Within an entry, tests
# keep their collection order.
LONG_FIRST = (
    "tests/local/test_endpoint_e2e.py::",
    # 1,000 services each, on the strict layer's ELB (about 113 s and 81 s in a clean-clone `make test`).
    "tests/reconciler/test_alb_pools.py::test_a_thousand_services_with_a_domain_fill_eleven_and_each_gets_its_record",
    "tests/reconciler/test_alb_pools.py::test_a_thousand_services_without_a_domain_fill_twenty_load_balancers",
    "tests/local/test_e2e.py::",
    "tests/simulation/test_simulation.py::",  # 200 steps per seed
    "tests/local/test_auth_e2e.py::",
    "tests/simulation/test_replay.py::",  # each seed run twice
    "tests/local/test_wake_e2e.py::",  # to zero, a wake, to zero and a wake again
    "tests/simulation/test_reclaim_wave.py::",  # eight simulated minutes of a wave per seed
    "tests/local/test_doctor_e2e.py::",  # the whole smoke test against `fleetkeeper local`
    "tests/reconciler/test_crash.py::test_a_crash_at_every_aws_call_is_completed_by_the_next_runs[replica-died-",
    "tests/reconciler/test_crash.py::test_a_crash_at_every_aws_call_is_completed_by_the_next_runs[update-",
    "tests/reconciler/test_crash.py::",  # a fresh world per crash point
    "tests/cleanup/test_cleanup.py::test_every_version_goes_in_ceil_n_over_25_batch_calls[10000]",
    "tests/api/test_aws_semantics.py::test_versions_pages_stay_under_the_lambda_response_limit",
    "tests/api/test_aws_semantics.py::test_the_idempotency_record_of_a_service_of_1000_replicas_is_small",
    "tests/reconciler/test_fanout.py::test_the_schedule_through_dispatcher_queue_and_workers_converges_many_services",
    "tests/cleanup/test_handler.py::test_recreating_the_name_loses_nothing_of_the_new_incarnation",
    "tests/store/test_store.py::test_updates_keep_the_newest_versions_and_never_prune_what_is_in_use",
    "tests/store/test_store.py::test_the_version_being_served_survives_pruning_after_a_rollback",
    "tests/reconciler/test_fanout.py::test_short_runs_stop_in_time_and_rotation_still_brings_every_service_to_ready",
    "tests/local/test_server.py::",  # `fleetkeeper local` subprocesses
    "tests/simulation/test_reactions.py::",
    "tests/stacks/test_isolation.py::",
    "tests/local/test_fixed_port_e2e.py::",
    "tests/replicas/test_boot_propagation.py::",  # waits out IAM's propagation on a real clock
)


# What `make check` leaves to `make test`: the tests on moto (the `aws` fixture and everything built on
# it, moto's server for the replicas' boot, template/test_replica_identity.py's own mock, moto in a
# fresh interpreter: its internals, its tunings against its own code), the ones that start processes
# or a browser, and the simulation.
INTEGRATION_FIXTURES = frozenset({"aws", "endpoints", "made", "plane", "dashboard", "browser"})
INTEGRATION_PATHS = (
    "tests/local/",
    "tests/simulation/",
    "tests/uninstall/",
    "tests/stacks/",
    "tests/dashboard/",
    "tests/test_moto_internals.py",
    "tests/test_moto_tuning.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """LONG_FIRST's tests are marked `slow` and go first; moto-backed and process tests are marked
    `integration`. `make check` runs neither (`-m "not slow and not integration"`)."""

    def rank(item: pytest.Item) -> int:
        return next((n for n, prefix in enumerate(LONG_FIRST) if item.nodeid.startswith(prefix)), len(LONG_FIRST))

    for item in items:
        if rank(item) < len(LONG_FIRST):
            item.add_marker(pytest.mark.slow)
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & INTEGRATION_FIXTURES or item.nodeid.startswith(INTEGRATION_PATHS) or "e2e" in item.keywords:
            item.add_marker(pytest.mark.integration)
    items.sort(key=rank)  # stable: every other test keeps its place


# The strict-AWS layer's hook replaces moto's in botocore's handler list before any client exists,
# so every client of the session carries it (inert until a test activates the layer).
strict_layer.install_hooks()
_STRICT = pytest.StashKey[strict_layer.StrictAws | None]()


def _wants_strict(request: pytest.FixtureRequest) -> bool:
    if "strict_aws" in request.fixturenames:
        return True
    if request.node.get_closest_marker("lenient_aws") is not None:
        return False
    # AWS's semantics are the default (invariant 9, docs/architecture/invariants.md);
    # FLEETKEEPER_STRICT_AWS=0 runs plain moto, to tell a finding of the layer from a fault of the test.
    return os.environ.get(strict_layer.STRICT_ENV, "1") != "0"


def _strict_seed(request: pytest.FixtureRequest) -> int:
    configured = os.environ.get(strict_layer.SEED_ENV)
    return int(configured) if configured else zlib.crc32(request.node.nodeid.encode())


@pytest.fixture
def aws(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh in-memory AWS for one test, with fleetkeeper's clients pointed at it.

    On the strict-AWS layer when the test asks for `strict_aws` or FLEETKEEPER_STRICT_AWS=1.
    """
    from moto import mock_aws

    from fleetkeeper import aws as aws_clients

    aws_clients.reset_clients()
    controller = None
    if _wants_strict(request):
        # Random faults from the environment are for the existing suite; a test asking for
        # `strict_aws` schedules its own.
        explicit = "strict_aws" in request.fixturenames
        faults = strict_layer.FaultRates.parse("" if explicit else os.environ.get(strict_layer.FAULTS_ENV, ""))
        controller = strict_layer.StrictAws(seed=_strict_seed(request), faults=faults)
    request.node.stash[_STRICT] = controller
    with mock_aws(), controller.active() if controller else contextlib.nullcontext():
        yield
    aws_clients.reset_clients()


@pytest.fixture
def strict_aws(aws: None, request: pytest.FixtureRequest) -> strict_layer.StrictAws:
    """The strict-AWS controller over this test's moto (see tests/strict_aws/__init__.py)."""
    controller: strict_layer.StrictAws | None = request.node.stash[_STRICT]
    assert controller is not None
    return controller


@pytest.fixture
def table(aws: None, monkeypatch: pytest.MonkeyPatch) -> str:
    from fleetkeeper import aws as aws_clients
    from fleetkeeper.local.template import create_table

    create_table(aws_clients.dynamodb(), TABLE)
    monkeypatch.setenv("TABLE_NAME", TABLE)
    return TABLE


@pytest.fixture
def atomic_dynamodb(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give moto the isolation DynamoDB guarantees, for tests that write from many threads.

    moto evaluates a transaction's conditions and then applies its writes without a lock, so two
    threads can both pass `attribute_not_exists`; DynamoDB never lets that happen. Serialising
    moto's read and write operations restores the real semantics while our code stays concurrent.
    """
    import functools
    import threading

    from moto.dynamodb.models import DynamoDBBackend

    lock = threading.RLock()
    for name in (
        "put_item",
        "get_item",
        "query",
        "scan",
        "update_item",
        "delete_item",
        "transact_write_items",
    ):
        original = getattr(DynamoDBBackend, name)

        @functools.wraps(original)
        def serialised(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
            with lock:
                return __original(*args, **kwargs)

        monkeypatch.setattr(DynamoDBBackend, name, serialised)


@pytest.fixture
def api(table: str) -> HandlerClient:
    return HandlerClient()
