#!/bin/bash
# Gossip averaging (loom_gossip_average) across real processes, over
# shared memory and over TCP (see mp_gossip.c for what each run checks):
# the spread across ranks after each seeded round (exact average after
# log2 n rounds of the hypercube on 4 and 8 ranks; the variance shrinking
# by the random matching's factor on 5 and 6), explicit partners, the
# mistakes users make, and partners that disagree.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_gossip
[ -x "$prog" ] || { echo "missing $prog"; exit 99; }

run() { # run LABEL TRANSPORT N ARGS...
    local label=$1 tr=$2 n=$3
    shift 3
    local out rc
    out=$(LOOM_TRANSPORT=$tr LOOM_TIMEOUT=20000 timeout 120 "$LOOMRUN" -n "$n" --timeout 100 \
        "$prog" "$@" 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then
        ok "$label, $n ranks over $tr: $(grep -E '^(mean|explicit|hypercube)' <<<"$out" | tr '\n' ' ')"
    else
        bad "$label, $n ranks over $tr: exit $rc"
        echo "$out" | tail -30
    fi
    [ -n "${LOOM_TEST_VERBOSE:-}" ] && echo "$out"
    return 0
}

for tr in shm tcp; do
    run "hypercube: exact after log2 n rounds" $tr 4 converge 6 float32
    run "hypercube: exact after log2 n rounds" $tr 8 converge 6 float64
    run "random matching: variance / 2 per round" $tr 5 converge 100 float64
    run "explicit partners and refused arguments" $tr 4 explicit
    run "explicit partners and refused arguments" $tr 5 explicit
done
run "random matching: variance x (n-2)/(2(n-1)) per round" shm 6 converge 100 float64

# Partners that disagree: rank 0 names 1, rank 1 names 2 (who names 1):
# rank 0 fails well within LOOM_TIMEOUT (20 s), its buffer restored
# (mp_gossip.c checks it), and rank 0 or 1 names both pairs; no rank hangs.
for tr in shm tcp; do
    t0=$SECONDS
    out=$(LOOM_TRANSPORT=$tr LOOM_TIMEOUT=20000 timeout 120 "$LOOMRUN" -n 4 --timeout 100 \
        "$prog" disagree 2>&1)
    rc=$?
    line=$(grep -E '^rank [01] .*ranks 0 and 1 paired.*ranks 1 and 2 paired' <<<"$out" | head -1)
    if [ $rc -eq 0 ] && [ $((SECONDS - t0)) -lt 20 ] && [ -n "$line" ]; then
        ok "disagreeing partners over $tr, $((SECONDS - t0)) s: $line"
    else
        bad "disagreeing partners over $tr: exit $rc after $((SECONDS - t0)) s"
        echo "$out" | tail -30
    fi
done
finish
