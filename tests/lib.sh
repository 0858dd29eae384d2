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
# fake_hosts: print the path of a wrapper (the caller removes it) that runs its
# command with LOOM_HOSTNAME=fakehost<LOOM_RANK / LOOM_RANKS_PER_HOST>, so
# that loomrun's ranks form hosts of LOOM_RANKS_PER_HOST on this machine;
# with FAKE_HOSTS_DEALT=H instead fakehost<LOOM_RANK % H>: ranks dealt
# round the H hosts, so no host holds consecutive ranks.
fake_hosts() {
    local w
    w=$(mktemp)
    cat >"$w" <<'W'
#!/bin/sh
if [ -n "${FAKE_HOSTS_DEALT:-}" ]; then
    export LOOM_HOSTNAME=fakehost$((LOOM_RANK % FAKE_HOSTS_DEALT))
else
    export LOOM_HOSTNAME=fakehost$((LOOM_RANK / LOOM_RANKS_PER_HOST))
fi
exec "$@"
W
    chmod +x "$w"
    echo "$w"
}
