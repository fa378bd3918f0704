"""Every private moto internal the suite and fleetkeeper.local rely on, one test each.

moto's public surface is `mock_aws` and its server; everything else below (backends, model classes,
their attributes, helpers) may change in any release. pyproject.toml pins moto exactly (the `local`
extra, which `dev` includes) to the release these were checked against, `CHECKED_MOTO`. When a
release changes one, its test here fails naming the internal, who relies on it and the pinned
release, instead of a patch silently doing nothing or a test failing somewhere far away.

Each internal is checked in a fresh interpreter (one for the module), before any of our patches
(tests/conftest.py installs tests/support/moto_tuning.py's and tests/support/public_images.py's at import, and a
patched method's signature is ours, not moto's). A method is checked for its leading parameters,
the ones our callers and replacements pass; an instance attribute on an object of a small world
made through boto3 inside `mock_aws`.
"""

from __future__ import annotations

import importlib
import inspect
import json
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import pytest

from fleetkeeper.local.moto_memory import CHECKED_MOTO
from tests import REPO_ROOT


@dataclass(frozen=True)
class Internal:
    """`path`: module:attribute.chain (resolved from the module), or Kind#attribute (an attribute of
    the world's object of that kind). `parameters`: a callable's leading parameter names, in order."""

    path: str
    used_by: str
    parameters: tuple[str, ...] | None = None


_DDB = "moto.dynamodb.models:DynamoDBBackend"
_MEMORY = "fleetkeeper/local/moto_memory.py"
_IN_MEMORY = "fleetkeeper/local/in_memory_aws.py"
_STRICT = "tests/strict_aws/"

