#!/bin/bash
# tests/gpu/run_on_gpu.sh [BUILDDIR] - on a machine with a GPU (no
# network needed): from a fresh checkout, autogen, configure --with-cuda,
# build, run the GPU suite (tests/gpu/gpu_suite: driver, devices, the
# device kernels of every datatype x op against the CPU ones, their
# throughput against cuMemcpyDtoD) and the tests around it, then print
# one summary: the GPU, driver and CUDA versions, each step's result and
# time, the benchmark lines.  Exits 0 when every step passed.  Each step
# is bounded (timeout), so the whole stays well under 10 minutes; the
# build is the long part (make -j on all cores; JOBS=N to choose).
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build-gpu}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 4)}
mkdir -p "$build" || exit 1
build=$(cd "$build" && pwd)
log=$build/run_on_gpu.log
: >"$log"
t0=$SECONDS
results=() failed=0

# step NAME LIMIT_S COMMAND...: run it into the log, note result and time.
step() {
    local name=$1 limit=$2 t=$SECONDS rc; shift 2
    echo "=== $name: $*" >>"$log"
    timeout "$limit" "$@" >>"$log" 2>&1; rc=$?
    local what=ok
    [ $rc = 77 ] && what=SKIP
    [ $rc = 124 ] && what="TIMEOUT (${limit} s)"
    [ $rc != 0 ] && [ $rc != 77 ] && [ $rc != 124 ] && what="FAIL (exit $rc)"
    [ "$what" = ok ] || [ "$what" = SKIP ] || failed=1
    results+=("$(printf '%-34s %-16s %4d s' "$name" "$what" $((SECONDS - t)))")
    echo "  $name: $what ($((SECONDS - t)) s)" >&2
    return $rc
}

cd "$src" || exit 1
if [ ! -x configure ]; then step "autogen" 120 ./autogen.sh; fi
cd "$build" || exit 1
step "configure --with-cuda" 120 "$src/configure" --with-cuda &&
    step "make -j$jobs" 300 make -j"$jobs" &&
    step "build the tests" 300 make -j"$jobs" check TESTS= &&
    step "gpu suite (kernels, throughput)" 120 tests/gpu/gpu_suite
step "allreduce via CUDA IPC, 2 ranks/GPU" 120 ./loomrun -n 2 --timeout 100 tests/gpu/gpu_ipc_bw 256
# Here the suite must run: a skip (no driver, no GPU) fails the run.
grep -q '^skipped: ' "$log" && failed=1
step "make check (gpu, memkind, layers, api)" 180 make check \
    TESTS="tests/gpu/gpu_suite tests/gpu/test_memkind.sh tests/tools/test_layers.sh tests/unit/test_api"

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)
echo
echo "================ Loom on GPU: summary ================"
echo "commit:        $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)"
echo "gpu (nvidia-smi): ${gpu:-nvidia-smi not found}"
echo "suite:         $(grep -m1 -E '^(gpu|skipped): ' "$log" || echo 'did not run')"
echo "build:         cuda $(grep -m1 '^  cuda: ' "$log" | sed 's/^  cuda: *//')"
printf '%s\n' "${results[@]}"
grep '^bench ' "$log" || echo "(no benchmark ran)"
grep -h '^FAIL' "$log" | head -20
grep -E '^(# )?(PASS|FAIL|SKIP|XFAIL|ERROR|TOTAL):' "$log" | tail -8
echo "total: $((SECONDS - t0)) s; full log: $log"
[ $failed = 0 ]
