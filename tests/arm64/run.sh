#!/bin/bash
# tests/arm64/run.sh - cross-build Loom for arm64 (Debian's
# aarch64-linux-gnu toolchain) and run a quick subset of its tests under
# qemu-user: .ci/run's arm64 step, which can be rerun by hand.
#
#   tests/arm64/run.sh [BUILDDIR]      (default: _ci/arm64 in the source tree)
#
# As root it installs what it needs first (LOOM_ARM64_INSTALL=0: don't).
# It fails loudly when something is missing: packages that do not
# install, an emulator that does not run arm64 programs, a build that
# warns.  What it runs, about 5 minutes on 2 cores (a fresh install
# takes longer):
#   - the cross build with -Werror (library, tools, perf binaries and
#     every test program);
#   - every Criterion unit test (tests/unit);
#   - tests/mp/test_allreduce.sh (every datatype and op, counts 0 to about
#     a million, on 1-5 and 8 ranks; several streams, the engine and the
#     shared allreduce; ranks that made different calls or algorithms,
#     over shared memory and TCP);
#   - mp_p2p (point-to-point, groups, barrier) on 1-4 ranks over shared
#     memory and 2-4 over TCP;
#   - all_reduce_perf -c 1 on 4 ranks over shared memory and over TCP,
#     every #wrong 0, and one rank started from LOOM_ROOT/LOOM_RANK/
#     LOOM_SIZE alone.
# Ends with "N passed, M failed".
#
# Left out: tests/mp/test_shm.sh and mp_shm, which assert single-copy
# transfers (process_vm_readv), which qemu-user does not implement
# (ENOSYS): under it the shared-memory transport moves everything
# through its FIFO cells, the fallback it takes wherever the kernel
# refuses single copy, and the tests above run over that; and the
# tests that time things or kill ranks, too slow or too timing-bound
# under emulation for CI's budget.
#
# The programs run through binfmt_misc (qemu-user-binfmt), so that
# loomrun's ranks, which it starts with posix_spawn, are emulated too;
# the step mounts binfmt_misc and registers qemu-aarch64 when it can.
# They use the arm64 C library of libc6:arm64 (/lib/ld-linux-aarch64.so.1
# with /lib/aarch64-linux-gnu/libc.so.6).  Not `qemu-aarch64 -L
# /usr/aarch64-linux-gnu` (QEMU_LD_PREFIX): that takes the dynamic loader
# of the cross toolchain's libc6-arm64-cross while the loader's cache
# still finds libc6:arm64's libc.so.6, and where the two packages'
# versions differ (2.36-8cross1 and 2.36-9+deb12u14 on Debian 12) they
# disagree on the layout of the loader's shared data: the first
# pthread_create walks the stack cache list at the wrong offset forever,
# which looked like Loom hanging after the rendezvous root listens.
set -u
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/_ci/arm64}
host=aarch64-linux-gnu
multi=/usr/lib/$host
die() { echo "arm64: $*" >&2; echo "0 passed, 1 failed"; exit 1; }
say() { echo "--- arm64: $*"; }
t_start=$SECONDS
unset QEMU_LD_PREFIX

# ------------------------------------------------------------ packages
# libcriterion-dev:arm64 cannot sit beside libcriterion-dev:amd64 (which
# the native build needs): neither it, libcriterion3 nor libnanomsg5
# (another version on arm64) is co-installable, and apt would remove the
# amd64 ones.  Their arm64 files are unpacked into the build directory
# instead (apt-get download, dpkg-deb -x); libgit2 and libffi are
# Multi-Arch: same and install normally.
if [ "$(id -u)" = 0 ] && [ "${LOOM_ARM64_INSTALL:-1}" != 0 ]; then
    say "installing the cross toolchain, arm64 libraries and qemu-user"
    export DEBIAN_FRONTEND=noninteractive
    dpkg --add-architecture arm64 || die "dpkg --add-architecture arm64 failed"
    apt-get update -qq >/dev/null || die "apt-get update failed"
    apt-get install -y -qq --no-remove crossbuild-essential-arm64 libhwloc-dev:arm64 \
        libssl-dev:arm64 libgit2-1.5:arm64 libffi8:arm64 qemu-user qemu-user-binfmt >/dev/null ||
        die "apt-get install of the arm64 packages failed"
