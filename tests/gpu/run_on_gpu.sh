#!/bin/bash
# tests/gpu/run_on_gpu.sh [BUILDDIR] - on a machine with a GPU (no
# network needed), from a copy of the repository: autogen, configure
# --with-cuda, build, then
#   - the GPU suite (tests/gpu/gpu_suite: driver, devices, the device
#     kernels of every datatype x op against the CPU ones, throughput);
#   - the tests around it (memkind, devbuf on the fake driver, layers, api);
#   - every collective on real device memory (tests/gpu/mp_gpu all:
#     cuMemAlloc'd buffers, small ones staged whole and large ones
#     pipelined, checked against a CPU reference), 2 and 4 processes
#     sharing the GPU over shared memory, 2 over TCP (blocking calls
#     through CUDA IPC there), and 4 with LOOM_CUDA_IPC=0 (all staged);
#   - a kill test: 4 ranks in allreduces of 64 MiB device buffers, one
#     SIGKILLed in the middle of one: the 3 others must return an error,
#     not hang;
#   - device allreduces of 64 and 256 MiB timed with the pipeline's
#     chunk at 4M, 1M and 0 (staged whole), 2 ranks over shm and tcp,
#     LOOM_CUDA_IPC=0;
#   - where nccl-tests' source is there (NCCL_TESTS_DIR, default
#     third_party/nccl-tests, which git ignores; see tests/gpu/README):
#     its all_reduce_perf built against libloom-nccl (nccl/nccl.h, and
#     libloom-nccl.so.2 as libnccl.so), run on 1 process, every #wrong 0;
# and print one summary: GPU, driver, CUDA version, each step's PASS,
# FAIL or SKIP and time.  Exits 0 when no step failed; 77 at once, with a
# SKIP, where there is no GPU.  Each step is bounded (timeout), so the
# whole stays well under 10 minutes on 16 cores; JOBS=N sets make -j.
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build-gpu}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
nccl_tests=${NCCL_TESTS_DIR:-$src/third_party/nccl-tests}
t0=$SECONDS

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader \
    2>/dev/null | head -1)
if [ -z "$gpu" ]; then
    echo "================ Loom on GPU: summary ================"
    echo "SKIP: no GPU here (nvidia-smi lists none); nothing was built or run"
    exit 77
fi

mkdir -p "$build" || exit 1
build=$(cd "$build" && pwd)
log=$build/run_on_gpu.log
: >"$log"
results=() failed=0

# step NAME LIMIT_S COMMAND...: run it into the log, note PASS / FAIL /
# SKIP (exit 77) and its time.
step() {
    local name=$1 limit=$2 t=$SECONDS rc; shift 2
    echo "=== $name: $*" >>"$log"
    timeout "$limit" "$@" >>"$log" 2>&1; rc=$?
    local what=PASS
    [ $rc = 77 ] && what=SKIP
    [ $rc = 124 ] && what="FAIL (timeout ${limit} s)"
    [ $rc != 0 ] && [ $rc != 77 ] && [ $rc != 124 ] && what="FAIL (exit $rc)"
    [ "$what" = PASS ] || [ "$what" = SKIP ] || failed=1
    results+=("$(printf '%-44s %-20s %4d s' "$name" "$what" $((SECONDS - t)))")
    echo "  $name: $what ($((SECONDS - t)) s)" >&2
    return $rc
}
skip() { results+=("$(printf '%-44s %-20s %4s' "$1" "SKIP ($2)" -)"); }

# The kill test: rank 3 kills itself in the middle of an allreduce; the
# others must each report the failure (not hang: loomrun's timeout).
kill_test() {
    local out rc n
    out=$(LOOM_TIMEOUT=30000 ./loomrun -n 4 --keep-going --timeout 150 tests/gpu/mp_gpu kill 2>&1)
    rc=$?
    echo "$out"
    n=$(echo "$out" | grep -c 'failed as it should')
    echo "loomrun exit $rc; $n of 3 surviving ranks returned an error"
    [ $rc != 124 ] && [ "$n" = 3 ]
}

# nccl-tests' all_reduce_perf against libloom-nccl, 1 process, 1 GPU.
nccl_tests_run() {
    local home=$build/nccl-home out=$build/nccl-tests-build cc cuda
    mkdir -p "$home/include" "$home/lib" "$out" || return 1
    cp "$src/nccl/nccl.h" "$home/include/nccl.h" || return 1
    ln -sf "$build/.libs/libloom-nccl.so.2" "$home/lib/libnccl.so" &&
        ln -sf "$build/.libs/libloom-nccl.so.2" "$home/lib/libnccl.so.2" || return 1
    cuda=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
    cc=$(echo "$gpu" | awk -F', ' '{print $4}' | tr -d .)
    [ -n "$cc" ] || cc=90
    make -C "$nccl_tests/src" -j"$jobs" MPI=0 NCCL_HOME="$home" CUDA_HOME="$cuda" \
        BUILDDIR="$out" NVCC_GENCODE="-gencode=arch=compute_$cc,code=sm_$cc" \
        "$out/all_reduce_perf" || return 1
    LD_LIBRARY_PATH=$home/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        "$out/all_reduce_perf" -b 8 -e 128M -f 4 -g 1 -c 1 -n 5 -w 2 >"$out/all_reduce_perf.out" 2>&1
    local rc=$?
    cat "$out/all_reduce_perf.out"
    [ $rc = 0 ] || return 1
    # every data line: out-of-place #wrong ($(NF-4)) and in-place ($NF) 0
    awk '/^ *[0-9]+ +[0-9]+ +[a-z0-9]+ /{ n++; if ($(NF-4) != "0" || ($NF != "0" && $NF != "N/A")) bad++ }
         END { printf "nccl-tests: %d sizes, %d with #wrong != 0\n", n, bad; exit !(n > 0 && bad == 0) }' \
        "$out/all_reduce_perf.out"
}
export -f kill_test nccl_tests_run
export build src jobs nccl_tests gpu

