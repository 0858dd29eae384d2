#!/bin/bash
# The device-direct collectives (allreduce, reduce_scatter, allgather,
# broadcast, reduce) between the ranks of one host, through CUDA IPC (src/comm/devpeer.c), on a machine without a GPU:
# tests/gpu/cuda_fake.c, built here as libcuda.so.1, shares its "device
# memory" between processes (memfd) and runs the kernels on the CPU
# (see mp_devpeer.c for what is checked).
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/lib_fake.sh"
prog=$BUILDDIR/tests/gpu/mp_devpeer
[ -x "$prog" ] || { echo "missing $prog"; exit 99; }
# Built without CUDA (configure --without-cuda, as the sanitizer builds
# are), the library has no device kernels and no CUDA IPC path: every
# device call stages (tests/gpu/test_devbuf.sh covers that).
grep -q '^#define HAVE_CUDA 1' "$BUILDDIR/config.h" 2>/dev/null || {
    echo "built without CUDA's device kernels: no CUDA IPC path to test: skipping"
    exit 77
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! fake_cuda "$tmp/cuda" || ! fake_cuda "$tmp/old" -DFAKE_NO_IPC; then
    bad "build the fake libcuda.so.1"
    finish
fi
# run DRIVER N MODE [ARGS]: the ranks' output in $out, status in $rc.
run() {
    local drv=$1 n=$2
    shift 2
    out=$(LD_LIBRARY_PATH=$tmp/$drv${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        LOOM_TIMEOUT=${TO:-20000} timeout 120 "$LOOMRUN" -n "$n" --timeout 100 "$prog" "$@" 2>&1)
    rc=$?
}
show() { [ $rc = 0 ] || echo "$out" | grep -v ': ok$' | head -20
         [ -n "${LOOM_TEST_VERBOSE:-}" ] && echo "$out"; true; }

for n in 2 3 4; do
    run cuda $n all
    check "allreduce, reduce_scatter, allgather, broadcast, reduce through CUDA IPC, every dtype x op, in place, odd counts, every root, $n ranks: device kernels and copies, no staging (exit $rc)" \
        [ $rc = 0 ]
    show
done
for n in 2 3; do
    LOOM_CUDA_IPC=0 run cuda $n all
    check "LOOM_CUDA_IPC=0: the same results, staged, no kernel, $n ranks (exit $rc)" [ $rc = 0 ]
    show
done
EXPECT=staged run old 3 all
check "a driver without IPC functions: staged, the same results (exit $rc)" [ $rc = 0 ]
show
run cuda 3 ipcfail
check "one rank's cuIpcGetMemHandle fails: every rank stages, the same results (exit $rc)" \
    [ $rc = 0 ]
show
# A rank passing host memory while the others pass device memory: every
# rank must come back (an error or the right result) within the deadline.
start=$(date +%s)
TO=5000 run cuda 3 mixed
el=$(( $(date +%s) - start ))
check "host buffers on one rank, device on the others: every rank returns in ${el}s (< 30 s) without a wrong result (exit $rc)" \
    [ $rc -lt 124 ] && [ $el -lt 30 ] && [ "$(echo "$out" | grep -c ': ok$')" = 3 ]
show
# A rank SIGKILLed in its kernel launch, between the exchange and the
# first barrier: the others must fail, well within LOOM_TIMEOUT.
for n in 2 4; do
    rm -rf "$tmp/out"
    LD_LIBRARY_PATH=$tmp/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} LOOM_TIMEOUT=20000 \
        timeout 120 "$LOOMRUN" -n $n --keep-going --timeout 100 --output "$tmp/out" \
        "$prog" kill 15000 >/dev/null 2>&1
    good=0
    for r in $(seq 0 $((n - 2))); do
        grep -q ': ok after' "$tmp/out/rank.$r.out" 2>/dev/null && good=$((good + 1))
    done
    check "rank $((n - 1)) of $n killed mid-call: the $((n - 1)) others fail within 15 s" \
        [ $good = $((n - 1)) ]
    [ $good = $((n - 1)) ] || head -5 "$tmp"/out/rank.*.out "$tmp"/out/rank.*.err 2>/dev/null
    [ -n "${LOOM_TEST_VERBOSE:-}" ] && cat "$tmp"/out/rank.*.out
done
finish
