#!/bin/bash
# Man pages: every page passes mandoc's lint, every public function of
# loom.h has a man3 page, every LOOM_* variable the sources read is in
# loom(7), and every installed program has a man1 page.
. "$(dirname "$0")/../lib.sh"
man=$SRCDIR/man
if [ -z "${MANDOC:-}" ] && ! command -v mandoc >/dev/null; then
    echo "mandoc not found: skipping"; exit 77
fi
MANDOC=${MANDOC:-mandoc}
for f in "$man"/man*/*.[137]; do
    out=$("$MANDOC" -T lint -W warning "$f" 2>&1)
    if [ -z "$out" ]; then ok "lint $(basename "$f")"; else bad "lint $(basename "$f"): $out"; fi
done
for fn in $(sed -n 's/^[a-z_ ]*[ *]\(loom_[a-z_]*\)(.*/\1/p' "$SRCDIR/include/loom.h" | sort -u); do
    # Its own page, or named (.Nm) on a page that Makefile.am links it to.
    check "man3 page for $fn" bash -c "[ -f '$man/man3/$fn.3' ] || grep -q '^\.Nm $fn\( ,\)\?\$' '$man'/man3/*.3"
    [ -f "$man/man3/$fn.3" ] || check "Makefile.am links $fn.3" grep -q "$fn.3:" "$SRCDIR/Makefile.am"
done
for v in $(grep -rhoE '"LOOM_[A-Z_]+"' "$SRCDIR/src" "$SRCDIR/transports" | tr -d '"' | sort -u); do
    check "loom(7) documents $v" grep -q "$v" "$man/man7/loom.7"
done
for p in loomrun all_reduce_perf; do
    check "man1 page for $p" [ -f "$man/man1/$p.1" ]
done
finish
