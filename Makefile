# detlab: `make run` starts the embedded dashboard; `make test` runs the whole test suite; `make test-fast` the
# tests that need no PostgreSQL, Redis, browser, deployment or rank processes (tests/conftest.py sorts them).
# Each sets up what it needs (virtualenv, packages; services and browser for the full suite).

VENV ?= .venv
PY := $(VENV)/bin/python
PORT ?= 8000

.PHONY: run test test-fast lint bench services

run: $(VENV)/.installed
	$(VENV)/bin/detlab up --port $(PORT)

PYTEST_ARGS ?=
# The full suite in this many processes (pytest-xdist), each taking a whole test file at a time, so that a file's
# shared deployment and browser stay in one process. Its tests mostly wait on processes of their own (ranks,
# servers, a browser): two of them keep a 2-core machine busy.
TEST_WORKERS ?= 2

test: $(VENV)/.installed services
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

test-fast: $(VENV)/.installed
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy detlab backend worker

services:
	bash scripts/test-services.sh

# torch is pinned to the CPU wheel: an unpinned torch pulls gigabytes of CUDA libraries.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[server,worker,dev]'
	touch $@
