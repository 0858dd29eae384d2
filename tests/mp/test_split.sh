#!/bin/bash
# loom_comm_split (mp_split.c), 4 ranks, over shared memory and over TCP
# (LOOM_TRANSPORT): the children's ranks follow (colour, key, rank) and
# their collectives and sends give the right values, also while the
# parent and other children run at the same time; an aborted or revoked
# child breaks neither the parent nor its sibling; a killed rank makes
# the parent and its own child fail within LOOM_TIMEOUT while the other
# child goes on; a rank that never calls split is named within
# LOOM_TIMEOUT; the mistakes give their errors; children outlive a
# destroyed parent; a rank killed during splits leaves every survivor
# with an error, not a hang.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_split
. "$(dirname "$0")/lib_group.sh"

for tr in shm tcp; do
    export LOOM_TRANSPORT=$tr
    job 4 basic
    if all_ok "OK basic" 0 1 2 3; then
        ok "$tr: even/odd, pairs with reversed keys, NOCOLOR, a split of a split: ranks, allgather order, allreduce, sends right; parent and children at once, one thread and two ($(tail -1 "$tmp/out/rank.0.out" | cut -d' ' -f3))"
    else bad "$tr: basic"; why; fi
    # Groups of unequal sizes, one of a single rank.
    job 5 basic
    if all_ok "OK basic" 0 1 2 3 4; then ok "$tr: the same on 5 ranks"
    else bad "$tr: basic on 5 ranks"; why; fi

    for m in abort revoke; do
        job 4 $m
        if all_ok "OK $m" 0 1 2 3; then
            ok "$tr: rank 0 ${m}s its child: rank 2's next call fails $(grep -h '^E' "$tmp/out/rank.2.out" | cut -d' ' -f3- | cut -c1-60); parent and sibling go on"
        else bad "$tr: $m"; why; fi
    done

    for victim in 3 0; do
        job 4 kill $victim
        surv=""; for r in 0 1 2 3; do [ $r != $victim ] && surv="$surv $r"; done
        if all_ok "OK kill" $surv; then
            worst=$(for r in $surv; do tail -1 "$tmp/out/rank.$r.out"; done | grep -o '_ms=[0-9]*' | cut -d= -f2 | sort -n | tail -1)
            if [ "$worst" -le "$LOOM_TIMEOUT" ]; then
                ok "$tr: rank $victim killed: parent and its child fail on every survivor within ${worst} ms (LOOM_TIMEOUT $LOOM_TIMEOUT), the other child works"
            else bad "$tr: rank $victim killed: an error took $worst ms"; fi
        else bad "$tr: kill $victim"; why; fi
    done

    # A rank killed at a random moment while the ranks split over and
    # over: every survivor's split fails (none hangs, none keeps a child),
    # and no survivor is named as one that never called split.
    for victim in 0 3; do
        t0=$SECONDS
        job 4 killsplit $victim
        surv=""; for r in 0 1 2 3; do [ $r != $victim ] && surv="$surv $r"; done
        named=$(for r in $surv; do tail -1 "$tmp/out/rank.$r.out"; done | grep -o 'ranks\? [0-9, ]* never called' | grep -v "^ranks\? $victim never" | head -1)
        if all_ok "OK killsplit" $surv && [ -z "$named" ]; then
            ok "$tr: rank $victim killed during splits: every survivor's split fails, in $((SECONDS - t0)) s ($(tail -1 "$tmp/out/rank.$(echo $surv | cut -d' ' -f1).out" | cut -d' ' -f3-8 | tr -d ,))"
        else bad "$tr: killsplit $victim ${named:+(blamed: $named)}"; why; fi
    done
done
unset LOOM_TRANSPORT

# Sealed connections (LOOM_ENCRYPT): the children's are sealed too.
LOOM_TRANSPORT=tcp LOOM_ENCRYPT=1 job 4 basic
if all_ok "OK basic" 0 1 2 3; then ok "tcp, LOOM_ENCRYPT=1: the basic splits and traffic"
else bad "LOOM_ENCRYPT=1: basic"; why; fi

# Two hosts of two ranks (LOOM_HOSTNAME): every child spans both hosts
# or lies in one, and the parent's picture of the hosts carries over.
w=$(fake_hosts)
rm -rf "$tmp/out"
LOOM_RANKS_PER_HOST=2 timeout 120 "$LOOMRUN" -n 4 --keep-going --timeout 100 --output "$tmp/out" \
    "$w" "$prog" basic >/dev/null 2>&1
rm -f "$w"
if all_ok "OK basic" 0 1 2 3; then ok "two hosts of two ranks: the basic splits and traffic"
else bad "two hosts: basic"; why; fi

for tr in shm tcp; do
    LOOM_TRANSPORT=$tr LOOM_TIMEOUT=3000 job 4 absent 3000
    if all_ok "OK absent" 0 1 2 3; then
        ok "$tr: rank 3 never calls split: the others fail in $(grep -ho 'ms=[0-9]*' "$tmp"/out/rank.[012].out | cut -d= -f2 | sort -n | tail -1) ms (LOOM_TIMEOUT 3000), naming it ($(grep -ho 'code=.*' "$tmp/out/rank.0.out" | cut -c1-110))"
    else bad "$tr: absent"; why; fi
done

for tr in shm tcp; do
    LOOM_TRANSPORT=$tr job 4 othercall
    if all_ok "OK othercall" 0 1 2 3 && grep -q "rank 3 called loom_allreduce" "$tmp/out/rank.0.out"; then
        ok "$tr: rank 3 calls loom_allreduce where the others split: LOOM_ERR_MISMATCH everywhere within $(grep -ho 'ms=[0-9]*' "$tmp"/out/rank.*.out | cut -d= -f2 | sort -n | tail -1) ms, naming it"
    else bad "$tr: othercall"; why; grep -h OK "$tmp"/out/rank.0.out; fi
done

for tr in shm tcp; do
    LOOM_TRANSPORT=$tr job 4 late
    if all_ok "OK late" 0 1 2 3; then ok "$tr: a message sent just before its sender destroyed the child is received after the goodbye"
    else bad "$tr: late"; why; fi
done

job 2 errors
if all_ok "OK errors" 0 1; then ok "mistakes: NULL newcomm, colour -2, NULL and stale comm, bad cfg, inside a group"
else bad "errors"; why; fi

job 4 destroy
if all_ok "OK destroy" 0 1 2 3; then ok "the parent destroyed, both children go on"
else bad "destroy"; why; fi
finish
