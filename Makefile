# Each target creates .venv when missing and installs the project with its dev extras.
# The editable install is a plain .pth ([tool.setuptools] in pyproject.toml), which mypy and
# pyright follow like any installed package.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-long test-slow test-postgres test-node lint typecheck bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,postgres,ui,otel,encryption]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest -q

# The costliest tests of the default selection (crash loops, many processes, benchmark
# harnesses), apart so that `make test` stays within its time; CI runs both. Their
# PostgreSQL variants run in test-postgres.
test-long: $(STAMP)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest -q -m "long and not postgres"

test-slow: $(STAMP)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-thorough} $(PY) -m pytest -q -m "slow"

# The PostgreSQL backend's contract and workflow tests; starts (or installs) the service.
# They include the cross-host tests (tests/test_hosts.py): workers in network namespaces
# against a cluster of their own (initdb in /tmp); they need root, iproute2 and the server
# programs, which .ci/postgres-up installs when missing.
test-postgres: $(STAMP)
	bash .ci/postgres-up
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest -q -m postgres

# Tests that run JavaScript in Node.js (the timeline page's fold, pyright); installs Node.js
# from Debian's packages when it is missing (needs root), as test-browser does for Chromium.
test-node: $(STAMP)
	command -v node >/dev/null 2>&1 || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y nodejs)
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(PY) -m pytest -q -m node

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

typecheck: $(STAMP)
	$(PY) -m mypy

bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m benchmarks all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis

# Browser tests of the timeline and graph pages and of the web UI (tests/browser, never part
# of `make test`): Debian's chromium renders them headless, the UI's driven by Playwright (a
# dev dependency; its own browser downloads are never used); the ui extra serves them.
# Chromium is installed when missing (needs root).
.PHONY: test-browser
test-browser: $(STAMP)
	command -v chromium >/dev/null 2>&1 || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium)
	$(PY) -m pytest -q -p no:cacheprovider tests/browser