fi
command -v $host-gcc >/dev/null || die "$host-gcc not found (crossbuild-essential-arm64)"
[ -e /lib/ld-linux-aarch64.so.1 ] || die "/lib/ld-linux-aarch64.so.1 missing (libc6:arm64)"
[ -e $multi/libhwloc.so ] || die "libhwloc-dev:arm64 is not installed"
[ -e $multi/libcrypto.so ] || die "libssl-dev:arm64 is not installed"

mkdir -p "$build" || die "cannot create $build"
build=$(cd "$build" && pwd)
crit=$build/criterion
clib=$crit/usr/lib/$host
if [ ! -e "$clib/libcriterion.so" ] || [ ! -e "$clib/libnanomsg.so.5" ]; then
    say "unpacking Criterion for arm64 into $crit"
    rm -rf "$crit" && mkdir -p "$crit/debs" || die "cannot create $crit"
    # As root apt-get download warns that _apt cannot write here: harmless.
    (cd "$crit/debs" && apt-get download libcriterion3:arm64 libcriterion-dev:arm64 \
        libnanomsg5:arm64 2>&1 | grep -v '^W: Download is performed unsandboxed') ||
        die "apt-get download of Criterion for arm64 failed"
    for d in "$crit"/debs/*.deb; do dpkg-deb -x "$d" "$crit" || die "dpkg-deb -x $d failed"; done
    [ -e "$clib/libcriterion.so" ] && [ -e "$clib/libnanomsg.so.5" ] ||
        die "Criterion's arm64 files are not where expected ($clib)"
fi

# ------------------------------------------------------------ emulator
bm=/proc/sys/fs/binfmt_misc
if [ ! -e $bm/register ] && [ "$(id -u)" = 0 ]; then
    mount -t binfmt_misc binfmt_misc $bm || die "cannot mount binfmt_misc on $bm"
fi
if [ ! -e $bm/qemu-aarch64 ] && [ -w $bm/register ] && [ -f /usr/lib/binfmt.d/qemu-aarch64.conf ]; then
    say "registering qemu-aarch64 with binfmt_misc"
    cat /usr/lib/binfmt.d/qemu-aarch64.conf >$bm/register || die "cannot register qemu-aarch64"
fi
probe=$build/probe
printf '#include <pthread.h>\n#include <stdio.h>\nstatic void *f(void *a) { return a; }\nint main(void) { pthread_t t; if (pthread_create(&t, 0, f, 0)) return 1; pthread_join(t, 0); puts("arm64 ok"); return 0; }\n' >"$probe.c"
$host-gcc -pthread -o "$probe" "$probe.c" || die "$host-gcc cannot build a program"
[ "$(timeout 20 "$probe" 2>&1)" = "arm64 ok" ] ||
    die "arm64 programs do not run here: binfmt_misc has no working qemu-aarch64 (qemu-user-binfmt; $bm/qemu-aarch64)"

# --------------------------------------------------------------- build
[ -x "$src/configure" ] || (cd "$src" && ./autogen.sh >/dev/null 2>&1) || die "autogen failed"
say "configure --host=$host"
(cd "$build" && "$src/configure" --host=$host \
    LDFLAGS="-Wl,-rpath-link,$multi -Wl,-rpath-link,$clib" \
    CRITERION_CFLAGS="-I$crit/usr/include" \
    CRITERION_LIBS="-L$clib -lcriterion -Wl,--disable-new-dtags,-rpath,$clib" >configure.out 2>&1) ||
    { tail -30 "$build/configure.out"; die "configure failed"; }
sed -n '/^Loom .* configured/,$p' "$build/configure.out"
grep -q 'unit tests: *yes' "$build/configure.out" || die "configure found no Criterion for arm64"
say "make -j2 (with the test programs)"
(cd "$build" && make -j2 >make.out 2>&1 && make -j2 check TESTS= >>make.out 2>&1) ||
    { grep -E 'error|warning' "$build/make.out" | head -30; die "the arm64 build failed"; }
if grep -E '(warning|error):' "$build/make.out" | grep -v 'skipping incompatible'; then
    die "the arm64 build warned"
fi
$host-readelf -h "$build/.libs/libloom.so.0" | grep -q 'Machine: *AArch64' ||
    die "libloom.so.0 is not an arm64 library"
echo "build: $((SECONDS - t_start)) s"

# --------------------------------------------------------------- tests
BUILDDIR=$build
LOOMRUN=$build/loomrun
. "$src/tests/lib.sh"
unit=$(cd "$build" && ls tests/unit/ | grep -E '^test_[a-z_0-9]+$' | sed 's,^,tests/unit/,' | tr '\n' ' ')
mp="tests/mp/test_allreduce.sh"
say "make check: $unit $mp"
(cd "$build" && LOOM_TEST_QUICK=1 make -j2 check TESTS="$unit $mp" >check.out 2>&1)
for t in $unit $mp; do
    res=$(sed -n 's/^:test-result: //p' "$build/$t.trs" 2>/dev/null | head -1)
    case $t in
    tests/unit/*) n=$(grep -o 'Tested: [0-9]*' "$build/$t.log" 2>/dev/null | tail -1) ;;
    *) n=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$build/$t.log" 2>/dev/null | tail -1) ;;
    esac
    if [ "$res" = PASS ]; then ok "$t ($n)"
    else bad "$t: ${res:-not run}"; tail -30 "$build/$t.log" 2>/dev/null; fi
done

# Point-to-point, groups and barrier (mp_p2p.c checks every result), as
# test_p2p.sh runs them, on 1-4 ranks: shared memory, then TCP.
for tr in shm tcp; do
    for n in 1 2 3 4; do
        [ $tr = tcp ] && [ $n -eq 1 ] && continue
        out=$(LOOM_TRANSPORT=$tr timeout 200 "$LOOMRUN" -n $n --timeout 180 \
            "$build/tests/mp/mp_p2p" 2>&1)
        rc=$?
        check "p2p/group/barrier on $n ranks over $tr: $(grep -m1 'rank 0 of' <<<"$out")" [ $rc -eq 0 ]
        [ $rc -eq 0 ] || tail -20 <<<"$out"
    done
done

# all_reduce_perf -c 1: every row's two #wrong columns 0, and the footer.
perf_ok() {
    awk '!/^#/ && NF >= 13 {rows++; if ($9 != 0 || $13 != 0) bad++}
         /Out of bounds values : 0 OK/ {footer = 1}
         END {exit !(rows > 0 && !bad && footer)}' <<<"$1"
}
for tr in shm tcp; do
    out=$(LOOM_TRANSPORT=$tr timeout 200 "$LOOMRUN" -n 4 --timeout 180 "$build/all_reduce_perf" \
        -b 8 -e 4M -f 8 -c 1 2>&1)
    rc=$?
    perf_ok "$out"
    pk=$?
    check "all_reduce_perf -c 1 on 4 ranks over $tr: exit $rc, #wrong 0" [ $rc -eq 0 -a $pk -eq 0 ]
    grep -E '^ +[0-9]|Out of bounds' <<<"$out" | sed 's/^/     /'
    [ $rc -eq 0 ] || tail -20 <<<"$out"
done
# The issue's reproduction: one rank from the environment alone.
port=$((20000 + RANDOM % 20000))
out=$(LOOM_ROOT=127.0.0.1:$port LOOM_RANK=0 LOOM_SIZE=1 timeout 120 \
    "$build/all_reduce_perf" -b 8 -e 64K -f 8 -c 1 2>&1)
rc=$?
perf_ok "$out"
pk=$?
check "all_reduce_perf -c 1 on 1 rank from LOOM_ROOT/LOOM_RANK/LOOM_SIZE: exit $rc" [ $rc -eq 0 -a $pk -eq 0 ]
[ $rc -eq 0 ] || tail -20 <<<"$out"

echo "arm64 step: $((SECONDS - t_start)) s"
finish
