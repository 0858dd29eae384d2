#!/bin/bash
# NCCL's API over Loom (libloom-nccl, loom-nccl(7)): tests/mp/nccl_prog.c,
# a program written against nccl.h alone with host buffers, run by real
# ranks that pass the ncclUniqueId through a file:
#  - every collective, send/recv rings in (nested) groups, PreMulSum and
#    the refused calls, on 2 and 4 ranks over shared memory and TCP;
#  - ranks passing different counts, a rank that dies (ncclRemoteError,
#    ncclCommGetAsyncError, ncclCommAbort returning at once), an abort
#    while another thread waits in a call (refused: Loom cannot interrupt);
#  - ncclCommInitAll: several ranks in one process, driven by one thread,
#    and two processes each creating two ranks in one group;
#  - device buffers: refused where the driver (tests/mp/cuda_stub.c)
#    lacks what staging needs; staged, with the stream synchronised
#    first, over tests/gpu/cuda_fake.c (nccl_devbuf.c), 2 and 4 ranks;
#  - installed: the same source built with `cc -lnccl` against the
#    installed libnccl.so, and a binary linked against another library
#    whose soname is libnccl.so.2 (as one built with NVIDIA's is), run
#    over the installed libnccl.so.2 through LD_LIBRARY_PATH alone.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/nccl_prog
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export LOOM_TIMEOUT=${LOOM_TIMEOUT:-60000}

# job NAME EXPECT_RC MODE N PROG [env...]: N ranks of PROG MODE; every rank
# must exit EXPECT_RC ("3" for the last rank of kill: it dies with 3).
job() {
    local name=$1 mode=$2 n=$3 bin=$4; shift 4
    local id=$tmp/id.$RANDOM pids=() r rc fails=0 out
    for ((r = 0; r < n; r++)); do
        env "$@" timeout 120 "$bin" "$mode" "$r" "$n" "$id" >"$tmp/out.$r" 2>&1 &
        pids+=($!)
    done
    for ((r = 0; r < n; r++)); do
        wait "${pids[$r]}"; rc=$?
        local want=0
        [ "$mode" = kill ] && [ $r -eq $((n - 1)) ] && want=3
        [ $rc -eq $want ] || { fails=$((fails + 1)); echo "  rank $r exit $rc (want $want)"; }
    done
    out=$(cat "$tmp"/out.*)
    if [ $fails -eq 0 ] && ! grep -q FAIL <<<"$out"; then
        ok "$name: $(grep -m1 'passed,' "$tmp/out.0")"
    else
        bad "$name"; echo "$out" | grep -E 'FAIL|passed' | head -20
    fi
    rm -f "$tmp"/out.*
}

