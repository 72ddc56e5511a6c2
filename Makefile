# Two entry points that work on a fresh machine:
#   make demo   - create the venv, install torch 2.13.0 and torch_npu, train a small model on npu
#   make test   - the same set-up, then the test suite
# Also: make bench (performance table), make test-wheel (the built wheel in a clean venv), make clean.
# Each set-up step prints what it does and how long it took (tools/make_step.sh); a failed or
# interrupted set-up is resumed by running the same command again.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SOURCES := $(shell find csrc -name '*.cpp' -o -name '*.h') setup.py pyproject.toml
STEP := tools/make_step.sh

.PHONY: demo test test-integration test-wheel bench install clean

# The markers .deps / .built are written only after their step succeeded. A venv left
# half-made by an interrupted run (no working python or pip) is removed and made again.
$(VENV)/.deps:
	@if [ -d $(VENV) ] && ! ( $(PY) -c "" && $(PY) -m pip --version ) >/dev/null 2>&1; then \
		echo "==> $(VENV) is incomplete (an interrupted set-up?): removing it to start over"; rm -rf $(VENV); fi
	@$(STEP) "create the virtual environment $(VENV)" -- $(PYTHON) -m venv $(VENV)
	@$(STEP) "install torch 2.13.0 and the build/test packages into $(VENV) (pip, one line per package)" -- \
	$(PY) -m pip install --progress-bar off --disable-pip-version-check torch==2.13.0 numpy pyyaml pytest expecttest ninja "setuptools>=61" wheel click hypothesis torch-tb-profiler en_dtypes matplotlib
	@touch $@

$(VENV)/.built: $(VENV)/.deps $(SOURCES)
	@$(STEP) --log $(VENV)/build.log "build torch_npu (C++ core, one line per file; about 3 min on 2 idle cores) and install it editable" -- \
		tools/build_progress.sh $(PY) $(VENV)/build.log
	@touch $@

install: $(VENV)/.built

demo: install
	$(PY) examples/demo.py

test: install
	$(PY) -m pytest tests -q -p no:cacheprovider

# Optional: the client libraries (transformers, accelerate, peft, diffusers,
# Lightning, DeepSpeed) on the virtual NPU. Installed with torch pinned, so
# they never replace torch 2.13.0. DeepSpeed's setup.py imports torch_npu (its
# accelerator probe), which exports the emulated CANN's $$ASCEND_HOME_PATH that
# its op builders then read; no op is prebuilt (DS_BUILD_OPS=0). The TensorBoard
# browser test needs headless Chromium: tools/ensure_chromium.sh installs it when missing.
INTEG_ENV := DS_BUILD_OPS=0
test-integration: install
	tools/ensure_chromium.sh $(VENV)
	echo 'torch==2.13.0' > $(VENV)/torch-pin.txt
	$(INTEG_ENV) $(PY) -m pip install -q --disable-pip-version-check -c $(VENV)/torch-pin.txt -r requirements-integration.txt
	$(INTEG_ENV) TORCH_NPU_INTEGRATION=1 timeout 2400 $(PY) -m pytest tests/integration -q -p no:cacheprovider

# The wheel that `pip install .` builds, installed with its dependencies into a clean venv
# (no dev packages), then its commands: tools/wheel_smoke.sh.
test-wheel: install
	@$(STEP) "wheel smoke test: build the wheel, install it into a clean venv, run its commands" -- \
		tools/wheel_smoke.sh $(PY)

bench: install
	$(PY) bench/run.py
	$(PY) bench/client_workloads.py
	$(PY) bench/migrate_bench.py

clean:
	rm -rf build *.egg-info torch_npu/_C*.so $(VENV)
