#!/bin/bash
# Ranks whose collective calls differ (mp_mismatch.c): one rank passes
# another count, datatype, op or root, or calls another collective, and
# every rank must return LOOM_ERR_MISMATCH within a second (LOOM_TIMEOUT
# is 30 s, so a timeout fails the check), with a message that names the
# rank that differs from the others and both calls ("rank 1 called
# loom_allreduce(count=1000, ...) while ranks 0, 2 called
# loom_allreduce(count=1024, ...)"; with 2 ranks there is no majority and
# both are named).  Over each path on one host: the shared arenas' slots
# (LOOM_PROBE=0 keeps small allreduces there), the shared allreduce, the
# ring's single-copy messages, a loom_mem_alloc window, the engine's
# messages, non-blocking calls with the progress thread; and over TCP
# between the same ranks.  A rank whose part of the call completed before
# the difference showed (the root of a broadcast) fails in its next call,
# the barrier after it.  And a rank that only comes late to each call
# (no mismatch) fails nothing.  LOOM_TEST_QUICK=1: 3 ranks only.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_mismatch
ranks="2 3 4"
[ -n "${LOOM_TEST_QUICK:-}" ] && ranks=3

# expect LABEL N ODD CASE ODD_CALL MAJORITY_CALL LATE_OK [VAR=VALUE... [-- nb]]
expect() {
    local label=$1 n=$2 odd=$3 cs=$4 oddc=$5 majc=$6 late=$7
    shift 7
    local envs=() extra=
    while [ $# -gt 0 ]; do
        if [ "$1" = -- ]; then extra=$2; break; fi
        envs+=("$1")
        shift
    done
    local out want why= worst=0
    out=$(env LOOM_TIMEOUT=30000 "${envs[@]}" timeout 120 "$LOOMRUN" -n "$n" --timeout 100 \
        "$prog" "$cs" "$odd" $extra 2>&1)
    if [ "$n" -ge 3 ]; then
        local others=
        for ((r = 0; r < n; r++)); do
            [ $r = "$odd" ] || others="${others:+$others, }$r"
        done
        want="rank $odd called $oddc while ranks $others called $majc"
    elif [ "$odd" = 1 ]; then
        want="rank 0 called $majc, rank 1 called $oddc"
    else
        want="rank 0 called $oddc, rank 1 called $majc"
    fi
    local pat="^rank R: $cs: LOOM_ERR_MISMATCH in [0-9.]+ ms"
    [ "$late" = late ] && pat="^rank R: $cs(: then barrier)?: LOOM_ERR_MISMATCH in [0-9.]+ ms"
    for ((r = 0; r < n; r++)); do
        local line ms
        line=$(grep -E "${pat/R/$r}" <<<"$out" | head -1)
        if [ -z "$line" ]; then
            why="rank $r did not return LOOM_ERR_MISMATCH"
            break
        fi
        ms=$(sed -E 's/.* in ([0-9]+)(\.[0-9]+)? ms.*/\1/' <<<"$line")
        [ "$ms" -gt "$worst" ] && worst=$ms
        if [ "$ms" -ge 1000 ]; then why="rank $r took $ms ms"; break; fi
        if ! grep -qF "$want" <<<"$line"; then why="rank $r does not say \"$want\""; break; fi
    done
    check "$label, $n ranks: every rank LOOM_ERR_MISMATCH within $worst ms, naming both calls" \
        [ -z "$why" ]
    if [ -n "$why" ]; then
        echo "   $why"
        grep '^rank' <<<"$out" | cut -c1-300 | head -12
    fi
}

f() { echo "loom_allreduce(count=$1, $2, $3)"; }
b() { echo "loom_broadcast(count=1024, float32, root=$1)"; }
for n in $ranks; do
    odd=1
    [ "$n" = 4 ] && odd=2
    # Shared memory (one host's default).
    expect "count 1000 vs 1024, the slots" "$n" $odd count1k "$(f 1000 float32 sum)" \
        "$(f 1024 float32 sum)" no LOOM_PROBE=0
    expect "count 100000 vs 102400, the shared allreduce" "$n" $odd count100k \
        "$(f 100000 float32 sum)" "$(f 102400 float32 sum)" no LOOM_ALGO=allreduce:shared
    expect "count 1000000 vs 1048576 (auto)" "$n" $odd count1m "$(f 1000000 float32 sum)" \
        "$(f 1048576 float32 sum)" no
    expect "count 1000000 vs 1048576, the ring's single-copy messages" "$n" $odd count1m \
        "$(f 1000000 float32 sum)" "$(f 1048576 float32 sum)" no LOOM_ALGO=allreduce:ring
    expect "datatype int32 vs float32, the slots" "$n" $odd dtype "$(f 1024 int32 sum)" \
        "$(f 1024 float32 sum)" no LOOM_PROBE=0
    expect "op max vs sum, the engine's messages" "$n" $odd op "$(f 1024 float32 max)" \
        "$(f 1024 float32 sum)" no LOOM_SHM_SMALL=0
    expect "root $odd vs 0 of a broadcast" "$n" $odd root "$(b $odd)" "$(b 0)" late
    expect "loom_broadcast vs loom_allreduce (the slots)" "$n" $odd bcast "$(b 0)" \
        "$(f 1024 float32 sum)" no LOOM_PROBE=0
    expect "count 65472 vs 65536 in a loom_mem_alloc window" "$n" $odd window \
        "$(f 65472 float32 sum)" "$(f 65536 float32 sum)" no
    expect "op max vs sum, loom_iallreduce with the progress thread" "$n" $odd op \
        "$(f 1024 float32 max)" "$(f 1024 float32 sum)" no LOOM_PROGRESS_THREAD=1 -- nb
    # TCP between the same ranks.
    T=LOOM_TRANSPORT=tcp
    expect "TCP: count 1000 vs 1024" "$n" $odd count1k "$(f 1000 float32 sum)" \
        "$(f 1024 float32 sum)" no $T
    expect "TCP: count 1000000 vs 1048576" "$n" $odd count1m "$(f 1000000 float32 sum)" \
        "$(f 1048576 float32 sum)" no $T
    expect "TCP: op max vs sum" "$n" $odd op "$(f 1024 float32 max)" "$(f 1024 float32 sum)" \
        no $T
    expect "TCP: root $odd vs 0 of a broadcast" "$n" $odd root "$(b $odd)" "$(b 0)" late $T
    expect "TCP: loom_broadcast vs loom_allreduce" "$n" $odd bcast "$(b 0)" \
        "$(f 1024 float32 sum)" no $T
    expect "TCP: count 100000 vs 102400, loom_iallreduce" "$n" $odd count100k \
        "$(f 100000 float32 sum)" "$(f 102400 float32 sum)" no $T -- nb
done
# No mismatch: the last rank enters every call 300 ms after the others,
# which probe it meanwhile; every call succeeds with the right result.
for tr in shm tcp; do
    out=$(LOOM_TRANSPORT=$tr LOOM_TIMEOUT=30000 timeout 120 "$LOOMRUN" -n 3 --timeout 100 \
        "$prog" late 2 2>&1)
    check "a rank 300 ms late to each call ($tr): every call succeeds" \
        [ $? -eq 0 -a "$(grep -c '^rank [0-2]: late: .*: success in .*: result right\|^rank [0-2]: late: barrier: success' <<<"$out")" = 15 ]
    [ $? -eq 0 ] || grep '^rank' <<<"$out" | grep -v 'result right' | head
done
finish
