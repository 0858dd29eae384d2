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
# Ranks that ask for windows of different sizes: every rank fails with
# LOOM_ERR_MISMATCH (it used to be LOOM_ERR_SYSTEM, against the page).
out=$(timeout 120 "$LOOMRUN" -n 3 --timeout 100 "$prog" sizes 2>&1)
rc=$?
check "windows of different sizes: LOOM_ERR_MISMATCH on every rank" \
    [ $rc -eq 0 -a "$(grep -c 'loom_mem_alloc: peers disagree.*asked for' <<<"$out")" -ge 2 ]
[ $rc -eq 0 ] || echo "$out" | tail -6
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
# Automatic choice, links from a tuning file (2 cores' figures), no
# slots: for 3 ranks the table of plain buffers takes shared from 64K or
# so (its sizes timed at init can move that), the one for windows from
# 768 bytes, and in place from 768K (recursive
# doubling, then the ring below; before the tree's closed form counted
# its 3-rank roots' two children, the tree came first and windows took
# shared from 3K).
# Once the ranks have windows, the allreduce is chosen from the latter
# two on every rank alike.
# So the checked 4000-byte calls read the windows, and at 32K rank 0's
# plain buffers meet the others' windows in the shared algorithm, whose
# check names the mismatch (a rank choosing by its own buffers would run
# another algorithm than its peers: they fail on a message of the wrong
# size, which does not say why).
tf=$(mktemp)
trap 'rm -f "$hosts_wrapper" "$tf"' EXIT
printf 'alpha_intra 5e-7\nbeta_intra 9.5e-11\ngamma 6.8e-11\ngamma_copy 6.8e-11\n' >"$tf"
export LOOM_SHM_SMALL=0
out=$(LOOM_TUNING_FILE="$tf" timeout 120 "$LOOMRUN" -n 3 --timeout 100 "$BUILDDIR/loom-info" \
    --job 2>&1)
window_table() { grep -A2 "loom_mem_alloc windows" | grep -q "allreduce .*shared from 768$"; }
check "windows, automatic: loom-info prints the table for windows" window_table <<<"$out"
window_inplace() {
    grep -A2 "loom_mem_alloc windows" | grep -q "in place .*ring from 1536, shared from 768K"
}
check "windows, automatic: loom-info prints the table for windows in place" window_inplace \
    <<<"$out"
out=$(env -u LOOM_ALGO LOOM_TUNING_FILE="$tf" LOOM_DEBUG=trace timeout 300 "$LOOMRUN" -n 3 \
    --timeout 280 "$prog" check 2>&1)
rc=$?
check "windows, automatic: $(echo "$out" | grep '^rank 0 of')" [ $rc -eq 0 ]
[ $rc -eq 0 ] || echo "$out" | grep -v TRACE | tail -15
check "windows, automatic: out-of-place allreduces read the windows" \
    grep -q "count 1000 float32, shared.*from the window" <<<"$out"
check "windows, automatic: 4 MiB in place reads the windows" \
    grep -q "count 1048579 float32, shared.*in place, from the window" <<<"$out"
check "windows, automatic: 256 KiB in place takes the ring" \
    grep -q "count 65537 float32, ring.*in place" <<<"$out"
out=$(env -u LOOM_ALGO LOOM_TUNING_FILE="$tf" timeout 120 "$LOOMRUN" -n 3 --timeout 100 \
    "$prog" mismatch 8192 2>&1)
rc=$?
check "windows, automatic, mismatch: every rank fails" [ $rc -eq 0 ]
[ $rc -eq 0 ] || echo "$out" | tail -15
check "windows, automatic, mismatch: the error says why" \
    grep -q "every rank of a host must use windows alike" <<<"$out"
finish
