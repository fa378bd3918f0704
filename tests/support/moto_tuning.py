"""Changes to how moto (and botocore beneath it) does its work, not to what it answers: the suite spent
much of its time in them (tests/conftest.py applies them before any mock starts; the CPU shares below
were measured with py-spy over a whole `make unit`).

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
- `quick_structures()`: the same picking, once per structure instead of once per field: a
  structure's members, with the names to try and the transformers that could apply to each, are
  worked out once per (class, shape), and a plain dict's key is read directly. DynamoDB's answers
  are mostly such structures (every attribute value is one, of ten members): their serialization
  was a twelfth of the suite's CPU.
- `one_pass_traversal()`: moto validates an UpdateExpression with ten passes over its tree, and each
  pass asks, at every node, for a fresh tuple of the node classes it processes and then which of them
  the node is (abstract classes, so a slow `isinstance`). A pass asks once per traversal, and once per
  node class; the nodes are visited, processed and replaced in the same order.
- `counted_clauses()`: one of those passes counts an update's ADD, REMOVE and SET clauses by
  listing them below every node, quadratic in the clauses; counted once per subtree instead.
- `partitioned_queries()`: a Query reads its partition's items as stored, not the whole table sorted.
- `shared_botocore_loader()`: every botocore session reads the service models through one loader,
  not one each (4% of the suite's CPU went to parsing the same JSON files again).
- `shared_event_aliases()`: botocore's sessions and clients with the same event aliases share the
  event names they have renamed, instead of each renaming every event again.
- `direct_method_lookup()`: moto asks whether the action is a method of its response class without
  listing the class's every member first.
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


# A structure's member: (its name, its shape, the attribute names to try, the transformer paths that could match it).
_MemberPick = tuple[str, Any, tuple[str, ...], tuple[str, ...]]


class _QuickPicking:
    """How moto's serializer picks a field's value, worked out once per combination: the names to
    try (`_NamesMemo`), the response transformers whose path could match the field, and, for a whole
    structure, both for each of its members (`plan`). Shared by quick_value_picking and
    quick_structures, which pick exactly as moto's `ResponseSerializer.get_value` does."""

    def __init__(self) -> None:
        from moto.core import serialize

        self.serialize = serialize
        self.picker_call = serialize.AttributePicker.__call__
        self.possible_keys = serialize.XFormedAttributePicker.get_possible_keys
        self.names_memo = _NamesMemo()
        # (the transformers' paths, field) -> the paths, in the transformers' order, that could match the field.
        self.paths_memo: dict[tuple[tuple[str, ...], str], tuple[str, ...]] = {}
        # (providers, transformers' paths, class, id(Meta), id(shape)) -> (Meta, shape, the members' picks)
        self.plans: dict[tuple[Any, ...], tuple[Any, Any, tuple[_MemberPick, ...]]] = {}

    def stock(self, picker: Any) -> bool:
        """Only moto's own picker, as moto's execute_result makes it; any other goes the usual way."""
        kind = type(picker)
        return kind.__call__ is self.picker_call and kind.get_possible_keys is self.possible_keys

    def names(self, serializer: Any, picker: Any, value: Any, key: str, shape: Any) -> tuple[str, ...]:
        def work_out() -> Any:
            context = self.serialize.AttributePickerContext(
                obj=value,
                key=key,
                shape=shape,
                operation_model=serializer.operation_model,
                service_model=serializer.operation_model.service_model,
                key_path=".".join(serializer.path),
            )
            return picker.get_possible_keys(context)

        return self.names_memo.names(picker.alias_providers, value, key, shape, work_out)

    def candidates(self, transformers: Any, key: str) -> tuple[str, ...]:
        if not transformers:
            return ()
        paths_key = (tuple(transformers), key)
        found = self.paths_memo.get(paths_key)
        if found is None:
            if len(self.paths_memo) >= _ALIAS_MEMO_LIMIT:
                self.paths_memo.clear()
            # The full path ends with ".<key>": a transformer's path can be a suffix of it only if it
            # is a suffix of the key, or ends with the key.
            found = tuple(path for path in transformers if key.endswith(path) or path.endswith(key))
            self.paths_memo[paths_key] = found
        return found

    def pick(
        self, serializer: Any, picker: Any, value: Any, key: str, names: tuple[str, ...], candidates: tuple[str, ...]
    ) -> Any:
        """The first name the object has, transformed by the first transformer whose path the
        field's dotted path ends with."""
        lookup, missing = self.serialize.get_value, self.serialize.MISSING
        picked = None
        plain_dict = type(value) is dict
        for name in names:
            # moto's get_value on a dict and an undotted name is a key lookup: the same, sooner.
            found = value.get(name, missing) if plain_dict and "." not in name else lookup(value, name, missing)
            if found is not missing:
                picked = found
                break
        if candidates:
            transformers = picker.response_transformers
            key_path = f"{'.'.join(serializer.path)}.{key}"
            for path in candidates:
                if key_path.endswith(path):
                    return transformers[path](picked)
        return picked

    def plan(self, serializer: Any, picker: Any, value: Any, shape: Any) -> tuple[_MemberPick, ...]:
        """A structure's members, each with its names and transformer paths, as moto's loop over
        `shape.members` would work them out (each member's parent set to the structure first)."""
        meta = getattr(value, "Meta", None)
        transformers = picker.response_transformers
        plan_key = (tuple(picker.alias_providers), tuple(transformers), type(value), id(meta), id(shape))
        entry = self.plans.get(plan_key)
        if entry is None or entry[0] is not meta or entry[1] is not shape:
            if len(self.plans) >= _ALIAS_MEMO_LIMIT:
                self.plans.clear()
            members = []
            for member_key, member_shape in shape.members.items():
                member_shape.parent = shape
                names = self.names(serializer, picker, value, member_key, member_shape)
                members.append((member_key, member_shape, names, self.candidates(transformers, member_key)))
            entry = (meta, shape, tuple(members))
            self.plans[plan_key] = entry
        return entry[2]


