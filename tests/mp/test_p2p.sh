#!/bin/bash
# Point-to-point, groups and barrier across 1, 2, 3, 4 and 7 real
# processes (see mp_p2p.c for what each run checks), and the TCP
# transport's cancel (mp_tcp.c).
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_p2p
for n in 1 2 3 4 7; do
    out=$(timeout 300 "$LOOMRUN" -n "$n" --timeout 280 "$prog" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then ok "p2p/group/barrier on $n ranks: $(echo "$out" | grep 'rank 0 of')"
    else bad "p2p/group/barrier on $n ranks: exit $rc"; echo "$out" | tail -20; fi
done
# Over TCP: the group across two communicators needs both driven (on
# one host shared memory can finish the sends without it).
out=$(LOOM_TRANSPORT=tcp timeout 300 "$LOOMRUN" -n 2 --timeout 280 "$prog" 2>&1)
check "p2p/group/barrier on 2 ranks over TCP" [ $? -eq 0 ]
[ $? -eq 0 ] || echo "$out" | tail -20
# One stream per peer: ordering must not depend on striping.
out=$(LOOM_TCP_STREAMS=1 timeout 300 "$LOOMRUN" -n 3 --timeout 280 "$prog" 2>&1)
check "p2p/group/barrier on 3 ranks, 1 stream" [ $? -eq 0 ]
[ $? -eq 0 ] || echo "$out" | tail -20
# The TCP transport itself: a send cancelled half on the wire still
# sends its own bytes, not what its buffer holds after cancel (mp_tcp.c).
out=$(timeout 180 "$BUILDDIR/tests/mp/mp_tcp" 2>&1); rc=$?
if [ $rc -eq 0 ]; then ok "$out"; else bad "tcp cancel half on the wire: exit $rc"; echo "$out" | tail -20; fi
finish
