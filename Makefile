# Two commands do all set-up on a fresh machine: `make train` and `make test`.
# Both create .venv and install the project into it first (once; redone when setup.cfg changes).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Extra flags for train.py, e.g. make train ARGS="--strategy ddp --devices 2 --accelerator cpu"
ARGS   ?=
# Extra flags for pytest, e.g. make test PYTEST_ARGS="-k shorthand"
PYTEST_ARGS ?=
# pytest-xdist workers: most tests wait on train.py processes, so 2 keep 2 cores busy (0 runs them in one process)
# --dist loadgroup: the tests of one xdist_group share one worker (the two-node SLURM: tests/cluster/test_two_nodes.py)
PYTEST_WORKERS ?= 2

.PHONY: help train test test-oldest test-unit test-cluster bench tensorboard clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | expand -t 14

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

train: $(STAMP)  ## set up, then train configs/default.yaml (ARGS="..." adds flags)
	$(BIN)/python train.py $(ARGS)

test: $(STAMP)  ## set up, then run the whole test suite (CPU; the cluster tier may apt-get SLURM): CI's newest leg
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m "not alone" $(PYTEST_ARGS)
	@# the timing proofs (tests/test_step_time.py) one at a time, with no other test on the cores (5: none selected)
	$(BIN)/python -m pytest -m alone $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The oldest leg: setup.cfg's floors (requirements/oldest.txt) in their own venv, made again when either changes.
# torch and torchvision go in first, as a cluster's image has them; the project is installed beside them, and
# tests/test_install_beside.py checks that it kept them. Its tests: the unit tier and those marked `oldest`.
OLDEST        := .venv-oldest
OLDEST_STAMP  := $(OLDEST)/.installed
OLDEST_TORCH  := grep -E '^torch(vision)?=='

$(OLDEST_STAMP): setup.cfg pyproject.toml requirements/oldest.txt
	rm -rf $(OLDEST)
	$(PYTHON) -m venv $(OLDEST)
	$(OLDEST)/bin/pip install --quiet --upgrade pip
	PIP_CONSTRAINT=/dev/null $(OLDEST)/bin/pip install --quiet $$($(OLDEST_TORCH) requirements/oldest.txt)
	$(OLDEST)/bin/python -m pip list --format freeze | $(OLDEST_TORCH) > $(OLDEST)/torch-before-project.txt
	grep -vE '^torch(vision)?==' requirements/oldest.txt > $(OLDEST)/beside-torch.txt
	PIP_CONSTRAINT=$(OLDEST)/beside-torch.txt $(OLDEST)/bin/pip install --quiet -e '.[dev]'
	touch $@

test-oldest: $(OLDEST_STAMP)  ## the oldest leg: setup.cfg's floors, the unit tier and the tests marked oldest (docs/testing.md)
	$(OLDEST)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup tests/unit $(PYTEST_ARGS)
	$(OLDEST)/bin/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup -m oldest tests $(PYTEST_ARGS)

test-unit: $(STAMP)  ## the unit tier only (tests/unit: no subprocess, no process group; under a minute): while editing
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup tests/unit $(PYTEST_ARGS)

test-cluster: $(STAMP)  ## the cluster tier only (tests/cluster): a real SLURM on this machine (apt-get installs it as root), torchrun agents
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup tests/cluster $(PYTEST_ARGS)

# Extra flags for the benchmark, e.g. make bench BENCH_ARGS="--network fast --repeats 5"
BENCH_ARGS ?=

bench: $(STAMP)  ## speed A/B, host time per step, breakdown cost (needs FASHION_MNIST_DIR); rewrites a section of docs/results.md
	$(BIN)/python -m benchmarks.speed --write $(BENCH_ARGS)
	$(BIN)/python -m benchmarks.host_time --profile
	$(BIN)/python -m benchmarks.step_time_cost

tensorboard: $(STAMP)  ## serve the TensorBoard logs under runs/ on http://localhost:6006
	$(BIN)/tensorboard --logdir runs

clean:  ## remove the virtualenv, training outputs and caches (not ./data)
	rm -rf $(VENV) $(OLDEST) runs lightning_logs .pytest_cache *.egg-info build dist
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
