#!/bin/bash
# Failure detection, revocation and shrink (mp_fault.c), with the default
# heartbeat (500 ms, a rank silent for 6 beats is failed) and LOOM_TIMEOUT
# at 60 s, so that every detection below comes from the control plane,
# not from an operation's deadline.  Bounds checked: a killed rank is an
# error on every survivor within 1 s, a stopped one within 4.5 s; shrink
# then builds a working communicator of the survivors (mp_fault checks
# sizes, renumbering and results).
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_fault
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
quick=${LOOM_TEST_QUICK:-0}

# run N MODE VICTIM [VICTIM2]: sets good (every survivor said OK, the
# victims nothing or OK), worst detection and worst shrink (ms).
run() {
    local n=$1 mode=$2 v=$3 v2=${4:-}
    rm -rf "$tmp/out" "$tmp/stamp"
    LOOM_TIMEOUT=60000 timeout 150 "$LOOMRUN" -n "$n" --keep-going --timeout 120 \
        --output "$tmp/out" "$prog" "$mode" "$v" "$tmp/stamp" $v2 >/dev/null 2>&1
    good=1 worst=0 wshrink=0
    for r in $(seq 0 $((n - 1))); do
        line=$(cat "$tmp/out/rank.$r.out" 2>/dev/null)
        if [ "$r" = "$v" ] || [ "$r" = "$v2" ]; then
            case "$mode:$line" in
            revoke:OK*|stop:OK*|*:) continue ;;
            esac
        fi
        case "$line" in
        OK*) ;;
        *) good=0; echo "  rank $r: ${line:-no output}"; tail -3 "$tmp/out/rank.$r.err" 2>/dev/null ;;
        esac
        [ "$r" = "$v" ] && continue
        d=$(echo "$line" | sed -n 's/.*detect_ms=\([0-9.-]*\).*/\1/p')
        s=$(echo "$line" | sed -n 's/.*shrink_ms=\([0-9.]*\).*/\1/p')
        [ -n "$d" ] && worst=$(echo "$d $worst" | awk '{print ($1>$2)?$1:$2}')
        [ -n "$s" ] && wshrink=$(echo "$s $wshrink" | awk '{print ($1>$2)?$1:$2}')
    done
}
within() { awk "BEGIN{exit !($1 < $2)}"; }

for n in 4 8; do
    for v in 0 $((n / 2)); do
        run "$n" kill "$v"
        if [ $good = 1 ] && within "$worst" 1000; then
            ok "kill rank $v of $n: error on every survivor within $worst ms, shrunk in $wshrink ms"
        else
            bad "kill rank $v of $n (slowest error $worst ms)"
        fi
    done
done
ns="4"
[ "$quick" = 1 ] || ns="4 8"
for n in $ns; do
    run "$n" stop 1
    if [ $good = 1 ] && within "$worst" 4500; then
        ok "SIGSTOP rank 1 of $n: error on every survivor after $worst ms (heartbeats), shrunk in $wshrink ms; the victim, resumed, is refused"
    else
        bad "SIGSTOP rank 1 of $n (slowest error $worst ms)"
    fi
done
run 4 idle 3
if [ $good = 1 ]; then
    ok "rank 3 killed while the others compute: their next call fails at once, shrink works"
else
    bad "rank 3 killed while the others compute"
fi
LOOM_DEBUG=info run 4 revoke 1
if [ $good = 1 ] && within "$worst" 1000; then
    ok "loom_comm_revoke on rank 1: every rank's operation fails within $worst ms; shrink keeps all 4"
else
    bad "loom_comm_revoke on rank 1 (slowest $worst ms)"
fi
# The shrunk communicator takes its parent's classes of reductions with
# its links: rank 0 (rank 0 of both) timed the kernels once.
log=$(cat "$tmp/out/rank.0.err" 2>/dev/null)
timed=$(grep -c "reductions timed in" <<<"$log")
if [ "$timed" = 1 ] && grep -q "the parent communicator's, not timed again" <<<"$log"; then
    ok "shrink: the classes of reductions come from the parent, timed once"
else
    bad "shrink: reductions timed $timed times; $(grep -m1 'class 1' <<<"$log" | cut -c1-160)"
fi
for pair in "2 0" "0 1" "5 3"; do
    set -- $pair
    n=6
    run "$n" coord "$1" "$2"
    if [ $good = 1 ]; then
        ok "rank $1 of $n killed, then rank $2 killed during the shrink: the survivors agree (shrunk in $wshrink ms)"
    else
        bad "rank $1 of $n killed, then rank $2 during the shrink"
    fi
done
finish
