"""boto3 clients, created lazily and cached per (service, region, endpoint).

Lazy, because a client made at import time costs cold-start time and escapes moto when tests start
it later; cached, because creating a client costs ~50 ms. `reset_clients()` is for tests that
start a fresh in-memory AWS. The service models, endpoint rules and the like that botocore reads
from its JSON files are read once per process (one loader shared by every client's session), so a
client made again after `reset_clients()` costs ~20-40 ms instead of ~70-170 ms.

Every client honours the deadline a handler sets for its invocation (`within`, fleetkeeper.aws.deadline):
no attempt starts and no retry pauses unless the time left covers it; short of it the call raises
`DeadlineReached`.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

# Re-exported: the handlers and the reconciler use them as `aws.within`, `aws.DeadlineReached`...
from fleetkeeper.aws.deadline import DeadlineReached as DeadlineReached
from fleetkeeper.aws.deadline import guard
from fleetkeeper.aws.deadline import keeping as keeping
from fleetkeeper.aws.deadline import reached as reached
from fleetkeeper.aws.deadline import seconds_left as seconds_left
from fleetkeeper.aws.deadline import within as within

if TYPE_CHECKING:
    from botocore.config import _RetryDict
    from mypy_boto3_cloudformation import CloudFormationClient
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_ec2 import EC2Client
    from mypy_boto3_elbv2 import ElasticLoadBalancingv2Client
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_ssm import SSMClient

# botocore's "standard" retry mode: a throttled or transient call is retried up to RETRIES times
# after the first attempt (botocore's `max_attempts` client option counts retries, not attempts).
# EC2's client uses "adaptive" mode: the same retries, plus client-side rate limiting (a token bucket
# whose rate botocore lowers on each throttle and raises again as calls succeed). EC2 throttles per
# account (DescribeInstances 20/s, RunInstances 2/s, mutating calls 5/s, with bursts), and the
# reconciler's shard workers share those buckets: each backs off on its own rather than retrying
# into the limit. DynamoDB (on-demand) keeps "standard".
RETRIES = 5
ADAPTIVE_SERVICES = frozenset({"ec2"})
# Its backoff (botocore/retries/standard.py, ExponentialBackoff): before retry i (i = 0, 1, ...) it
# sleeps up to min(1 s * 2**i, 20 s) after a throttling error (less after other errors), and up to
# 5 s more when the response carries `x-amz-retry-after`.
_BACKOFF_CAP_SECONDS = 20.0
_RETRY_AFTER_EXTRA_SECONDS = 5.0
# So one call can spend this long sleeping between its attempts before it raises: 1 + 2 + 4 + 8 + 16
# + 5 * 5 = 56 s (the attempts' own time comes on top): why no caller can keep a call's worst case
# in hand, and why the handlers hold every call to their invocation's deadline instead (`within`).
WORST_CASE_RETRY_WAIT_SECONDS = sum(
    min(2.0**retry, _BACKOFF_CAP_SECONDS) + _RETRY_AFTER_EXTRA_SECONDS for retry in range(RETRIES)
)

# Each attempt's limits: this long to connect, then this long for each wait on the socket for data.
CONNECT_TIMEOUT_SECONDS = 3
READ_TIMEOUT_SECONDS = 10

# The api's reconciler kick (a SendMessage to the kick queue) has its own client: a kick is
# best-effort and the schedule is its backstop, so it may cost an api request at most
# KICK_CONNECT_TIMEOUT + KICK_READ_TIMEOUT seconds, one attempt, never the shared client's 5
# retries with 10 s reads, which could outlast API Gateway's 29 s integration timeout.
KICK_CONNECT_TIMEOUT = 1
KICK_READ_TIMEOUT = 2

_clients: dict[tuple[str, str | None, str | None], Any] = {}
_lock = threading.Lock()
# botocore's data loader (its JSON files, parsed and cached), shared by every session made below.
_loader: Any = None


def _client(service: str, *, kick: bool = False) -> Any:
    # Read here, not from fleetkeeper.settings: clients are made lazily from anywhere (the handlers,
    # the CLI, the embedded server, tests), the embedded server points them at its in-memory AWS
    # after start-up, and the cache key keeps a client per (region, endpoint) as they change.
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    endpoint = os.environ.get("FLEETKEEPER_AWS_ENDPOINT_URL") or None
    key = (service + ("/kick" if kick else ""), region, endpoint)
    with _lock:
        client = _clients.get(key)
        if client is None:
            # botocore directly, imported on first use: boto3's session adds ~40 ms of imports
            # (s3transfer, resources) that no fleetkeeper function needs.
            import botocore
            import botocore.session
            from botocore.config import Config

            from fleetkeeper.aws.parsing import ResponseParsers, checked_against

            if kick:
                config = Config(
                    retries={"mode": "standard", "total_max_attempts": 1},
                    connect_timeout=KICK_CONNECT_TIMEOUT,
                    read_timeout=KICK_READ_TIMEOUT,
                )
            else:
                retries: _RetryDict = {"mode": "adaptive" if service in ADAPTIVE_SERVICES else "standard"}
                retries["max_attempts"] = RETRIES
                config = Config(
                    retries=retries,
                    connect_timeout=CONNECT_TIMEOUT_SECONDS,
                    read_timeout=READ_TIMEOUT_SECONDS,
                    # S3's presigned URLs (workdir uploads) must be SigV4: it signs their checksum header.
                    signature_version="s3v4" if service == "s3" else None,
                )
            global _loader
            session = botocore.session.get_session()
            # The first session's loader serves every later one: it holds only what botocore's data
            # files say (read from the search path the first session's settings gave it).
            if _loader is None:
                _loader = session.get_component("data_loader")
            else:
                session.register_component("data_loader", _loader)
            # The same responses as botocore's own parsers give, at a fraction of their CPU for
            # DescribeInstances and DynamoDB items (fleetkeeper.aws.parsing says how): only on the
            # botocore release they were checked against (the one the Lambda bundle pins); any other
            # keeps botocore's own parsers, whose private handlers the shortcuts override.
            if checked_against(botocore.__version__):
                session.register_component("response_parser_factory", ResponseParsers())
            client = session.create_client(service, region_name=region, endpoint_url=endpoint, config=config)
            guard(client)
            _clients[key] = client
        return client


def dynamodb() -> DynamoDBClient:
    client: DynamoDBClient = _client("dynamodb")
    return client


def ec2() -> EC2Client:
    client: EC2Client = _client("ec2")
    return client


def sqs_for_kick() -> SQSClient:
    """SQS for the api's best-effort reconciler kick: one attempt, short timeouts."""
    client: SQSClient = _client("sqs", kick=True)
    return client


def elbv2() -> ElasticLoadBalancingv2Client:
    client: ElasticLoadBalancingv2Client = _client("elbv2")
    return client


def cloudwatch() -> CloudWatchClient:
    client: CloudWatchClient = _client("cloudwatch")
    return client


def sqs() -> SQSClient:
    client: SQSClient = _client("sqs")
    return client


def ssm() -> SSMClient:
    client: SSMClient = _client("ssm")
    return client


def s3() -> S3Client:
    client: S3Client = _client("s3")
    return client


def iam() -> Any:
    """IAM (the owners' replica roles: fleetkeeper.replicas.identity). Untyped: the stubs are not installed."""
    return _client("iam")


def route53() -> Any:
    """Route 53 (no type stubs installed): the reconciler's records for services on extra load balancer pools."""
    return _client("route53")


def cloudformation() -> CloudFormationClient:
    """CloudFormation (the uninstall cleanup asks whether its own stack is being deleted)."""
    client: CloudFormationClient = _client("cloudformation")
    return client


def reset_clients() -> None:
    with _lock:
        _clients.clear()
