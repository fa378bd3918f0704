"""Four changes to how moto does its work, not to what it answers: the suite spent much of its time
in them (tests/conftest.py applies them before any mock starts).

- `amis_file()`: moto builds every default AMI, each with a volume and a snapshot, whenever it
  makes an EC2 backend, and it makes one twice per mock (on first use, and again in its reset at the
  end): about 0.2 s per test that touches EC2, per world of the crash sweep, almost all of it for
  1,200 ECS-optimized images no test looks at. With MOTO_AMIS_PATH set, moto loads that file's AMIs
  instead (read when its EC2 models are imported; `fleetkeeper local` subprocesses inherit it).
  The simulation keeps moto's own set (`default_amis()`): every AMI draws ids from moto's seeded
  RNG, so the AMIs loaded decide the ids, and the steps, a seed gets.
- `share_stream_records()` and `lean_transaction_backups()` (fleetkeeper.local.moto_memory, which
  `fleetkeeper local` installs too): moto backs up every table a TransactWriteItems touches with a deepcopy
  (to roll back a cancelled one), stream shard included, a copy that grows with every write of the
  test. A record is never changed once written, so the backup's shard shares them (it still gets a
  list of its own, so a rollback restores the shard as it was). The rest of that backup is lean
  too: a transaction writes only the items it names, so the backup copies those items and shares
  every other (an item is changed in place only by a write to its key); the table's partitions get
  dicts of their own, so a rollback restores them as they were.
- `direct_tag_lookup()`: moto finds an EC2 resource's tags (every instance DescribeInstances lists
  or filters by tag) by matching a pattern of its id against every tag of every resource: quadratic
  in a test's instances, terminated ones included. An id with no wildcard in it matches only itself,
  so its tags are read from moto's tag dict directly, in the same order, with the same fields.
- `remembered_attribute_names()`: moto's response serializer asks six alias providers, for every
  field of every object it answers with, which attribute names to try: a pure function of the
  object's class (and its `Meta`), the field and its shape (and the shape's parent), worked out
  anew each time (a fifth of a DescribeInstances answer's cost). Worked out once per combination.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetkeeper.local.moto_memory import lean_transaction_backups, share_stream_records

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["amis_file", "default_amis", "install", "lean_transaction_backups", "share_stream_records"]


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


_WILDCARDS = frozenset("*?[\\")


def direct_tag_lookup() -> None:
    from moto.ec2.models.core import TaggedEC2Resource
    from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

    original = TaggedEC2Resource.get_tags
    if getattr(original, "direct", False):
        return

    def get_tags(self: Any) -> list[dict[str, str]]:
        resource_id = self.id
        if not resource_id or not isinstance(resource_id, str) or _WILDCARDS & set(resource_id):
            return original(self)
        tags = self.ec2_backend.tags.get(resource_id)
        if not tags:
            return []
        kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(resource_id), "")
        return [{"resource_id": resource_id, "key": k, "value": v, "resource_type": kind} for k, v in tags.items()]

    get_tags.direct = True  # type: ignore[attr-defined]
    TaggedEC2Resource.get_tags = get_tags  # type: ignore[method-assign]


_ALIAS_MEMO_LIMIT = 200_000


def remembered_attribute_names() -> None:
    from moto.core.serialize import AttributePicker

    original = AttributePicker.get_possible_keys
    if getattr(original, "remembered", False):
        return
    # (providers, class, field, id(Meta), id(shape), id(parent)) -> (Meta, shape, parent, names): the
    # objects themselves are kept, so that an id is never another object's while its entry stands.
    memo: dict[tuple[Any, ...], tuple[Any, Any, Any, tuple[str, ...]]] = {}

    def get_possible_keys(self: Any, context: Any) -> Iterator[str]:
        obj, shape = context.obj, context.shape
        meta = getattr(obj, "Meta", None)
        parent = getattr(shape, "parent", None)
        key = (tuple(self.alias_providers), type(obj), context.key, id(meta), id(shape), id(parent))
        entry = memo.get(key)
        if entry is None or entry[0] is not meta or entry[1] is not shape or entry[2] is not parent:
            if len(memo) >= _ALIAS_MEMO_LIMIT:
                memo.clear()
            entry = (meta, shape, parent, tuple(original(self, context)))
            memo[key] = entry
        return iter(entry[3])

    get_possible_keys.remembered = True  # type: ignore[attr-defined]
    AttributePicker.get_possible_keys = get_possible_keys  # type: ignore[method-assign]


def install() -> None:
    """Every tuning above that patches moto's classes (conftest applies them before any mock starts)."""
    share_stream_records()
    lean_transaction_backups()
    direct_tag_lookup()
    remembered_attribute_names()