_picking: _QuickPicking | None = None


def _shared_picking() -> _QuickPicking:
    global _picking
    if _picking is None:
        _picking = _QuickPicking()
    return _picking


def quick_value_picking() -> None:
    from moto.core import serialize

    original = serialize.ResponseSerializer.get_value
    if getattr(original, "quick", False):
        return
    picking = _shared_picking()

    def get_value(self: Any, value: Any, key: str, shape: Any) -> Any:
        picker = self._value_picker
        if not picking.stock(picker):
            return original(self, value, key, shape)
        names = picking.names(self, picker, value, key, shape)
        return picking.pick(self, picker, value, key, names, picking.candidates(picker.response_transformers, key))

    get_value.quick = True  # type: ignore[attr-defined]
    serialize.ResponseSerializer.get_value = get_value  # type: ignore[method-assign]


def quick_structures() -> None:
    from moto.core import serialize

    base = serialize.ResponseSerializer
    original = base._serialize_type_structure
    if getattr(original, "quick", False):
        return
    member_of = base._serialize_structure_member
    picking = _shared_picking()

    def _serialize_type_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        kind = type(self)
        picker = self._value_picker
        # A serializer that picks or serializes a member in its own way (REST's headers) goes the usual way.
        if (
            value is None
            or not getattr(kind.get_value, "quick", False)
            or kind._serialize_structure_member is not member_of
            or not picking.stock(picker)
        ):
            original(self, serialized, value, shape, key)
            return
        wrapper = self.MAP_TYPE() if key else serialized
        for member_key, member_shape, names, candidates in picking.plan(self, picker, value, shape):
            member_shape.parent = shape
            member_value = picking.pick(self, picker, value, member_key, names, candidates)
            if member_value is not None:
                self._serialize(wrapper, member_value, member_shape, member_key)
        if key:
            self._default_serialize(serialized, wrapper, shape, key)

    _serialize_type_structure.quick = True  # type: ignore[attr-defined]
    base._serialize_type_structure = _serialize_type_structure  # type: ignore[method-assign]


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


def counted_clauses() -> None:
    """moto's ActionCountValidator checks, at every UpdateExpression node of an update's tree (one
    per clause), that the subtree below holds at most one ADD, REMOVE and SET clause, by listing
    them (`find_clauses`, an abstract-class isinstance per node): quadratic in the clauses. Counted
    instead, each subtree once per kind, in the same walk order, raising the same error for the
    same kind first (ADD, then REMOVE, then SET; moto lists all three before raising, which
    changes nothing)."""
    from moto.dynamodb.parsing import ast_nodes, validators

    original = validators.ActionCountValidator.verify_action_counts
    if getattr(original, "counted", False):
        return
    own_find = ast_nodes.Node.find_clauses
    kinds = (
        ("ADD", validators.UpdateExpressionAddClause),
        ("REMOVE", validators.UpdateExpressionRemoveClause),
        ("SET", validators.UpdateExpressionSetClause),
    )
    descended = (ast_nodes.Expression, ast_nodes.UpdateExpressionFunction)
    descends_into: dict[type, bool] = {}  # find_clauses goes into a child of that class

    def count(node: Any, kind: type, memo: dict[tuple[int, type], tuple[Any, int]]) -> int:
        """len(node.find_clauses([kind])), each subtree counted once (the pass replaces no node)."""
        known = memo.get((id(node), kind))
        if known is not None and known[0] is node:
            return known[1]
        found = 0
        for child in node.children or []:
            child_class = type(child)
            if child_class is kind:
                found += 1
                continue
            descends = descends_into.get(child_class)
            if descends is None:
                descends = descends_into[child_class] = isinstance(child, descended)
            if descends:
                own = child_class.find_clauses is own_find
                found += count(child, kind, memo) if own else len(child.find_clauses([kind]))
        memo[(id(node), kind)] = (node, found)
        return found

    def verify_action_counts(self: Any, node: Any) -> Any:
        if type(node).find_clauses is not own_find:
            return original(self, node)
        # Per validator: moto makes one per update, and walks its tree once.
        memo = self.__dict__.setdefault("_fleetkeeper_clause_counts", {})
        for word, kind in kinds:
            if count(node, kind, memo) > 1:
                raise validators.TooManyClauses(word)
        return node

    verify_action_counts.counted = True  # type: ignore[attr-defined]
    validators.ActionCountValidator.verify_action_counts = verify_action_counts  # type: ignore[method-assign]


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


