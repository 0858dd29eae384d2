#!/bin/bash
# Man pages: every page passes mandoc's lint and is installed, every public
# function of loom.h has a man3 page, every LOOM_* variable the sources read
# and every collective and algorithm LOOM_ALGO accepts is in loom(7), and
# every installed program has a man1 page.
. "$(dirname "$0")/../lib.sh"
man=$SRCDIR/man
if [ -z "${MANDOC:-}" ] && ! command -v mandoc >/dev/null; then
    echo "mandoc not found: skipping"; exit 77
fi
MANDOC=${MANDOC:-mandoc}
# The words of a (possibly continued) variable assignment in Makefile.am.
mkvar() {
    sed -n "/^$1[[:space:]]*=/,/[^\\\\]\$/p" "$SRCDIR/Makefile.am" |
        sed "s/^$1[[:space:]]*=//; s/\\\\\$//"
}
links=$(mkvar MAN3_LINKS)
installed=" $(mkvar dist_man_MANS | tr -s " \t\n" " ") "
for f in "$man"/man*/*.[137]; do
    out=$("$MANDOC" -T lint -W warning "$f" 2>&1)
    if [ -z "$out" ]; then ok "lint $(basename "$f")"; else bad "lint $(basename "$f"): $out"; fi
    rel=${f#"$SRCDIR"/}
    case $installed in
    *" $rel "*) ok "Makefile.am installs $rel" ;;
    *) bad "Makefile.am installs $rel (add it to dist_man_MANS)" ;;
    esac
done
for fn in $(sed -n 's/^[a-z_ ]*[ *]\(loom_[a-z_]*\)(.*/\1/p' "$SRCDIR/include/loom.h" | sort -u); do
    # Its own page, or named (.Nm) on a page that Makefile.am links it to.
    [ -f "$man/man3/$fn.3" ] && { ok "man3 page for $fn"; continue; }
    target=
    for l in $links; do [ "${l%%:*}" = "$fn.3" ] && target=${l#*:}; done
    if [ -z "$target" ]; then
        bad "man3 page for $fn (no page, and no $fn.3:PAGE in MAN3_LINKS)"
    elif [ ! -f "$man/man3/$target" ]; then
        bad "man3 page for $fn (MAN3_LINKS points to $target, which does not exist)"
    else
        check "man3 page for $fn (on $target)" grep -q "^\.Nm $fn\( ,\)\?\$" "$man/man3/$target"
    fi
done
for v in $(grep -rhoE '"LOOM_[A-Z_]+"' "$SRCDIR/src" "$SRCDIR/transports" | tr -d '"' | sort -u); do
    check "loom(7) documents $v" grep -q "$v" "$man/man7/loom.7"
done
# The names LOOM_ALGO accepts (the name tables of src/coll/algo.c).
for w in $(sed -n '/_names\[LOOMI_NUM_[A-Z]*\] = {/,/};/p' "$SRCDIR/src/coll/algo.c" |
        grep -o '"[a-z0-9_]*"' | tr -d '"' | sort -u); do
    check "loom(7) names $w for LOOM_ALGO" grep -qw "$w" "$man/man7/loom.7"
done
# Every installed program (bin_PROGRAMS in Makefile.am) has its page.
progs=$(sed -n '/^bin_PROGRAMS *=/,/[^\\]$/p' "$SRCDIR/Makefile.am" | sed 's/bin_PROGRAMS *=//; s/\\//g')
[ -n "$progs" ] || bad "no bin_PROGRAMS found in Makefile.am"
for p in $progs; do
    check "man1 page for $p" [ -f "$man/man1/$p.1" ]
done
finish
