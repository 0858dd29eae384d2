#!/bin/bash
# Compressed collectives across processes: all_reduce_perf --codec for
# every built-in codec on 2, 3 and 4 ranks (sum and avg, out of place and
# in place, odd sizes), then all_gather_perf and reduce_scatter_perf, and
# non-blocking calls.  With a codec the perf binaries count as #wrong the
# elements beyond the codec's error bound, NaNs, and every rank whose
# result differs in any byte from the others' (allreduce, allgather):
# passing means exit 0, rows, 0 in both #wrong columns and an error line
# per row.
. "$(dirname "$0")/../lib.sh"

run() { # run NRANKS BINARY FLAGS...: the combined output; status in $rc
    out=$(timeout 120 "$LOOMRUN" -n "$1" --timeout 110 "$BUILDDIR/$2" "${@:3}" 2>&1)
    rc=$?
}
expect_ok() {
    if [ "$rc" -eq 0 ] &&
        awk '!/^#/ && NF >= 13 { rows++; if ($9 != 0 || $13 != 0) bad++ }
             /^#  codec .* error:/ { errs++ }
             END { exit !(rows > 0 && bad == 0 && errs == rows) }' <<<"$out" &&
        grep -q "Out of bounds values : 0 OK" <<<"$out"; then
        ok "$1"
    else
        bad "$1 (exit $rc)"
        tail -15 <<<"$out"
    fi
}

sizes=(-b 4 -e 600K -f 13 -n 2 -w 1 -c 1)
for codec in int8 int4 fp4 bf16 fp16 topk int8:64 topk:0.1; do
    for n in 2 3 4; do
        run "$n" all_reduce_perf "${sizes[@]}" -o all --codec "$codec"
        expect_ok "all_reduce_perf --codec $codec on $n ranks (sum, avg)"
    done
done
for codec in int8 bf16 topk; do
    run 3 all_gather_perf "${sizes[@]}" -Z "$codec"
    expect_ok "all_gather_perf -Z $codec on 3 ranks"
done
for codec in int8 fp16 int4; do
    run 3 reduce_scatter_perf "${sizes[@]}" -o all -Z "$codec"
    expect_ok "reduce_scatter_perf -Z $codec on 3 ranks"
done
run 4 all_reduce_perf "${sizes[@]}" -z 0 -Z int8
expect_ok "all_reduce_perf -Z int8 -z 0 (non-blocking) on 4 ranks"
LOOM_TRANSPORT=tcp run 3 all_reduce_perf "${sizes[@]}" -Z int4
expect_ok "all_reduce_perf -Z int4 over tcp on 3 ranks"

# -Z none is the exact baseline: no codec line, rows checked exactly.
run 3 all_reduce_perf "${sizes[@]}" -Z none
if [ "$rc" -eq 0 ] && ! grep -q "codec" <<<"$out" &&
    awk '!/^#/ && NF >= 13 { rows++; if ($9 != 0 || $13 != 0) bad++ }
         END { exit !(rows > 0 && bad == 0) }' <<<"$out"; then
    ok "all_reduce_perf -Z none runs uncompressed and exact"
else
    bad "all_reduce_perf -Z none (exit $rc)"; tail -5 <<<"$out"
fi

# An unknown codec fails the run with a message naming it.
run 2 all_reduce_perf -b 64 -e 64 -n 1 -w 0 -Z no_such_codec
check "an unknown codec fails the run" [ "$rc" -ne 0 ]
check "... and says so" grep -q "no_such_codec" <<<"$out"
# Only the three collectives take a codec.
run 2 broadcast_perf -b 64 -e 64 -n 1 -w 0 -Z int8
check "broadcast_perf refuses -Z" [ "$rc" -ne 0 ]
finish
