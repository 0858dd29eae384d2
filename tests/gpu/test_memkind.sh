#!/bin/bash
# What memory a buffer is, and device buffers refused at the collectives'
# door where the driver cannot stage them (tests/gpu/memkind.c), on a
# machine without a GPU: once with tests/mp/cuda_stub.c standing in for
# libcuda.so.1 (it calls the buffers it marks device or managed memory,
# and has no cuMemAllocHost), once with no driver at all.  Staged device
# buffers: test_devbuf.sh.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/gpu/memkind
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir -p "$tmp/cuda"
if ${CC:-cc} -shared -fPIC -Wl,-soname,libcuda.so.1 "$SRCDIR/tests/mp/cuda_stub.c" \
        -o "$tmp/cuda/libcuda.so.1"; then
    out=$(LD_LIBRARY_PATH=$tmp/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 60 \
        "$prog" stub 2>&1); rc=$?
    check "stand-in driver without cuMemAllocHost: device buffers refused naming them, managed and host used (exit $rc): $(tail -1 <<<"$out")" \
        [ $rc = 0 ]
    [ $rc = 0 ] || echo "$out" | grep -v '^ok'
else
    bad "build the stand-in libcuda.so.1"
fi
out=$(timeout 60 "$prog" nodriver 2>&1); rc=$?
if [ $rc = 77 ]; then
    echo "a CUDA driver is installed here: the no-driver case is not checked ($(tail -1 <<<"$out"))"
else
    check "no driver: every buffer is host memory (exit $rc): $(tail -1 <<<"$out")" [ $rc = 0 ]
    [ $rc = 0 ] || echo "$out" | grep -v '^ok'
fi
finish
