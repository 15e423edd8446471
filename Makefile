# GraftPool: `make demo` and `make test` work from a fresh clone with Python >= 3.10 and make.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
# torch goes in first, so that the project's `torch>=2.6` is already met and pip
# never pulls a multi-GB CUDA build on a CPU machine. Override on GPU machines.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# `make dashboard`: the MLflow UI for $(STORE) on 127.0.0.1:$(PORT)
PORT ?= 5000
STORE ?= runs/mlflow.db

.PHONY: install demo test lint bench bench-learning zoo dashboard clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip setuptools wheel
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

demo: install
	$(PY) -m orchestrator demo

test: install
	@bash tests/install_chromium.sh || true
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .

dashboard: install
	$(PY) -m dashboards ui --store $(STORE) --host 127.0.0.1 --port $(PORT)

bench: install
	$(PY) -m benchmarks.bench_routing

# The paper's Table 1 at laptop scale: 9 methods x 3 seeds (resumable; see benchmarks/).
bench-learning: install
	$(PY) -m benchmarks.bench_learning $(BENCH_ARGS)

# (Re)build the tiny model zoo into .cache/zoo and print each model's skill profile.
zoo: install
	$(PY) -m workers.model_zoo

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs mlruns
