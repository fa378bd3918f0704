"""What the tests share that is not a fixture: builders, fakes, recorders, the in-process api client.

Test modules import these from here; tests/conftest.py keeps only fixtures and hooks (its fixtures
import from here too). The modules that also hold fixtures (`cfn`, `reconciler_world`) are loaded as
pytest plugins by tests/conftest.py.
"""

# The DynamoDB table the `table` fixture creates (tests/conftest.py) and the suite's handlers are pointed at.
TABLE = "fleetkeeper-test"
