# tests/lib.sh - shared by the test scripts: counters, bounded runs, the
# closing "N passed, N failed" line.
pass=0 fail=0
ok()   { pass=$((pass + 1)); echo "ok   - $*"; }
bad()  { fail=$((fail + 1)); echo "FAIL - $*"; }
check() { # check "description" command...: passes when the command exits 0
    local d=$1; shift
    if "$@"; then ok "$d"; else bad "$d"; fi
}
finish() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
}
: "${BUILDDIR:=$(cd "$(dirname "$0")/../.." && pwd)}"
: "${SRCDIR:=$BUILDDIR}"
: "${LOOMRUN:=$BUILDDIR/loomrun}"
# libtool wrappers live in the build tree; run them directly.
export LOOM_DEBUG=${LOOM_DEBUG:-none}
