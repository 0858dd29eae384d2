#!/bin/bash
# The C examples of the man pages (man3, man7) and of README.md compile
# against loom.h: whole programs are built with libloom and, where the
# page says so, run on real ranks; fragments are compiled as the body of
# a function, with the declarations the page gives for what they use;
# copies of loom.h's types have its members.  A C example that says
# nothing of how to check it fails (see tests/man/examples.py).  So a
# page and the header cannot drift apart unnoticed.
. "$(dirname "$0")/../lib.sh"
CC=${CC:-cc}
command -v python3 >/dev/null || { echo "python3 not found: skipping"; exit 77; }
command -v "${CC%% *}" >/dev/null || { echo "no C compiler ($CC): skipping"; exit 77; }
T=$(mktemp -d "${TMPDIR:-/tmp}/loom-examples.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
if ! python3 "$SRCDIR/tests/man/examples.py" "$SRCDIR" "$T" 2>"$T/err"; then
    bad "extracting the examples: $(cat "$T/err")"
    finish
    exit
fi
# Strict C99, as the pages promise loom.h is.  Unused names are fine in a
# fragment, and so are the buffers it leaves to a comment to allocate.
# (GCC ignores the -Wno- options it does not know; clang needs telling.)
flags=(-std=c99 -pedantic -Wall -Werror -Wno-unused -Wno-uninitialized
    -Wno-maybe-uninitialized -Wno-unknown-warning-option -I"$SRCDIR/include")
mpi=$(pkg-config --cflags ompi-c 2>/dev/null || mpicc --showme:compile 2>/dev/null)
ran=0
while IFS=$'\t' read -r kind where file a b; do
    case $kind in
    program)
        exe=$T/$(basename "$file" .c)
        if ! out=$($CC "${flags[@]}" ${LOOM_TEST_CFLAGS:-} -c "$file" -o "$exe.o" 2>&1); then
            bad "$where: the program compiles: $out"; continue
        fi
        if ! out=$("$BUILDDIR/libtool" --tag=CC --mode=link --quiet $CC ${LOOM_TEST_CFLAGS:-} -static \
                -o "$exe" "$exe.o" "$BUILDDIR/libloom.la" 2>&1); then
            bad "$where: the program links with libloom: $out"; continue
        fi
        ok "$where: the program compiles and links"
        [ "$b" = - ] && b=
        if [ "$a" != - ]; then
            out=$(timeout 60 "$LOOMRUN" -n "$a" --timeout 50 "$exe" 2>&1); rc=$?
            if [ $rc -ne 0 ]; then
                bad "$where: runs on $a ranks (exit $rc): $(tail -3 <<<"$out")"
            elif [ -n "$b" ] && ! grep -qF -- "$b" <<<"$out"; then
                bad "$where: runs on $a ranks and prints '$b': $(tail -3 <<<"$out")"
            else
                ok "$where: runs on $a ranks${b:+ and prints '$b'}"
                ran=$((ran + 1))
            fi
        fi
        ;;
    fragment)
        extra=()
        if grep -q '^#include <mpi.h>' "$file"; then
            if [ -z "$mpi" ]; then ok "$where: skipped (no mpi.h here)"; continue; fi
            read -r -a extra <<<"$mpi"
        fi
        if out=$($CC "${flags[@]}" "${extra[@]}" -c "$file" -o "$T/frag.o" 2>&1); then
            ok "$where: the fragment compiles"
        else
            bad "$where: the fragment compiles: $out"
        fi
        ;;
    declaration) ok "$where: the copy of the type has loom.h's members" ;;
    skip) ok "$where: not checked: $a" ;;
    missing|bad) bad "$where: $a" ;;
    *) bad "$where: unknown manifest entry '$kind'" ;;
    esac
done <"$T/manifest"
check "at least one C example found" [ -s "$T/manifest" ]
check "at least one example ran" [ "$ran" -gt 0 ]
finish
