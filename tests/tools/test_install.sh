#!/bin/bash
# An installed libloom is found without LD_LIBRARY_PATH.  The library,
# loom.h and loom.pc are installed into a temporary DESTDIR; the README's
# example, built with `pkg-config --cflags --libs loom` (--define-prefix
# reads the prefix from where the pc file lies, under DESTDIR), runs
# under loomrun with LD_LIBRARY_PATH unset: loom.pc's Libs carry
# -Wl,-rpath,${libdir} for a libdir outside the dynamic linker's default
# directories.  (make installcheck does the same after a real install.)
# A static-only build (configure --disable-shared, as CI's sanitizer
# build) installs libloom.a alone: its users link with
# `pkg-config --static`, which adds Libs.private (hwloc, libm).
. "$(dirname "$0")/../lib.sh"
pkg-config --help 2>&1 | grep -q -- --define-prefix || { echo "pkg-config has no --define-prefix"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dest=$tmp/dest

# Only the three install targets, from a make of its own (not the
# jobserver of a parallel make check).
out=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL ${MAKE:-make} -s -C "$BUILDDIR" DESTDIR="$dest" \
    install-libLTLIBRARIES install-includeHEADERS install-pkgconfigDATA 2>&1)
rc=$?
pc=$(find "$dest" -name loom.pc | head -1)
static=
if [ "$(sed -n "s/^build_libtool_libs=//p" "$BUILDDIR/libtool" 2>/dev/null | head -1)" = no ]; then
    static=--static lib=libloom.a
else
    lib='libloom.so*'
fi
check "make install DESTDIR=...: $lib, loom.h and loom.pc installed" \
    bash -c '[ "$1" = 0 ] && [ -n "$2" ] && [ -n "$(find "$3" -name "$4" -print -quit)" ] &&
             [ -n "$(find "$3" -name loom.h -print -quit)" ]' _ "$rc" "$pc" "$dest" "$lib"
[ "$rc" = 0 ] || echo "$out" | tail -5
[ -n "$pc" ] || { finish; exit; }

flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-prefix --cflags --libs $static loom)
libdir=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --define-prefix --variable=libdir loom)
echo "# pkg-config --cflags --libs${static:+ $static} loom: $flags"
awk '/^```c$/ { f = 1; next } /^```$/ { f = 0 } f' "$SRCDIR/README.md" >"$tmp/example.c"
# shellcheck disable=SC2086 # flags are words
out=$(${LOOM_TEST_CC:-cc} "$tmp/example.c" -o "$tmp/example" $flags 2>&1)
check "the README's example builds with pkg-config's flags alone" [ $? = 0 ]
[ -x "$tmp/example" ] || { echo "$out" | tail -5; finish; exit; }

case "$static: $flags " in
--static:*)
    out=$(timeout 60 "$LOOMRUN" -n 2 --timeout 50 "$tmp/example" 2>&1)
    rc=$?
    check "the statically linked example runs on 2 ranks (exit $rc)" \
        bash -c '[ "$1" = 0 ] && grep -qx "average of ranks 0..1: 0.5" <<<"$2"' _ "$rc" "$out"
    [ "$rc" = 0 ] || echo "$out" | tail -5
    ;;
*" -Wl,-rpath,$libdir "*)
    found=$(env -u LD_LIBRARY_PATH ldd "$tmp/example" | awk '$1 ~ /^libloom\.so/ { print $3 }')
    check "the example finds the installed libloom ($found) without LD_LIBRARY_PATH" \
        [ "$(dirname "${found:-/none}")" = "$libdir" ]
    out=$(env -u LD_LIBRARY_PATH timeout 60 "$LOOMRUN" -n 2 --timeout 50 "$tmp/example" 2>&1)
    rc=$?
    check "the example runs on 2 ranks without LD_LIBRARY_PATH (exit $rc)" \
        bash -c '[ "$1" = 0 ] && grep -qx "average of ranks 0..1: 0.5" <<<"$2"' _ "$rc" "$out"
    [ "$rc" = 0 ] || echo "$out" | tail -5
    ;;
*)
    # No rpath: the configured libdir is one the dynamic linker searches
    # by itself (--prefix=/usr), or --disable-pc-rpath.
    check "no rpath in loom.pc: configure said why" \
        grep -qE '^  loom.pc rpath: +no \(' "$BUILDDIR/config.log"
    ;;
esac
finish
