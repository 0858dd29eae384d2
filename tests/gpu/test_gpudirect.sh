#!/bin/bash
# GPUDirect RDMA's registration of device memory through dmabuf
# (LOOM_GPUDIRECT) on a machine without a GPU or NIC: tests/gpu/gpudirect.c
# with tests/gpu/cuda_fake.c, built here as libcuda.so.1 (and once without
# cuMemGetHandleForAddressRange, an old driver); then the staged device
# collectives (mp_devbuf) under every LOOM_GPUDIRECT value, whose results
# must not change.
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/lib_fake.sh"
prog=$BUILDDIR/tests/gpu/gpudirect
mp=$BUILDDIR/tests/gpu/mp_devbuf
[ -x "$prog" ] && [ -x "$mp" ] || { echo "missing $prog or $mp"; exit 99; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if ! fake_cuda "$tmp/cuda" || ! fake_cuda "$tmp/old" -DFAKE_NO_DMABUF; then
    bad "build the fake libcuda.so.1"
    finish
fi
run() { # dir args...
    local d=$1; shift
    LD_LIBRARY_PATH=$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 60 "$prog" "$@" 2>&1
}
out=$(run "$tmp/cuda" driver); rc=$?
check "the driver's dmabuf of a device range: pages, offsets, every refusal's reason (exit $rc): $(tail -1 <<<"$out")" [ $rc = 0 ]
[ $rc = 0 ] || echo "$out" | grep -v '^ok'
out=$(run "$tmp/old" olddriver); rc=$?
check "a driver without cuMemGetHandleForAddressRange (exit $rc): $(tail -1 <<<"$out")" [ $rc = 0 ]
[ $rc = 0 ] || echo "$out" | grep -v '^ok'
out=$(run "$tmp/cuda" verbs); rc=$?
if [ $rc = 77 ]; then
    echo "built without infiniband/verbs.h: the verbs registration is not checked"
else
    check "verbs: auto / 1 / 0, the registration cache, mem_register (exit $rc): $(tail -1 <<<"$out")" [ $rc = 0 ]
    [ $rc = 0 ] || echo "$out" | grep -v '^ok'
fi
[ -n "${LOOM_TEST_VERBOSE:-}" ] && echo "$out"
for v in auto 0 1; do
    out=$(LOOM_GPUDIRECT=$v run "$tmp/cuda" env); rc=$?
    check "LOOM_GPUDIRECT=$v read (exit $rc)" [ $rc = 0 ]
done
out=$(LOOM_GPUDIRECT=yes run "$tmp/cuda" badenv); rc=$?
check "LOOM_GPUDIRECT=yes refused, naming it (exit $rc): $(tail -1 <<<"$out")" [ $rc = 0 ]
# The device collectives' results under every value: over TCP and shared
# memory no rank has verbs, so every value (1 included: it concerns
# verbs' registrations only) stages, and the results stay right.
for v in auto 0 1; do
    out=$(LD_LIBRARY_PATH=$tmp/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} LOOM_CUDA_IPC=0 \
        LOOM_GPUDIRECT=$v LOOM_TRANSPORT=tcp LOOM_TIMEOUT=20000 timeout 120 "$LOOMRUN" -n 3 \
        --timeout 100 "$mp" all 2>&1); rc=$?
    check "LOOM_GPUDIRECT=$v: every staged device collective right, 3 ranks over tcp (exit $rc)" \
        [ $rc = 0 ]
    [ $rc = 0 ] || echo "$out" | grep -v ': ok$' | head -20
done
finish
