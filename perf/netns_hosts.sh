#!/bin/bash
# netns_hosts.sh - several "hosts" on one machine: one network namespace
# per host, all joined by a bridge, each host's outgoing link optionally
# limited with tbf.  Ranks in one namespace share the machine's /dev/shm,
# so they talk through shared memory; ranks in different namespaces cross
# a real network stack.  Needs root and iproute2.
#
#   netns_hosts.sh up H [RATE]   namespaces loomh0..loomh(H-1), 10.78.0.(1+h),
#                                bridge loombr; RATE (e.g. 1gbit) limits each
#                                host's egress with tbf
#   netns_hosts.sh run R PROG ARGS
#                                R ranks per host (rank = h*R + i) with
#                                LOOM_HOSTNAME=host<h>, rank r bound to CPU
#                                r mod (CPUs) as loomrun --bind core does
#                                (NOBIND=1: not bound), and torch's env://
#                                variables (MASTER_ADDR, RANK, ...); prints
#                                rank 0's output; exit status: the first
#                                failure
#   netns_hosts.sh down          remove them
set -eu
pre=loomh br=loombr
nhosts() { ip netns list | awk -v p=$pre '$1 ~ "^"p"[0-9]+$"' | wc -l; }
cmd=${1:-}; shift || true
case "$cmd" in
up)
    H=${1:?number of hosts}; rate=${2:-}
    "$0" down 2>/dev/null || true
    # The kernel removes a deleted namespace's links a moment later.
    for _ in $(seq 50); do
        ip link show ${br}p0 >/dev/null 2>&1 || ip link show veth0 >/dev/null 2>&1 || break
        sleep 0.1
    done
    ip link add $br type bridge
    ip link set $br up
    for ((h = 0; h < H; h++)); do
        ns=$pre$h
        ip netns add $ns
        ip link add veth$h type veth peer name ${br}p$h
        ip link set veth$h netns $ns
        ip link set ${br}p$h master $br
        ip link set ${br}p$h up
        ip -n $ns addr add 10.78.0.$((1 + h))/24 dev veth$h
        ip -n $ns link set lo up
        ip -n $ns link set veth$h up
        if [ -n "$rate" ]; then
            ip netns exec $ns tc qdisc add dev veth$h root tbf rate "$rate" burst 256kb latency 50ms
        fi
    done
    ;;
down)
    for ns in $(ip netns list | awk -v p=$pre '$1 ~ "^"p"[0-9]+$" {print $1}'); do
        ip netns del "$ns"
    done
    ip link del $br 2>/dev/null || true
    ;;
run)
    R=${1:?ranks per host}; shift
    H=$(nhosts)
    [ "$H" -gt 0 ] || { echo "netns_hosts.sh: no hosts (run: $0 up H)" >&2; exit 2; }
    n=$((H * R))
    port=$((20000 + RANDOM % 10000))
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    out=$(mktemp)
    pids=()
    ncpu=$(nproc)
    bind() { [ -n "${NOBIND:-}" ] || echo "taskset -c $(($1 % ncpu))"; }
    # torch's env:// rendezvous (rank 0's store on the next port) and
    # gloo's interface, for programs that use torch.distributed.
    torchenv() { # HOST LOCAL_RANK RANK
        echo "MASTER_ADDR=10.78.0.1 MASTER_PORT=$((port + 1)) RANK=$3 WORLD_SIZE=$n" \
            "LOCAL_RANK=$2 LOCAL_WORLD_SIZE=$R GLOO_SOCKET_IFNAME=veth$1"
    }
    for ((h = H - 1; h >= 0; h--)); do
        for ((i = R - 1; i >= 0; i--)); do
            r=$((h * R + i))
            [ $r -eq 0 ] && continue
            ip netns exec $pre$h $(bind $r) env LOOM_ROOT=10.78.0.1:$port LOOM_RANK=$r \
                LOOM_SIZE=$n LOOM_JOB_KEY=$key LOOM_HOSTNAME=host$h $(torchenv $h $i $r) "$@" >/dev/null &
            pids+=($!)
        done
    done
    rc=0
    ip netns exec ${pre}0 $(bind 0) env LOOM_ROOT=10.78.0.1:$port LOOM_RANK=0 LOOM_SIZE=$n \
        LOOM_JOB_KEY=$key LOOM_HOSTNAME=host0 $(torchenv 0 0 0) "$@" >"$out" || rc=$?
    for p in "${pids[@]}"; do wait "$p" || { [ $rc -eq 0 ] && rc=$?; }; done
    cat "$out"
    rm -f "$out"
    exit $rc
    ;;
*)
    sed -n '2,18p' "$0"
    exit 2
    ;;
esac
