#!/bin/bash
# Real processes over shared memory and TCP, with the topology deciding
# which peer goes through which: one host of 4 ranks, and 2 "hosts" of 2
# ranks faked on this machine with LOOM_HOSTNAME.  Every allreduce
# algorithm (including hierarchical and shared) checked element by
# element by mp_allreduce, over shm+tcp and over TCP alone; loom-info
# --job shows the job's picture and the selection table it built.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_allreduce
info=$BUILDDIR/loom-info
perf=$BUILDDIR/all_reduce_perf
hosts_wrapper=$(fake_hosts)
trap 'rm -f "$hosts_wrapper"' EXIT

for algo in shared hierarchical ring recursive_doubling; do
    out=$(LOOM_ALGO=allreduce:$algo timeout 300 "$LOOMRUN" -n 4 --timeout 280 "$prog" quick 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then ok "4 ranks, one host, shm+tcp, allreduce:$algo"
    else bad "4 ranks, one host, shm+tcp, allreduce:$algo (exit $rc)"; echo "$out" | tail -15; fi
    out=$(LOOM_ALGO=allreduce:$algo LOOM_RANKS_PER_HOST=2 timeout 300 "$LOOMRUN" -n 4 \
        --timeout 280 "$hosts_wrapper" "$prog" quick 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then ok "2 hosts x 2 ranks, allreduce:$algo"
    else bad "2 hosts x 2 ranks, allreduce:$algo (exit $rc)"; echo "$out" | tail -15; fi
done
# The hierarchical reduce-scatter, allgather and alltoall over real
# processes, every result checked by the perf binaries: hosts of
# consecutive ranks (2 x 2, 3 x 2: no copies, the phases in place) and
# ranks dealt round the hosts (the forms that copy), out of place and in
# place, at sizes that do not divide evenly.
wrong_ok() { # every data row's two #wrong columns are 0, and there are rows
    awk '!/^#/ && NF >= 13 { rows++; if ($9 != 0 || $13 != 0) bad++ }
         END { exit !(rows > 0 && bad == 0) }'
}
for layout in 2x2 3x2 dealt2x2; do
    case $layout in
    2x2) n=4 env=(LOOM_RANKS_PER_HOST=2) ;;
    3x2) n=6 env=(LOOM_RANKS_PER_HOST=2) ;;
    dealt2x2) n=4 env=(FAKE_HOSTS_DEALT=2) ;;
    esac
    for c in reduce_scatter all_gather alltoall; do
        out=$(env "${env[@]}" LOOM_ALGO=${c/all_gather/allgather}:hierarchical timeout 300 \
            "$LOOMRUN" -n $n --timeout 280 "$hosts_wrapper" "$BUILDDIR/${c}_perf" \
            -b 4 -e 2M -f 23 -n 2 -w 1 -c 1 2>&1)
        rc=$?
        if [ $rc -eq 0 ] && wrong_ok <<<"$out" && grep -q "Out of bounds values : 0 OK" <<<"$out"
        then ok "$layout: $c hierarchical, #wrong 0"
        else bad "$layout: $c hierarchical (exit $rc)"; grep -v '^#' <<<"$out" | tail -10; fi
    done
done
# The automatic choice, and TCP alone (shared arenas absent: shared falls back).
out=$(LOOM_RANKS_PER_HOST=2 timeout 300 "$LOOMRUN" -n 4 --timeout 280 "$hosts_wrapper" "$prog" quick 2>&1)
check "2 hosts x 2 ranks, automatic selection" [ $? -eq 0 ]
out=$(LOOM_TRANSPORT=tcp LOOM_ALGO=allreduce:shared timeout 300 "$LOOMRUN" -n 3 --timeout 280 "$prog" quick 2>&1)
check "3 ranks, TCP only, allreduce:shared falls back" [ $? -eq 0 ]
out=$(LOOM_TRANSPORT=shm timeout 300 "$LOOMRUN" -n 3 --timeout 280 "$prog" quick 2>&1)
check "3 ranks, shared memory only" [ $? -eq 0 ]
# Shared memory only, but two hosts: an error at init that says why.
out=$(LOOM_TRANSPORT=shm LOOM_RANKS_PER_HOST=1 timeout 120 "$LOOMRUN" -n 2 --timeout 100 \
    "$hosts_wrapper" "$prog" quick 2>&1)
