# fleetkeeper — the two commands a new machine needs: `make local` and `make test`.
# Both create .venv with whatever python3 (3.11+) is on the PATH and install into it.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PORT   ?= 8080
# Tests get both cores; override with PYTEST_WORKERS=1 to debug.
PYTEST_WORKERS ?= 2

.PHONY: local test lint typecheck cfn unit bench openapi clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "fleetkeeper needs Python 3.11 or newer")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

local: $(STAMP)
	$(BIN)/python -m fleetkeeper.local.demo --port $(PORT)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

cfn: $(STAMP)
	$(BIN)/cfn-lint template.yaml
	@if command -v sam >/dev/null 2>&1; then sam validate --lint --template template.yaml; \
	 else echo "sam CLI not installed: skipping 'sam validate' (the template is still translated offline by the tests)"; fi

# The suite runs inside a network namespace with only loopback up where Linux allows it, so a
# test that tried to reach anything but 127.0.0.1 fails instead of sending traffic.
unit: $(STAMP)
	@if unshare -rn true 2>/dev/null; then \
	   echo "running pytest in a loopback-only network namespace"; \
	   unshare -rn sh -c 'ip link set lo up && exec $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)'; \
	 else \
	   echo "no user namespaces here: running pytest with the normal network"; \
	   $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS); \
	 fi

test: lint typecheck cfn unit

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Regenerates the checked-in OpenAPI document; a test fails while it differs from the code's.
openapi: $(STAMP)
	TABLE_NAME=unused $(BIN)/python -c 'from fleetkeeper.api.handler import openapi_json; print(openapi_json())' > docs/openapi.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .aws-sam
