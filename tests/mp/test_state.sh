#!/bin/bash
# Shared-state sync (mp_state.c): a newcomer and a diverged copy are
# repaired from the majority of the newest revision, hashes checked;
# size and count mismatches fail everywhere and change nothing; a larger
# state reaches a newcomer intact.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_state
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in 2 3 4; do
    out=$(timeout 120 "$LOOMRUN" -n "$n" --timeout 100 "$prog" check 2>"$tmp/err")
    if [ "$(echo "$out" | grep -c '^OK state sync')" = "$n" ]; then
        ok "state sync on $n ranks: newcomer and diverged copy repaired, mismatches refused"
    else
        bad "state sync on $n ranks: $out $(tail -3 "$tmp/err")"
    fi
done
mib=64
[ "${LOOM_TEST_QUICK:-0}" = 1 ] && mib=16
out=$(timeout 120 "$LOOMRUN" -n 4 --timeout 100 "$prog" big "$mib" 2>"$tmp/err")
line=$(echo "$out" | grep '^OK sync')
if [ -n "$line" ] && [ "$(echo "$out" | grep -c '^OK')" = 4 ]; then
    ok "$mib MiB to a newcomer from 3 donors, hash verified: ${line#OK }"
else
    bad "$mib MiB to a newcomer: $out $(tail -3 "$tmp/err")"
fi
finish