cd "$src" || exit 1
if [ ! -x configure ]; then step "autogen" 120 ./autogen.sh; fi
cd "$build" || exit 1
built=no
step "configure --with-cuda" 120 "$src/configure" --with-cuda &&
    step "make -j$jobs" 300 make -j"$jobs" &&
    step "build the tests" 300 make -j"$jobs" check TESTS= && built=yes
if [ $built = yes ]; then
    step "gpu suite (kernels, throughput)" 120 tests/gpu/gpu_suite
    step "allreduce via CUDA IPC, 2 ranks/GPU" 120 ./loomrun -n 2 --timeout 100 tests/gpu/gpu_ipc_bw 256
    # Here the suite must run: a skip (no driver, no GPU) fails the run.
    grep -q '^skipped: ' "$log" && failed=1
    step "make check (gpu, memkind, devbuf, layers, api)" 240 make check \
        TESTS="tests/gpu/gpu_suite tests/gpu/test_memkind.sh tests/gpu/test_devbuf.sh tests/tools/test_layers.sh tests/unit/test_api"
    step "collectives on device memory, 2 ranks shm" 180 \
        env LOOM_TRANSPORT=shm ./loomrun -n 2 --timeout 170 tests/gpu/mp_gpu all
    step "collectives on device memory, 4 ranks shm" 180 \
        env LOOM_TRANSPORT=shm ./loomrun -n 4 --timeout 170 tests/gpu/mp_gpu all
    step "collectives on device memory, 2 ranks tcp" 180 \
        env LOOM_TRANSPORT=tcp ./loomrun -n 2 --timeout 170 tests/gpu/mp_gpu all
    # On one host blocking calls go through CUDA IPC; staged (and
    # pipelined) here:
    step "collectives on device memory, staged, 4 ranks" 180 env LOOM_CUDA_IPC=0 \
        LOOM_TRANSPORT=shm ./loomrun -n 4 --timeout 170 tests/gpu/mp_gpu all
    step "kill one of 4 ranks mid-allreduce (device)" 170 bash -c kill_test
    # GPUDirect RDMA: whether the driver exports device memory as a
    # dmabuf and the NIC registers it (ibv_reg_dmabuf_mr), or which
    # reason sends device buffers through host staging; skipped (77)
    # where no verbs device exists.
    step "GPUDirect RDMA: device memory with the NIC (dmabuf), 2 ranks verbs" 120 \
        env LOOM_TRANSPORT=verbs LOOM_CUDA_IPC=0 LOOM_DEBUG=info ./loomrun -n 2 --timeout 100 \
        tests/gpu/gpudirect real
    # Figures: the pipelined staging against whole staging, 2 ranks
    # sharing the GPU (timed on this machine, one run each).
    for tr in shm tcp; do
        for ch in 4M 1M 0; do
            step "bench allreduce, $tr, pipeline chunk $ch" 90 env LOOM_CUDA_IPC=0 LOOM_TRANSPORT=$tr \
                LOOM_CUDA_PIPELINE_CHUNK=$ch ./loomrun -n 2 --timeout 80 tests/gpu/mp_gpu bench
        done
    done
    if [ -f "$nccl_tests/src/all_reduce.cu" ]; then
        step "nccl-tests all_reduce_perf on libloom-nccl" 300 bash -c nccl_tests_run
    else
        skip "nccl-tests all_reduce_perf on libloom-nccl" "no $nccl_tests"
    fi
else
    skip "everything after the build" "the build failed"
fi

cudaver=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -1)
nvccver=$(nvcc --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p')
echo
echo "================ Loom on GPU: summary ================"
echo "commit:        $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "gpu:           $gpu (name, driver, memory, compute capability)"
echo "cuda:          driver API ${cudaver:-unknown}, nvcc ${nvccver:-not found}"
echo "suite:         $(grep -m1 -E '^(gpu|skipped): ' "$log" || echo 'did not run')"
echo "gpudirect:     $(grep -E '^gpudirect (driver|path|alltoall|skipped|FAIL)' "$log" | sort -u | tr '\n' ';')"
echo "build:         cuda $(grep -m1 '^  cuda: ' "$log" | sed 's/^  cuda: *//')"
printf '%s\n' "${results[@]}"
grep '^bench ' "$log" || echo "(no benchmark ran)"
grep -h '^nccl-tests: ' "$log"
grep -h -E '^(rank [0-9]+: )?FAIL' "$log" | head -20
grep -E '^(# )?(PASS|FAIL|SKIP|XFAIL|ERROR|TOTAL):' "$log" | tail -8
echo "total: $((SECONDS - t0)) s; full log: $log"
[ $failed = 0 ]
