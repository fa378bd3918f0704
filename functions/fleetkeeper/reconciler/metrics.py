"""The autoscaler's signal: each service's request rate, from its endpoint's CloudWatch metric.

Both load balancers publish `AWS/ApplicationELB` `RequestCount` (the ALB itself per target group and
minute; the local balancer into the in-memory AWS every `--metrics-interval`), with the dimensions
the endpoint record keeps. One run reads every autoscaled service's metric in as few GetMetricData
calls as the API allows: at most `MAX_QUERIES_PER_CALL` (500) metrics a call, never one call per
service. A metric with no data point in the window is zero requests (the ALB publishes nothing
for a minute without requests).

The window: `window_seconds` ending `lag_seconds` ago, both aligned to the window (CloudWatch's
buckets start on the period), so that the bucket read is complete when read: the ALB publishes a
minute's count about a minute after it ends. rate = the window's Sum / window_seconds.
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


def _default_client() -> CloudWatchClient:
    from fleetkeeper import aws

    return aws.cloudwatch()


@dataclass
class RequestRates:
    """Reads request rates for a run's services (the shell's `rates`)."""

    window_seconds: int = DEFAULT_WINDOW_SECONDS
    lag_seconds: int = DEFAULT_LAG_SECONDS
    client: Callable[[], CloudWatchClient] = _default_client

    def window(self, now: datetime) -> tuple[datetime, datetime]:
        """[start, end) of the window read at `now`: aligned to the window, `lag_seconds` back."""
        epoch = (now - timedelta(seconds=self.lag_seconds)).timestamp()
        end = math.floor(epoch / self.window_seconds) * self.window_seconds
        return (
            datetime.fromtimestamp(end - self.window_seconds, UTC),
            datetime.fromtimestamp(end, UTC),
        )

    def read(self, dimensions: Mapping[str, Sequence[tuple[str, str]]], now: datetime) -> dict[str, float]:
        """Requests a second of each key's metric (a key: a service name), every key answered
        (no data point: 0.0). ceil(len / 500) GetMetricData calls (more only if CloudWatch pages)."""
        keys = sorted(dimensions)
        start, end = self.window(now)
        sums = dict.fromkeys(keys, 0.0)
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
                request: dict[str, Any] = {"MetricDataQueries": queries, "StartTime": start, "EndTime": end}
                if token:
                    request["NextToken"] = token
                answer = client.get_metric_data(**request)
                for result in answer.get("MetricDataResults", []):
                    key = ids.get(result.get("Id", ""))
                    if key is not None:
                        sums[key] += sum(float(value) for value in result.get("Values", []))
                token = answer.get("NextToken")
                if not token:
                    break
        return {key: total / self.window_seconds for key, total in sums.items()}

    @staticmethod
    def calls_for(metrics: int) -> int:
        """GetMetricData calls a run makes for this many autoscaled services (no paging)."""
        return math.ceil(metrics / MAX_QUERIES_PER_CALL)
