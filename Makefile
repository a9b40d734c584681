# Two commands do all the set-up on a fresh machine:
#   make experiment NAME=fedpe_synthetic   # creates .venv, installs, runs, leaves plots
#   make test                              # creates .venv if needed, runs the test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# The example plugin: installed into the venv by `make test` and tested there, as a user would.
PLUGIN := examples/fedbandit-example-plugin
PLUGIN_STAMP := $(VENV)/.plugin-stamp
NAME ?= fedpe_synthetic
ARGS ?=
# A user-supplied data file or folder for experiments that need one, e.g.
#   make experiment NAME=fedpe_movielens DATA=/path/to/ml-100k
DATA ?=
# Processes the default test tier is spread over (pytest-xdist; 0 runs it in this process). The
# slow tier runs in one process: its deployments time rounds and share the loopback.
TEST_WORKERS ?= 2

# Flower phones home and installs run-time dependencies unless told not to.
export FLWR_TELEMETRY_ENABLED := 0
export FLWR_DISABLE_UPDATE_CHECK := 1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION := 1
export MPLBACKEND := Agg

.PHONY: venv experiment test test-slow test-heavy test-all bench lint list docs docs-serve dist clean

venv: $(STAMP)

# rliable (fedbandit suite's statistics) goes in without its requirements: it asks for arch < 8,
# which does not import under pandas 3; the suite extra (in dev) holds the rest.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m pip install --quiet --no-deps 'rliable>=1.2,<1.3'
	touch $(STAMP)

# A study (an experiment with a [sweep] table) runs with `fedbandit sweep`, the others with `run`.
STUDY_OR_RUN := import sys; from fedbandit.config import load_experiment; \
	print("sweep" if load_experiment(sys.argv[1]).sweep else "run")

experiment: $(STAMP)
	@command=$$($(BIN)/python -c '$(STUDY_OR_RUN)' $(NAME) 2>/dev/null || echo run); \
	set -x; $(BIN)/fedbandit $$command $(NAME) $(if $(DATA),--set 'instance.path=$(DATA)') $(ARGS)
	@echo "fedbandit is installed in $(BIN): 'source $(BIN)/activate' puts it on your PATH"

list: $(STAMP)
	$(BIN)/fedbandit list

$(PLUGIN_STAMP): $(STAMP) $(PLUGIN)/pyproject.toml
	$(BIN)/python -m pip install --quiet --no-deps -e $(PLUGIN)
	touch $(PLUGIN_STAMP)

test: $(PLUGIN_STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) tests $(PLUGIN)/tests

test-slow: $(PLUGIN_STAMP)
	$(BIN)/python -m pytest -q -m 'slow and not heavy' --durations=20 tests $(PLUGIN)/tests

# Deployment scenarios under a CPU burner or repeated faults: minutes each, outside CI's budget.
test-heavy: $(PLUGIN_STAMP)
	$(BIN)/python -m pytest -q -m heavy --durations=20 tests

test-all: $(PLUGIN_STAMP)
	$(BIN)/python -m pytest -q -m 'slow or not slow' tests $(PLUGIN)/tests

BENCH_STAMP := $(VENV)/.bench-extra-stamp

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/fedbandit bench all

# The documentation site, built strictly (a broken link, anchor or API reference fails) into
# build/site; its code blocks run in `make test` (tests/test_docs.py).
# Material's end-of-maintenance banner is silenced: the choice to stay on it, pinned, is recorded
# in the docs' testing page.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

docs-serve: $(STAMP)
	$(BIN)/mkdocs serve

# The sdist and the wheel in dist/, checked as an index would check them.
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	$(BIN)/twine check --strict dist/*

lint: $(STAMP)
	$(BIN)/ruff check fedbandit tests $(PLUGIN)
	$(BIN)/ruff format --check fedbandit tests $(PLUGIN)
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build dist *.egg-info $(PLUGIN)/src/*.egg-info
