"""The autoscaler's signal: each service's request rate, from its endpoint's CloudWatch metric.

Both load balancers publish `AWS/ApplicationELB` `RequestCount` (the ALB itself per target group and
minute; the local balancer into the in-memory AWS every `--metrics-interval`), with the dimensions
the endpoint record keeps. One run reads every autoscaled service's metric in as few GetMetricData
calls as the API allows: at most `MAX_QUERIES_PER_CALL` (500) metrics a call, never one call per
service.

The window: `window_seconds` ending `lag_seconds` ago, both aligned to the window (CloudWatch's
buckets start on the period), so that the bucket read is complete when read: the ALB publishes a
minute's count about a minute after it ends. rate = the window's Sum / window_seconds.

A missing data point is not zero requests. The ALB publishes nothing for a minute without requests
("If there are no requests flowing through the load balancer or no data for a metric, the metric is
not reported": https://docs.aws.amazon.com/elasticloadbalancing/latest/application/load-balancer-cloudwatch-metrics.html),
and nothing yet for a minute whose data point is late: the two look the same in the newest window.
So the read covers `quiet_windows` windows back: a metric with a data point in the newest window
has that rate; one with data points only in the older windows has NO reading this run (None: its
newest count may still come; the autoscaler holds its target, autoscale.decide); one with no data
point in any of them has been quiet that long, which lateness does not explain: zero requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from fleetkeeper.reconciler.balancer import METRIC_NAME, METRIC_NAMESPACE

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_cloudwatch.type_defs import MetricDataQueryTypeDef

# GetMetricData's documented limit: "A single GetMetricData call can include as many as 500
# MetricDataQuery structures" (and 100,800 data points in all: one a metric here).
MAX_QUERIES_PER_CALL = 500
DEFAULT_WINDOW_SECONDS = 60
DEFAULT_LAG_SECONDS = 60
# Windows without a single data point before a metric reads as zero requests: five minutes on AWS,
# well past the minute or two an ALB data point arrives late, and well inside the autoscaler's
# downscale delay (1,200 s by default), so stopping traffic still scales down in time.
DEFAULT_QUIET_WINDOWS = 5


def _default_client() -> CloudWatchClient:
    from fleetkeeper import aws

    return aws.cloudwatch()


@dataclass
class RequestRates:
    """Reads request rates for a run's services (the shell's `rates`)."""

    window_seconds: int = DEFAULT_WINDOW_SECONDS
    lag_seconds: int = DEFAULT_LAG_SECONDS
    quiet_windows: int = DEFAULT_QUIET_WINDOWS
    client: Callable[[], CloudWatchClient] = _default_client

    def __post_init__(self) -> None:
        if self.quiet_windows < 1:
            raise ValueError(f"quiet_windows must be at least 1 (it is {self.quiet_windows})")

    def window(self, now: datetime) -> tuple[datetime, datetime]:
        """[start, end) of the window read at `now`: aligned to the window, `lag_seconds` back."""
        epoch = (now - timedelta(seconds=self.lag_seconds)).timestamp()
        end = math.floor(epoch / self.window_seconds) * self.window_seconds
        return (
            datetime.fromtimestamp(end - self.window_seconds, UTC),
            datetime.fromtimestamp(end, UTC),
        )

    def read(self, dimensions: Mapping[str, Sequence[tuple[str, str]]], now: datetime) -> dict[str, float | None]:
        """Requests a second of each key's metric (a key: a service name), every key answered: the
        newest window's rate, None (no reading: only older windows have data points, the newest may
        be late), or 0.0 (no data point in `quiet_windows` windows). ceil(len / 500) GetMetricData
        calls (more only if CloudWatch pages)."""
        keys = sorted(dimensions)
        start, end = self.window(now)
        # The older windows, read in the same query (one data point per window and metric: at most
        # 500 x quiet_windows a call, far below GetMetricData's 100,800).
        since = start - timedelta(seconds=self.window_seconds * (self.quiet_windows - 1))
        newest = dict.fromkeys(keys, 0.0)
        counted: set[str] = set()
        heard: set[str] = set()
        client = self.client()
        for first in range(0, len(keys), MAX_QUERIES_PER_CALL):
            chunk = keys[first : first + MAX_QUERIES_PER_CALL]
            ids = {f"m{index}": key for index, key in enumerate(chunk)}
            queries: list[MetricDataQueryTypeDef] = [
                {
                    "Id": query_id,
                    "MetricStat": {
                        "Metric": {
                            "Namespace": METRIC_NAMESPACE,
                            "MetricName": METRIC_NAME,
                            "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions[key]],
                        },
                        "Period": self.window_seconds,
                        "Stat": "Sum",
                    },
                    "ReturnData": True,
                }
                for query_id, key in ids.items()
            ]
            token: str | None = None
            while True:
                request: dict[str, Any] = {"MetricDataQueries": queries, "StartTime": since, "EndTime": end}
                if token:
                    request["NextToken"] = token
                answer = client.get_metric_data(**request)
                for result in answer.get("MetricDataResults", []):
                    key = ids.get(result.get("Id", ""))
                    if key is None:
                        continue
                    for stamp, value in zip(result.get("Timestamps", []), result.get("Values", []), strict=False):
                        heard.add(key)
                        if stamp >= start:
                            counted.add(key)
                            newest[key] += float(value)
                token = answer.get("NextToken")
                if not token:
                    break
        return {key: self._rate(newest[key], key in counted, key in heard) for key in keys}

    def _rate(self, newest: float, counted: bool, heard: bool) -> float | None:
        if counted:
            return newest / self.window_seconds
        return None if heard else 0.0

    @staticmethod
    def calls_for(metrics: int) -> int:
        """GetMetricData calls a run makes for this many autoscaled services (no paging)."""
        return math.ceil(metrics / MAX_QUERIES_PER_CALL)


def request_series(
    client: CloudWatchClient,
    dimensions: Sequence[tuple[str, str]],
    start: datetime,
    end: datetime,
    period_seconds: int,
) -> list[tuple[datetime, float]]:
    """One endpoint's requests a second in each `period_seconds` bucket of [start, end), oldest first,
    from the same RequestCount the autoscaler reads (the api's GET .../metrics, for a dashboard's plot).

    A bucket without a data point is left out, not answered as zero: as for the autoscaler, a missing
    point may be a quiet minute or a late one (the module docstring), and a plot must not tell them apart
    by guessing. One GetMetricData query, followed through its pages."""
    query: MetricDataQueryTypeDef = {
        "Id": "requests",
        "MetricStat": {
            "Metric": {
                "Namespace": METRIC_NAMESPACE,
                "MetricName": METRIC_NAME,
                "Dimensions": [{"Name": k, "Value": v} for k, v in dimensions],
            },
            "Period": period_seconds,
            "Stat": "Sum",
        },
        "ReturnData": True,
    }
    sums: dict[datetime, float] = {}
    token: str | None = None
    while True:
        request: dict[str, Any] = {
            "MetricDataQueries": [query],
            "StartTime": start,
            "EndTime": end,
            "ScanBy": "TimestampAscending",
        }
        if token:
            request["NextToken"] = token
        answer = client.get_metric_data(**request)
        for result in answer.get("MetricDataResults", []):
            for stamp, value in zip(result.get("Timestamps", []), result.get("Values", []), strict=False):
                sums[stamp] = sums.get(stamp, 0.0) + float(value)
        token = answer.get("NextToken")
        if not token:
            break
    return [(stamp, total / period_seconds) for stamp, total in sorted(sums.items())]