# On the public API alone: every Loom symbol libloom-nccl uses is one
# loom.h declares, and its sources include no other Loom header.
objs=$(find "$BUILDDIR/nccl" -name '*.o' ! -path '*/.libs/*')
used=$(for o in $objs; do nm -u "$o"; done | awk '$2 ~ /^loom/ { print $2 }' | sort -u)
hidden=$(for f in $used; do grep -q "[ *]$f(" "$SRCDIR/include/loom.h" || echo "$f"; done)
incl=$(grep -h '#include "' "$SRCDIR"/nccl/*.[ch] | grep -v -e '"loom.h"' -e '"nccl/' || true)
check "libloom-nccl uses $(wc -w <<<"$used") loom_* calls, all in loom.h${hidden:+ (not: $hidden)}${incl:+ (includes: $incl)}" \
    bash -c '[ -n "$1" ] && [ -z "$2" ] && [ -z "$3" ]' _ "$used" "$hidden" "$incl"

# nccl.h alone, as C99 and C++11, and with CUDA's runtime header before
# or after it (their cudaStream_t is the same type), where CUDA is here.
cat >"$tmp/h.c" <<'C'
#include <nccl.h>
int main(void)
{
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    cudaStream_t s = NULL;
    int v = 0;
    return ncclGetVersion(&v) != ncclSuccess || v != NCCL_VERSION_CODE || c.size != sizeof c ||
           ncclAllReduce(&v, &v, 1, ncclInt, ncclSum, NULL, s) != ncclInvalidArgument;
}
C
cp "$tmp/h.c" "$tmp/h.cc"
hflags="-Wall -Wextra -Werror -pedantic -I$SRCDIR/nccl"
# shellcheck disable=SC2086 # flags are words
out=$(${CC:-cc} -std=c99 $hflags -fsyntax-only "$tmp/h.c" 2>&1 &&
      ${CXX:-c++} -std=c++11 $hflags -fsyntax-only "$tmp/h.cc" 2>&1)
check "nccl.h compiles alone as C99 and C++11" [ $? = 0 ]
[ -z "$out" ] || echo "$out" | head -5
cuda=${CUDA_HOME:-/usr/local/cuda}/include
if [ -f "$cuda/cuda_runtime.h" ]; then
    for order in before after; do
        for lang in c cc; do
            hdr=cuda_runtime_api.h std=c11 comp=${CC:-cc}
            [ $lang = cc ] && hdr=cuda_runtime.h std=c++14 comp=${CXX:-c++}
            if [ $order = before ]; then printf '#include <%s>\n' $hdr; cat "$tmp/h.c"
            else cat "$tmp/h.c"; printf '#include <%s>\n' $hdr; fi >"$tmp/hc.$lang"
            # shellcheck disable=SC2086
            out=$($comp -std=$std $hflags -I"$cuda" -fsyntax-only "$tmp/hc.$lang" 2>&1)
            check "nccl.h with CUDA's $hdr $order it ($std)" [ $? = 0 ]
            [ -z "$out" ] || echo "$out" | head -5
        done
    done
else
    echo "no $cuda/cuda_runtime.h: nccl.h not tried beside CUDA's headers"
fi

for t in "" tcp; do
    for n in 2 4; do
        job "every call on $n ranks${t:+ over $t}" run "$n" "$prog" LOOM_TRANSPORT=$t
    done
done
job "mismatched counts on 3 ranks" mismatch 3 "$prog"
job "2 processes of 2 ranks, each pair created in one group" pair 2 "$prog"
job "... over tcp" pair 2 "$prog" LOOM_TRANSPORT=tcp
job "a rank dies, 3 ranks" kill 3 "$prog"
job "ncclCommAbort while another thread waits in a call" abortbusy 2 "$prog"
job "a rank dies, 3 ranks over tcp" kill 3 "$prog" LOOM_TRANSPORT=tcp
out=$(timeout 60 "$prog" initall 3 2>&1); rc=$?
check "ncclCommInitAll: 3 ranks in one process (exit $rc): $(tail -1 <<<"$out")" \
    bash -c '[ "$1" = 0 ] && grep -q "3 passed, 0 failed" <<<"$2"' _ "$rc" "$out"
# NCCL_DEBUG=WARN prints the reason of a refusal.
out=$(NCCL_DEBUG=WARN timeout 60 "$prog" initall 0 2>&1); rc=$?
check "ncclCommInitAll(ndev 0) under NCCL_DEBUG=WARN: refused, a WARN line names ndev (exit $rc)" \
    bash -c '[ "$1" = 0 ] && grep -q "NCCL WARN ncclCommInitAll: ndev 0" <<<"$2"' _ "$rc" "$out"
out=$(timeout 60 "$prog" initall 0 2>&1)
check "... and nothing on stderr without NCCL_DEBUG" bash -c '! grep -q "NCCL WARN" <<<"$1"' _ "$out"

# Device memory, where CUDA's driver is loaded: a stand-in for
# libcuda.so.1 says which buffers are device memory.
mkdir -p "$tmp/cuda"
if ${CC:-cc} -shared -fPIC -Wl,-soname,libcuda.so.1 "$SRCDIR/tests/mp/cuda_stub.c" \
        -o "$tmp/cuda/libcuda.so.1"; then
    out=$(LD_LIBRARY_PATH=$tmp/cuda${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 60 \
        "$BUILDDIR/tests/mp/nccl_devptr" 2>&1); rc=$?
    check "device buffers refused, host and managed ones used (exit $rc): $(tail -1 <<<"$out")" \
        [ $rc = 0 ]
    [ $rc = 0 ] || echo "$out" | tail -12
    out=$(timeout 60 "$BUILDDIR/tests/mp/nccl_devptr" 2>&1); rc=$?
    check "without a CUDA driver the device check is not made (exit $rc)" [ $rc = 77 ]
else
    bad "build the stand-in libcuda.so.1"
fi
# Device buffers and streams: tests/gpu/cuda_fake.c as libcuda.so.1 keeps
# "device memory" in host memory and carries out copies queued on a
# stream only when the stream is synchronised (nccl_devbuf.c).
mkdir -p "$tmp/fake"
if ${CC:-cc} -shared -fPIC -Wl,-soname,libcuda.so.1 "$SRCDIR/tests/gpu/cuda_fake.c" \
        -o "$tmp/fake/libcuda.so.1"; then
    for t in "" tcp; do
        for n in 2 4; do
            job "device buffers and a stream (fake driver), $n ranks${t:+ over $t}" dev "$n" \
                "$BUILDDIR/tests/mp/nccl_devbuf" LOOM_TRANSPORT=$t \
                LD_LIBRARY_PATH="$tmp/fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        done
    done
else
    bad "build the fake libcuda.so.1"
fi

# ------------------------------------------------------------- installed
if [ "$(sed -n "s/^build_libtool_libs=//p" "$BUILDDIR/libtool" 2>/dev/null | head -1)" = no ]; then
    echo "static-only build: no libnccl.so.2 to install"
    finish; exit
fi
dest=$tmp/dest
out=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL ${MAKE:-make} -s -C "$BUILDDIR" DESTDIR="$dest" \
    install-libLTLIBRARIES install-includeHEADERS install-nccl-links 2>&1)
rc=$?
so=$(find "$dest" -name libnccl.so.2 | head -1)
hdr=$(find "$dest" -name nccl.h | head -1)
check "make install: libnccl.so.2 -> $(readlink "$so" 2>/dev/null), nccl.h (exit $rc)" \
    bash -c '[ "$1" = 0 ] && [ -L "$2" ] && [ -e "$2" ] && [ -f "$3" ] && [ -L "$(dirname "$2")/libnccl.so" ]' \
    _ "$rc" "$so" "$hdr"
[ -n "$so" ] && [ -n "$hdr" ] || { echo "$out" | tail -5; finish; exit; }
libdir=$(dirname "$so")
cc=${LOOM_TEST_CC:-cc}
# (LD_LIBRARY_PATH lets the linker find libloom.so.0 too: the installed
# libraries' runpath is the configured libdir, not DESTDIR.)
out=$(LD_LIBRARY_PATH=$libdir $cc -std=c11 -Wall -Wextra -Werror -I"$(dirname "$hdr")" "$SRCDIR/tests/mp/nccl_prog.c" \
    -o "$tmp/prog_installed" -L"$libdir" -lnccl -lm -pthread 2>&1)
check "nccl_prog.c builds with -I<include> -lnccl against the installed library" [ $? = 0 ]
[ -x "$tmp/prog_installed" ] || echo "$out" | tail -5
if [ -x "$tmp/prog_installed" ]; then
    job "installed (-lnccl), 2 ranks, LD_LIBRARY_PATH" run 2 "$tmp/prog_installed" \
        LD_LIBRARY_PATH="$libdir"
fi
# A binary that needs libnccl.so.2 by that name: linked against a stand-in
# whose soname is libnccl.so.2, then run over the installed library.
mkdir -p "$tmp/stub"
nm -D --defined-only "$so" | awk '$3 ~ /^p?nccl/ { print "void " $3 "(void) {}" }' >"$tmp/stub/stub.c"
$cc -shared -fPIC -Wl,-soname,libnccl.so.2 "$tmp/stub/stub.c" -o "$tmp/stub/libnccl.so.2" &&
    ln -s libnccl.so.2 "$tmp/stub/libnccl.so" &&
    LD_LIBRARY_PATH=$libdir $cc -I"$(dirname "$hdr")" "$SRCDIR/tests/mp/nccl_prog.c" -o "$tmp/prog_nv" \
        -L"$tmp/stub" -lnccl -lm -pthread
needed=$(readelf -d "$tmp/prog_nv" 2>/dev/null | sed -n 's/.*NEEDED.*\[\(libnccl[^]]*\)\].*/\1/p')
loaded=$(LD_LIBRARY_PATH=$libdir ldd "$tmp/prog_nv" 2>/dev/null | awk '$1 == "libnccl.so.2" { print $3 }')
check "a binary needing $needed loads $loaded from LD_LIBRARY_PATH" \
    bash -c '[ "$1" = libnccl.so.2 ] && [ "$(dirname "$2")" = "$3" ]' _ "$needed" "$loaded" "$libdir"
[ -x "$tmp/prog_nv" ] && job "that binary, 2 ranks over tcp" run 2 "$tmp/prog_nv" \
    LD_LIBRARY_PATH="$libdir" LOOM_TRANSPORT=tcp
finish
