#!/bin/bash
# Straggler telemetry (loom_comm_get_stats(3)) on 4 ranks over shared
# memory and TCP: one rank sleeps 20 ms before each of 20 allreduces;
# every rank that receives from it first thing in an operation must show
# it the latest peer (>= 15 ms on average, the others under half that), and
# LOOM_DEBUG=info must name it (and no other rank) as the straggler.
# Then the mistakes (NULL count, a bad size, room for fewer peers than
# there are, reset) and LOOM_STATS=0.  Last, where root and network
# namespaces are at hand, one rank's link limited by tbf is named slow.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_stats
for tr in shm tcp; do
    for count in 16 1024; do
        out=$(LOOM_TRANSPORT=$tr LOOM_DEBUG=info timeout 120 "$LOOMRUN" -n 4 --timeout 100 \
            "$prog" slow 3 20 20 $count 2>&1)
        rc=$?
        saw=$(grep -c '^rank [012]: saw 3 late by' <<<"$out")
        named=$(grep -c 'straggler: rank 3 was the last' <<<"$out")
        wrong=$(grep 'straggler: rank [0-9]* was' <<<"$out" | grep -vc 'straggler: rank 3 ')
        # Over the slots (shm, small) every rank sees every other; over
        # messages, those that receive from rank 3 before anything else.
        want=1; [ $tr = shm ] && want=3
        check "$tr, $count floats, rank 3 sleeps 20 ms a call: $saw ranks saw it late" \
            [ $rc -eq 0 -a "$saw" -ge $want ]
        [ $rc -eq 0 ] || echo "$out" | grep -v INFO | tail -20
        check "... LOOM_DEBUG=info named it on $named ranks, another rank on $wrong" \
            [ "$named" -ge $want -a "$wrong" -eq 0 ]
        grep -m1 'straggler:' <<<"$out" | sed 's/^/     /'
        grep '^rank [012]: saw' <<<"$out" | sed 's/^/     /'
    done
done
for tr in shm tcp; do
    out=$(LOOM_TRANSPORT=$tr timeout 120 "$LOOMRUN" -n 4 --timeout 100 "$prog" api 2>&1)
    check "$tr: bad arguments refused, capacity, reset" [ $? -eq 0 ]
    [ $? -eq 0 ] || echo "$out" | tail -10
done
out=$(LOOM_STATS=0 timeout 120 "$LOOMRUN" -n 3 --timeout 100 "$prog" off 2>&1)
check "LOOM_STATS=0: loom_comm_get_stats says it is off" [ $? -eq 0 ]
[ $? -eq 0 ] || echo "$out" | tail -10
# One slow link: four "hosts", each a network namespace with one rank,
# joined by a bridge; host 3's egress limited by tbf to 200 Mbit/s.  With
# halving-doubling each rank receives from two peers, so a rank that
# receives from rank 3 can compare it with its other peer: LOOM_DEBUG=info
# must name rank 3's link as slow, and no rank another's.  Needs root,
# iproute2 and tc: skipped otherwise (the checks above still count).
link_case() {
    [ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v tc >/dev/null || {
        echo "# slow link: needs root, iproute2 and tc: skipped"; return; }
    local id=$(($$ % 10000)) h r
    local pre=loomst$id br=lsbr$id tmp
    tmp=$(mktemp -d)
    link_down() {
        for h in 0 1 2 3; do ip netns del $pre$h 2>/dev/null; done
        ip link del $br 2>/dev/null
        rm -rf "$tmp"
    }
    trap link_down EXIT
    if ! ip link add $br type bridge 2>/dev/null; then
        echo "# slow link: cannot create a bridge: skipped"; return; fi
    ip link set $br up
    for h in 0 1 2 3; do
        ip netns add $pre$h 2>/dev/null || { echo "# slow link: no namespaces: skipped"; return; }
        ip link add lsv${id}x$h type veth peer name lsb${id}x$h
        ip link set lsv${id}x$h netns $pre$h
        ip link set lsb${id}x$h master $br
        ip link set lsb${id}x$h up
        ip -n $pre$h addr add 10.77.$((id % 200)).$((1 + h))/24 dev lsv${id}x$h
        ip -n $pre$h link set lo up
        ip -n $pre$h link set lsv${id}x$h up
    done
    if ! ip netns exec ${pre}3 tc qdisc add dev lsv${id}x3 root tbf rate 200mbit burst 64kb \
        latency 100ms; then
        echo "# slow link: tc tbf refused: skipped"; return; fi
    local net=10.77.$((id % 200)) port=$((20000 + RANDOM % 10000)) pids=()
    local key
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    for r in 3 2 1 0; do
        ip netns exec $pre$r env LOOM_ROOT=$net.1:$port LOOM_RANK=$r LOOM_SIZE=4 \
            LOOM_JOB_KEY=$key LOOM_HOSTNAME=host$r LOOM_DEBUG=info LOOM_TIMEOUT=60000 \
            LOOM_ALGO=allreduce:halving_doubling timeout 60 "$prog" link 20 262144 \
            >"$tmp/out.$r" 2>&1 &
        pids+=($!)
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    local all
    all=$(cat "$tmp"/out.*)
    local named wrong
    named=$(grep -c 'slow link: data from rank 3 ' <<<"$all")
    wrong=$(grep 'slow link: data from rank' <<<"$all" | grep -vc 'from rank 3 ')
    check "slow link (rank 3's egress at 200 Mbit/s): named by $named ranks, another rank by $wrong" \
        [ $rc -eq 0 -a "$named" -ge 1 -a "$wrong" -eq 0 ]
    grep -m2 'slow link:' <<<"$all" | sed 's/^/     /'
    grep 'peer 3 ops' <<<"$all" | sed 's/^/     /'
    [ $rc -eq 0 ] || grep -v INFO <<<"$all" | tail -10
}
link_case
finish