rc=$?
check "shm only across hosts fails" [ $rc -ne 0 ]
check "... naming the unreachable rank" grep -q "no allowed transport reaches rank" <<<"$out"

# What the job found and chose.
out=$(LOOM_RANKS_PER_HOST=2 timeout 120 "$LOOMRUN" -n 4 --timeout 100 "$hosts_wrapper" "$info" --job 2>&1)
check "loom-info --job on 2 x 2 exits 0" [ $? -eq 0 ]
check "... two hosts" grep -q "job of 4 rank(s) on 2 host(s)" <<<"$out"
check "... shm to the local peer, tcp to the others" grep -q "1 peer(s) over shm, 2 over tcp" <<<"$out"
check "... links measured" grep -q "measured" <<<"$out"
check "... a selection table" grep -q "^  allreduce " <<<"$out"
# Fake hosts share this machine's cores: all 4 ranks count for whether
# waiting ranks must yield, not the host's 2.
cores=$(sed -n 's/^host 0: .*, \([0-9]*\) cores, .*/\1/p' <<<"$out")
check "... all 4 ranks counted on the machine" grep -q "machine runs 4 rank(s) of the job on $cores core(s)" <<<"$out"
if [ "${cores:-0}" -lt 4 ]; then
    check "... oversubscribed with $cores cores" grep -q "core(s): oversubscribed" <<<"$out"
else
    check "... not oversubscribed with $cores cores" grep -q "core(s)$" <<<"$out"
fi
# --explain: the cost model's estimates for the collectives the table
# covers by the model, each algorithm a row of numbers (shared: on one host).
out=$(timeout 120 "$LOOMRUN" -n 2 --timeout 100 "$info" --job --explain 2>&1)
for coll in allreduce reduce_scatter allgather alltoall broadcast; do
    check "--explain: $coll's estimates" \
        awk -v c="$coll" '/^cost model/ {s = 1; next} s && $1 == c {f = 1; next}
            f && /^  [a-z]/ {exit} f && NF == 8 && $2 + 0 > 0 {rows++}
            END {exit !(rows >= 2)}' <<<"$out"
done
check "... the broadcast's shared row" \
    awk '/^cost model/ {s = 1} s && $1 == "broadcast" {f = 1; next} f && /^  [a-z]/ {exit}
        f && $1 == "shared" && $8 + 0 > 0 {ok = 1} END {exit !ok}' <<<"$out"
out=$(LOOM_PROBE=0 timeout 120 "$LOOMRUN" -n 2 --timeout 100 "$info" --job 2>&1)
check "LOOM_PROBE=0: built-in link figures" grep -q "\[default\]" <<<"$out"
check "LOOM_PROBE=0: allreduce takes the slots up to their size, unmeasured" \
    grep -q "allreduce: up to 64K," <<<"$out"
check "... and so does alltoall" grep -q "alltoall: up to 64K," <<<"$out"

# Up to which size each collective takes the slots is measured at init:
# the limit must follow from the figures rank 0 logs (slots no slower
# than the engine at every size up to it, slower at the next).
small_limit_follows() { # small_limit_follows OUTPUT CAP COLL
    local line
    line=$(grep -o "small $3: slots up to [0-9]* bytes (bytes:slots/engine us[^;]*" <<<"$1")
    if [ -z "$line" ]; then
        # Past the measuring's time budget (a slow host, sanitizers) the
        # rest keep the slots up to their size.
        line=$(grep -o "small $3: slots up to [0-9]* bytes (unmeasured: out of time)" <<<"$1")
        [ -n "$line" ] || { echo "  no measurement logged for $3"; return 1; }
        echo "  $line"
        [ "$(awk '{print $6}' <<<"$line")" -le "$2" ]
        return
    fi
    echo "  $line"
    awk -v cap="$2" '{
        lim = $6; ok = (lim <= cap); first = 1
        for (i = 10; i <= NF; i++) {
            split($i, f, "[:/]"); s = f[1]; a = f[2] + 0; b = f[3] + 0
            if (s <= lim) { if (a > b) ok = 0 }
            else if (first) { first = 0; if (a < b) ok = 0 }
        }
        if (lim < 1024 && lim != 512) ok = 0
        exit !ok
    }' <<<"$line"
}
colls="allreduce reduce_scatter allgather alltoall"
for n in 2 3; do
    out=$(LOOM_DEBUG=info timeout 120 "$LOOMRUN" -n $n --timeout 100 "$info" --job 2>&1)
    for coll in $colls; do
        check "$n ranks: the $coll slot limit follows from its measurement" \
            small_limit_follows "$out" 65536 $coll
        lim=$(grep -o "small $coll: slots up to [0-9]*" <<<"$out" | awk '{print $NF}')
        check "... and loom-info --job reports it" \
            grep -q "    $coll: up to $(awk -v b="$lim" 'BEGIN{if (b >= 1024) print b / 1024 "K"; else print b}'), " \
            <<<"$out"
    done
