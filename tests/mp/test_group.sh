#!/bin/bash
# Fused groups (comm/group.c): mp_group.c's groups of mixed allreduces,
# reduce-scatters and allgathers (five datatypes, three ops, in place and
# out of place, 1 element to 1 MiB, packed and as views of one buffer,
# with a compressed allreduce, a broadcast and a send/receive ring in the
# same group) on 4 ranks over shared memory and over TCP, and on 3 and 1;
# then groups that differ between ranks (a count, one call more, a
# datatype): every rank must fail with LOOM_ERR_MISMATCH, none hang,
# also where rank 0 comes late to the group.
# perf/group_perf's own check (-c 1) is in tests/perf/test_perf.sh.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_group

run() { # run DESCRIPTION NRANKS ARGS... (environment before the call)
    local what=$1 n=$2
    shift 2
    out=$(timeout 300 "$LOOMRUN" -n "$n" --timeout 280 "$prog" "$@" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then ok "$what: $(grep 'rank 0 of' <<<"$out" | head -1)"
    else bad "$what: exit $rc"; tail -20 <<<"$out"; fi
}

LOOM_TRANSPORT=shm run "fused groups, 4 ranks, shm" 4
LOOM_TRANSPORT=tcp run "fused groups, 4 ranks, tcp" 4
run "fused groups, 3 ranks" 3
run "fused groups, 1 rank" 1
for m in count extra dtype; do
    LOOM_TIMEOUT=60000 run "groups that differ ($m), 4 ranks" 4 "$m"
    if [ $rc -eq 0 ]; then
        check "groups that differ ($m): the error names the fused calls" \
            grep -q "fused" <<<"$out"
    fi
done
LOOM_TRANSPORT=tcp LOOM_TIMEOUT=60000 run "groups that differ (count), 4 ranks, tcp" 4 count
# Rank 0 comes 200 ms late, after the others found the mismatch and
# revoked the communicator: into its group, then to its loom_group_end.
LOOM_TRANSPORT=tcp LOOM_TIMEOUT=60000 run "groups that differ (count), rank 0 late, tcp" 4 \
    count late
LOOM_TRANSPORT=tcp LOOM_TIMEOUT=60000 run "groups that differ (count), rank 0 late to the end, tcp" \
    4 count lateend

finish
