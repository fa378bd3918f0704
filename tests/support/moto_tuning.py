"""Seven changes to how moto does its work, not to what it answers: the suite spent much of its time
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
- `quick_value_picking()`: for every field of every answer, moto's serializer also builds a context
  object and the field's dotted path, then tests the path against each of the service's response
  transformers (EC2 has a dozen): the suite's largest single cost (a sixth of its CPU, measured with
  py-spy over `make unit`). The names to try come from the memo above; the path is built only when a
  transformer's path could end with the field's name, the only case in which one can match. The
  same value comes out, transformed by the same transformer.
- `one_pass_traversal()`: moto validates an UpdateExpression with ten passes over its tree, and each
  pass asks, at every node, for a fresh tuple of the node classes it processes and then which of them
  the node is (abstract classes, so a slow `isinstance`). A pass asks once per traversal, and once per
  node class; the nodes are visited, processed and replaced in the same order.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import tempfile
import threading
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


class _NamesMemo:
    """The attribute names moto's pickers try for a field: a pure function of the alias providers, the
    object's class (and its `Meta`), the field and its shape (and the shape's parent), kept per
    combination. (providers, class, field, id(Meta), id(shape), id(parent)) -> (Meta, shape, parent,
    names): the objects themselves are kept, so that an id is never another object's while its entry
    stands."""

    def __init__(self) -> None:
        self._entries: dict[tuple[Any, ...], tuple[Any, Any, Any, tuple[str, ...]]] = {}

    def names(self, providers: Any, obj: Any, key: str, shape: Any, work_out: Any) -> tuple[str, ...]:
        meta = getattr(obj, "Meta", None)
        parent = getattr(shape, "parent", None)
        memo_key = (tuple(providers), type(obj), key, id(meta), id(shape), id(parent))
        entry = self._entries.get(memo_key)
        if entry is None or entry[0] is not meta or entry[1] is not shape or entry[2] is not parent:
            if len(self._entries) >= _ALIAS_MEMO_LIMIT:
                self._entries.clear()
            entry = (meta, shape, parent, tuple(work_out()))
            self._entries[memo_key] = entry
        return entry[3]


def remembered_attribute_names() -> None:
    from moto.core.serialize import AttributePicker

    original = AttributePicker.get_possible_keys
    if getattr(original, "remembered", False):
        return
    memo = _NamesMemo()

    def get_possible_keys(self: Any, context: Any) -> Iterator[str]:
        names = memo.names(
            self.alias_providers, context.obj, context.key, context.shape, lambda: original(self, context)
        )
        return iter(names)

    get_possible_keys.remembered = True  # type: ignore[attr-defined]
    AttributePicker.get_possible_keys = get_possible_keys  # type: ignore[method-assign]


def quick_value_picking() -> None:
    from moto.core import serialize

    original = serialize.ResponseSerializer.get_value
    if getattr(original, "quick", False):
        return
    picker_call = serialize.AttributePicker.__call__
    possible_keys = serialize.XFormedAttributePicker.get_possible_keys
    lookup = serialize.get_value
    missing = serialize.MISSING
    names_memo = _NamesMemo()
    # (the transformers' paths, field) -> the paths, in the transformers' order, that could match the field.
    paths_memo: dict[tuple[tuple[str, ...], str], tuple[str, ...]] = {}

    def get_value(self: Any, value: Any, key: str, shape: Any) -> Any:
        picker = self._value_picker
        kind = type(picker)
        # Only moto's own picker, as moto's execute_result makes it; any other goes the usual way.
        if kind.__call__ is not picker_call or kind.get_possible_keys is not possible_keys:
            return original(self, value, key, shape)

        def work_out() -> Any:
            context = serialize.AttributePickerContext(
                obj=value,
                key=key,
                shape=shape,
                operation_model=self.operation_model,
                service_model=self.operation_model.service_model,
                key_path=".".join(self.path),
            )
            return picker.get_possible_keys(context)

        names = names_memo.names(picker.alias_providers, value, key, shape, work_out)
        picked = None
        for name in names:
            found = lookup(value, name, missing)
            if found is not missing:
                picked = found
                break
        transformers = picker.response_transformers
        if not transformers:
            return picked
        paths_key = (tuple(transformers), key)
        candidates = paths_memo.get(paths_key)
        if candidates is None:
            if len(paths_memo) >= _ALIAS_MEMO_LIMIT:
                paths_memo.clear()
            # The full path ends with ".<key>": a transformer's path can be a suffix of it only if it
            # is a suffix of the key, or ends with the key.
            candidates = tuple(path for path in transformers if key.endswith(path) or path.endswith(key))
            paths_memo[paths_key] = candidates
        if candidates:
            key_path = f"{'.'.join(self.path)}.{key}"
            for path in candidates:
                if key_path.endswith(path):
                    return transformers[path](picked)
        return picked

    get_value.quick = True  # type: ignore[attr-defined]
    serialize.ResponseSerializer.get_value = get_value  # type: ignore[method-assign]


def one_pass_traversal() -> None:
    from moto.dynamodb.parsing.ast_nodes import DepthFirstTraverser, Node

    original = DepthFirstTraverser.traverse
    if getattr(original, "one_pass", False):
        return
    own = {name: DepthFirstTraverser.__dict__[name] for name in ("traverse_node_recursively", "process")}

    def traverse(self: Any, node: Any) -> Any:
        kind = type(self)
        # A traverser that walks or processes in its own way goes the usual way.
        if any(getattr(kind, name) is not function for name, function in own.items()):
            return original(self, node)
        processing = self._processing_map()
        processed = self.nodes_to_be_processed()
        # What the walk asks of a node depends on its class only: (a Node?, processed?, the processor
        # process() would pick), asked once per class.
        by_class: dict[type, tuple[bool, bool, Any]] = {}

        def judged(node: Any) -> tuple[bool, bool, Any]:
            node_class = type(node)
            verdict = by_class.get(node_class)
            if verdict is None:
                is_node, is_processed = isinstance(node, Node), isinstance(node, processed)
                chosen = next((p for cls, p in processing.items() if isinstance(node, cls)), None)
                verdict = by_class[node_class] = (is_node, is_processed, chosen)
            return verdict

        def visit(node: Any, child_id: int = -1) -> Any:
            is_node, is_processed, chosen = judged(node)
            if is_node:
                parent_node = node.parent
                if node.children is not None:
                    for i, child_node in enumerate(node.children):
                        self.pre_processing_of_child(node, i)
                        visit(child_node, i)
                if is_processed:
                    node = chosen(node) if chosen is not None else None
                    node.parent = parent_node  # type: ignore[attr-defined]
                    if parent_node:
                        parent_node.children[child_id] = node
            return node

        return visit(node)

    traverse.one_pass = True  # type: ignore[attr-defined]
    DepthFirstTraverser.traverse = traverse  # type: ignore[method-assign]


_querying = threading.local()


def partitioned_queries() -> None:
    from moto.dynamodb.models.table import Table

    original_query, original_all_items = Table.query, Table.all_items
    if getattr(original_query, "partitioned", False):
        return
    signature = inspect.signature(original_query)

    def query(self: Any, *args: Any, **kwargs: Any) -> Any:
        asked = signature.bind(self, *args, **kwargs).arguments
        # (table, partition key or None for an index's Query), for all_items below, in this thread only.
        _querying.asked = (self, None if asked.get("index_name") else asked.get("hash_key"))
        try:
            return original_query(self, *args, **kwargs)
        finally:
            _querying.asked = None

    def all_items(self: Any) -> Any:
        asked = getattr(_querying, "asked", None)
        if asked is None or asked[0] is not self:
            return original_all_items(self)
        partition_key = asked[1]
        if partition_key is None:
            stored = list(self.items.values())
        else:
            stored = [self.items[partition_key]] if partition_key in self.items else []
        if not self.range_key_attr:
            return stored
        return [item for partition in stored for item in partition.values()]

    query.partitioned = True  # type: ignore[attr-defined]
    Table.query = query  # type: ignore[method-assign]
    Table.all_items = all_items  # type: ignore[method-assign]


def install() -> None:
    """Every tuning above that patches moto's classes (conftest applies them before any mock starts)."""
    share_stream_records()
    lean_transaction_backups()
    direct_tag_lookup()
    remembered_attribute_names()
    quick_value_picking()
    one_pass_traversal()
    partitioned_queries()
