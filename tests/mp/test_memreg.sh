#!/bin/bash
# loom_mem_register / loom_mem_deregister across real processes (see
# mp_memreg.c): fresh mappings at old addresses, registered and not, in
# and out of place, checked element by element.  Here over shared memory
# and TCP (where registration is bookkeeping); over RDMA verbs, where a
# stale registration would corrupt data, in the VM suite (test_verbs.sh).
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_memreg
for t in "" tcp; do
    for n in 2 3; do
        out=$(LOOM_TRANSPORT=$t timeout 300 "$LOOMRUN" -n "$n" --timeout 280 "$prog" 4 2>&1)
        rc=$?
        if [ $rc -eq 0 ]; then ok "memreg on $n ranks${t:+ over $t}: $(echo "$out" | grep 'rank 0 of')"
        else bad "memreg on $n ranks${t:+ over $t}: exit $rc"; echo "$out" | tail -10; fi
    done
done
finish