INTERNALS = (
    # -- fleetkeeper.local: the in-memory AWS's bounded memory (moto_memory) and its server (in_memory_aws)
    Internal("moto.core.common_models:BaseModel.__new__", _MEMORY + " untracked_models replaces it"),
    Internal("moto.core.model_instances:reset_model_data", _MEMORY + " untracked_models", ()),
    Internal("moto.core.model_instances:model_data", _MEMORY + " tracked_models"),
    Internal("moto.core.exceptions:JsonRESTError", _MEMORY + " (its errors)", ("error_type", "message")),
    Internal("moto.dynamodb.models:dynamodb_backends", _MEMORY + ", tests/simulation/sim.py, " + _STRICT),
    Internal("moto.dynamodb.models.table:StreamShard.get", _MEMORY + " trimmed_reads", ("self", "start", "quantity")),
    Internal("moto.dynamodb.models.table:Table", _MEMORY + " lean_transaction_backups (its __deepcopy__)"),
    Internal(
        "moto.dynamodb.models.dynamo_type:DynamoType", _MEMORY + ", " + _STRICT + "dynamodb.py", ("type_as_dict",)
    ),
    Internal(f"{_DDB}.transact_write_items", _MEMORY + " lean_transaction_backups", ("self", "transact_items")),
    Internal(
        "moto.dynamodbstreams.models:ShardIterator",
        _MEMORY + " iterators_by_table",
        ("streams_backend", "stream_shard"),
    ),
    Internal(
        "moto.dynamodbstreams.models:DynamoDBStreamsBackend.__init__",
        _MEMORY + " bounded_shard_iterators",
        ("self", "region_name", "account_id"),
    ),
    Internal("moto.dynamodbstreams.models:dynamodbstreams_backends", _MEMORY + " retained"),
    *(
        Internal(f"{_DDB}.{name}", _IN_MEMORY + " serialise_dynamodb (and tests/conftest.py atomic_dynamodb)")
        for name in (
            "put_item",
            "get_item",
            "query",
            "scan",
            "update_item",
            "delete_item",
            "transact_get_items",
            "batch_write_item",
            "batch_get_item",
        )
    ),
    *(
        Internal(f"moto.dynamodbstreams.models:DynamoDBStreamsBackend.{name}", _IN_MEMORY + " serialise_dynamodb")
        for name in ("describe_stream", "get_shard_iterator", "get_records")
    ),
    Internal(
        "moto.moto_server.werkzeug_app:DomainDispatcherApplication", _IN_MEMORY + " InMemoryAws.start", ("create_app",)
    ),
    Internal("moto.moto_server.werkzeug_app:MotoRequestHandler", _IN_MEMORY + " InMemoryAws.start"),
    Internal("moto.moto_server.werkzeug_app:create_backend_app", _IN_MEMORY + " InMemoryAws.start", ("service",)),
    # -- the world's objects: what those modules and the strict layer read and write on them
    Internal(
        "Table#items",
        _MEMORY
        + ", "
        + _STRICT
        + "dynamodb.py, tests/support/moto_tuning.py (a partition: a dict of range key -> item)",
    ),
    Internal("Table#stream_shard", _MEMORY + ", tests/simulation/sim.py"),
    Internal("Table#hash_key_attr", _MEMORY + ", " + _STRICT + "dynamodb.py"),
    Internal("Table#range_key_attr", _MEMORY + ", " + _STRICT + "dynamodb.py, tests/support/moto_tuning.py"),
    Internal("Table#table_key_attrs", _STRICT + "dynamodb.py"),
    Internal("Table#table_arn", "tests/simulation/sim.py"),
    Internal("Table#latest_stream_label", "tests/simulation/sim.py"),
    Internal("Table#get_item", _STRICT + "dynamodb.py", ("hash_key", "range_key")),
    Internal("Table#all_items", "tests/simulation/sim.py", ()),
    Internal("StreamShard#items", _MEMORY + " trim_stream, tests/simulation/sim.py"),
    Internal("StreamShard#starting_sequence_number", _MEMORY + " trim_stream"),
    Internal("StreamShard#table", _MEMORY + " share_stream_records"),
    Internal("DynamoDBBackend#tables", _MEMORY),
    Internal("DynamoDBBackend#get_table", _STRICT + "dynamodb.py, tests/simulation/sim.py", ("table_name",)),
    Internal("DynamoDBStreamsBackend#shard_iterators", _MEMORY + " bounded_shard_iterators"),
    Internal("DynamoDBStreamsBackend#dynamodb", _MEMORY + " iterators_by_table"),
    # -- tests/support/moto_tuning.py and tests/support/public_images.py
    Internal(
        "moto.utilities.utils:load_resource",
        "tests/support/moto_tuning.py, tests/support/public_images.py",
        ("resource",),
    ),
    Internal(
        "moto.ec2.models.amis:AMIS", "tests/support/moto_tuning.py default_amis (and MOTO_AMIS_PATH, read at import)"
    ),
    Internal(
        "moto.ec2.models.core:TaggedEC2Resource.get_tags", "tests/support/moto_tuning.py direct_tag_lookup", ("self",)
    ),
    Internal("moto.ec2.utils:EC2_PREFIX_TO_RESOURCE", "tests/support/moto_tuning.py direct_tag_lookup"),
    Internal("moto.ec2.utils:get_prefix", "tests/support/moto_tuning.py direct_tag_lookup", ("resource_id",)),
    Internal(
        "moto.core.serialize:AttributePicker.get_possible_keys",
        "tests/support/moto_tuning.py remembered_attribute_names",
        ("self", "context"),
    ),
    Internal(
        "moto.core.serialize:ResponseSerializer.get_value",
        "tests/support/moto_tuning.py quick_value_picking replaces it",
        ("self", "value", "key", "shape"),
    ),
    Internal(
        "moto.core.serialize:AttributePicker.__call__",
        "tests/support/moto_tuning.py quick_value_picking",
        ("self", "context"),
    ),
    Internal(
        "moto.core.serialize:XFormedAttributePicker.get_possible_keys",
        "tests/support/moto_tuning.py quick_value_picking",
        ("self", "context"),
    ),
    Internal(
        "moto.core.serialize:AttributePickerContext",
        "tests/support/moto_tuning.py quick_value_picking (by keyword)",
        ("obj", "key", "shape", "operation_model", "service_model", "key_path"),
    ),
    Internal(
        "moto.core.serialize:get_value", "tests/support/moto_tuning.py quick_value_picking", ("obj", "key", "default")
    ),
    Internal("moto.core.serialize:MISSING", "tests/support/moto_tuning.py quick_value_picking"),
    Internal(
        "moto.dynamodb.parsing.ast_nodes:DepthFirstTraverser.traverse",
        "tests/support/moto_tuning.py one_pass_traversal replaces it",
        ("self", "node"),
    ),
    Internal(
        "moto.dynamodb.parsing.ast_nodes:DepthFirstTraverser.traverse_node_recursively",
        "tests/support/moto_tuning.py one_pass_traversal (walks as it does)",
        ("self", "node", "child_id"),
    ),
    Internal(
        "moto.dynamodb.parsing.ast_nodes:DepthFirstTraverser.process",
        "tests/support/moto_tuning.py one_pass_traversal (picks as it does)",
        ("self", "node"),
    ),
    Internal(
        "moto.dynamodb.parsing.ast_nodes:DepthFirstTraverser.nodes_to_be_processed",
        "tests/support/moto_tuning.py one_pass_traversal",
        ("self",),
    ),
    Internal(
        "moto.dynamodb.parsing.ast_nodes:DepthFirstTraverser.pre_processing_of_child",
        "tests/support/moto_tuning.py one_pass_traversal",
        ("self", "parent_node", "child_id"),
    ),
    Internal(
        "moto.dynamodb.parsing.ast_nodes:DepthFirstTraverser._processing_map",
        "tests/support/moto_tuning.py one_pass_traversal",
        ("self",),
    ),
    Internal(
        "moto.dynamodb.models.table:Table.query",
        "tests/support/moto_tuning.py partitioned_queries replaces it (by name)",
        ("self", "hash_key", "range_comparison", "range_objs", "limit", "exclusive_start_key"),
    ),
    Internal(
        "moto.dynamodb.models.table:Table.all_items",
        "tests/support/moto_tuning.py partitioned_queries replaces it",
        ("self",),
    ),
    Internal("moto.dynamodb.parsing.ast_nodes:Node", "tests/support/moto_tuning.py one_pass_traversal"),
    Internal(
        "moto.core.serialize:ResponseSerializer._serialize_type_structure",
        "tests/support/moto_tuning.py quick_structures replaces it",
        ("self", "serialized", "value", "shape", "key"),
    ),
    Internal(
        "moto.core.serialize:ResponseSerializer._serialize_structure_member",
        "tests/support/moto_tuning.py quick_structures (serializes a member as it does)",
        ("self", "serialized", "value", "shape", "key"),
    ),
    Internal(
        "moto.core.serialize:ResponseSerializer._serialize",
        "tests/support/moto_tuning.py quick_structures",
        ("self", "serialized", "value", "shape", "key"),
    ),
    Internal(
        "moto.core.serialize:ResponseSerializer._default_serialize",
        "tests/support/moto_tuning.py quick_structures",
        ("self", "serialized", "value", "shape", "key"),
    ),
    Internal("moto.core.serialize:ResponseSerializer.MAP_TYPE", "tests/support/moto_tuning.py quick_structures"),
    Internal(
        "moto.dynamodb.parsing.validators:ActionCountValidator.verify_action_counts",
        "tests/support/moto_tuning.py counted_clauses replaces it",
        ("self", "node"),
    ),
    Internal(
        "moto.dynamodb.parsing.ast_nodes:Node.find_clauses",
        "tests/support/moto_tuning.py counted_clauses (counts what it lists)",
        ("self", "clause_types"),
    ),
    *(
        Internal(f"moto.dynamodb.parsing.{path}", "tests/support/moto_tuning.py counted_clauses")
        for path in (
            "ast_nodes:Expression",
            "ast_nodes:UpdateExpressionFunction",
            "validators:UpdateExpressionAddClause",
            "validators:UpdateExpressionRemoveClause",
            "validators:UpdateExpressionSetClause",
        )
    ),
    Internal(
        "moto.dynamodb.parsing.validators:TooManyClauses", "tests/support/moto_tuning.py counted_clauses", ("_type",)
    ),
    Internal(
        "moto.core.responses:method_names_from_class",
        "tests/support/moto_tuning.py direct_method_lookup replaces it (call_action asks `in` only)",
        ("clazz",),
    ),
    # botocore's, pinned with the Lambda bundle (functions/requirements.txt), checked the same way.
    Internal(
        "botocore.loaders:create_loader",
        "tests/support/moto_tuning.py shared_botocore_loader replaces it",
        ("search_path_string",),
    ),
    Internal(
        "botocore.hooks:EventAliaser.__init__",
        "tests/support/moto_tuning.py shared_event_aliases (sets _alias_name_cache, read by _alias_event_name)",
        ("self", "event_emitter", "event_aliases"),
    ),
    Internal(
        "botocore.hooks:EventAliaser._alias_event_name",
        "tests/support/moto_tuning.py shared_event_aliases (its _alias_name_cache)",
        ("self", "event_name"),
    ),
    Internal(
        "botocore.session:create_loader",
        "tests/support/moto_tuning.py shared_botocore_loader replaces it (session.py's own name)",
        ("search_path_string",),
    ),
    Internal(
        "moto.ssm.models:ParameterDict._check_loading_status", "tests/support/public_images.py install", ("self", "key")
    ),
    Internal(
        "moto.ssm.models:Parameter",
        "tests/support/public_images.py (by keyword)",
        (
            "account_id",
            "name",
            "value",
            "parameter_type",
            "description",
            "allowed_pattern",
            "keyid",
            "last_modified_date",
            "version",
            "data_type",
        ),
    ),
    Internal("moto.ssm.models:ssm_backends", "tests/support/public_images.py, " + _STRICT),
    Internal("moto.core.utils:utcnow", "tests/support/public_images.py"),
    Internal("SsmBackend#_parameters", "tests/support/public_images.py, " + _STRICT + "authorization.py"),
    Internal("SsmBackend#get_parameter", _STRICT + "ec2.py, " + _STRICT + "authorization.py", ("name",)),
    # -- the strict layer's hook and wire
    Internal("moto.core.models:botocore_stubber", _STRICT + "core.py install_hooks (moto's before-send handler)"),
    Internal(
        "moto.core.models:DEFAULT_ACCOUNT_ID", _STRICT + ", tests/support/public_images.py, tests/simulation/sim.py"
    ),
    Internal(
        "moto.core:DEFAULT_ACCOUNT_ID", _STRICT + "iam.py, tests/simulation/sim.py, tests/reconciler/test_shell.py"
    ),
    Internal(
        "moto.core.botocore_stubber:BotocoreStubber.process_request",
        _STRICT + "core.py, tests/reconciler/test_shell.py",
        ("self", "request"),
    ),
    Internal("moto.core.botocore_stubber:MockRawResponse", _STRICT + "wire.py", ("response_input",)),
    Internal(
        "moto.dynamodb.parsing.key_condition_expression:parse_expression",
        _STRICT + "dynamodb.py (by keyword)",
        ("key_condition_expression", "expression_attribute_values", "expression_attribute_names", "schema"),
    ),
    # -- EC2
    Internal("moto.ec2.models:ec2_backends", _STRICT + ", tests/simulation/sim.py, tests/reconciler/test_shell.py"),
    Internal(
        "moto.ec2.models.instances:StateReason", _STRICT + "ec2.py, tests/reconciler/test_shell.py", ("message", "code")
    ),
    Internal("moto.ec2.models.instances:utcnow", "tests/simulation/sim.py (replaced by the simulated clock)"),
    Internal(
        "moto.ec2.models.instances:InstanceBackend.run_instances",
        "tests/reconciler/test_shell.py _idempotent_client_tokens",
        ("self", "image_id", "count", "user_data", "security_group_names"),
    ),
    Internal("moto.settings:ENABLE_AMI_VALIDATION", "tests/reconciler/test_shell.py _validate_amis"),
    Internal("moto.moto_api._internal:mock_random.seed", "tests/simulation/sim.py"),
    Internal("Ec2Backend#tags", _STRICT + "authorization.py, tests/simulation/sim.py, tests/support/moto_tuning.py"),
    Internal("Ec2Backend#reservations", _STRICT + ", tests/reconciler/test_shell.py"),
    Internal("Ec2Backend#all_instances", "tests/simulation/sim.py", ()),
    Internal("Ec2Backend#get_instance", _STRICT + "elbv2.py, tests/reconciler/test_shell.py", ("instance_id",)),
    Internal("Ec2Backend#get_instance_by_id", _STRICT + "ec2.py", ("instance_id",)),
    Internal("Ec2Backend#terminate_instances", _STRICT + "ec2.py", ("instance_ids",)),
    Internal("Ec2Backend#reset", "tests/simulation/sim.py", ()),
    Internal("Instance#state_reason", _STRICT + "ec2.py, tests/reconciler/test_shell.py"),
    Internal("Instance#_reason", _STRICT + "ec2.py terminate_by_aws"),
    Internal("Instance#lifecycle", _STRICT + "ec2.py, tests/simulation/sim.py"),
    Internal("Instance#client_token", "tests/reconciler/test_shell.py"),
    Internal("Instance#placement", _STRICT + "elbv2.py"),
    Internal("Instance#state", _STRICT + "ec2.py _forgotten (its name: terminated)"),
    Internal("Instance#id", _STRICT + "ec2.py"),
    # -- ELB, IAM, KMS, Route 53
    Internal("moto.elbv2.models:elbv2_backends", _STRICT + "elbv2.py, " + _STRICT + "authorization.py"),
    Internal("ElbBackend#load_balancers", _STRICT + "elbv2.py"),
    Internal("ElbBackend#target_groups", _STRICT + "elbv2.py"),
    Internal("ElbBackend#tagging_service.get_tag_dict_for_resource", _STRICT + "authorization.py", ("arn",)),
    Internal("LoadBalancer#listeners", _STRICT + "elbv2.py"),
    Internal("LoadBalancer#dns_name", _STRICT + "elbv2.py"),
    Internal("LoadBalancer#canonical_hosted_zone_id", _STRICT + "elbv2.py"),
    Internal("Listener#default_actions", _STRICT + "elbv2.py"),
    Internal("Listener#_non_default_rules", _STRICT + "elbv2.py"),
    Internal("Listener#rules", _STRICT + "elbv2.py"),
    Internal("Rule#actions", _STRICT + "elbv2.py"),
    Internal("Action#data", _STRICT + "elbv2.py (a forward's TargetGroupArn)"),
    Internal("TargetGroup#load_balancer_arns", _STRICT + "elbv2.py _attach"),
    Internal("TargetGroup#targets", _STRICT + "elbv2.py"),
    Internal("moto.iam.models:iam_backends", _STRICT + "iam.py, " + _STRICT + "authorization.py"),
    Internal("IamBackend#instance_profiles", _STRICT + "iam.py"),
    Internal("IamBackend#get_role", _STRICT + "authorization.py", ("role_name",)),
    Internal("IamBackend#get_instance_profile", _STRICT + "authorization.py", ("profile_name",)),
    Internal("moto.kms.models:kms_backends", _STRICT + "authorization.py"),
    Internal("KmsBackend#any_id_to_key_id", _STRICT + "authorization.py", ("key_id",)),
    Internal("KmsBackend#keys", _STRICT + "authorization.py"),
    Internal("moto.route53.models:route53_backends", _STRICT + "authorization.py"),
    Internal("Route53Backend#get_hosted_zone", _STRICT + "authorization.py", ("id_",)),
)


