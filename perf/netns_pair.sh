#!/bin/bash
# netns_pair.sh - two "hosts" on one machine: network namespaces joined by
# a veth pair, for measuring Loom across a real network stack and against
# iperf3 on the same link.  Needs root and iproute2 (iperf3 for `iperf`).
#
#   netns_pair.sh up [RATE]      create loomA (10.77.0.1) and loomB (10.77.0.2);
#                                RATE (e.g. 1gbit) limits both directions with tbf
#   netns_pair.sh iperf [SECS]   iperf3 --bidir between them; prints per-direction Gbit/s
#   netns_pair.sh loom PROG ARGS run PROG as rank 0 in loomA and rank 1 in loomB
#                                (LOOM_ROOT etc. set); prints rank 0's output
#   netns_pair.sh down           remove both namespaces
set -eu
A=loomA B=loomB IPA=10.77.0.1 IPB=10.77.0.2
cmd=${1:-}; shift || true
case "$cmd" in
up)
    "$0" down 2>/dev/null || true
    ip netns add $A
    ip netns add $B
    ip link add vethA type veth peer name vethB
    ip link set vethA netns $A
    ip link set vethB netns $B
    ip -n $A addr add $IPA/24 dev vethA
    ip -n $B addr add $IPB/24 dev vethB
    for ns in $A $B; do ip -n $ns link set lo up; done
    ip -n $A link set vethA up
    ip -n $B link set vethB up
    if [ -n "${1:-}" ]; then
        # tbf on each egress: the link's rate in each direction.
        ip netns exec $A tc qdisc add dev vethA root tbf rate "$1" burst 256kb latency 50ms
        ip netns exec $B tc qdisc add dev vethB root tbf rate "$1" burst 256kb latency 50ms
    fi
    ;;
down)
    ip netns del $A 2>/dev/null || true
    ip netns del $B 2>/dev/null || true
    ;;
iperf)
    secs=${1:-5}
    ip netns exec $A iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
    sleep 0.5
    ip netns exec $B iperf3 -c $IPA -p 5201 --bidir -t "$secs" -f g 2>&1 |
        awk '/\[TX-C\].*receiver/ {tx=$(NF-2)} /\[RX-C\].*receiver/ {rx=$(NF-2)}
             END {printf "iperf3 --bidir: B->A %s Gbit/s, A->B %s Gbit/s, per direction (mean) %.3f Gbit/s = %.3f GB/s\n", tx, rx, (tx+rx)/2, (tx+rx)/16}'
    wait
    ;;
loom)
    port=$((20000 + RANDOM % 10000))
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    out=$(mktemp)
    ip netns exec $B env LOOM_ROOT=$IPA:$port LOOM_RANK=1 LOOM_SIZE=2 LOOM_JOB_KEY=$key "$@" >/dev/null &
    ip netns exec $A env LOOM_ROOT=$IPA:$port LOOM_RANK=0 LOOM_SIZE=2 LOOM_JOB_KEY=$key "$@" >"$out"
    rc=$?
    wait $! || rc=$?
    cat "$out"
    rm -f "$out"
    exit $rc
    ;;
*)
    sed -n '2,13p' "$0"
    exit 2
    ;;
esac
