# `make demo` and `make test` do all set-up: they build .venv on first use.
# torch==2.13.0 goes in first: that pin is the CPU build; a looser one pulls the CUDA build.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
COLLECTOR := $(VENV)/.collector
PIP := $(PY) -m pip install --disable-pip-version-check --progress-bar on
# The README's figures were taken with one thread: on a small shared machine more threads make
# op times swing (a 2-thread _foreach_sqrt took 210 ms). Override with `make demo OMP_NUM_THREADS=4`.
OMP_NUM_THREADS ?= 1
export OMP_NUM_THREADS

.PHONY: demo test lint format docs collector gpu-check clean

$(STAMP): pyproject.toml
	@echo "==> creating $(VENV) (first run only)"
	test -x $(PY) || python3 -m venv $(VENV)
	@echo "==> installing torch 2.13.0 (CPU build)"
	$(PIP) torch==2.13.0
	@echo "==> installing optrace and its test and plot dependencies"
	$(PIP) -e '.[dev]'
	touch $(STAMP)
	@echo "==> $(VENV) is ready: run '$(VENV)/bin/optrace', or 'source $(VENV)/bin/activate' first"

# The compiled hook (tracer/native/_dispatch.cpp, with tracer/native/_collector.cpp), built against the installed torch with
# torch's extension tooling into tracer/native/_collector.so (57 s on a 2-core VM, 181 s with other jobs sharing it; it prints
# a line per source compiled); if it cannot be built, optrace runs its pure-Python path and the trace's metadata
# says so (`collector`).
# `make test BUILD_EXT_FLAGS=--strict` (.ci/run) stops there instead.
BUILD_EXT_FLAGS ?=
$(COLLECTOR): $(STAMP) tracer/native/_collector.cpp tracer/native/_dispatch.cpp tracer/native/_where.cpp tracer/native/_native_flops.cpp tracer/native/_collector.h tracer/native/_dispatch.h tracer/native/build_ext.py
	$(PY) -m tracer.native.build_ext $(BUILD_EXT_FLAGS)
	touch $(COLLECTOR)

collector: $(COLLECTOR)

demo: $(STAMP) $(COLLECTOR)
	$(PY) examples/gpt.py --export runs/gpt.json

# The suite in 2 worker processes (pytest-xdist): pytest 219 s on an idle 2-core VM (2026-12-05, 2,045 tests).
# Every test is independent of the others' order and process; `make test PYTEST_WORKERS=0` runs it in one.
PYTEST_WORKERS ?= 2

test: lint $(STAMP) $(COLLECTOR)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS)

# ruff (the dev extra pins it; its rules are in pyproject.toml): lint, and the formatter's check, over the code that
# is formatted. `make format` applies both.
LINT_PATHS ?= .

lint: $(STAMP)
	$(PY) -m ruff check $(LINT_PATHS)
	$(PY) -m ruff format --check $(LINT_PATHS)

format: $(STAMP)
	$(PY) -m ruff check --fix $(LINT_PATHS)
	$(PY) -m ruff format $(LINT_PATHS)

# The documentation site (mkdocs.yml, docs/): built with --strict, so a broken link or a docstring mkdocstrings cannot
# read fails it; into site/ (gitignored). The dev extra installs mkdocs (the docs extra alone: pip install -e '.[docs]').
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

# benchmarks/gpu_check.py: every CUDA path (event and sync timing, cuda_memory, the Meter, MFU, torch.compile, NCCL)
# against torch.cuda's own figures, one table, exit status 1 when a check fails; without a GPU one line, exit 0.
# It needs a CUDA build of torch in $(VENV) (the pin above installs the CPU build).
gpu-check: $(STAMP) $(COLLECTOR)
	$(PY) benchmarks/gpu_check.py

clean:
	rm -rf $(VENV) runs site tracer/native/_collector.so