def _world() -> dict[str, Any]:
    """One object of each kind the `Kind#attribute` internals name, made through boto3 inside `mock_aws`
    (the caller keeps the mock running while it reads them)."""
    import boto3
    from moto.core.models import DEFAULT_ACCOUNT_ID as ACCOUNT
    from moto.dynamodb.models import dynamodb_backends
    from moto.dynamodbstreams.models import dynamodbstreams_backends
    from moto.ec2.models import ec2_backends
    from moto.elbv2.models import elbv2_backends
    from moto.iam.models import iam_backends
    from moto.kms.models import kms_backends
    from moto.route53.models import route53_backends
    from moto.ssm.models import ssm_backends

    region = "us-east-1"
    client = lambda service: boto3.client(service, region_name=region)  # noqa: E731
    client("dynamodb").create_table(
        TableName="t",
        KeySchema=[{"AttributeName": "PK", "KeyType": "HASH"}, {"AttributeName": "SK", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "PK", "AttributeType": "S"},
            {"AttributeName": "SK", "AttributeType": "S"},
        ],
        BillingMode="PAY_PER_REQUEST",
        StreamSpecification={"StreamEnabled": True, "StreamViewType": "NEW_AND_OLD_IMAGES"},
    )
    client("dynamodb").put_item(TableName="t", Item={"PK": {"S": "a"}, "SK": {"S": "b"}})
    dynamodb = dynamodb_backends[ACCOUNT][region]
    table = dynamodb.get_table("t")
    ec2 = client("ec2")
    instance_id = ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1)["Instances"][0]["InstanceId"]
    vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
    subnets = [s["SubnetId"] for s in ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Subnets"]]
    elb = client("elbv2")
    balancer = elb.create_load_balancer(Name="b", Subnets=subnets[:2])["LoadBalancers"][0]["LoadBalancerArn"]
    group = elb.create_target_group(Name="g", Protocol="HTTP", Port=80, VpcId=vpc)["TargetGroups"][0]["TargetGroupArn"]
    forward = [{"Type": "forward", "TargetGroupArn": group}]
    listener = elb.create_listener(LoadBalancerArn=balancer, Protocol="HTTP", Port=80, DefaultActions=forward)
    listener_arn = listener["Listeners"][0]["ListenerArn"]
    rule = elb.create_rule(
        ListenerArn=listener_arn,
        Priority=1,
        Conditions=[{"Field": "path-pattern", "Values": ["/x"]}],
        Actions=forward,
    )["Rules"][0]["RuleArn"]
    elbv2 = elbv2_backends[ACCOUNT][region]
    moto_listener = elbv2.load_balancers[balancer].listeners[listener_arn]
    client("ssm").put_parameter(Name="/p", Value="v", Type="String")
    client("kms").create_key()
    client("route53").create_hosted_zone(Name="example.com", CallerReference="r")
    ec2_backend = ec2_backends[ACCOUNT][region]
    return {
        "Table": table,
        "StreamShard": table.stream_shard,
        "DynamoDBBackend": dynamodb,
        "DynamoDBStreamsBackend": dynamodbstreams_backends[ACCOUNT][region],
        "SsmBackend": ssm_backends[ACCOUNT][region],
        "Ec2Backend": ec2_backend,
        "Instance": ec2_backend.get_instance(instance_id),
        "ElbBackend": elbv2,
        "LoadBalancer": elbv2.load_balancers[balancer],
        "Listener": moto_listener,
        "Rule": moto_listener._non_default_rules[rule],
        "Action": moto_listener.default_actions[0],
        "TargetGroup": elbv2.target_groups[group],
        "IamBackend": iam_backends[ACCOUNT]["global"],
        "KmsBackend": kms_backends[ACCOUNT][region],
        "Route53Backend": route53_backends[ACCOUNT]["global"],
    }


def _problem(internal: Internal, world: dict[str, Any]) -> str | None:
    """What is wrong with one internal in this moto, or None."""
    try:
        if "#" in internal.path:
            kind, chain = internal.path.split("#", 1)
            target: Any = world[kind]
        else:
            module, chain = internal.path.split(":", 1)
            target = importlib.import_module(module)
        for name in chain.split("."):
            if not hasattr(target, name):
                return f"{type(target).__name__} has no attribute {name!r}"
            target = getattr(target, name)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    if internal.parameters is not None:
        try:
            names = list(inspect.signature(target).parameters)
        except (TypeError, ValueError) as exc:
            return f"no signature: {exc}"
        if names[: len(internal.parameters)] != list(internal.parameters):
            return f"parameters {names}, expected to start with {list(internal.parameters)}"
    return None


def probe() -> dict[str, str | None]:
    """Every internal's problem (None: none), in this interpreter: run by the fixture below in a fresh one."""
    from moto import mock_aws

    with mock_aws():
        try:
            world = _world()
        except Exception as exc:  # the world itself needs moto's internals: every attribute check fails with it
            broken = f"the checks' world could not be made: {type(exc).__name__}: {exc}"
            return {i.path: broken if "#" in i.path else _problem(i, {}) for i in INTERNALS}
        return {internal.path: _problem(internal, world) for internal in INTERNALS}


@pytest.fixture(scope="module")
def problems() -> dict[str, str | None]:
    code = "import json; from tests.test_moto_internals import probe; print(json.dumps(probe()))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, str | None] = json.loads(done.stdout.splitlines()[-1])
    return found


def test_the_installed_moto_is_the_release_the_internals_were_checked_against() -> None:
    assert version("moto") == CHECKED_MOTO, (
        f"moto {version('moto')} is installed; the internals below were checked against {CHECKED_MOTO} "
        "(pyproject.toml pins it): run this module, mend what changed, then move the pin and CHECKED_MOTO"
    )


@pytest.mark.parametrize("internal", INTERNALS, ids=[i.path for i in INTERNALS])
def test_a_moto_internal_we_rely_on_is_still_there(internal: Internal, problems: dict[str, str | None]) -> None:
    problem = problems[internal.path]
    assert problem is None, (
        f"moto {version('moto')} changed {internal.path} ({problem}), on which {internal.used_by} relies; "
        f"checked against moto {CHECKED_MOTO}, the release pyproject.toml pins"
    )


def test_every_internal_is_listed_once() -> None:
    paths = [i.path for i in INTERNALS]
    assert len(paths) == len(set(paths))
