# tests/gpu/lib_fake.sh - sourced by the GPU test scripts (after
# tests/lib.sh): build tests/gpu/cuda_fake.c as libcuda.so.1.
# fake_cuda DIR [CFLAGS...]: DIR/libcuda.so.1, the fake driver built with
# CFLAGS (e.g. -DFAKE_NO_IPC, -DFAKE_NO_DMABUF: an older driver's);
# fails (status 1) when it does not compile.
fake_cuda() {
    local dir=$1; shift
    mkdir -p "$dir" &&
        ${CC:-cc} -shared -fPIC "$@" -Wl,-soname,libcuda.so.1 \
            "$SRCDIR/tests/gpu/cuda_fake.c" -o "$dir/libcuda.so.1"
}
