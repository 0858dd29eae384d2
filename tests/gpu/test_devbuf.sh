#!/bin/bash
# Collectives on CUDA device buffers, staged through pinned host memory,
# across real ranks over shared memory and TCP, on a machine without a
# GPU: tests/gpu/cuda_fake.c, built here as libcuda.so.1, keeps "device
# memory" in host memory and carries out copies queued on a stream only
# when the stream is synchronised (see mp_devbuf.c for what is checked).
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/lib_fake.sh"
prog=$BUILDDIR/tests/gpu/mp_devbuf
[ -x "$prog" ] || { echo "missing $prog"; exit 99; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! fake_cuda "$tmp/cuda"; then
    bad "build the fake libcuda.so.1"
    finish
fi
# LOOM_CUDA_IPC=0: the staging path is what this test is about; the
# device-direct allreduce between a host's ranks is test_devpeer.sh's.
export LOOM_CUDA_IPC=0
for tr in shm tcp; do
    for n in 2 3 4; do
        out=$(LD_LIBRARY_PATH=$tmp/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
            LOOM_TRANSPORT=$tr LOOM_TIMEOUT=20000 timeout 120 "$LOOMRUN" -n $n --timeout 100 \
            "$prog" all 2>&1); rc=$?
        check "every collective on device buffers (in place, mixed, blocking, wait, test, wait_all, streams), $n ranks over $tr (exit $rc)" \
            [ $rc = 0 ]
        [ $rc = 0 ] || echo "$out" | grep -v ': ok$' | head -30
        [ -n "${LOOM_TEST_VERBOSE:-}" ] && echo "$out"
        # Large calls pipelined in 4 KiB chunks (LOOM_CUDA_PIPELINE_CHUNK).
        out=$(LD_LIBRARY_PATH=$tmp/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
            LOOM_CUDA_PIPELINE_CHUNK=4096 LOOM_TRANSPORT=$tr LOOM_TIMEOUT=20000 timeout 120 \
            "$LOOMRUN" -n $n --timeout 100 "$prog" pipe 2>&1); rc=$?
        check "pipelined: every dtype and op of allreduce, broadcast, reduce, reduce_scatter, allgather (in place, blocking, wait, test), copies overlapping the collectives, failed copies back undone, $n ranks over $tr (exit $rc)" \
            [ $rc = 0 ]
        [ $rc = 0 ] || echo "$out" | grep -v ': ok$' | head -30
    done
done
# A device whose input copies never finish: the pipelined call fails by
# LOOM_TIMEOUT instead of waiting for them (staged, not CUDA IPC).
out=$(LD_LIBRARY_PATH=$tmp/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} LOOM_CUDA_IPC=0 \
    LOOM_CUDA_PIPELINE_CHUNK=4096 LOOM_TIMEOUT=1500 timeout 60 \
    "$LOOMRUN" -n 2 --timeout 30 "$prog" stuck 2>&1); rc=$?
check "pipelined: input copies that never finish fail by LOOM_TIMEOUT, not a hang (exit $rc)" \
    [ $rc = 0 ]
[ $rc = 0 ] || echo "$out" | head -10
# LOOM_CUDA_PIPELINE_CHUNK=0 turns the pipeline off: the large calls of
# "all" staged whole; a bad value is refused at init, naming it.
out=$(LD_LIBRARY_PATH=$tmp/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} LOOM_CUDA_PIPELINE_CHUNK=0 \
    LOOM_TRANSPORT=shm timeout 120 "$LOOMRUN" -n 2 --timeout 100 "$prog" all 2>&1); rc=$?
check "LOOM_CUDA_PIPELINE_CHUNK=0: whole staging (exit $rc)" [ $rc = 0 ]
out=$(LD_LIBRARY_PATH=$tmp/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} LOOM_CUDA_PIPELINE_CHUNK=lots \
    LOOM_TRANSPORT=shm timeout 60 "$LOOMRUN" -n 2 --timeout 50 "$prog" all 2>&1); rc=$?
refused=no
[ $rc != 0 ] && echo "$out" | grep -q LOOM_CUDA_PIPELINE_CHUNK && refused=yes
check "LOOM_CUDA_PIPELINE_CHUNK=lots refused, naming it (exit $rc)" [ $refused = yes ]
finish
