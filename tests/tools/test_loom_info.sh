#!/bin/bash
# loom-info: the plain report, a bad LOOM_ALGO, --simulate (a row with
# numbers per algorithm), --measure, and clear errors for bad options.
. "$(dirname "$0")/../lib.sh"
info=$BUILDDIR/loom-info
if [ ! -x "$info" ]; then
    echo "test_loom_info.sh: '$info' is not an executable (set BUILDDIR)" >&2
    exit 1
fi
run() { timeout 120 "$info" "$@"; }
T=$(mktemp -d "${TMPDIR:-/tmp}/loom-info-test.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT

# ---------------------------------------------------------------- plain
run >"$T/out" 2>"$T/err"; rc=$?
check "plain: exit 0" [ $rc -eq 0 ]
check "plain: nothing on stderr" [ ! -s "$T/err" ]
check "plain: the version" grep -q '^Loom [0-9]*\.[0-9]*\.[0-9]*' "$T/out"
check "plain: the transports" grep -q 'transports *tcp' "$T/out"
check "plain: the reduction kernels" grep -Eq 'reduce kernels *(generic|avx2|avx512|neon)' "$T/out"
for v in LOOM_TIMEOUT LOOM_TCP_STREAMS LOOM_CHUNK_SIZE LOOM_ALGO LOOM_TRANSPORT; do
    check "plain: setting $v" grep -q "^  $v " "$T/out"
done
for c in allreduce reduce_scatter allgather alltoall alltoallv broadcast reduce gather scatter barrier; do
    check "plain: collective $c" grep -q "^  $c\$" "$T/out"
done
# One table, the cost model's for the stated job: not also the fixed
# thresholds of in-process communicators (it printed both, and they
# disagreed).
check "plain: one allreduce table (and the windows' forms)" \
    [ "$(grep -c '^  allreduce  *[a-z_]* from 0' "$T/out")" -eq 2 ]
check "plain: no second table of defaults" [ "$(grep -c '^    default ' "$T/out")" -eq 0 ]
# Ranks: one per core of this host unless --ranks says, and said so.
cores=$(sed -n 's/^host 0: .* \([0-9]*\) cores, .*/\1/p' "$T/out")
check "plain: one rank per core of this host ($cores), and it says so" \
    grep -q "^topology ($cores rank(s) on each of 1 host(s) like this one: one per core" "$T/out"
check "plain: the selection is for that many ranks" grep -q "^selection for $cores rank(s) on 1 host(s)" "$T/out"
run -n 8 >"$T/out" 2>&1
check "-n 8: the topology and table of 8 ranks" \
    bash -c "grep -q '^topology (8 rank(s) on each of 1 host(s) like this one, as --ranks asked)' '$T/out' && grep -q '^selection for 8 rank(s) on 1 host(s)' '$T/out'"
check "plain: 8 ranks on one host take the slots up to 32K" \
    grep -q 'blocking calls with input up to 32K: slots' "$T/out"
run --ranks 4 --hosts 2 >"$T/out" 2>&1
check "2 hosts: no slots" [ "$(grep -c 'slots in the shared arenas' "$T/out")" -eq 0 ]
# Near-ties (the default links give some on 2 x 2): each under its
# collective's line, in the documented form, the chosen algorithm the
# one that its table runs at the span's start.
check "2 hosts: near-ties marked under their collectives, the table's choice" \
    awk '/^selection/ { s = 1 } /^once/ { s = 0 } !s { next }
         /^  [a-z_]+ / { c = $1; line = $0; next }
         /tie:/ { n++
                  if ($0 !~ /^    from [0-9]+[KMG]? (to [0-9]+[KMG]?|on): tie: [a-z_]+ [0-9.]+x [a-z_]+; chose [a-z_]+, worst case [0-9.]+x$/) bad++
                  from = $2; ch = $0; sub(/.*chose /, "", ch); sub(/,.*/, "", ch)
                  if (index(line, ch " from ") == 0) bad++ }
         END { exit !(n > 0 && !bad) }' "$T/out"
LOOM_SHM_SMALL=1K run --ranks 4 >"$T/out" 2>&1
check "LOOM_SHM_SMALL=1K: slots up to 1K" grep -q 'blocking calls with input up to 1K: slots' "$T/out"

LOOM_CHUNK_SIZE=1M LOOM_ALGO=allreduce:ring run >"$T/out" 2>&1; rc=$?
check "settings from the environment: exit 0" [ $rc -eq 0 ]
check "settings from the environment: chunk" grep -q 'LOOM_CHUNK_SIZE *1M' "$T/out"
check "settings from the environment: forced algorithm" grep -q 'LOOM_ALGO *forces ring' "$T/out"

LOOM_ALGO=allreduce:nonsense run >"$T/out" 2>"$T/err"; rc=$?
check "bad LOOM_ALGO: non-zero exit" [ $rc -ne 0 ]
check "bad LOOM_ALGO: the library's message, naming the value" \
    bash -c "grep -q \"LOOM_ALGO.*'nonsense'\" '$T/err' && grep -q 'valid' '$T/err'"
check "bad LOOM_ALGO: the rest is still reported" grep -q '^  barrier$' "$T/out"

LOOM_CHUNK_SIZE=lots run >"$T/out" 2>"$T/err"; rc=$?
check "bad LOOM_CHUNK_SIZE: non-zero exit naming it" \
    bash -c "[ $rc -ne 0 ] && grep -q 'LOOM_CHUNK_SIZE=lots' '$T/err'"

# ------------------------------------------------------------- simulate
run --simulate allreduce --ranks 8 --bytes 1M >"$T/out" 2>"$T/err"; rc=$?
cat "$T/out"
check "simulate: exit 0" [ $rc -eq 0 ]
check "simulate: the parameters and their source" \
    bash -c "grep -q '^  alpha .*default' '$T/out' && grep -q '^  beta ' '$T/out' && grep -q '^  gamma ' '$T/out'"
num='[0-9][0-9.e+-]* \(ns\|us\|ms\|s\)'
for a in ring recursive_doubling halving_doubling tree; do
    # Simulated and closed form, or "not available" and the closed form.
    check "simulate: a row with numbers for $a" \
        grep -q "^$a\( \*\| (forced)\)\? *\($num *$num *[0-9.]* \|- *$num *not available\)" "$T/out"
done
rows=$(grep -c '^[a-z_]\+\( \*\)\? \+\(-\|[0-9]\)' "$T/out")
check "simulate: one row per algorithm (4)" [ "$rows" -eq 4 ]
# The star is the cost model's choice (the least closed form), which the
# last lines name, with the fastest simulated.
star=$(sed -n 's/^\([a-z_]*\) \*.*/\1/p' "$T/out")
check "simulate: the starred row is the cost model's choice ($star)" \
    grep -q "^\* the cost model's choice: $star (" "$T/out"
check "simulate: the fastest simulated named" grep -q "^  fastest simulated: [a-z_]* (" "$T/out"
run --simulate allreduce >"$T/out2" 2>&1
check "simulate: the default rank count said" grep -q "^allreduce on 8 ranks (the default of --ranks)" "$T/out2"
# The double tree on many ranks and chunks: its simulation and its closed
# form agree (simulated 3.3 times the form on 1024 ranks at 1 GiB, before
# its generator sent each tree's chunks up in order).
run --simulate allreduce --ranks 1024 --bytes 256M --algo tree >"$T/out" 2>&1; rc=$?
ratio=$(awk '$1 == "tree" || $1 == "tree*" {print $6}' "$T/out")
check "simulate: tree on 1024 ranks, 256 MiB: simulated/closed form $ratio within [0.95, 1.3]" \
    awk -v r="$ratio" 'BEGIN { exit !(r != "" && r >= 0.95 && r <= 1.3) }'
run --simulate allreduce --ranks 3 --bytes 8 >"$T/out" 2>&1
check "simulate: on 3 ranks, 8 B, the cost model's choice is the fastest simulated" \
    bash -c "c=\$(sed -n \"s/^\* the cost model's choice: \([a-z_]*\) .*/\1/p\" '$T/out'); grep -q \"^  fastest simulated: \$c \" '$T/out'"

run --simulate reduce_scatter --ranks 5 --bytes 64K --algo ring --alpha 10us --beta 0.1ns \
    --gamma 0.05ns --dtype bfloat16 --op max >"$T/out" 2>&1; rc=$?
check "simulate with --algo and parameters: exit 0" [ $rc -eq 0 ]
check "simulate with --algo: one row" [ "$(grep -c '^ring' "$T/out")" -eq 1 ]
check "simulate: given alpha shown with its source" grep -q '^  alpha *10 us *--alpha' "$T/out"
check "simulate: dtype and op shown" grep -q 'bfloat16, max' "$T/out"

run --simulate allreduce --ranks 64 --bytes 1M --algo ring --max-steps 100 >"$T/out" 2>&1; rc=$?
check "over the step budget: model only" \
    bash -c "[ $rc -eq 0 ] && grep -q 'too large to simulate.*model only' '$T/out'"

run --simulate barrier --ranks 5 >"$T/out" 2>&1; rc=$?
check "simulate barrier: exit 0" [ $rc -eq 0 ]

# ------------------------------------------------------------- measure
run --measure >"$T/out" 2>&1; rc=$?
cat "$T/out"
check "measure: exit 0" [ $rc -eq 0 ]
check "measure: alpha, beta and gamma, measured" \
    bash -c "[ \$(grep -c '^  \(alpha\|beta\|gamma\) .*measured' '$T/out') -eq 3 ]"

# ---------------------------------------------------------- bad options
bad_option() { # description, expected text on stderr, arguments...
    local d=$1 want=$2; shift 2
    run "$@" >"$T/out" 2>"$T/err"; local rc=$?
    if [ $rc -eq 2 ] && grep -q -- "$want" "$T/err"; then ok "$d"
    else bad "$d (exit $rc: $(cat "$T/err"))"; fi
}
bad_option "unknown option named" "unknown option '--frobnicate'" --frobnicate
bad_option "stray argument named" "unexpected argument 'allreduce'" allreduce
bad_option "--ranks 0 named" "--ranks: '0'" --simulate allreduce --ranks 0
bad_option "--ranks without a value named" "--ranks needs a value" --simulate allreduce --ranks
bad_option "--bytes not a size named" "--bytes: 'lots'" --simulate allreduce --bytes lots
bad_option "--bytes not a multiple of the element size" "--bytes: 6 is not a multiple" \
    --simulate allreduce --bytes 6
bad_option "unknown collective named with the valid ones" \
    "--simulate: unknown name 'allsum' (valid: allreduce" --simulate allsum
bad_option "algorithm of another collective named" "--algo: allreduce has no algorithm bruck" \
    --simulate allreduce --algo bruck
bad_option "--alpha not a time named" "--alpha: 'fast'" --simulate allreduce --alpha fast
bad_option "--dtype unknown named" "--dtype: unknown name 'float8'" --simulate allreduce --dtype float8
# Options that would be ignored are refused instead.
bad_option "--hosts with --simulate refused" "--hosts: --simulate estimates N ranks one per host" \
    --simulate allreduce --hosts 2
bad_option "--bytes without --simulate refused" "--bytes is an option of --simulate" --bytes 1M
bad_option "--alpha= without --simulate refused" "--alpha is an option of --simulate" --alpha=20us

run --help >"$T/out" 2>&1; rc=$?
check "--help: exit 0 and the options" bash -c "[ $rc -eq 0 ] && grep -q -- '--simulate COLL' '$T/out'"
run --version >"$T/out" 2>&1; rc=$?
check "--version: exit 0" bash -c "[ $rc -eq 0 ] && grep -q '^loom-info (Loom) ' '$T/out'"
finish
