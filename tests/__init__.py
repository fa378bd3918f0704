"""fleetkeeper's test suite.

Tests find the repository's files from here, never from their own `__file__`, so that moving a test
between folders of tests/ changes nothing it reads.
"""

from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
