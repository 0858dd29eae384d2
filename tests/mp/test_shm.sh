#!/bin/bash
# The shared-memory transport on 2, 3 and 4 forked processes (see mp_shm.c
# for what each run checks: exchanges at many sizes with and without
# single copy, the no-CMA fallback, early messages, cancel, the shared
# arena, length mismatch, a killed peer, nothing left in /dev/shm).
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_shm
if [ ! -d /dev/shm ] || [ ! -w /dev/shm ]; then
    echo "SKIP: /dev/shm is not writable here"
    exit 77
fi
for n in 2 3 4; do
    out=$(timeout 300 "$prog" "$n" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then ok "shm transport on $n ranks: $(echo "$out" | grep 'mp_shm on')"
    else bad "shm transport on $n ranks: exit $rc"; echo "$out" | tail -30; fi
    # The figures the benchmarks compare against (noisy on small machines).
    echo "$out" | grep '^timing' | sed 's/^/     /'
done
finish
