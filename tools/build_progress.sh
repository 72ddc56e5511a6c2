#!/usr/bin/env bash
# Build and install torch_npu editable into a venv, showing the C++ build file by file:
#   tools/build_progress.sh PYTHON LOG
# pip -v streams the build backend's output, which goes whole into LOG; of it, only
# ninja's "[n/N]" line per compiled file (indented by pip) is shown (as "[n/N] csrc/x.cpp"). Exit status: pip's.
set -u
py=$1
log=$2
root=$(pwd)
MAX_JOBS=${MAX_JOBS:-2} "$py" -m pip install -v --disable-pip-version-check --no-build-isolation --no-deps -e . 2>&1 \
    | tee "$log" | sed -unE "s#^ *(\[[0-9]+/[0-9]+\]) .* -c ([^ ]+).*#    \1 \2#p" | sed -u "s#${root}/##"
exit "${PIPESTATUS[0]}"
