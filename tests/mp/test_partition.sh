#!/bin/bash
# A host cut off from the network (test (c) of the failure model): three
# "hosts", each a network namespace with two ranks, joined by a bridge.
# While the ranks loop allreduce, host 2's link goes down; its ranks stay
# alive but unreachable.  Hosts 0 and 1 must fail by heartbeat (within
# 4.5 s, LOOM_TIMEOUT being 60 s), shrink to their 4 ranks and go on; the
# cut-off ranks' shrink must refuse them a job of their own (a minority:
# LOOM_ERR_REVOKED, "no majority") and their communicator say so.  Needs root and
# network namespaces: skipped (77) where they cannot be made.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_fault
id=$(($$ % 10000))
pre=loomp$id br=lpbr$id
[ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v python3 >/dev/null || {
    echo "needs root, iproute2 and python3: skipping"; exit 77; }
tmp=$(mktemp -d)
down() {
    for h in 0 1 2; do ip netns del $pre$h 2>/dev/null; done
    ip link del $br 2>/dev/null
    rm -rf "$tmp"
}
trap down EXIT
ip link add $br type bridge 2>/dev/null || { echo "cannot create a bridge: skipping"; exit 77; }
ip link set $br up
for h in 0 1 2; do
    ip netns add $pre$h || { echo "cannot create namespaces: skipping"; exit 77; }
    ip link add lpv${id}x$h type veth peer name lpb${id}x$h
    ip link set lpv${id}x$h netns $pre$h
    ip link set lpb${id}x$h master $br
    ip link set lpb${id}x$h up
    ip -n $pre$h addr add 10.79.$((id % 200)).$((1 + h))/24 dev lpv${id}x$h
    ip -n $pre$h link set lo up
    ip -n $pre$h link set lpv${id}x$h up
done
net=10.79.$((id % 200))
port=$((20000 + RANDOM % 10000))
key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
pids=()
for r in 5 4 3 2 1 0; do
    h=$((r / 2))
    ip netns exec $pre$h env LOOM_ROOT=$net.1:$port LOOM_RANK=$r LOOM_SIZE=6 LOOM_JOB_KEY=$key \
        LOOM_HOSTNAME=host$h LOOM_TIMEOUT=60000 timeout 120 "$prog" cut 4 "$tmp/stamp" 5 \
        >"$tmp/out.$r" 2>"$tmp/err.$r" &
    pids+=($!)
done
sleep 3
python3 -c 'import time; print("%.3f 0" % (time.monotonic() * 1000))' >"$tmp/stamp.tmp"
mv "$tmp/stamp.tmp" "$tmp/stamp"
ip link set lpb${id}x2 down
for p in "${pids[@]}"; do wait "$p"; done
good=1 worst=0
for r in 0 1 2 3; do
    line=$(cat "$tmp/out.$r")
    case "$line" in
    "OK detect"*) ;;
    *) good=0; echo "  rank $r: ${line:-nothing}"; tail -2 "$tmp/err.$r" ;;
    esac
    d=$(echo "$line" | sed -n 's/.*detect_ms=\([0-9.]*\).*/\1/p')
    [ -n "$d" ] && worst=$(echo "$d $worst" | awk '{print ($1>$2)?$1:$2}')
done
for r in 4 5; do
    case "$(cat "$tmp/out.$r")" in
    "OK minority"*) ;;
    *) good=0; echo "  cut-off rank $r: $(cat "$tmp/out.$r")"; tail -2 "$tmp/err.$r" ;;
    esac
done
if [ $good = 1 ] && awk "BEGIN{exit !($worst < 4500)}"; then
    ok "host 2 cut off: ranks 0-3 failed by heartbeat within $worst ms and shrank to 4; ranks 4-5 were refused as a minority"
else
    bad "host 2 cut off (slowest $worst ms)"
fi
finish
