#!/bin/bash
# loom_comm_create_group (mp_cgroup.c), 4 ranks, over shared memory and
# over TCP: only the listed ranks call it; disjoint groups at once, an
# overlapping one with a rank idle, the same list twice; collectives on
# the children exact; a member with another list, another tag or not in
# its own list named fast on every member; a member that never calls
# named at LOOM_TIMEOUT; a killed member fails its group and a create,
# the sibling goes on, the survivors shrink the parent; the mistakes.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_cgroup
. "$(dirname "$0")/lib_group.sh"

for tr in shm tcp; do
    export LOOM_TRANSPORT=$tr
    job 4 basic
    if all_ok "OK basic" 0 1 2 3; then
        ok "$tr: {1,0} and {2,3} at once, {0,2,3} with rank 1 idle, the whole list twice: ranks, order, allreduces exact ($(tail -1 "$tmp/out/rank.0.out" | cut -d' ' -f3-))"
    else bad "$tr: basic"; why; fi
    job 4 kill
    if all_ok "OK kill" 0 1 2; then
        ok "$tr: rank 3 killed: rank 2's group fails ($(tail -1 "$tmp/out/rank.2.out" | cut -d' ' -f3-4)), {0,1} goes on, a create with rank 3 fails naming it, the survivors shrink the parent"
    else bad "$tr: kill"; why; fi
done
unset LOOM_TRANSPORT

job 4 mismatch
if all_ok "OK mismatch" 0 1 2 3; then
    ok "another list, another tag: every member fails naming the culprit in $(tail -1 "$tmp/out/rank.0.out" | cut -d' ' -f3) (rank 0: $(tail -1 "$tmp/out/rank.0.out" | cut -d' ' -f5- | cut -c1-160)); then the right list works"
else bad "mismatch"; why; fi
job 4 notin
if all_ok "OK notin" 0 1 2 3; then
    ok "a member not in its own list: every member fails naming rank 1 ($(tail -1 "$tmp/out/rank.0.out" | cut -d' ' -f3))"
else bad "notin"; why; fi
LOOM_TIMEOUT=3000 job 4 absent
if all_ok "OK absent" 0 1; then
    ok "a member never calls: LOOM_ERR_TIMEOUT naming it ($(tail -1 "$tmp/out/rank.0.out" | cut -d' ' -f3-))"
else bad "absent"; why; fi
job 4 errors
if all_ok "OK errors" 0 1 2 3; then ok "the mistakes give their errors; then a create works"
else bad "errors"; why; fi
finish
