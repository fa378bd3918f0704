"""The strict-AWS test layer: AWS's semantics over moto, where moto is kinder than AWS.

Fixtures (tests/conftest.py):

    strict_aws      a `StrictAws` controller active over the `aws` fixture's moto (asking for it
                    is enough: `aws`, `table` and `api` then run on the strict layer too)
    aws             with FLEETKEEPER_STRICT_AWS=1 in the environment, every test that uses it
                    runs on the strict layer (FLEETKEEPER_STRICT_AWS_SEED fixes the RNG's seed,
                    otherwise it is derived from the test's id, and
                    FLEETKEEPER_STRICT_AWS_FAULTS="torn_read=0.2,throttle=0.05" draws faults from
                    it); `@pytest.mark.lenient_aws` keeps a test on moto's own semantics

Always on while active: DynamoDB's number rules and ExclusiveStartKey validation, atomic
DynamoDB requests, EC2's ClientToken idempotency and `resolve:ssm:` image ids. Everything else
happens only when scheduled (`strict_aws.dynamodb.tear_next_read(...)`, `strict_aws.throttle(...)`,
`strict_aws.hang(...)`, `strict_aws.ec2.set_describe_lag(...)`, ...) or drawn from the seeded RNG
(`strict_aws.faults = FaultRates(...)`). Without a fault the layer is transparent.

How it hooks into botocore and moto: `tests/strict_aws/core.py`. What it models and what it does
not: docs/architecture/testing.md, "The strict-AWS test layer".
"""

from tests.strict_aws.clock import VirtualClock
from tests.strict_aws.context import LambdaContext, LambdaTimeout
from tests.strict_aws.core import Fault, FaultRates, StrictAws, active_controller, install_hooks
from tests.strict_aws.dynamodb import ItemRef, TornRead, Transaction, TxItem
from tests.strict_aws.ec2 import STATE_REASONS, CapacityRule

STRICT_ENV = "FLEETKEEPER_STRICT_AWS"
SEED_ENV = "FLEETKEEPER_STRICT_AWS_SEED"
FAULTS_ENV = "FLEETKEEPER_STRICT_AWS_FAULTS"

__all__ = [
    "FAULTS_ENV",
    "SEED_ENV",
    "STATE_REASONS",
    "STRICT_ENV",
    "CapacityRule",
    "Fault",
    "FaultRates",
    "ItemRef",
    "LambdaContext",
    "LambdaTimeout",
    "StrictAws",
    "TornRead",
    "Transaction",
    "TxItem",
    "VirtualClock",
    "active_controller",
    "install_hooks",
]
