# kvpilot — every target sets up what it needs (a fresh machine needs only Python 3.11, Go, npm).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv test unit e2e demo images cluster-build cluster-up cluster-down render bench bench-scale lint typecheck crds clean e2e-tools

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

# Two distributions, both editable: kvsim (simulator/, with its server and plots extras) first, so that
# kvpilot's requirement `kvsim==0.1.0` is met by this repository's copy and never looked up on PyPI.
$(STAMP): pyproject.toml simulator/pyproject.toml
	@echo "==> Creating $(VENV) and installing kvsim and kvpilot (editable) with the test and bench extras"
	@# --clear: an older venv's kvpilot owned the `kvsim` script; upgrading in place would let pip's uninstall of it
	@# delete the script the kvsim distribution has just installed.
	$(PY) -m venv --clear $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e './simulator[serve,plots]'
	$(BIN)/pip install -q -e '.[test,bench]'
	@touch $@

venv: $(STAMP) ## Create the virtualenv with kvpilot, kvsim and the test tools

# NVIDIA's aiperf (a real benchmark client for the simulator's API) pins its own dependency versions, so it
# lives in a virtualenv of its own rather than in the project's.
AIPERF_VENV := .venv-aiperf
AIPERF_STAMP := $(AIPERF_VENV)/.installed
$(AIPERF_STAMP):
	@echo "==> Creating $(AIPERF_VENV) with NVIDIA aiperf (a real client for the kvsim tests)"
	$(PY) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/pip install -q --upgrade pip
	$(AIPERF_VENV)/bin/pip install -q 'aiperf>=0.13,<0.14'
	@touch $@

images: ## Build the operator and kvsim images with buildah (no Docker; cached by content hash outside the repo)
	@hack/images/build.sh

cluster-build: ## Build or reuse the control-plane binaries (cached outside the repo, keyed by version)
	@hack/testenv/build.sh >/dev/null

cluster-up: venv cluster-build ## Start etcd, kube-apiserver, controller-manager, scheduler, kwok + fake GPU nodes
	@hack/testenv/cluster-up.sh

cluster-down: ## Stop exactly what cluster-up started
	@hack/testenv/cluster-down.sh

e2e-tools: ## Install the real tools the tests run, from Debian when missing: prometheus + promtool, lua5.1
	@hack/testenv/apt-tools.sh

test: venv ## Run every test: unit, chart, simulator, end-to-end on the local control plane (stopped at the end unless KVPILOT_KEEP_CLUSTER=1)
	@# The set-up steps run side by side (on a new machine: mypy, the control plane's Go build, aiperf's
	@# virtualenv, Debian's tools and then the images), the two that use apt-get one after the other.
	@$(MAKE) --no-print-directory -j3 lint $(AIPERF_STAMP) cluster-build test-apt-steps
	KVSIM_AIPERF=$(CURDIR)/$(AIPERF_VENV)/bin/aiperf $(BIN)/pytest -q --durations=30 tests

.PHONY: test-apt-steps
test-apt-steps: e2e-tools
	@$(MAKE) --no-print-directory images

unit: venv e2e-tools ## Run the fast tests that need no cluster
	$(BIN)/pytest -q tests -m 'not e2e'

demo: venv cluster-build images ## Closed loop on a local cluster: build -> serve (kvsim) -> load -> retune
	$(BIN)/python -m hack.demo

render: venv ## Render the objects for every example (like helm template)
	@for f in examples/*.yaml; do echo "# ---- $$f"; $(BIN)/kvpilot render -f $$f; done

lint: venv typecheck ## Static checks: mypy (typecheck), then ruff
	$(BIN)/pip install -q 'ruff>=0.6,<1' && $(BIN)/ruff check operator simulator tests hack

# mypy (pinned in the test extras; settings in pyproject.toml [tool.mypy]). Strict on the operator; default
# mode on the other code. Add a path to the list that fits it.
MYPY_STRICT_PATHS := operator/kvpilot
MYPY_DEFAULT_PATHS := hack simulator/kvsim
typecheck: venv ## Type checks (mypy): strict on operator/kvpilot, default on the simulator and the tools
	$(BIN)/mypy --strict $(MYPY_STRICT_PATHS)
	$(BIN)/mypy $(MYPY_DEFAULT_PATHS)

bench: venv ## Run the benchmarks and print their figures
	$(BIN)/python -m tests.bench

ENGINES ?= 1000
bench-scale: venv cluster-build ## N engines on one operator, own local cluster: make bench-scale ENGINES=1000
	$(BIN)/python -m hack.bench_scale --engines $(ENGINES) $(BENCH_SCALE_ARGS)

crds: venv ## Regenerate the CRD (crds/ and the chart) from operator/kvpilot/api (spec_schema.py, status_schema.py)
	$(BIN)/kvpilot crd > crds/serving.kvpilot.io_inferenceengines.yaml
	cp crds/serving.kvpilot.io_inferenceengines.yaml charts/kvpilot/files/crds/

clean: ## Remove the virtualenv and local cluster state (not the binary cache)
	-hack/testenv/cluster-down.sh
	-KVPILOT_TESTENV_DIR=$(CURDIR)/.testenv-bench hack/testenv/cluster-down.sh
	rm -rf $(VENV) $(AIPERF_VENV) .testenv .testenv-bench
