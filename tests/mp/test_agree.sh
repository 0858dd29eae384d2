#!/bin/bash
# loom_comm_agree (mp_agree.c): agreements on 2-6 ranks checked against
# the value every rank computes; on a revoked communicator; with
# different ops (LOOM_ERR_MISMATCH everywhere); with a rank killed at a
# random moment, the coordinator (rank 0) among them, where every
# survivor must get the same value for every agreement; with a stopped
# rank, which the others agree without and which, continued, must be
# refused (LOOM_ERR_REVOKED, and its communicator says so); and the
# retry pattern of loom_comm_agree(3), where the survivors must redo the
# same step.  Heartbeats every 100 ms keep the silent cases short.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_agree
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export LOOM_HEARTBEAT_MS=100 LOOM_TIMEOUT=20000
runs=6
[ "${LOOM_TEST_QUICK:-0}" = 1 ] && runs=3

job() { # job N MODE ITER [VICTIM]: rank outputs in $tmp/out
    rm -rf "$tmp/out"
    timeout 120 "$LOOMRUN" -n "$1" --keep-going --timeout 100 --output "$tmp/out" \
        "$prog" "$2" "$3" ${4:-} >/dev/null 2>&1
}
all_ok() { # all_ok N PREFIX: every rank's last line starts with PREFIX
    local r
    for r in $(seq 0 $(($1 - 1))); do
        tail -1 "$tmp/out/rank.$r.out" 2>/dev/null | grep -q "^$2" || return 1
    done
}

for n in 2 3 6; do
    job $n basic 300
    if all_ok $n "OK basic"; then
        ok "$n ranks: 300 agreements, min and max, every value right ($(cut -d' ' -f4 "$tmp/out/rank.0.out") per agreement)"
    else
        bad "$n ranks: agreements"; grep -h FAIL "$tmp"/out/rank.*.out | head -3
    fi
done

job 4 revoke 1
if all_ok 4 "OK revoke"; then ok "4 ranks agree on a revoked communicator, which stays revoked"
else bad "agreement on a revoked communicator"; cat "$tmp"/out/rank.*.out | head -4; fi

job 3 ops 1
if all_ok 3 "OK ops"; then ok "3 ranks, one passing another op: LOOM_ERR_MISMATCH on every rank ($(cut -d' ' -f6- "$tmp/out/rank.0.out" | cut -c1-60))"
else bad "different ops"; cat "$tmp"/out/rank.*.out | head -3; fi

# A rank killed at a random moment while 4 (5) ranks agree in a loop.
for victim in 0 2; do
    good=0 why=""
    for _ in $(seq "$runs"); do
        job 5 kill 400 "$victim"
        surv=""
        for r in 0 1 2 3 4; do [ "$r" != "$victim" ] && surv="$surv $r"; done
        bad_run=""
        for r in $surv; do
            grep -q '^OK kill' "$tmp/out/rank.$r.out" 2>/dev/null || bad_run="rank $r: $(grep -h FAIL "$tmp/out/rank.$r.out" | head -1)"
        done
        # Every agreement: one value among the survivors.
        split=$(cat $(for r in $surv; do echo "$tmp/out/rank.$r.out"; done) 2>/dev/null |
            awk '$1=="A" && $3==0 {v[$2]=v[$2] " " $4} END {for (i in v) {n=split(v[i],a," "); for (k=2;k<=n;k++) if (a[k]!=a[1]) {print i; break}}}' | head -3)
        [ -n "$split" ] && bad_run="$bad_run; agreements with different values: $split"
        if [ -z "$bad_run" ]; then good=$((good + 1)); else why=$bad_run; fi
    done
    if [ "$good" = "$runs" ]; then
        ok "5 ranks, rank $victim killed at a random moment: $runs of $runs runs, every survivor got the same value in every agreement"
    else
        bad "5 ranks, rank $victim killed: $good of $runs runs; last: $why"
    fi
done

job 4 stop 1 2
if all_ok 4 "OK"; then
    ok "4 ranks, rank 2 stopped: the others agree without it ($(grep -h '^OK stop' "$tmp/out/rank.0.out" | cut -d' ' -f3-6)); continued, it is refused"
else
    bad "a stopped rank"; cat "$tmp"/out/rank.*.out | grep -v '^OK' | head -4
fi

# A rank that forced an algorithm around a call that failed puts it back
# on the broken communicator; the shrink then measures the new group
# with every rank on the same path (it hung until LOOM_TIMEOUT before:
# loom_comm_set_algo refused a broken communicator, and the shrunk one
# inherited the forced algorithm on two ranks of three).
LOOM_TIMEOUT=8000 job 4 setalgo 1
if all_ok 3 "OK setalgo"; then ok "survivors that forced the shared allreduce reset it on the broken communicator; the shrink does not split them ($(grep -o 'in [0-9]* ms' "$tmp/out/rank.0.out"))"
else bad "setalgo"; cat "$tmp"/out/rank.[012].out | head -3; fi

# The retry pattern: a rank dies during a step; the survivors agree the
# step failed, shrink and redo it; all end with the same count of steps.
for victim in 0 3; do
    job 4 steps 40 "$victim"
    lines=$(for r in 0 1 2 3; do [ "$r" != "$victim" ] && tail -1 "$tmp/out/rank.$r.out"; done | sort -u)
    if [ "$(echo "$lines" | wc -l)" = 1 ] && grep -q '^OK steps done=40 redone=[1-3] size=3' <<<"$lines"; then
        ok "retry pattern, rank $victim killed: the survivors redid the same step ($lines)"
    else
        bad "retry pattern, rank $victim killed: $(echo $lines)"
    fi
done
finish