done
out=$(LOOM_SHM_SMALL=2K LOOM_DEBUG=info timeout 120 "$LOOMRUN" -n 2 --timeout 100 "$info" --job 2>&1)
for coll in $colls; do
    check "LOOM_SHM_SMALL=2K: $coll's measured limit stays within it" \
        small_limit_follows "$out" 2048 $coll
done
# The allreduce's table on one host, timed at init (tune.c): where rank
# 0's log shows another algorithm faster than the table's (the first of
# each size) by more than the 15% margin, loom-info --job lists it as
# taken over and the table runs it there; where none was, the table's
# stands; whatever is listed, the table runs.  The log's times are
# rounded to 0.1 us: sizes that rounding could put either side of the
# margin are left out, and the one taken over may be any within 0.1 us
# of the fastest.
ar_tuning_follows() { # ar_tuning_follows OUTPUT
    local line
    line=$(grep -o "allreduce measured from [0-9]* to [0-9]* bytes (bytes:algorithm:us[^;]*" <<<"$1")
    if [ -z "$line" ]; then
        echo "  no allreduce timing logged; what init said of it:"
        grep -E "not timed|timing the tables|small allreduce: slots" <<<"$1" | cut -c1-200 | sed 's/^/    /'
        return 1
    fi
    echo "  $line"
    { echo "$line"; grep -E "^  allreduce  |^    from [0-9]+[KM]?, below " <<<"$1"; } | awk '
        function bytes(s) { if (s ~ /K$/) return s * 1024; if (s ~ /M$/) return s * 1048576; return s + 0 }
        NR == 1 { for (i = 9; i <= NF; i++) {
                      n = split($i, c, "[:/]"); sz[++ns] = c[1]; first[ns] = c[2]; t0[ns] = c[3] + 0; m = t0[ns]
                      for (k = 2; k < n; k += 2) { t[ns, c[k]] = c[k + 1] + 0; if (c[k + 1] + 0 < m) m = c[k + 1] + 0 }
                      tmin[ns] = m }
                  next }
        $1 == "allreduce" && !tab { tab = 1; for (i = 2; i <= NF; i += 3) { na++; alg[na] = $i; sub(/,$/, "", $(i + 2)); from[na] = bytes($(i + 2)) } next }
        $1 == "from" { s = $2; sub(/,$/, "", s); b = $5; sub(/,$/, "", b); took[bytes(s)] = b; next }
        END {
            # No size had two candidates within the margin of the model:
            # nothing was timed, and nothing may have been taken over.
            ok = tab
            if (ns == 0) for (s in took) { print "  " s ": taken over with nothing timed"; ok = 0 }
            for (z = 1; z <= ns; z++) {
                a = ""; for (i = 1; i <= na && from[i] <= sz[z]; i++) a = alg[i]
                s = sz[z]
                if (s in took && a != took[s]) { print "  " s ": " took[s] " taken over, table runs " a; ok = 0 }
                # What the size runs in the end: the pick of the timing.
                # When the timing raised the links, the tables were built
                # again and the picks kept (loom(7)): a pick that is the
                # algorithm the size was timed with is then recorded as
                # taken over from the choice of the new model.
                fin = (s in took) ? took[s] : a
                if (t0[z] - 0.05 > 1.15 * (tmin[z] + 0.05) && (!((z, fin) in t) || t[z, fin] > tmin[z] + 0.1)) {
                    print "  " s ": a clear win (" tmin[z] " us against " t0[z] "), but it runs " fin; ok = 0 }
                if (t0[z] + 0.05 < 1.15 * (tmin[z] - 0.05) && fin != first[z]) {
                    print "  " s ": taken over without a clear win (runs " fin ", timed with " first[z] ")"; ok = 0 }
            }
            exit !ok
        }'
}
for n in 2 3; do
    # On a loaded host the slots' measuring can spend init's time for
    # both; then the job is run again, 3 times at most.
    for _ in 1 2 3; do
        out=$(LOOM_DEBUG=info timeout 120 "$LOOMRUN" -n $n --timeout 100 "$info" --job 2>&1)
        grep -q "allreduce not timed: measuring the slots spent" <<<"$out" || break
    done
    # Three loaded runs in a row leave nothing to judge: said, not counted.
    if grep -q "allreduce not timed: measuring the slots spent" <<<"$out"; then
        echo "SKIP - $n ranks: the allreduce's table was not timed in 3 runs (host too busy)"
        continue
    fi
    check "$n ranks: the allreduce's table follows its timing at init" ar_tuning_follows "$out"
