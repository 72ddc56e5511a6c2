#!/usr/bin/env bash
# What the TensorBoard browser test (tests/integration/test_tensorboard_browser.py) needs
# beyond the venv:
#   - Debian's chromium (headless), installed with apt-get when missing;
#   - the Web Components v0 polyfill that torch-tb-profiler's trace view loads from a CDN
#     (webcomponents.js 0.7.24, from the npm registry), kept at
#     VENV/share/webcomponentsjs-0.7.24/webcomponents.min.js for the test to serve offline.
# Usage: tools/ensure_chromium.sh VENV
# When something cannot be installed it says why; under CI=true that is an error (exit 1),
# elsewhere the test skips with the same reason.
set -uo pipefail
venv=${1:?usage: tools/ensure_chromium.sh VENV}
status=0

cannot() {
    echo "ensure_chromium: $*" >&2
    if [ "${CI:-}" = "true" ]; then status=1; fi
}

if command -v chromium >/dev/null 2>&1; then
    echo "ensure_chromium: $(chromium --version 2>/dev/null | head -1) at $(command -v chromium)"
elif ! command -v apt-get >/dev/null 2>&1; then
    cannot "chromium is not installed and apt-get is not available: install Debian's (or your distribution's) chromium package"
elif [ "$(id -u)" != 0 ]; then
    cannot "chromium is not installed and apt-get needs root: run 'sudo apt-get install -y --no-install-recommends chromium'"
else
    echo "ensure_chromium: installing Debian's chromium (apt-get)"
    if ! { timeout 600 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 1200 \
            apt-get install -y -qq --no-install-recommends chromium >/dev/null; }; then
        cannot "apt-get could not install chromium (see the apt-get output above)"
    fi
fi

dest="$venv/share/webcomponentsjs-0.7.24/webcomponents.min.js"
sha=3858273ab39b299e7c2227f0830534afafaabf4a572c9ea73c2076fecbd8978c
if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status; then
    echo "ensure_chromium: trace-view polyfill at $dest"
elif ! command -v npm >/dev/null 2>&1; then
    cannot "npm is not installed: it fetches the trace view's polyfill (webcomponents.js 0.7.24); install npm"
else
    tmp=$(mktemp -d)
    if (cd "$tmp" && timeout 300 npm pack --silent webcomponents.js@0.7.24 >/dev/null \
            && tar xzf webcomponents.js-0.7.24.tgz package/webcomponents.min.js) \
        && echo "$sha  $tmp/package/webcomponents.min.js" | sha256sum -c --status; then
        mkdir -p "$(dirname "$dest")" && cp "$tmp/package/webcomponents.min.js" "$dest"
        echo "ensure_chromium: trace-view polyfill installed at $dest"
    else
        cannot "could not fetch webcomponents.js 0.7.24 with npm (or its checksum differs)"
    fi
    rm -rf "$tmp"
fi
exit $status
