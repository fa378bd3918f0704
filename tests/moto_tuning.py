"""Two changes to how moto does its work, not to what it answers: the suite spent much of its time
in them (tests/conftest.py applies both before any mock starts).

- `amis_file()`: moto builds every default AMI, each with a volume and a snapshot, whenever it
  makes an EC2 backend, and it makes one twice per mock (on first use, and again in its reset at the
  end): about 0.2 s per test that touches EC2, per world of the crash sweep, almost all of it for
  1,200 ECS-optimized images no test looks at. With MOTO_AMIS_PATH set, moto loads that file's AMIs
  instead (read when its EC2 models are imported; `fleetkeeper local` subprocesses inherit it).
  The simulation keeps moto's own set (`default_amis()`): every AMI draws ids from moto's seeded
  RNG, so the AMIs loaded decide the ids, and the steps, a seed gets.
- `share_stream_records()`: moto backs up every table a TransactWriteItems touches with a deepcopy
  (to roll back a cancelled one), stream shard included, a copy that grows with every write of the
  test. A record is never changed once written, so the backup's shard shares them (it still gets a
  list of its own, so a rollback restores the shard as it was).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator


def amis_file() -> str:
    """A file of the AMIs moto's EC2 knows in us-east-1 (its amis.json and latest_amis), but the
    ECS-optimized ones. Made from moto's own resources, so the Amazon images, and those its SSM
    `ami-amazon-linux-latest` parameters name, stay as moto ships them."""
    from moto.utilities.utils import load_resource

    path = Path(tempfile.gettempdir()) / f"fleetkeeper-tests-moto-{version('moto')}-amis.json"
    if not path.exists():
        amis = load_resource("ec2/resources/amis.json") + load_resource("ec2/resources/latest_amis/us-east-1.json")
        # Atomically: xdist's workers may all write it at once.
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_text(json.dumps(amis))
        partial.replace(path)
    return str(path)


@contextlib.contextmanager
def default_amis() -> Iterator[None]:
    """EC2 backends made meanwhile load every AMI moto ships, as without MOTO_AMIS_PATH."""
    from moto.ec2.models import amis
    from moto.utilities.utils import load_resource

    saved_path, saved_amis = os.environ.pop("MOTO_AMIS_PATH", None), amis.AMIS
    amis.AMIS = load_resource("ec2/resources/amis.json")
    try:
        yield
    finally:
        amis.AMIS = saved_amis
        if saved_path is not None:
            os.environ["MOTO_AMIS_PATH"] = saved_path


def _copy_shard(shard: Any, memo: dict[int, Any]) -> Any:
    """`copy.deepcopy` of moto's StreamShard: its own list of the very same (immutable) records."""
    clone = copy.copy(shard)
    memo[id(shard)] = clone
    clone.table = copy.deepcopy(shard.table, memo)
    clone.items = list(shard.items)
    return clone


def share_stream_records() -> None:
    from moto.dynamodb.models.table import StreamShard

    StreamShard.__deepcopy__ = _copy_shard  # type: ignore[attr-defined]
