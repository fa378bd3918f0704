# fleetkeeper — the two commands a new machine needs: `make local` and `make test`.
# Both create .venv with whatever python3 (3.11+) is on the PATH and install into it.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The embedded API's port: one no app's example takes (SkyPilot YAMLs hard-code 8080, 8000, 8081).
PORT   ?= 8470
# Seconds between the local endpoints' request-count datapoints, which the autoscaler reads.
METRICS_INTERVAL ?= 5
# Tests get both cores; override with PYTEST_WORKERS=1 to debug. Each worker takes the next test as
# it finishes one (xdist's default hands each worker an eighth of the suite up front), longest
# first (tests/conftest.py, LONG_FIRST): both workers end within a short test of each other.
PYTEST_WORKERS ?= 2
PYTEST_DIST    ?= --dist load --maxschedchunk 1

.PHONY: local test check check-tests lint typecheck imports cfn unit fuzz mutate bench openapi clean sim soak browser screenshots

# checkov and the SAM CLI pin boto3 (and each other's dependencies) to exact versions that clash
# with ours and with each other, so each gets a venv of its own under .venv-tools/.
TOOLS           := .venv-tools
CHECKOV_VERSION := 3.3.30
SAM_CLI_VERSION := 1.170.0
CHECKOV         := $(TOOLS)/checkov/bin/checkov
SAM             := $(TOOLS)/sam/bin/sam
# A stamp per version, so that changing a pin above reinstalls the tool.
CHECKOV_STAMP   := $(TOOLS)/checkov/.installed-$(CHECKOV_VERSION)
SAM_STAMP       := $(TOOLS)/sam/.installed-$(SAM_CLI_VERSION)
# Template checks run with no network at all where Linux allows it: a check that wanted to download
# something fails here instead of quietly depending on the internet.
OFFLINE         := $(shell unshare -rn true 2>/dev/null && echo unshare -rn)
CFN_TEMPLATES   := template.yaml $(wildcard infra/*.yaml)

# The Lambda bundle's pins (functions/requirements.txt: boto3 and botocore) constrain the dev install,
# so the suite runs the SDK release the functions ship with.
# Every install goes through uv (pinned, in a venv of its own, itself installed by pip): it installs
# the three venvs of `make test` in seconds of CPU where pip took about four minutes of it on 2 cores
# (docs/PERFORMANCE.md). It compiles .venv's bytecode at install, as pip does: where a machine sets
# PYTHONDONTWRITEBYTECODE, nothing would cache it later and every process would compile botocore,
# moto and the rest again (twice the CPU of an import). uv reads PyPI, not pip's configuration:
# where uv cannot be installed or cannot install (a mirror only pip.conf names, say), pip does the
# install instead, with the same arguments.
UV_VERSION := 0.13.9
UV         := $(TOOLS)/uv/bin/uv
UV_STAMP   := $(TOOLS)/uv/.installed-$(UV_VERSION)

$(UV_STAMP):
	@test -x $(TOOLS)/uv/bin/python || $(PYTHON) -m venv $(TOOLS)/uv
	@$(TOOLS)/uv/bin/python -m pip install --quiet "uv==$(UV_VERSION)" || echo "could not install uv: pip installs instead"
	@touch $@

# $(call install,venv,arguments[,--compile-bytecode]): install the arguments into that venv, with uv
# (compiling their bytecode when asked), else with pip. The tool venvs skip it: checkov and the SAM
# CLI run once or twice per `make test`, and compiling all they install costs more than what those
# runs compile on the way.
define install
{ test -x $(UV) && $(UV) pip install --quiet $(3) --python $(1)/bin/python $(2); } || \
  { echo "installing with pip instead of uv"; $(1)/bin/python -m pip install --quiet --upgrade pip && \
    $(1)/bin/python -m pip install --quiet $(2); }
endef

$(STAMP): pyproject.toml functions/requirements.txt | $(UV_STAMP)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "fleetkeeper needs Python 3.11 or newer")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(call install,$(VENV),-e '.[dev]' -c functions/requirements.txt,--compile-bytecode)
	@touch $(STAMP)

# `make local` needs the embedded mode's runtime only (the `local` extra: moto, aiohttp), not the
# development and test toolchain `make test` installs (README: the sizes). A venv that has the
# toolchain already has the runtime too.
LOCAL_STAMP := $(VENV)/.installed-local

$(LOCAL_STAMP): pyproject.toml functions/requirements.txt | $(UV_STAMP)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "fleetkeeper needs Python 3.11 or newer")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@if [ -f $(STAMP) ] && [ $(STAMP) -nt pyproject.toml ] && [ $(STAMP) -nt functions/requirements.txt ]; then :; else \
	   $(call install,$(VENV),-e '.[local]' -c functions/requirements.txt,--compile-bytecode); fi
	@touch $@

# `make local VERBOSE=1` also prints the handlers' INFO logs, every reconciler run's included.
local: $(LOCAL_STAMP)
	$(BIN)/python -m fleetkeeper.local.demo --port $(PORT) --metrics-interval $(METRICS_INTERVAL) $(if $(VERBOSE),--verbose)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# The architecture as a checked contract: the layers, the pure planner, and what Lambda may import
# ([tool.importlinter] in pyproject.toml; tests/test_architecture.py proves each contract can fail).
imports: $(STAMP)
	$(BIN)/lint-imports --no-cache

$(CHECKOV_STAMP): | $(UV_STAMP)
	@test -x $(TOOLS)/checkov/bin/python || $(PYTHON) -m venv $(TOOLS)/checkov
	$(call install,$(TOOLS)/checkov,"checkov==$(CHECKOV_VERSION)")
	@touch $@

$(SAM_STAMP): | $(UV_STAMP)
	@test -x $(TOOLS)/sam/bin/python || $(PYTHON) -m venv $(TOOLS)/sam
	$(call install,$(TOOLS)/sam,"aws-sam-cli==$(SAM_CLI_VERSION)")
	@touch $@

# cfn-lint, `sam validate` (SAM's translator, then its cfn-lint mode) and checkov, all offline.
# checkov's skips, each with its reason, are in .checkov.yaml.
cfn: $(STAMP) $(CHECKOV_STAMP) $(SAM_STAMP)
	$(BIN)/cfn-lint $(CFN_TEMPLATES)
	SAM_CLI_TELEMETRY=0 $(OFFLINE) $(SAM) validate --template template.yaml --region us-east-1
	SAM_CLI_TELEMETRY=0 $(OFFLINE) $(SAM) validate --lint --template template.yaml --region us-east-1
	$(OFFLINE) $(CHECKOV) --config-file .checkov.yaml $(addprefix -f ,$(CFN_TEMPLATES))

# The dashboard's browser tests (tests/dashboard/test_browser.py) drive Debian's headless Chromium and
# its driver: installed here when missing and we may (root with apt-get); otherwise this says so and
# those tests, only those, are skipped with the same words.
BROWSER_PACKAGES := chromium chromium-driver
browser:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	 elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	   echo "installing $(BROWSER_PACKAGES) for the dashboard's browser tests"; \
	   DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES) >/dev/null 2>&1 || \
	   { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(BROWSER_PACKAGES) >/dev/null 2>&1; } || \
	   echo "could not install $(BROWSER_PACKAGES): the dashboard's browser tests will be skipped"; \
	 else echo "no Chromium here and no root apt-get to install it: the dashboard's browser tests will be skipped"; fi

# The suite runs inside a network namespace with only loopback up where Linux allows it, so a
# test that tried to reach anything but 127.0.0.1 fails instead of sending traffic.
# It runs with Python's bytecode cache on (PYTHONDONTWRITEBYTECODE unset, where a machine sets it):
# the suite starts a few hundred Python processes (`fleetkeeper local`, the CLI, fresh interpreters),
# each of which would otherwise compile the project's sources again, about 0.3 s of CPU each.
# (__pycache__/ is ignored by git.)
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_DIST)
define pytest_loopback
if unshare -rn true 2>/dev/null && command -v ip >/dev/null 2>&1; then \
   echo "running pytest in a loopback-only network namespace"; \
   unshare -rn sh -c 'ip link set lo up && exec $(PYTEST) $(1)'; \
 else \
   echo "no user namespaces here: running pytest with the normal network"; \
   $(PYTEST) $(1); \
 fi
endef

unit: $(STAMP) browser
	+@$(call pytest_loopback,$(PYTEST_ARGS))

# The fast loop: lint, types, the import contracts and the tests that need neither moto, nor a local
# process, nor a browser, and are not among the longest (tests/conftest.py marks them `integration`
# and `slow`), in the same loopback-only namespace; about a minute on 2 cores (docs/PERFORMANCE.md).
# `make test` runs everything.
CHECK_TESTS := -q -m "not slow and not integration"
check-tests: $(STAMP)
	+@$(call pytest_loopback,$(CHECK_TESTS) $(PYTEST_ARGS))

check:
	@$(MAKE) --no-print-directory -k -j 4 --output-sync=target lint typecheck imports check-tests

# Everything at once, on make's jobs: the three venvs install side by side, the suite starts as soon
# as .venv is ready (while checkov's and the SAM CLI's venvs are still installing) and the checks run
# beside it. The suite's output streams as it runs (the `+` on unit's recipe, which also makes
# `make -n` run it); each check's prints as one block when that check ends (--output-sync=target).
# Any step that fails fails `make test` (make still lets the others finish, -k, so one run reports
# every failure). TEST_JOBS=1 runs them one by one.
TEST_JOBS ?= 8

test:
	@$(MAKE) --no-print-directory -k -j $(TEST_JOBS) --output-sync=target lint typecheck imports cfn unit

# The property tests (every @given test: hypothesis marks them) as a random search, FUZZ_EXAMPLES
# examples per test (default 3000) instead of `make test`'s fixed, derandomized 200. A failure
# prints the input and a blob to reproduce it; keep the input as an @example of its test.
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(MAKE) --no-print-directory unit PYTEST_ARGS="-m hypothesis $(PYTEST_ARGS)"

# The seeded simulation (tests/simulation/test_simulation.py; docs/architecture/simulation.md). `make test`
# runs its fixed seeds; `make sim SIM_SEED=n` replays one seed; `make soak SEEDS=N` runs N random
# seeds (each printed; a failure prints its seed and steps) of SIM_STEPS steps (default 2000; the
# fixed seeds of `make test` run 200 each, tests/simulation/test_simulation.py).
SEEDS     ?= 20
SIM_STEPS ?= 2000
SOAK_BASE ?= $(shell date +%s)

sim: $(STAMP)
	SIM_SEED=$(SIM_SEED) SIM_STEPS=$(SIM_STEPS) $(BIN)/python -m pytest tests/simulation/test_simulation.py -p no:xdist -s -q $(PYTEST_ARGS)

soak: $(STAMP)
	@echo "soak: $(SEEDS) seeds drawn from SOAK_BASE=$(SOAK_BASE)"
	SIM_SOAK=$(SEEDS) SIM_SOAK_BASE=$(SOAK_BASE) SIM_STEPS=$(SIM_STEPS) $(MAKE) --no-print-directory unit PYTEST_ARGS="tests/simulation/test_simulation.py -rxX $(PYTEST_ARGS)"

# Mutation testing (slow, so not part of `make test`): mutmut changes MUTATE_PATHS (paths under
# functions/, globs allowed) one small edit at a time and runs only MUTATE_TESTS, the tests that
# exercise them, against each mutant; a mutant no test fails on "survived". It runs in $(MUTATE_DIR)
# (the package, the tests, template.yaml and docs/ linked in: the api tests check answers against
# docs/openapi.json; mutmut's copy under $(MUTATE_DIR)/mutants), fresh each time.
# The default scope is the planner's package (reconciler/plan/) against every planner test file
# (tests/reconciler/plan/test_*.py), and the store package (store/) against the store's tests.
# `make mutate MUTATE_PATHS=fleetkeeper/store/keys.py MUTATE_TESTS=tests/store/test_store.py` narrows it;
# then `cd $(MUTATE_DIR) && ../$(BIN)/mutmut show NAME` prints one mutant's diff.
# Floors: after the run, .ci/mutation_floors.py fails `make mutate` when a module's killed share
# (killed + timeout over all but skipped mutants) is below its floor in MUTATE_FLOORS; every planner
# module must have one (a narrowed run checks only the modules it mutated). A floor is the measured
# share rounded down to 5% (one 5% lower on a 5% mark): after a run that raised a module's share, or for a new
# module, `.venv/bin/python .ci/mutation_floors.py --measured $(MUTATE_DIR)/results.txt` prints the
# measured floors to copy in (docs/architecture/testing.md, "Mutation testing").
MUTATE_PATHS   ?= fleetkeeper/reconciler/plan/*.py \
                  $(patsubst functions/%,%,$(wildcard functions/fleetkeeper/store.py functions/fleetkeeper/store/*.py))
MUTATE_TESTS   ?= $(wildcard tests/reconciler/plan/test_*.py) \
                  $(wildcard tests/store/test_*.py tests/reconciler/test_store*.py)
MUTATE_FLOORS  ?= tests/mutation_floors.toml
MUTATE_WORKERS ?= $(PYTEST_WORKERS)
MUTATE_DIR     := .mutmut
MUTATE_STAMP   := $(VENV)/.installed-mutate
comma          := ,

$(MUTATE_STAMP): $(STAMP)
	$(call install,$(VENV),-e '.[dev,mutate]' -c functions/requirements.txt,--compile-bytecode)
	@touch $@

mutate: $(MUTATE_STAMP)
	rm -rf $(MUTATE_DIR)
	mkdir -p $(MUTATE_DIR)
	ln -s ../functions/fleetkeeper ../tests ../template.yaml ../docs $(MUTATE_DIR)/
	{ cat pyproject.toml; echo; echo '[tool.mutmut]'; \
	  echo 'source_paths = ["fleetkeeper"]'; \
	  echo 'only_mutate = [$(foreach p,$(MUTATE_PATHS),"$(p)"$(comma))]'; \
	  echo 'pytest_add_cli_args_test_selection = [$(foreach t,$(MUTATE_TESTS),"$(t)"$(comma))]'; \
	  echo 'pytest_add_cli_args = ["-p", "no:xdist", "-p", "no:cacheprovider"]'; \
	  echo 'also_copy = ["template.yaml", "docs"]'; \
	} > $(MUTATE_DIR)/pyproject.toml
	cd $(MUTATE_DIR) && ../$(BIN)/mutmut run --max-children $(MUTATE_WORKERS)
	cd $(MUTATE_DIR) && ../$(BIN)/mutmut results
	cd $(MUTATE_DIR) && ../$(BIN)/mutmut results --all true > results.txt
	$(BIN)/python .ci/mutation_floors.py --floors $(MUTATE_FLOORS) $(MUTATE_DIR)/results.txt

# A smoke test of a deployed stack, with your own AWS credentials (docs/DEPLOY.md, "Smoke test"):
# `make smoke-aws STACK=fleetkeeper [SECOND_OWNER_ROLE=arn:aws:iam::...:role/NAME] [DOCTOR_ARGS=...]`
# runs `fleetkeeper doctor --stack STACK`: a few short-lived instances, about 10 to 20 minutes.
# Never part of `make test` (it needs an account).
.PHONY: smoke-aws
ifneq ($(filter smoke-aws,$(MAKECMDGOALS)),)
ifeq ($(STACK),)
$(error usage: make smoke-aws STACK=NAME [SECOND_OWNER_ROLE=ARN] [DOCTOR_ARGS=...])
endif
endif
smoke-aws: $(STAMP)
	$(BIN)/fleetkeeper doctor --stack "$(STACK)" $(if $(SECOND_OWNER_ROLE),--second-owner-role "$(SECOND_OWNER_ROLE)") $(DOCTOR_ARGS)

bench: $(STAMP)
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# Regenerates the checked-in OpenAPI document; a test fails while it differs from the code's.
openapi: $(STAMP)
	TABLE_NAME=unused $(BIN)/python -c 'from fleetkeeper.api.handler import openapi_json; print(openapi_json())' > docs/openapi.json

# The dashboard's screenshots in docs/images/ (the README shows one), taken by its browser test.
screenshots: $(STAMP) browser
	FLEETKEEPER_SCREENSHOTS=docs/images $(BIN)/python -m pytest tests/dashboard/test_browser.py -p no:xdist -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(TOOLS) $(MUTATE_DIR) .mypy_cache .ruff_cache .pytest_cache .aws-sam
