#!/bin/bash
# The layers of LAYERS hold: no file of the library uses (a symbol, an
# #include) what a layer above it defines, beyond the uses LAYERS still
# lists as known.  The checker itself is tried first on a small tree
# that breaks the rule, so that a checker that sees nothing cannot pass.
. "$(dirname "$0")/../lib.sh"
py=/usr/bin/python3
[ -x "$py" ] || py=$(command -v python3)
if [ -z "$py" ] || ! command -v nm >/dev/null; then
    echo "test_layers.sh: needs python3 and nm; skipped"
    exit 77
fi
checker=$SRCDIR/tests/tools/layers.py
T=$(mktemp -d "${TMPDIR:-/tmp}/layers-test.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT

# ------------------------------------------------ the checker, on a toy
mkdir -p "$T/s/low" "$T/s/high" "$T/b/low" "$T/b/high"
printf 'low: low\nhigh: high\n' >"$T/s/LAYERS"
printf 'int high_fn(void);\n' >"$T/s/high/h.h"
printf '#include "high/h.h"\nint high_fn(void) { return 1; }\n' >"$T/s/high/h.c"
printf 'int low_fn(void) { return 2; }\n' >"$T/s/low/ok.c"
printf '#include "../high/h.h"\nint low_bad(void) { return high_fn(); }\n' >"$T/s/low/bad.c"
for f in high/h low/ok low/bad; do
    ${CC:-cc} -I"$T/s" -c "$T/s/$f.c" -o "$T/b/$f.o" || { bad "compile the toy tree"; finish; exit; }
done
out=$("$py" "$checker" --src "$T/s" --build "$T/b" 2>&1); rc=$?
check "toy: an upward use fails the check (exit $rc)" [ $rc -eq 1 ]
check "toy: the symbol, with both files" grep -q '^UP .*low/bad.c -> high/h.c .*high_fn' <<<"$out"
check "toy: the #include, with both files" grep -q '^UP .*low/bad.c -> high/h.h .*#include' <<<"$out"
check "toy: a file that keeps to its layer is not named" bash -c '! grep -q "low/ok.c" <<<"$1"' _ "$out"
printf 'known low/bad.c -> high/h.c\nknown low/bad.c -> high/h.h\n' >>"$T/s/LAYERS"
"$py" "$checker" --src "$T/s" --build "$T/b" >"$T/out" 2>&1; rc=$?
check "toy: uses listed as known pass (exit $rc)" [ $rc -eq 0 ]
printf 'known low/ok.c -> high/h.c\n' >>"$T/s/LAYERS"
"$py" "$checker" --src "$T/s" --build "$T/b" >"$T/out" 2>&1; rc=$?
check "toy: a known use that is gone fails (exit $rc)" \
    bash -c '[ $1 -eq 1 ] && grep -q "^GONE .*low/ok.c" "$2"' _ $rc "$T/out"
printf 'low low\n' >"$T/s/LAYERS"
"$py" "$checker" --src "$T/s" --build "$T/b" >"$T/out" 2>&1; rc=$?
check "toy: a malformed LAYERS is a usage error naming the line (exit $rc)" \
    bash -c '[ $1 -eq 2 ] && grep -q "LAYERS:1:" "$2"' _ $rc "$T/out"

# ------------------------------------------------------- the library
out=$("$py" "$checker" --src "$SRCDIR" --build "$BUILDDIR" 2>&1); rc=$?
echo "$out" | sed 's/^/     /'
check "the library keeps to LAYERS (exit $rc)" [ $rc -eq 0 ]
check "every layer has files" bash -c '! "$1" "$2" --src "$3" --build "$4" --list | grep -q "(0 files)"' \
    _ "$py" "$checker" "$SRCDIR" "$BUILDDIR"
finish
