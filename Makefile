# `make demo` and `make test` do all set-up: they build .venv on first use.
# torch==2.13.0 goes in first: that pin is the CPU build; a looser one pulls the CUDA build.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/gpt.py --export runs/gpt.json

test: $(STAMP)
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs
