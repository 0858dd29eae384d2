#!/bin/bash
# run_in_vm.sh - boot a small Linux VM whose kernel has the soft-RoCE
# driver (rdma_rxe), put the built binaries in it, and run a command
# there against a real RDMA device "rxe0" (on a dummy interface d0,
# 10.9.0.1/24, MTU 9000).  By default the command is the verbs suite
# (tests/verbs/vm_suite.sh): the multi-process tests and the perf
# binaries over LOOM_TRANSPORT=verbs.
#
# usage: run_in_vm.sh [-t TIMEOUT_S] [-m MEM_MB] [-c CPUS] [-- COMMAND [ARGS...]]
#   COMMAND runs as root under busybox sh, in /loom, with PATH holding
#   /loom/bin (loomrun, the perf binaries, mp_* tests), ib_write_bw and
#   rdma, and LD_LIBRARY_PATH /loom/lib (libloom).
#
# Environment: BUILDDIR (the build tree; default: two levels above this
# script), SRCDIR, LOOM_VM_CACHE (where the kernel is kept; default
# ~/.cache/loom-rxe-vm), LOOM_VM_KEEP=1 keeps the console log.
#
# Exit status: the command's own; 77 when the VM cannot be had here (no
# qemu-system-x86_64, busybox, cpio, libibverbs provider, or no kernel
# package to download); 99 when the VM booted but no status came back
# (boot failure or timeout).
#
# Needs (Debian): qemu-system-x86 busybox-static cpio rdma-core
# ibverbs-providers libibverbs-dev perftest, and apt access to download one
# linux-image-*-amd64 package (once; kept in the cache).  The VM runs
# under TCG emulation (nested KVM is not assumed): boot takes about 10 s
# and code runs several times slower than on the host.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${BUILDDIR:=$(cd "$here/../.." && pwd)}"
: "${SRCDIR:=$(cd "$here/../.." && pwd)}"
mem=2048 tmo=900 cpus=2
while getopts "t:m:c:" o; do
    case $o in t) tmo=$OPTARG ;; m) mem=$OPTARG ;; c) cpus=$OPTARG ;; *) exit 2 ;; esac
done
shift $((OPTIND - 1))
[[ ${1:-} == -- ]] && shift
skip() { echo "run_in_vm: SKIP: $*" >&2; exit 77; }

# ------------------------------------------------------------ requirements
command -v qemu-system-x86_64 >/dev/null || skip "qemu-system-x86_64 not found (Debian: qemu-system-x86)"
busybox=$(command -v busybox || true)
[[ -n $busybox ]] || skip "busybox not found (Debian: busybox-static)"
file -L "$busybox" 2>/dev/null | grep -q "statically linked" ||
    ldd "$busybox" 2>&1 | grep -q "not a dynamic" || skip "$busybox is not static (Debian: busybox-static)"
command -v cpio >/dev/null || skip "cpio not found"
prov=$(ls /usr/lib/*/libibverbs/librxe-rdmav*.so 2>/dev/null | head -1 || true)
[[ -n $prov ]] || skip "the rxe provider of libibverbs is missing (Debian: ibverbs-providers)"
libibverbs=$(ls /usr/lib/*/libibverbs.so.1 2>/dev/null | head -1 || true)
[[ -n $libibverbs ]] || skip "libibverbs.so.1 not found (Debian: libibverbs1)"
for t in rdma ib_write_bw; do
    command -v $t >/dev/null || skip "$t not found (Debian: rdma-core / perftest)"
done
[[ -x $BUILDDIR/loomrun || -x $BUILDDIR/.libs/loomrun ]] || { echo "run_in_vm: no loomrun in $BUILDDIR (build first)" >&2; exit 99; }

# ------------------------------------------------------------------ kernel
cache=${LOOM_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/loom-rxe-vm}
mkdir -p "$cache"
mods="crypto/crc32_generic net/ipv4/udp_tunnel net/ipv6/ip6_udp_tunnel
      drivers/infiniband/core/ib_core drivers/infiniband/core/ib_uverbs
      drivers/infiniband/sw/rxe/rdma_rxe drivers/net/dummy"
if [[ ! -f $cache/vmlinuz || ! -f $cache/mods/rdma_rxe.ko* ]]; then
    command -v apt-cache >/dev/null && command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
        skip "no kernel in $cache and no apt-get/dpkg to fetch one"
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
    [[ -n $pkg ]] || skip "no linux-image package known to apt (apt-get update?)"
    dl=$(mktemp -d)
    (cd "$dl" && apt-get download "$pkg" >/dev/null 2>&1) || { rm -rf "$dl"; skip "cannot download $pkg"; }
    dpkg -x "$dl"/"$pkg"_*.deb "$dl/kroot" || { rm -rf "$dl"; skip "cannot unpack $pkg"; }
    cp "$dl"/kroot/boot/vmlinuz-* "$cache/vmlinuz.new"
    kmods=$(ls -d "$dl"/kroot/lib/modules/*/kernel)
    rm -rf "$cache/mods" && mkdir -p "$cache/mods"
    for m in $mods; do
        f=$kmods/$m.ko; [[ -f $f ]] || f=$f.xz
        [[ -f $f ]] || { rm -rf "$dl"; skip "$pkg has no $m module"; }
        cp "$f" "$cache/mods/"
    done
    mv "$cache/vmlinuz.new" "$cache/vmlinuz"
    rm -rf "$dl"
fi

# --------------------------------------------------------------- initramfs
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/{bin,proc,sys,dev,tmp,etc/libibverbs.d,mods,run,loom/bin,loom/lib}
cp "$busybox" "$root/bin/busybox"
for a in $("$busybox" --list); do [[ $a == busybox ]] || ln -sf busybox "$root/bin/$a"; done
cp "$cache"/mods/* "$root/mods/"
export LD_LIBRARY_PATH=$BUILDDIR/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
copy_libs() { # the shared libraries of ELF file $1, at their own paths
    ldd "$1" 2>/dev/null | grep -o '/[^ ]*' | while read -r l; do
        case $l in "$BUILDDIR"/*) continue ;; esac # libloom: in /loom/lib
        [[ -e $root$l ]] || { mkdir -p "$root$(dirname "$l")"; cp -L "$l" "$root$l"; }
    done
}
for b in rdma ib_write_bw ib_send_bw; do
    p=$(command -v $b || true)
    [[ -n $p ]] || continue
    cp "$p" "$root/bin/"
    copy_libs "$p"
done
mkdir -p "$root$(dirname "$prov")" "$root$(dirname "$libibverbs")"
cp -L "$prov" "$root$prov"
copy_libs "$prov"
cp -L "$libibverbs" "$root$libibverbs"
copy_libs "$libibverbs"
echo "driver rxe" >"$root/etc/libibverbs.d/rxe.driver"
echo "root:x:0:0:root:/tmp:/bin/sh" >"$root/etc/passwd"
echo "127.0.0.1 localhost" >"$root/etc/hosts"
# Loom's binaries: the real ELF files behind libtool's wrappers.
for b in loomrun loom-info all_reduce_perf reduce_scatter_perf all_gather_perf alltoall_perf broadcast_perf \
    reduce_perf gather_perf scatter_perf sendrecv_perf tests/mp/mp_allreduce tests/mp/mp_kill \
    tests/mp/mp_p2p tests/mp/mp_boot tests/mp/mp_memreg tests/mp/mp_mismatch tests/verbs/verbs_access \
    tests/gpu/gpudirect; do
    d=$(dirname "$b") n=$(basename "$b") src=
    for c in "$BUILDDIR/$d/.libs/$n" "$BUILDDIR/$b"; do
        if [[ -f $c ]] && head -c4 "$c" | grep -q ELF; then src=$c; break; fi
    done
    [[ -n $src ]] || { echo "run_in_vm: $b is not built (make check builds the tests)" >&2; exit 99; }
    cp "$src" "$root/loom/bin/$n"
    copy_libs "$src"
done
for l in "$BUILDDIR"/.libs/libloom.so*; do [[ -e $l ]] && cp -L "$l" "$root/loom/lib/"; done
# The fake CUDA driver (tests/gpu/cuda_fake.c) for the suite's GPUDirect
# section, apart from /loom/lib so that only that section loads it.
mkdir -p "$root/loom/cuda"
${CC:-cc} -shared -fPIC -Wl,-soname,libcuda.so.1 "$SRCDIR/tests/gpu/cuda_fake.c" \
    -o "$root/loom/cuda/libcuda.so.1" || rm -rf "$root/loom/cuda"
cp "$here/vm_suite.sh" "$root/loom/"
# A GPU server whose second NIC is the VM's rxe0 (the suite's section 7).
sed 's/"mlx5_1"/"rxe0"/' "$here/../topo/dgx_2s8g4n.xml" >"$root/loom/topo_rxe.xml"
# glibc's dlopen of libibverbs looks in the default paths, which we copied.
if (($#)); then printf '%q ' "$@" >"$root/run/cmd"; else echo "sh /loom/vm_suite.sh" >"$root/run/cmd"; fi
# Settings of the suite travel into the VM.
: >"$root/run/env"
for v in LOOM_VM_QUICK LOOM_VM_BW_MIN LOOM_VM_SECTIONS ASAN_OPTIONS UBSAN_OPTIONS; do
    if [[ -n ${!v:-} ]]; then printf 'export %s=%q\n' "$v" "${!v}" >>"$root/run/env"; fi
done
cat >"$root/init" <<'EOF'
#!/bin/sh
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/shm /dev/pts; mount -t tmpfs tmpfs /dev/shm; mount -t tmpfs tmpfs /tmp
for m in crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe dummy; do
    insmod /mods/$m.ko* 2>/dev/null
done
ip link set lo up
ip link add d0 type dummy; ip link set d0 mtu 9000
ip addr add 10.9.0.1/24 dev d0; ip link set d0 up
rdma link add rxe0 type rxe netdev d0 || echo "run_in_vm: rdma link add failed"
sleep 1
export HOME=/tmp PATH=/loom/bin:/bin:/usr/bin LD_LIBRARY_PATH=/loom/lib
. /run/env
cd /loom
sh -c "$(cat /run/cmd)"
echo "LOOM_VM_STATUS=$?"
poweroff -f
EOF
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc 2>/dev/null | gzip -1) >"$work/initrd.gz"

# -------------------------------------------------------------------- boot
# TCG, not KVM: nested KVM hangs at boot on some hosts; TCG is slower but
# always there.
timeout "$tmo" qemu-system-x86_64 -accel tcg,thread=multi -cpu max -m "$mem" -smp "$cpus" \
    -kernel "$cache/vmlinuz" -initrd "$work/initrd.gz" \
    -append "console=ttyS0 quiet panic=-1" -nographic -no-reboot -serial mon:stdio \
    </dev/null >"$work/console" 2>&1 || true
[[ -n ${LOOM_VM_KEEP:-} ]] && cp "$work/console" "${LOOM_VM_KEEP_FILE:-/tmp/loom-vm-console.log}"
sed -n '/Booting from ROM/,$p' "$work/console" | sed -e 's/^.*\x1b\[2J//' -e '/^Booting from ROM/d' \
    -e 's/\r$//' -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e '/reboot: Power down/d' -e '/^LOOM_VM_STATUS=/d' || true
st=$(sed -n 's/^LOOM_VM_STATUS=\([0-9]*\).*/\1/p' "$work/console" | tail -1)
[[ -n $st ]] || { echo "run_in_vm: no status came back (boot failure or timeout after $tmo s)" >&2; exit 99; }
exit "$st"
