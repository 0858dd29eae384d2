#!/bin/bash
# Every file git tracks is in the distribution (make distdir), but for
# the few listed below: a source, script or page left out of Makefile.am
# breaks the tarball's build or a test in it.  make distcheck in .ci/run
# runs only a part of the suite in the tarball (distcheck-quick), so this
# is what finds a file missing from it.  Skipped outside a git checkout
# (in the tarball itself).
. "$(dirname "$0")/../lib.sh"
if ! command -v git >/dev/null || ! git -C "$SRCDIR" rev-parse --git-dir >/dev/null 2>&1; then
    echo "test_dist.sh: the sources are not a git checkout; skipped"
    exit 77
fi
# Tracked, and rightly not distributed.
not_dist='^\.gitignore$'
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dist-test.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
# missing LIST DIR: the files of LIST (one a line) not under DIR.
missing() {
    while IFS= read -r f; do [ -e "$2/$f" ] || echo "$f"; done <"$1" | grep -Ev "$not_dist"
}
# The comparison itself, on a tree that lacks a file.
mkdir -p "$tmp/toy/a"; : >"$tmp/toy/a/x.c"
printf 'a/x.c\na/y.c\n.gitignore\n' >"$tmp/toy.list"
got=$(missing "$tmp/toy.list" "$tmp/toy")
check "the comparison finds a missing file (got: ${got:-nothing})" test "$got" = a/y.c

git -C "$SRCDIR" ls-files >"$tmp/tracked"
if make -C "$BUILDDIR" distdir distdir="$tmp/d" >"$tmp/make.log" 2>&1; then
    ok "make distdir"
    lost=$(missing "$tmp/tracked" "$tmp/d")
    n=$(wc -l <"$tmp/tracked")
    if [ -z "$lost" ]; then
        ok "all $n tracked files are in the distribution"
    else
        bad "tracked but not distributed (add them to Makefile.am): $(echo $lost)"
    fi
else
    tail -20 "$tmp/make.log"
    bad "make distdir failed"
fi
finish
