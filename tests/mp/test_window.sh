#!/bin/bash
# loom_mem_alloc windows across real processes (mp_window.c): the shared
# allreduce reading the peers' windows, checked element by element, on
# one host and on 2 "hosts" x 2 ranks (rails between them); and ranks
# that pass their buffers differently failing together with a mismatch.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_window
hosts_wrapper=$(fake_hosts)
trap 'rm -f "$hosts_wrapper"' EXIT
# Small arenas: the larger counts take several rounds.
export LOOM_ALGO=allreduce:shared LOOM_SHM_SIZE=256K
for n in 2 3 4; do
    out=$(LOOM_DEBUG=trace timeout 300 "$LOOMRUN" -n "$n" --timeout 280 "$prog" check 2>&1)
    rc=$?
    check "windows, $n ranks: $(echo "$out" | grep '^rank 0 of')" [ $rc -eq 0 ]
    [ $rc -eq 0 ] || echo "$out" | grep -v TRACE | tail -15
    # The window form ran (the trace says so), and the staged one too.
    check "windows, $n ranks: allreduces read the windows" \
        grep -q "shared.*from the window" <<<"$out"
done
out=$(LOOM_DEBUG=trace LOOM_RANKS_PER_HOST=2 timeout 300 "$LOOMRUN" -n 4 --timeout 280 \
    "$hosts_wrapper" "$prog" check 2>&1)
rc=$?
check "windows, 2 hosts x 2 ranks: $(echo "$out" | grep '^rank 0 of')" [ $rc -eq 0 ]
[ $rc -eq 0 ] || echo "$out" | grep -v TRACE | tail -15
check "windows, 2 hosts x 2 ranks: allreduces read the windows" \
    grep -q "shared.*from the window" <<<"$out"
# Streamed results from the windows.
out=$(LOOM_SHM_STREAM=4K timeout 300 "$LOOMRUN" -n 3 --timeout 280 "$prog" check 2>&1)
rc=$?
check "windows, 3 ranks, streamed results" [ $rc -eq 0 ]
[ $rc -eq 0 ] || echo "$out" | tail -15
# Ranks that disagree: all fail (mp_window exits 0 only then, its
# buffers untouched); the rank that saw it says why.
for m in "mismatch:every rank of a host must use windows alike" \
    "offsets:every rank must pass the same offsets"; do
    out=$(timeout 120 "$LOOMRUN" -n 3 --timeout 100 "$prog" "${m%%:*}" 2>&1)
    rc=$?
    check "windows, ${m%%:*}: every rank fails" [ $rc -eq 0 ]
    [ $rc -eq 0 ] || echo "$out" | tail -15
    check "windows, ${m%%:*}: the error says why" grep -q "${m#*:}" <<<"$out"
    echo "$out" | grep -m1 "${m#*:}" | cut -c1-240
done
finish
