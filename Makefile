# Two entry points that work on a fresh machine:
#   make demo   - create the venv, install torch 2.13.0 and torch_npu, train a small model on npu
#   make test   - the same set-up, then the test suite
# Also: make bench (performance table), make clean.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.h') setup.py pyproject.toml

.PHONY: demo test test-integration bench install clean

$(VENV)/.deps:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0 numpy pyyaml pytest expecttest ninja "setuptools>=61" wheel click libcst hypothesis torch-tb-profiler en_dtypes matplotlib
	touch $@

$(VENV)/.built: $(VENV)/.deps $(SOURCES)
	MAX_JOBS=2 $(PY) -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
	touch $@

install: $(VENV)/.built

demo: install
	$(PY) examples/demo.py

test: install
	$(PY) -m pytest tests -q -p no:cacheprovider

# Optional: the client libraries (transformers, accelerate, peft, diffusers,
# Lightning, DeepSpeed) on the virtual NPU. Installed with torch pinned, so
# they never replace torch 2.13.0. DeepSpeed's setup.py imports torch_npu (its
# accelerator probe), which exports the emulated CANN's $$ASCEND_HOME_PATH that
# its op builders then read; no op is prebuilt (DS_BUILD_OPS=0).
INTEG_ENV := DS_BUILD_OPS=0
test-integration: install
	echo 'torch==2.13.0' > $(VENV)/torch-pin.txt
	$(INTEG_ENV) $(PY) -m pip install -q --disable-pip-version-check -c $(VENV)/torch-pin.txt -r requirements-integration.txt
	$(INTEG_ENV) TORCH_NPU_INTEGRATION=1 timeout 1200 $(PY) -m pytest tests/integration -q -p no:cacheprovider

bench: install
	$(PY) bench/run.py

clean:
	rm -rf build *.egg-info torch_npu/_C*.so $(VENV)
