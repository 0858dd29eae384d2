#!/bin/sh
# make check: every seed of tests/fuzz/corpus and every crash ever found
# (tests/fuzz/crashes) through its harness, built with the normal
# compiler (no clang needed): what once crashed stays fixed.
set -u
: "${SRCDIR:=$(cd "$(dirname "$0")/../.." && pwd)}"
: "${BUILDDIR:=.}"
status=0 any=0
for bin in "$BUILDDIR"/tests/fuzz/fuzz_*_replay; do
    [ -x "$bin" ] || continue
    h=$(basename "$bin" _replay)
    h=${h#fuzz_}
    out=$("$bin" "$SRCDIR/tests/fuzz/corpus/$h" "$SRCDIR/tests/fuzz/crashes/$h" 2>&1)
    rc=$?
    echo "$out" | tail -1
    if [ $rc -ne 0 ]; then
        echo "FAIL: fuzz_$h replay (exit $rc)"; echo "$out" | tail -30; status=1
    fi
    any=1
done
[ $any = 1 ] || { echo "no replay programs built"; exit 77; }
exit $status