done
# Whether init has time left to time the allreduce is rank 0's word.
# With rank 1's clock running 20 times as fast (fast_clock.c), that rank
# found the slots' measuring had spent the time, skipped the timing and
# left the others waiting for it until LOOM_TIMEOUT (3 ranks under a
# real mpirun on a loaded host did it too).  Heartbeats off: rank 1
# would find its peers' silent.
fast=$BUILDDIR/tests/mp/.libs/fast_clock.so
if [ ! -f "$fast" ]; then
    echo "skip - a rank whose clock runs fast: no $fast (sanitizers or no shared libraries)"
else
    out=$(LOOM_HEARTBEAT_MS=0 LOOM_TIMEOUT=20000 timeout 120 "$LOOMRUN" -n 3 --timeout 100 \
        bash -c '[ "$LOOM_RANK" != 1 ] || export LD_PRELOAD=$0 FAST_CLOCK_X=20; exec "$@"' \
        "$fast" "$prog" quick 2>&1)
    rc=$?
    if [ $rc -eq 0 ]; then ok "3 ranks, rank 1's clock 20 times as fast: init and allreduce agree"
    else bad "3 ranks, rank 1's clock 20 times as fast (exit $rc)"; echo "$out" | tail -8; fi
fi
# The reductions' classes (small.c): fp32 sums are class 0, so never
# listed; fp16 and bf16 max, some 7 times as slow here, are in one; no
# class takes the slots further than the fp32 sums do, nor past the one
# before it.  The sanitizers check every load, which slows the fp32 sums
# most (their own kernel is the fastest): in that build bf16 max fell to
# class 0 on a Zen 5 VM, so there the classes need not hold it.
out=$(timeout 120 "$LOOMRUN" -n 4 --timeout 100 "$info" --job 2>&1)
red_classes_sane() {
    awk -v san="${LOOM_TEST_SANITIZERS:-no}" '
        function bytes(s) { return s ~ /K$/ ? s * 1024 : s ~ /M$/ ? s * 1048576 : s + 0 }
        $1 == "allreduce:" && $2 == "up" { sub(/,$/, "", $4); lim = bytes($4) }
        $1 == "class" && $3 == "slots" {
            sub(/:$/, "", $6); l = bytes($6); n++
            if (l > lim || (prev && l > prev)) { print "  " $0 " is above " lim " or " prev; bad = 1 }
            prev = l
            if ($0 ~ /float32 sum/) { print "  fp32 sums in a slower class"; bad = 1 }
            if ($0 ~ /bfloat16 [a-z,]*max/) slowmax = 1
        }
        END { if (san != "yes" && (!n || !slowmax)) { print "  no classes, or bf16 max in none"; bad = 1 }
              exit bad }
    ' <<<"$1"
}
check "4 ranks: classes of slower reductions, each with slots up to its own limit" red_classes_sane "$out"
# Their allreduces, through the slots, their class's table and the
# timed spans, give the right sums (the perf binary checks each).
out=$(timeout 200 "$LOOMRUN" -n 4 --timeout 180 "$perf" -b 512 -e 512K -f 4 -n 3 -w 1 -c 1 -d all -o all 2>&1)
all_right() {
    awk '$1 ~ /^[0-9]+$/ { n++; if ($9 != 0 || $13 != 0) { print "  wrong: " $0; bad = 1 } }
         END { if (n != 6 * 50) { print "  " n " rows, not 300"; bad = 1 } exit bad }' <<<"$1"
}
check "4 ranks: every datatype and op by its class's path, checked" all_right "$out"
out=$(LOOM_ALGO=allreduce:ring LOOM_DEBUG=info timeout 120 "$LOOMRUN" -n 2 --timeout 100 "$info" --job 2>&1)
check "LOOM_ALGO forcing the allreduce: nothing timed" eval '! grep -q "allreduce measured" <<<"$out"'
tf=$(mktemp)
printf '# test\nalpha_intra 3e-6\nbeta_intra 1e-10\nalpha_inter 5e-5\nbeta_inter 8e-9\n' >"$tf"
out=$(LOOM_TUNING_FILE=$tf timeout 120 "$LOOMRUN" -n 2 --timeout 100 "$info" --job 2>&1)
check "LOOM_TUNING_FILE: figures from the file" grep -q "alpha 3.00 us.*tuning file" <<<"$out"
# The chunks: 8 hosts of a rank on a 100 Gbit/s RDMA-like link, each
# chunk 5 us (loom(7), Selection): the reduce's scatter-allgather in
# smaller chunks somewhere; LOOM_CHUNK_SIZE set: none.
printf 'alpha_inter 5e-6\nbeta_inter 0.08e-9\nchunk_inter 5e-6\n' >"$tf"
out=$(LOOM_TUNING_FILE=$tf timeout 60 "$info" --hosts 8 --ranks 1 2>&1)
check "LOOM_TUNING_FILE: the chunk's price from the file" \
    grep -q "a chunk more costs 0.00 us within a host, 5.00 us between hosts" <<<"$out"
