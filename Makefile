# Two entry points that work on a fresh machine:
#   make demo   - create the venv, install torch 2.13.0 and torch_npu, train a small model on npu
#   make test   - the same set-up, then the test suite
# Also: make bench (performance table), make clean.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.h') setup.py pyproject.toml

.PHONY: demo test bench install clean

$(VENV)/.deps:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0 numpy pyyaml pytest expecttest ninja "setuptools>=61" wheel click libcst hypothesis torch-tb-profiler
	touch $@

$(VENV)/.built: $(VENV)/.deps $(SOURCES)
	MAX_JOBS=2 $(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	touch $@

install: $(VENV)/.built

demo: install
	$(PY) examples/demo.py

test: install
	$(PY) -m pytest tests -q -p no:cacheprovider

bench: install
	$(PY) bench/run.py

clean:
	rm -rf build *.egg-info torch_npu/_C*.so $(VENV)
