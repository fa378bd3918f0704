"""moto's tunings (tests/support/moto_tuning.py) change how moto works, never what it answers.

One small world is built and asked in two fresh interpreters (the suite's has the tunings installed
since conftest's import) from the same seed of moto's ids: one on moto's own code, one with every
tuning installed. Every answer (parsed by botocore, times set aside: the two runs happen at different
moments), errors included, must be the same. The world touches what the tunings change: EC2's
serializer with its response transformers (images, instances, tags), DynamoDB items of every
attribute type through Query, GetItem, transactions and update expressions of every action kind
(and the ones moto refuses), Queries of a partition, of an index (by pages) and of a table without a
sort key, ELBv2's answers, and EC2 tag lookups.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests import REPO_ROOT

_CHILD = textwrap.dedent(
    """
    import datetime, json, os, re, sys
    sys.path[:0] = ["functions", "."]
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    from tests.support import moto_tuning
    os.environ["MOTO_AMIS_PATH"] = moto_tuning.amis_file()
    import boto3, botocore.exceptions
    from moto import mock_aws
    from moto.moto_api._internal import mock_random

    # What moto draws at random and not only from its seeded generator (ids, addresses, tokens): each
    # distinct one becomes its order of appearance, so that the same one stays the same everywhere.
    MADE_UP = re.compile(
        r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
        r"|\\b[a-z]+(?:-[a-z]+)*-[0-9a-f]{8,17}\\b"
        r"|\\b\\d{1,3}(?:[.-]\\d{1,3}){3}\\b"
        r"|\\b(?:[0-9a-f]{2}:){5}[0-9a-f]{2}\\b"
        r"|(?<=/)[0-9a-f]{16}\\b"
    )
    seen = {}

    def made_up(match):
        return seen.setdefault(match.group(0), f"<{len(seen)}>")

    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items() if k != "ResponseMetadata"}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, datetime.datetime):
            return "<time>"
        if isinstance(value, str):
            return MADE_UP.sub(made_up, re.sub(r"\\d{4}-\\d\\d-\\d\\d[ T]\\d\\d:\\d\\d:\\d\\d", "<time>", value))
        return value

    def asked(call, **kwargs):
        try:
            return plain(call(**kwargs))
        except botocore.exceptions.ClientError as exc:
            return {"error": exc.response["Error"]}

    every_type = {
        "pk": {"S": "p"}, "sk": {"S": "a"}, "n": {"N": "12.5"}, "b": {"B": b"\\x00\\x01"},
        "ss": {"SS": ["x", "y"]}, "ns": {"NS": ["1", "2"]}, "bs": {"BS": [b"\\x02"]},
        "m": {"M": {"k": {"S": "v"}, "l": {"L": [{"N": "1"}, {"BOOL": False}, {"NULL": True}]}}},
        "l": {"L": [{"S": "s"}, {"M": {}}]}, "nul": {"NULL": True}, "t": {"BOOL": True}, "gk": {"S": "g"},
    }

    def world():
        mock_random.seed(20261203)
        answers = []
        with mock_aws():
            ec2 = boto3.client("ec2")
            image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
            answers.append(asked(ec2.describe_images, ImageIds=[image]))
            tags = [{"ResourceType": "instance", "Tags": [{"Key": "fleetkeeper:stack", "Value": "s"}]}]
            ran = ec2.run_instances(ImageId=image, MinCount=3, MaxCount=3, TagSpecifications=tags)
            answers.append(plain(ran))
            ids = [i["InstanceId"] for i in ran["Instances"]]
            ec2.create_tags(Resources=ids[:1], Tags=[{"Key": "extra", "Value": "1"}])
            ec2.terminate_instances(InstanceIds=ids[2:])
            answers.append(asked(ec2.describe_instances))
            answers.append(asked(ec2.describe_instances, Filters=[{"Name": "tag:extra", "Values": ["1"]}]))
            answers.append(asked(ec2.describe_tags))
            answers.append(asked(ec2.describe_instance_status, IncludeAllInstances=True))
            answers.append(asked(ec2.describe_security_groups))
            answers.append(asked(ec2.describe_instances, InstanceIds=["i-0000000000000000f"]))

            ddb = boto3.client("dynamodb")
            ddb.create_table(
                TableName="t",
                KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
                AttributeDefinitions=[{"AttributeName": n, "AttributeType": "S"} for n in ("pk", "sk", "gk")],
                GlobalSecondaryIndexes=[{
                    "IndexName": "by-g", "KeySchema": [{"AttributeName": "gk", "KeyType": "HASH"}],
                    "Projection": {"ProjectionType": "ALL"},
                }],
                BillingMode="PAY_PER_REQUEST",
            )
            ddb.put_item(TableName="t", Item=every_type)
            ddb.put_item(TableName="t", Item={**every_type, "sk": {"S": "b"}})
            ddb.put_item(TableName="t", Item={**every_type, "pk": {"S": "q"}})
            ddb.put_item(TableName="t", Item={**every_type, "pk": {"S": "o"}, "sk": {"S": "c"}})
            key = {"pk": {"S": "p"}, "sk": {"S": "a"}}
            updates = [
                dict(UpdateExpression="SET #n = #n + :one, m.k = :v, l[0] = :v ADD ns :ns REMOVE nul DELETE ss :del",
                     ExpressionAttributeNames={"#n": "n"},
                     ExpressionAttributeValues={":one": {"N": "1"}, ":v": {"S": "w"}, ":ns": {"NS": ["3"]},
                                                ":del": {"SS": ["x"]}, ":t": {"BOOL": True}, ":zero": {"N": "0"}},
                     ConditionExpression="attribute_exists(pk) AND (t = :t OR size(l) > :zero)",
                     ReturnValues="ALL_NEW"),
                dict(UpdateExpression="SET c = if_not_exists(c, :zero), lst = list_append(l, :more)",
                     ExpressionAttributeValues={":zero": {"N": "0"}, ":more": {"L": [{"S": "z"}]}},
                     ReturnValues="UPDATED_OLD"),
                dict(UpdateExpression="SET a = :v, a = :v", ExpressionAttributeValues={":v": {"S": "x"}}),
                dict(UpdateExpression="SET m = :v REMOVE m.k", ExpressionAttributeValues={":v": {"S": "x"}}),
                dict(UpdateExpression="SET pk = :v", ExpressionAttributeValues={":v": {"S": "x"}}),
                dict(UpdateExpression="SET n = n + :v", ExpressionAttributeValues={":v": {"S": "x"}}),
                dict(UpdateExpression="SET x = y.z"),
                # A clause given twice: moto names ADD before REMOVE before SET, wherever they stand.
                dict(UpdateExpression="SET a = :v SET b = :v", ExpressionAttributeValues={":v": {"S": "x"}}),
                dict(UpdateExpression="REMOVE a SET b = :v REMOVE c ADD ns :ns SET d = :v ADD ns2 :ns",
                     ExpressionAttributeValues={":v": {"S": "x"}, ":ns": {"NS": ["3"]}}),
                dict(UpdateExpression="REMOVE a SET b = :v SET c = :v REMOVE d",
                     ExpressionAttributeValues={":v": {"S": "x"}}),
                dict(UpdateExpression="SET a = :v", ConditionExpression="t = :f",
                     ExpressionAttributeValues={":v": {"S": "x"}, ":f": {"BOOL": False}}),
            ]
            for update in updates:
                answers.append(asked(ddb.update_item, TableName="t", Key=key, **update))
            answers.append(asked(ddb.get_item, TableName="t", Key=key))
            answers.append(asked(ddb.query, TableName="t", KeyConditionExpression="pk = :p",
                                 ExpressionAttributeValues={":p": {"S": "p"}}, Limit=1))
            answers.append(asked(ddb.query, TableName="t", IndexName="by-g", KeyConditionExpression="gk = :g",
                                 ExpressionAttributeValues={":g": {"S": "g"}}))
            answers.append(asked(ddb.query, TableName="t", KeyConditionExpression="pk = :p AND sk > :a",
                                 ExpressionAttributeValues={":p": {"S": "p"}, ":a": {"S": "a"}},
                                 ScanIndexForward=False))
            answers.append(asked(ddb.query, TableName="t", KeyConditionExpression="pk = :p",
                                 ExpressionAttributeValues={":p": {"S": "none"}}))
            page = ddb.query(TableName="t", IndexName="by-g", KeyConditionExpression="gk = :g",
                             ExpressionAttributeValues={":g": {"S": "g"}}, Limit=2)
            answers.append(plain(page))
            answers.append(asked(ddb.query, TableName="t", IndexName="by-g", KeyConditionExpression="gk = :g",
                                 ExpressionAttributeValues={":g": {"S": "g"}},
                                 ExclusiveStartKey=page["LastEvaluatedKey"]))
            ddb.create_table(TableName="h", KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                             AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                             BillingMode="PAY_PER_REQUEST")
            for name in ("a", "b", "c"):
                ddb.put_item(TableName="h", Item={"pk": {"S": name}, "v": {"N": "1"}})
            answers.append(asked(ddb.query, TableName="h", KeyConditionExpression="pk = :p",
                                 ExpressionAttributeValues={":p": {"S": "b"}}))
            answers.append(asked(ddb.transact_write_items, TransactItems=[
                {"Update": {"TableName": "t", "Key": key, "UpdateExpression": "SET q = :q",
                            "ExpressionAttributeValues": {":q": {"N": "1"}}}},
                {"ConditionCheck": {"TableName": "t", "Key": {"pk": {"S": "p"}, "sk": {"S": "b"}},
                                    "ConditionExpression": "attribute_not_exists(pk)"}},
            ]))
            answers.append(asked(ddb.scan, TableName="t"))
            answers.append(asked(ddb.describe_table, TableName="t"))

            elb = boto3.client("elbv2")
            subnets = [s["SubnetId"] for s in ec2.describe_subnets()["Subnets"][:2]]
            lb = elb.create_load_balancer(Name="lb", Subnets=subnets)
            answers.append(plain(lb))
            vpc = ec2.describe_vpcs()["Vpcs"][0]["VpcId"]
            group = elb.create_target_group(Name="tg", Protocol="HTTP", Port=80, VpcId=vpc)
            arn = group["TargetGroups"][0]["TargetGroupArn"]
            elb.register_targets(TargetGroupArn=arn, Targets=[{"Id": ids[0]}])
            answers.append(asked(elb.describe_target_health, TargetGroupArn=arn))
            answers.append(asked(elb.describe_load_balancers))
            answers.append(asked(elb.describe_tags, ResourceArns=[arn]))
        return answers

    if sys.argv[1] == "tuned":
        moto_tuning.install()
    print(json.dumps(world(), default=str))
    """
)


def _answers(mode: str) -> list[object]:
    ran = subprocess.run(
        [sys.executable, "-c", _CHILD, mode], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert ran.returncode == 0, ran.stderr[-4000:]
    answers: list[object] = json.loads(ran.stdout.splitlines()[-1])
    return answers


def test_every_tuning_leaves_every_answer_as_moto_gives_it() -> None:
    own, tuned = _answers("own"), _answers("tuned")
    assert len(own) == len(tuned) == 34
    differing = [(i, a, b) for i, (a, b) in enumerate(zip(own, tuned, strict=True)) if a != b]
    assert not differing, differing[:2]
    errors = sorted(answer["error"]["Code"] for answer in own if isinstance(answer, dict) and "error" in answer)
    # moto's validators at work (duplicate and overlapping paths, a key attribute, a type mismatch, an
    # unknown value, a clause given twice, three times), the failed condition, the cancelled
    # transaction, and the unknown instance.
    assert errors == [
        "ConditionalCheckFailedException",
        "InvalidInstanceID.NotFound",
        "TransactionCanceledException",
        *["ValidationException"] * 8,
    ]
