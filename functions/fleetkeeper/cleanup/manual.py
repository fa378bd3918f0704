"""Run the cleanup by hand for one (name, uid): what an operator does after CleanupFailuresAlarm.

    python -m fleetkeeper.cleanup.manual --table T --name web            # list the partition's uids
    python -m fleetkeeper.cleanup.manual --table T --name web --uid UID  # delete that uid's children

The stream's failure queue only describes the failed batch (shard, sequence numbers); the name is in
the alarm's logs (`service_name`, `uid`) or found by listing. Deletion goes through the same code as
the function and refuses the live incarnation's uid. Listing never deletes anything: telling an
orphan from a new incarnation mid-creation is a decision for the operator, not a guess for code.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from fleetkeeper.cleanup.logic import Budget, Cleaner
from fleetkeeper.store.cleanup import ChildKeys, partition_uids
from fleetkeeper.store.table import Table

if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetkeeper.cleanup.manual", description=__doc__)
    parser.add_argument("--table", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--uid", help="the removed incarnation whose versions and replicas to delete")
    args = parser.parse_args(argv)
    table = Table(args.table)
    live, counts = partition_uids(table, args.name)
    if args.uid is None:
        for uid, count in sorted(counts.items()):
            print(f"{uid}  {count} child item(s){'  (live incarnation)' if uid == live else ''}")
        return 0
    if args.uid == live:
        print(f"refusing: {args.uid} is the live incarnation of {args.name!r}", file=sys.stderr)
        return 2
    progress = Cleaner(
        children=ChildKeys(table, args.name, args.uid),
        budget=Budget(remaining_ms=lambda: 10**9),  # no Lambda limit here
    ).run()
    print(f"deleted {progress.deleted} item(s) of {args.name!r} uid {args.uid} ({progress.batch_calls} calls)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
