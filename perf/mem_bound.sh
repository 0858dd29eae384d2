#!/bin/bash
# mem_bound.sh - the allreduce's bus bandwidth against the memory
# bandwidth bound of this host, both measured in turn, several times.
#
# The bound: every rank reads its n-byte input and writes its n-byte
# result at least once, so an allreduce on p ranks of one host moves at
# least 2pn bytes through memory; at the traffic T that the cores
# sustain, t >= 2pn/T, and busbw = 2(p-1)/p * n/t <= (p-1)T/p^2.  T comes
# from perf/membw (one thread per rank, at most one per CPU, copying SIZE
# bytes: the ranks run on that many cores, and on a host with more cores
# than ranks the idle ones add bandwidth no rank can use): memcpy, with
# each byte counted as read once and written once (STREAM's Copy
# convention), and copies with streaming stores, which do not read the
# lines they overwrite and so sustain more: the faster of one stream and
# two at once per thread (the "stream" figure).  Each round runs membw, then
# the allreduce (automatic choice, out of place and in place; its time the
# median of 5 batches of 4 calls, as membw's is its best round, so that a
# batch that the host's other tenants slowed does not decide), and prints
# busbw as a share of both bounds; the last lines give the medians.
#
# In place, a result that overwrites the input can only be undone (the
# restore on failure that loom(7) promises) if the input was first kept
# somewhere: a write of n more per rank, 3pn in all, so that bound is
# 2/3 of the other.  The last line gives the in-place shares of it too.
#
# The bound holds for heap buffers too (-R 0).  Those are staged through
# the ranks' shared arenas (LOOM_SHM_SIZE, 4M each by default), which
# every round reuses, so the copies into them and out of them can stay
# in the caches.  Counting the staging as memory traffic ((5L-2)/L pn on
# L ranks, 4pn on 2) made a figure that 2 ranks beat: 64M in 8.9-9.4 ms,
# 57 GB/s of such traffic, against 52 GB/s of streaming copies; with
# 256M arenas, one round that cannot stay in the caches, 10.0-10.5 ms.
# The "buffers" line says which the run used.
#
# The last column is how long CPUs 0 and 1 take to hand a cache line
# back and forth (membw's last line; 0: not measured): the staging's
# peers read lines another core has just written.  On a 2-core VM whose
# hypervisor moved its cores, the same build read 126 ns and 400-1000 ns
# within the hour, and the shares of the bound moved with it.
#
# Heap buffers cannot reach that bound through shared memory wherever
# the arenas' traffic goes to memory.  A rank reaches another's heap only
# through memory both map, so per element, beyond the p reads of the
# inputs and the p writes of the results: combining p values held by p
# processes takes at least p-1 reads of values another process wrote, so
# p-1 writes of them; and all ranks but the one that finished the sum
# read it from where that one wrote it, p-1 reads and a write.  In all at
# least (5p-2)n bytes against 2pn, so busbw <= 2p/(5p-2) of the memcpy
# bound: 44% on 4 ranks, 50% on 2 (the "staging cap" line).  Caches that
# hold the arenas lift it: with the cores close, perf/staged reached
# 70.5% of a memcpy bound that was then lower (43 GB/s of traffic
# against 73).  The kernel's single copy (process_vm_readv) needs no
# arena: a rank reads its peers' slices of their inputs and adds them,
# then reads their slices of the result, (3-1/p)n bytes a rank, up to 73%
# of the bound on 4 ranks and 80% on 2 if the kernel copied at memcpy's
# pace.  membw's line for it gives its rate (on the VM these figures come
# from, 8-11 GB/s for one reader, against 17-19 for memcpy), and
# perf/kcopy that design's ceiling (the "kcopy" columns).
#
# With heap buffers each round also runs perf/staged, the same staging
# with nothing but its copies and its reduction (no engine, no messages:
# spinning barriers), with the faster of its two copy-ins (cached or
# streamed stores into the arena), the ceiling of that design on this
# host: the last columns give its busbw as a share of the memcpy bound
# and the out-of-place allreduce's busbw as a share of it.  Of the (5L-2)/L pn
# bytes the staging moves, only 2pn need go to memory; the rest goes
# through the caches, as fast as they allow with L ranks on the CPUs.
# Then perf/kcopy, the kernel's single copy with nothing else, and its
# busbw as a share of the memcpy bound.
#
#   perf/mem_bound.sh [-n RANKS] [-b SIZE] [-r ROUNDS] [-- PERF FLAGS]
#
#   RANKS 4, SIZE 64M, ROUNDS 5; run from the build directory or with
#   BUILDDIR set.
set -u
n=4 size=64M rounds=5
BUILDDIR=${BUILDDIR:-.}
while getopts "n:b:r:h" o; do
    case $o in
    n) n=$OPTARG ;; b) size=$OPTARG ;; r) rounds=$OPTARG ;;
    h) sed -n '2,/^set -u/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" = -- ] && shift
