#!/bin/bash
# all_reduce_perf under loomrun: the table, #wrong 0 at every size in
# place and out of place, over all datatypes and ops; a failing run must
# exit non-zero.
. "$(dirname "$0")/../lib.sh"
perf=$BUILDDIR/all_reduce_perf
run() { timeout 300 "$LOOMRUN" -n "$1" --timeout 280 "$perf" "${@:2}" 2>&1; }
wrong_ok() { # every data row's two #wrong columns are 0 and there is at least one row
    awk '!/^#/ && NF >= 13 { rows++; if ($9 != 0 || $13 != 0) bad++ }
         END { exit !(rows > 0 && bad == 0) }'
}
out=$(run 4 -b 8 -e 4M -f 4 -c 1); rc=$?
echo "$out" | grep -v '^loom' | head -30
check "4 ranks, 8 B..4 MiB float sum: exit 0" [ $rc -eq 0 ]
check "4 ranks, 8 B..4 MiB: #wrong 0 everywhere" wrong_ok <<<"$out"
check "footer reports no out-of-bounds values" grep -q "Out of bounds values : 0 OK" <<<"$out"
out=$(run 3 -b 8 -e 64K -f 8 -c 1 -d all -o all); rc=$?
check "3 ranks, -d all -o all: exit 0" [ $rc -eq 0 ]
check "3 ranks, -d all -o all: #wrong 0 everywhere" wrong_ok <<<"$out"
out=$(LOOM_ALGO=allreduce:nonsense run 2 -b 8 -e 8 -c 1); rc=$?
check "an invalid LOOM_ALGO makes the benchmark fail with a message" \
    bash -c "[ $rc -ne 0 ] && grep -q ring <<<'$out'"
finish
