# Two entry points: `make demo` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: invalidate demo test test-fast faults moves deploy browser check lint typecheck services bench clean

# Bytecode caching on, whatever the environment says: with PYTHONDONTWRITEBYTECODE set, every
# pytest worker and every child process the tests start (a few hundred) compiled the package,
# and rewrote the tests' asserts, again.
unexport PYTHONDONTWRITEBYTECODE

# pytest-xdist workers (each has its own namespace, caches and ports: tests/conftest.py), a test
# module to a worker. `make test XDIST=` runs the suite in one process. Four on two cores: the
# tests wait on servers, sleeps and child processes, and with three a part of the CPU still sat
# idle (with four, 2% of it over a whole run). The modules go out in the order collected, the
# longest first (tests/conftest.py LONGEST_FIRST), not by their number of tests.
XDIST ?= -n 4 --dist loadscope --no-loadscope-reorder
# Where the tests keep their files: the data directories of the MariaDB and PostgreSQL servers they
# start, their SQLite files and tmp_path. On tmpfs where the machine has one (files made and
# dropped by the thousand cost a disk file system's journal a third of the PostgreSQL move tests'
# CPU); `make test TEST_TMPDIR=` keeps the usual temporary folder.
TEST_TMPDIR ?= $(shell [ -d /dev/shm ] && [ -w /dev/shm ] && echo /dev/shm)
PYTEST := $(if $(TEST_TMPDIR),TMPDIR=$(TEST_TMPDIR) )$(BIN)/pytest
# The tests that need no server (tests/conftest.py marks the others `servers`).
FAST := not servers and not moves and not faults and not browser and not deploy and not packaging

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q --upgrade pip
	# The distribution was named `store` before `shardstore`: drop that install from an old venv.
	$(BIN)/pip uninstall -qq -y store
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

## demo: create a venv, install, run `store demo` on the embedded default
demo: $(STAMP)
	$(BIN)/store demo

## test: start services if down, then format check, lint, type check, whole test suite
## (on pytest-xdist workers, one tier: the tests that count queries, time a browser or read
## under a timeout wait for what they count, with bounds a busy machine meets; pytest's exit
## code 5, no tests collected, fails the target like any other)
test: $(STAMP) services $(VENV)/.mysqlclient lint typecheck
	bash scripts/browser.sh
	$(PYTEST) $(XDIST)

## test-fast: the tests that need no server (under a minute), on pytest-xdist workers (test by
## test: no server fixtures to share)
test-fast: $(STAMP)
	$(PYTEST) -n 2 -m "$(FAST)"

# mysqlclient compiles against MariaDB's client headers, which services.sh installs.
$(VENV)/.mysqlclient: $(STAMP) | services
	$(BIN)/pip install -q -e '.[mysqlclient]'
	touch $@

## faults: the fault suite alone (servers killed, blackholed, restarted); prints its report table
faults: $(STAMP) services
	$(PYTEST) -m faults

## moves: moves, tombstones and `store check` alone, on MariaDB servers the tests start
moves: $(STAMP) services
	$(PYTEST) -m moves

## deploy: the store under gunicorn --preload (sync and gthread workers) and forked workers alone
deploy: $(STAMP) services
	$(PYTEST) tests/test_forks.py tests/test_deploy.py

## browser: the operator page in headless Chromium during a real move (installs Chromium if missing)
browser: $(STAMP) services
	bash scripts/browser.sh
	$(PYTEST) -m browser

services:
	bash scripts/services.sh

## invalidate: the cache invalidation daemon for config/local.yaml (one per server leads; Ctrl-C stops it)
invalidate: $(STAMP) services
	$(BIN)/store init --config config/local.yaml --shards 0-15
	$(BIN)/store invalidate --config config/local.yaml

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP) services
	$(BIN)/store init --config config/local.yaml --shards 0-15
	$(BIN)/store bench --config config/local.yaml

clean:
	rm -rf $(VENV) store-data .mypy_cache .ruff_cache .pytest_cache
