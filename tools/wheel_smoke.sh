#!/usr/bin/env bash
# The wheel a user gets from `pip install .`, checked the way a user meets it:
#   tools/wheel_smoke.sh BUILD_PYTHON [BASE_PYTHON]
# 1. builds the wheel with BUILD_PYTHON (the dev venv: torch and the build tools are there);
# 2. makes a clean venv from BASE_PYTHON (default python3) with only torch==2.13.0, then
#    installs the wheel with its declared dependencies, torch kept pinned (-c pin.txt);
# 3. runs, outside the source tree: torch-npu --help, torch-npu doctor, torch-npu migrate
#    (no extra needed: it parses with the standard library), torch_npu_run --help and the
#    README's quick check.
# Every step prints its time; the first failure stops the script with its output shown.
# WHEEL_SMOKE_KEEP=1 keeps the scratch directory.
set -euo pipefail
build_py=$1
base_py=${2:-python3}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/torch_npu_wheel.XXXXXX")
if [ "${WHEEL_SMOKE_KEEP:-0}" != 1 ]; then trap 'rm -rf "$work"' EXIT; fi
t0=$SECONDS

step() { echo "--> $1 ($((SECONDS - t0)) s)"; }

step "build the wheel (C++ core included; ccache used when present)"
if [ -d /usr/lib/ccache ]; then export PATH="/usr/lib/ccache:$PATH"; fi  # its c++ runs through ccache
(cd "$repo" && MAX_JOBS=${MAX_JOBS:-2} TORCH_DEVICE_BACKEND_AUTOLOAD=0 "$build_py" -m pip wheel -q \
    --disable-pip-version-check --no-build-isolation --no-deps -w "$work/dist" . ) > "$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log"; echo "wheel build failed (log above)" >&2; exit 1; }
wheel=$(ls "$work"/dist/torch_npu-*.whl)
echo "    $(basename "$wheel")"

step "clean venv: torch==2.13.0 only, then the wheel with its dependencies (torch pinned)"
"$base_py" -m venv "$work/venv"
vpy="$work/venv/bin/python"
echo "torch==2.13.0" > "$work/pin.txt"
"$vpy" -m pip install -q --disable-pip-version-check torch==2.13.0
"$vpy" -m pip install -q --disable-pip-version-check "$wheel" -c "$work/pin.txt"
"$vpy" -m pip check
export PATH="$work/venv/bin:$PATH"
cd "$work"  # never the source tree: the installed package must stand alone
unset PYTHONPATH

step "torch-npu --help"
torch-npu --help > out.txt || { cat out.txt; exit 1; }
grep -q "migrate" out.txt

step "torch-npu doctor"
torch-npu doctor > out.txt || { cat out.txt; exit 1; }
grep -q "torch 2.13.0" out.txt

cat > sample.py <<'PY'
import torch
model = torch.nn.Linear(2, 2).cuda()
PY
step "torch-npu migrate sample.py (no extra installed)"
rc=0; torch-npu migrate sample.py > out.txt 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "cuda-call" out.txt || { cat out.txt; echo "migrate: exit $rc" >&2; exit 1; }

step "torch_npu_run --help"
torch_npu_run --help > out.txt || { cat out.txt; exit 1; }
grep -q "nproc-per-node" out.txt

step "README quick check"
sed -n '/^## Quick check/,/^## /p' "$repo/README.md" | sed -n '/^```python/,/^```/p' | sed '1d;$d' > quick_check.py
[ -s quick_check.py ] || { echo "no quick check found in README.md" >&2; exit 1; }
"$vpy" quick_check.py > out.txt 2>&1 || { cat out.txt; exit 1; }
grep -q "device='npu:0'" out.txt || { cat out.txt; exit 1; }

echo "wheel smoke test passed in $((SECONDS - t0)) s"