def shared_botocore_loader() -> None:
    """Every botocore session of the process reads its data files through one loader per search
    path: botocore's loader caches what it loads, but per session, and the suite makes sessions by
    the thousand (a boto3 client in a fixture, moto's regions, each test's clients), each reading
    and parsing the service's model files again (4% of the suite's CPU, mostly json.loads). A loader
    holds only what those files say, and botocore already shares one loader among all the clients of
    a session (fleetkeeper.aws shares the first session's among its sessions for the same reason)."""
    import botocore.loaders
    import botocore.session

    original = botocore.loaders.create_loader
    if getattr(original, "shared", False):
        return
    loaders: dict[str | None, Any] = {}
    lock = threading.Lock()

    def create_loader(search_path_string: str | None = None) -> Any:
        with lock:
            loader = loaders.get(search_path_string)
            if loader is None:
                loader = loaders[search_path_string] = original(search_path_string)
            return loader

    create_loader.shared = True  # type: ignore[attr-defined]
    botocore.loaders.create_loader = create_loader
    botocore.session.create_loader = create_loader  # type: ignore[attr-defined]


def shared_event_aliases() -> None:
    """botocore renames every event a session or client registers or emits through its aliases
    (`EventAliaser._alias_event_name`), remembering each name per aliaser: every new session (one per
    fleetkeeper client, each boto3.Session) and every client (a copy of its session's aliaser) starts
    with none remembered and works out the same names again. The renamed name is a function of the
    name and the aliases (in their order), so aliasers with the same aliases share what they
    remember."""
    from botocore.hooks import EventAliaser

    original = EventAliaser.__init__
    if getattr(original, "shared", False):
        return
    remembered: dict[tuple[tuple[Any, Any], ...], dict[str, str]] = {}

    def __init__(self: Any, event_emitter: Any, event_aliases: Any = None) -> None:
        original(self, event_emitter, event_aliases)
        aliases = tuple(self._event_aliases.items())
        self._alias_name_cache = remembered.setdefault(aliases, {})

    __init__.shared = True  # type: ignore[attr-defined]
    EventAliaser.__init__ = __init__  # type: ignore[method-assign]


def direct_method_lookup() -> None:
    """moto's call_action lists every function of the response class (`inspect.getmembers`: dir,
    sorted, a getattr each) to ask whether the action is one of them: 1% of the suite's CPU. The
    answer is the same asked directly: the name is in the class's namespace or a base's (dir's
    names) and what getattr finds under it is a function. Anything but `in` gets moto's list."""
    import inspect as inspection

    from moto.core import responses

    original = responses.method_names_from_class
    if getattr(original, "direct", False):
        return

    class _Functions:
        def __init__(self, clazz: Any) -> None:
            self.clazz = clazz

        def __contains__(self, name: object) -> bool:
            if not isinstance(name, str) or not any(name in vars(c) for c in self.clazz.__mro__):
                return False
            try:
                return inspection.isfunction(getattr(self.clazz, name))
            except AttributeError:
                return name in original(self.clazz)

        def __iter__(self) -> Iterator[str]:
            return iter(original(self.clazz))

    def method_names_from_class(clazz: Any) -> Any:
        return _Functions(clazz) if isinstance(clazz, type) else original(clazz)

    method_names_from_class.direct = True  # type: ignore[attr-defined]
    responses.method_names_from_class = method_names_from_class


def install() -> None:
    """Every tuning above that patches moto's classes (conftest applies them before any mock starts)."""
    share_stream_records()
    lean_transaction_backups()
    direct_tag_lookup()
    remembered_attribute_names()
    quick_value_picking()
    quick_structures()
    one_pass_traversal()
    counted_clauses()
    partitioned_queries()
    shared_botocore_loader()
    shared_event_aliases()
    direct_method_lookup()
