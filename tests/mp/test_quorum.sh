#!/bin/bash
# The quorum allreduce (loom_allreduce_quorum) across real processes,
# over shared memory and over TCP (see mp_quorum.c for what each run
# checks): refused arguments; quorum n against loom_allreduce for every
# dtype x op; a rank slowed by 100 ms left out, told so, and rejoining
# the next call; late contributions dropped by rule; mismatched calls;
# a rank that never makes the call fails the others at LOOM_TIMEOUT;
# idling past LOOM_TIMEOUT with a late contribution pending is no failure.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_quorum
[ -x "$prog" ] || { echo "missing $prog"; exit 99; }

for tr in shm tcp; do
    for n in 3 4; do
        t0=$SECONDS
        out=$(LOOM_TRANSPORT=$tr LOOM_TIMEOUT=20000 timeout 120 "$LOOMRUN" -n $n --timeout 100 \
            "$prog" all 2>&1)
        rc=$?
        if [ $rc -eq 0 ] && grep -q '^late contributions: 5 dropped' <<<"$out"; then
            ok "quorum allreduce, $n ranks over $tr, $((SECONDS - t0)) s: $(grep -cE '^slow rank' <<<"$out") slow-rank calls, $(grep -E '^every dtype' <<<"$out")"
        else
            bad "quorum allreduce, $n ranks over $tr: exit $rc"
            echo "$out" | tail -30
        fi
        [ -n "${LOOM_TEST_VERBOSE:-}" ] && echo "$out"
    done
done

# A rank that never makes the call: every other rank fails at the
# deadline (LOOM_TIMEOUT 2 s), none hangs, and destroy returns everywhere.
for tr in shm tcp; do
    t0=$SECONDS
    out=$(LOOM_TRANSPORT=$tr LOOM_TIMEOUT=2000 timeout 60 "$LOOMRUN" -n 4 --timeout 50 \
        "$prog" absent 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && [ "$(grep -c '^absent rank: rank [0-2] failed' <<<"$out")" = 3 ]; then
        ok "absent rank over $tr, $((SECONDS - t0)) s: $(grep '^absent rank: rank 0' <<<"$out")"
    else
        bad "absent rank over $tr: exit $rc"
        echo "$out" | tail -30
    fi
done

for tr in shm tcp; do
    out=$(LOOM_TRANSPORT=$tr LOOM_TIMEOUT=1000 timeout 60 "$LOOMRUN" -n 4 --timeout 50 \
        "$prog" idle 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && grep -q '^idle past LOOM_TIMEOUT' <<<"$out"; then
        ok "idle past LOOM_TIMEOUT with a late contribution pending, over $tr"
    else
        bad "idle past LOOM_TIMEOUT over $tr: exit $rc"
        echo "$out" | tail -30
    fi
done
finish
