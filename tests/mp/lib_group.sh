# tests/mp/lib_group.sh - sourced by the tests of communicators made from
# a parent (test_split.sh, test_create_group.sh) after tests/lib.sh, with
# prog set to the rank program: a scratch directory $tmp, heartbeats
# every 100 ms and LOOM_TIMEOUT 10 s, and
#   job N ARGS...         loomrun N ranks of "$prog ARGS...", each rank's
#                         output in $tmp/out/rank.R.out
#   all_ok PREFIX RANKS... each rank's last line starts with PREFIX
#   why                   the first lines that are not OK (or E) lines
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export LOOM_HEARTBEAT_MS=100 LOOM_TIMEOUT=10000

job() { # job N ARGS...: rank outputs in $tmp/out
    local n=$1; shift
    rm -rf "$tmp/out"
    timeout 120 "$LOOMRUN" -n "$n" --keep-going --timeout 100 --output "$tmp/out" \
        "$prog" "$@" >/dev/null 2>&1
}
all_ok() { # all_ok PREFIX RANKS...: each rank's last line starts with PREFIX
    local p=$1 r; shift
    for r in "$@"; do
        tail -1 "$tmp/out/rank.$r.out" 2>/dev/null | grep -q "^$p" || return 1
    done
}
why() { grep -h -m2 -v '^OK\|^E ' "$tmp"/out/rank.*.out 2>/dev/null | head -3; }