check "... and the reduce cut into smaller chunks" \
    grep -Eq "^  reduce .*scatter_allgather from [0-9]+[KM] \(chunks of (64|128|256|512)K\)" <<<"$out"
out=$(LOOM_CHUNK_SIZE=2M LOOM_TUNING_FILE=$tf timeout 60 "$info" --hosts 8 --ranks 1 2>&1)
check "LOOM_CHUNK_SIZE set: no chunks in the table" eval '! grep -q "chunks of" <<<"$out"'
# A job of 2 hosts of a rank each (faked here: each rank has a core) runs
# the chunks its table names, and its results are right; with
# LOOM_CHUNK_SIZE every call runs in that.
chunks_run() {
    LOOM_TUNING_FILE=$tf LOOM_RANKS_PER_HOST=1 LOOM_DEBUG=trace timeout 200 "$LOOMRUN" -n 2 \
        --timeout 180 "$hosts_wrapper" "${prog_:-$perf}" -b 256K -e 8M -f 2 -n 2 -w 0 -c 1 "$@" 2>&1
}
six_right() {
    awk '$1 ~ /^[0-9]+$/ { n++; if ($9 != 0 || $13 != 0) bad = 1 } END { exit bad || n != 6 }'
}
# some_chunked COLL: some call of COLL in $out ran in chunks other than 2M.
# (The model weighs chunks only where each rank has a core: 2 here.)
some_chunked() {
    [ "$(nproc)" -ge 2 ] || return 0
    check "... some $1 in chunks other than 2M" \
        grep -Eq "loom_$1: count [0-9]+ float32, [a-z_]+, chunks of (65536|131072|262144|524288|1048576)," <<<"$out"
}
out=$(chunks_run)
check "2 hosts x 1: results right in the model's chunks" six_right <<<"$out"
some_chunked allreduce
all_2m() {
    local calls
    calls=$(grep -E "loom_allreduce(_opts)?: count" <<<"$out")
    [ -n "$calls" ] && ! grep -v "chunks of 2097152," <<<"$calls" | grep -q .
}
out=$(LOOM_CHUNK_SIZE=2M chunks_run)
check "... and with LOOM_CHUNK_SIZE=2M, every call in 2M chunks" all_2m
out=$(chunks_run -Z bf16)
check "... and compressed calls, which the model did not weigh, in LOOM_CHUNK_SIZE's" all_2m
out=$(prog_=$BUILDDIR/reduce_perf chunks_run)
check "... the reduce's results right in the model's chunks" six_right <<<"$out"
some_chunked reduce
printf 'alpha_intra fast\n' >"$tf"
out=$(LOOM_TUNING_FILE=$tf timeout 120 "$LOOMRUN" -n 2 --timeout 100 "$info" --job 2>&1)
rc=$?
check "a bad tuning file fails init" [ $rc -ne 0 ]
check "... naming file and line" grep -q "$tf:1" <<<"$out"
rm -f "$tf"
finish
