#!/usr/bin/env bash
# One step of the Makefile's set-up, shown as it runs:
#   tools/make_step.sh [--log FILE] TITLE -- COMMAND [ARGS...]
# prints "==> TITLE", runs COMMAND, then "done in N s"; on failure it names the step,
# shows the end of FILE (the step's full log, when it has one) and says how to retry.
# Exit status: COMMAND's.
set -uo pipefail
log=""
if [ "${1:-}" = "--log" ]; then log=$2; shift 2; fi
title=$1; shift
if [ "${1:-}" = "--" ]; then shift; fi
echo "==> $title"
start=$SECONDS
"$@"
rc=$?
took=$((SECONDS - start))
if [ $rc -eq 0 ]; then
    echo "    done in ${took} s"
    exit 0
fi
{
    echo
    echo "!! FAILED after ${took} s (exit status $rc): $title"
    if [ -n "$log" ] && [ -s "$log" ]; then
        echo "   last lines of $log (the full log):"
        tail -n 25 "$log" | sed 's/^/   | /'
    fi
    echo "   Fix the cause above, then run the same make command again: finished steps are kept,"
    echo "   an interrupted virtual environment is repaired, no 'make clean' is needed."
} >&2
exit $rc
