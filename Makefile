# `make demo` and `make test` work on a fresh machine: they create .venv when it is missing.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The demo's own install: the core and the `demo` extra, not the dev toolchain (Playwright, mypy,
# schemathesis, every integration's host framework).
DEMO_STAMP := $(VENV)/.demo-installed
LINTED := $(wildcard src tests benchmarks docs/reference/*.py)

# In CI (CI=true) the PostgreSQL half of the suite must run: a server that does not answer fails
# its tests instead of skipping them (tests/ledgers.py). On a developer's machine they skip.
ifeq ($(CI),true)
export EFFECTFLOW_REQUIRE_PG ?= 1
endif

.PHONY: demo test lint docs bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/effectflow demo

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy

# The suite runs in TEST_PROCESSES processes (pytest-xdist; each test keeps its own ledger and
# PostgreSQL database, so they do not meet). `make test TEST_PROCESSES=0` runs it in this one.
TEST_PROCESSES ?= 2

test: lint
	$(PY) -m pytest -n $(TEST_PROCESSES)

# The documentation site and its API reference (mkdocs.yml) into site/. --strict fails on a broken
# link, a docstring naming an object that does not exist, a malformed docstring section, a public
# name left out of the reference. tests/docs/test_reference.py runs the same build in the suite, so
# `make test` and CI check the docs without this target.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

bench: $(STAMP)
	$(PY) benchmarks/core_overhead.py

clean:
	rm -rf $(VENV) build dist site .pytest_cache .mypy_cache .ruff_cache
