#!/bin/bash
# Sparse collectives (loom_sparse_allgather, loom_sparse_reduce_scatter)
# across real processes (see mp_sparse.c for what each run checks): the
# result equals the dense collective's on 1-5 ranks for every dtype and
# op, with empty inputs, colliding and duplicate indices, unsorted input
# and densities on both sides of the switch to dense (the info log must
# show both exchanges taken); a bad index refused on every rank naming
# the culprit; mismatched dense_count, dtype or call; a rank's bad
# argument; perf/sparse_perf's bytes at 1% density.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_sparse
[ -x "$prog" ] || { echo "missing $prog"; exit 99; }

run() { # run LABEL TRANSPORT N MODE [GREP...]
    local label=$1 tr=$2 n=$3 mode=$4
    shift 4
    local out rc t0=$SECONDS
    out=$(LOOM_DEBUG=info LOOM_TRANSPORT=$tr LOOM_TIMEOUT=20000 timeout 120 "$LOOMRUN" -n "$n" \
        --timeout 100 "$prog" "$mode" 2>&1)
    rc=$?
    local miss=
    for pat in "$@"; do grep -qE -- "$pat" <<<"$out" || miss="$miss [$pat]"; done
    if [ $rc -eq 0 ] && [ -z "$miss" ]; then
        ok "$label, $n ranks over $tr, $((SECONDS - t0)) s: $(grep -E '^(cases|refused|mismatch|badarg 0)' <<<"$out" | tr '\n' ' ')"
    else
        bad "$label, $n ranks over $tr: exit $rc, missing:$miss"
        grep -vE 'INFO|info' <<<"$out" | tail -30
    fi
    [ -n "${LOOM_TEST_VERBOSE:-}" ] && echo "$out"
    return 0
}

for n in 1 2 3 4 5; do
    run "equals the dense collective" shm $n correct 'sparse exchange' 'dense exchange'
done
run "equals the dense collective" tcp 3 correct 'sparse exchange' 'dense exchange'
for n in 1 3 4; do
    run "bad index refused on every rank" shm $n badindex "is out of range"
done
run "bad index refused on every rank" tcp 2 badindex "is out of range"
for n in 2 5; do
    run "mismatched dense_count, dtype, call" shm $n mismatch "ranks disagree on dense_count" \
        "ranks disagree on dtype" "ranks disagree on the call"
    run "a rank's bad argument" shm $n badarg "refused its arguments"
done

# perf/sparse_perf runs, over TCP so that the telemetry counts the bytes:
# at 1% density the sparse calls must receive fewer bytes than the dense.
perf=$BUILDDIR/perf/sparse_perf
if [ -x "$perf" ]; then
    out=$(LOOM_TRANSPORT=tcp LOOM_TIMEOUT=20000 timeout 120 "$LOOMRUN" -n 3 --timeout 100 "$perf" \
        -n 300K -d 1 -r 2 -w 0 2>&1)
    rc=$?
    x=$(awk '$3 ~ /^sparse_/ && $1 == 1 { if ($7 + 0 > 4) n++ } END { print n + 0 }' <<<"$out")
    if [ $rc -eq 0 ] && [ "$x" = 2 ]; then
        ok "sparse_perf, 3 ranks over tcp: both sparse calls receive >4x fewer bytes at 1%"
    else
        bad "sparse_perf: exit $rc, $x of 2 rows with >4x fewer bytes"
        echo "$out" | tail -12
    fi
fi
finish
