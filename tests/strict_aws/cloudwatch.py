"""CloudWatch's GetMetricData as AWS documents it, over moto's cloudwatch (which accepts anything).

Always on:

- at most 500 `MetricDataQueries` a call (API reference, *GetMetricData*: "A single GetMetricData
  call can include as many as 500 MetricDataQuery structures"); more is a `ValidationError` (400);
- each query's `Id` unique in the call and matching `^[a-z][a-zA-Z0-9_]*$`, at most 255 characters
  (*MetricDataQuery*: "The first character must be a lowercase letter"; "Valid characters are
  letters, numbers, and underscore"; unique within the request);
- a `MetricStat` period of 1, 5, 10, 20, 30 or 60 seconds, or a multiple of 60 (*MetricStat*:
  "For metrics with regular resolution, a period can be as short as one minute (60 seconds) and
  must be a multiple of 60. For high-resolution metrics ... 1, 5, 10, 20, 30, 60, or any multiple
  of 60");
- `EndTime` after `StartTime` (moto checks this one itself).

The error code AWS answers for these is not documented; the layer's `ValidationError` is the one
AWS's other Query-API validation answers with. It counts the metrics each call requested
(`metrics_requested`): GetMetricData is billed per metric requested, not per call.
Not modelled: the 100,800 data points a call (AWS then pages with NextToken), Metrics Insights
queries, math expressions, throttling beyond what `StrictAws.throttle` schedules.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING

from tests.strict_aws.wire import Call, Response, json_error

if TYPE_CHECKING:
    from tests.strict_aws.core import StrictAws

MAX_QUERIES = 500
_ID = re.compile(r"^[a-z][a-zA-Z0-9_]{0,254}$")
_HIGH_RESOLUTION_PERIODS = frozenset({1, 5, 10, 20, 30})
_PREFIX = "com.amazonaws.cloudwatch"


def _refuse(message: str) -> Response:
    return json_error("ValidationError", message, prefix=_PREFIX)


class CloudWatchLayer:
    def __init__(self, strict: StrictAws) -> None:
        self.strict = strict
        self.lock = threading.Lock()
        # One entry per GetMetricData call that reached moto: how many metrics it requested.
        self.metrics_requested: list[int] = []

    def send(self, call: Call) -> Response:
        if call.operation != "GetMetricData":
            return call.send()
        queries = call.json().get("MetricDataQueries") or []
        if len(queries) > MAX_QUERIES:
            return _refuse(f"The collection MetricDataQueries must not have a size greater than {MAX_QUERIES}.")
        seen: set[str] = set()
        for number, query in enumerate(queries, start=1):
            query_id = str(query.get("Id", ""))
            if not _ID.match(query_id):
                return _refuse(
                    f"The value {query_id} for parameter MetricDataQueries.member.{number}.Id is not valid: "
                    "it must start with a lowercase letter and contain only letters, numbers and underscores."
                )
            if query_id in seen:
                return _refuse(
                    f"The value {query_id} for parameter MetricDataQueries.member.{number}.Id is not unique."
                )
            seen.add(query_id)
            stat = query.get("MetricStat")
            if stat is not None:
                period = int(stat.get("Period", 0))
                if period <= 0 or (period not in _HIGH_RESOLUTION_PERIODS and period % 60 != 0):
                    return _refuse(
                        f"The parameter MetricDataQueries.member.{number}.MetricStat.Period must be 1, 5, 10, 20, "
                        "30, 60 or a multiple of 60."
                    )
        with self.lock:
            self.metrics_requested.append(len(queries))
        return call.send()