# Windows (-R 1, --register 1) or heap buffers, for the record.
win=0 prev=
for f in "$@"; do
    case "$prev $f" in "-R 1" | "--register 1") win=1 ;; esac
    case $f in -R1 | --register=1) win=1 ;; esac
    prev=$f
done
# The arenas the ranks get (LOOM_SHM_SIZE as the library resolves it),
# for perf/staged.
arena=$("$BUILDDIR/loom-info" | awk '$1 == "LOOM_SHM_SIZE" {print $2; exit}')
[ -n "$arena" ] || { echo "no LOOM_SHM_SIZE in loom-info's output"; exit 1; }
cpus=$(nproc)
threads=$((n < cpus ? n : cpus))
echo "# $n ranks, $size allreduce, $rounds rounds; membw with $threads threads"
hdr="# round  memcpy-T  stream-T   oop-busbw  %memcpy %stream   ip-busbw  %memcpy %stream"
[ "$win" = 1 ] || hdr="$hdr  staged-busbw %memcpy %staged  kcopy-busbw %memcpy"
echo "$hdr  handoff-ns"
# The figure after "busbw" in the line staged or kcopy printed.
busbw_of() { awk '{for (k = 1; k <= NF; k++) if ($k == "busbw") print $(k + 1)}' <<<"$1"; }
res=()
for ((i = 1; i <= rounds; i++)); do
    m=$("$BUILDDIR/perf/membw" "$size" "$threads" 5) || exit 1
    tc=$(awk '/memcpy/ {for (k = 1; k <= NF; k++) if ($k == "traffic") print $(k + 1)}' <<<"$m")
    ts=$(awk '/streaming/ {for (k = 1; k <= NF; k++) if ($k == "traffic" && $(k + 1) > t) t = $(k + 1)}
              END {if (t) print t}' <<<"$m")
    [ -n "$ts" ] || ts=$tc
    ho=$(awk '/hand a cache line/ {for (k = 1; k <= NF; k++) if ($k == "ns") print $(k - 1)}' <<<"$m")
    out=$("$BUILDDIR/loomrun" -n "$n" --bind core "$BUILDDIR/all_reduce_perf" -b "$size" \
        -e "$size" -n 20 -w 3 -S 5 -c 1 "$@" 2>&1) || { echo "$out" | tail -5; exit 1; }
    row=$(awk '!/^#/ && NF >= 13 {print $8, $12, $9, $13; exit}' <<<"$out")
    read -r ob ib ow iw <<<"$row"
    if [ -z "${ob:-}" ] || [ "$ow" != 0 ] || [ "$iw" != 0 ]; then
        echo "no result, or wrong values:"; echo "$out" | tail -5; exit 1
    fi
    sb= kb=
    if [ "$win" = 0 ]; then
        st=$("$BUILDDIR/perf/staged" "$n" "$size" "$arena" 10) || exit 1
        sb=$(busbw_of "$st")
        kc=$("$BUILDDIR/perf/kcopy" "$n" "$size" 5) || exit 1
        kb=$(busbw_of "$kc")
    fi
    line=$(awk -v p="$n" -v tc="$tc" -v ts="$ts" -v ob="$ob" -v ib="$ib" -v i="$i" -v sb="$sb" -v kb="$kb" \
        -v ho="${ho:-0}" 'BEGIN {
        bc = (p - 1) * tc / (p * p); bs = (p - 1) * ts / (p * p)
        printf "%7d %9.2f %9.2f %11.2f %8.1f %7.1f %10.2f %8.1f %7.1f", i, tc, ts,
               ob, 100 * ob / bc, 100 * ob / bs, ib, 100 * ib / bc, 100 * ib / bs
        if (sb != "") printf " %13.2f %8.1f %8.1f %12.2f %8.1f", sb, 100 * sb / bc, 100 * ob / sb,
                             kb, 100 * kb / bc
        printf " %11.0f\n", ho }')
    echo "$line"
    res+=("$line")
done
printf '%s\n' "${res[@]}" | awk -v win="$win" -v p="$n" '
    function median(c,   i, j, t, m) {
        m = 0; for (i = 1; i <= NR; i++) v[++m] = col[i, c]
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
        return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2
    }
    { for (c = 2; c <= NF; c++) col[NR, c] = $c }
    END { printf "# median %9.2f %9.2f %11.2f %8.1f %7.1f %10.2f %8.1f %7.1f",
          median(2), median(3), median(4), median(5), median(6), median(7), median(8), median(9)
          if (!win) printf " %13.2f %8.1f %8.1f %12.2f %8.1f", median(10), median(11), median(12),
                           median(13), median(14)
          printf " %11.0f\n", median(NF)
          printf "# in place against the restorable bound (3pn of traffic): %.1f%% memcpy, %.1f%% streaming\n",
          1.5 * median(8), 1.5 * median(9)
          printf "# buffers: %s\n", win ? "windows" : "heap"
          if (!win) { cap = 200 * p / (5 * p - 2)
              printf "# staging cap (heap, arenas in memory): %.1f%% of the memcpy bound; out of place reached %.1f%% of it\n",
              cap, 100 * median(5) / cap } }'
