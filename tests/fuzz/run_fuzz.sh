#!/bin/sh
# make fuzz: run each libFuzzer harness for FUZZ_SECONDS on a copy of its
# seed corpus (tests/fuzz/corpus/<harness>) and of the crashes already
# found (tests/fuzz/crashes/<harness>); fail if any harness crashes, and
# leave the input that did in tests/fuzz/found/ (to be fixed, then saved
# under tests/fuzz/crashes/<harness>/ as a regression test).
# Usage: run_fuzz.sh SRCDIR SECONDS HARNESS... (the built fuzz_HARNESS
# programs in tests/fuzz of the current directory).
set -u
src=$1 secs=$2
shift 2
status=0
mkdir -p tests/fuzz/found tests/fuzz/run
for h in "$@"; do
    bin=tests/fuzz/fuzz_$h
    work=tests/fuzz/run/$h
    rm -rf "$work" && mkdir -p "$work"
    for d in "$src/tests/fuzz/corpus/$h" "$src/tests/fuzz/crashes/$h"; do
        [ -d "$d" ] && cp "$d"/* "$work"/ 2>/dev/null
    done
    log=tests/fuzz/run/$h.log
    # Each input must finish in 10 s and 2 GB resident; no leak check (a
    # peer's bytes cannot leak, and the harnesses build and free whole
    # objects).  One allocation may be as large as the transports' budget
    # for early messages (2 GiB, reserved at the header, filled as bytes
    # come): libFuzzer's malloc limit, the rss limit by default, would
    # call that an out-of-memory.
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=4096 -max_len=65536 \
            -print_final_stats=1 -artifact_prefix="tests/fuzz/found/$h-" "$work" >"$log" 2>&1
    rc=$?
    done_line=$(grep '^#[0-9]*.*DONE' "$log" | tail -1)
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    cov=$(echo "$done_line" | sed -n 's/.*\(cov: [0-9]* ft: [0-9]*\).*/\1/p')
    if [ $rc -ne 0 ]; then
        status=1
        echo "FAIL fuzz_$h (exit $rc): see $log and tests/fuzz/found/"
        grep -A30 '^==[0-9]*==ERROR\|runtime error' "$log" | head -40
    else
        echo "ok   fuzz_$h: ${runs:-?} runs in ${secs} s (${eps:-?}/s), ${cov:-cov ?}"
    fi
done
exit $status
