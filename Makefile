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

.PHONY: install demo test lint bench clean

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
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .

bench: install
	$(PY) -m benchmarks.bench_routing

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs mlruns
