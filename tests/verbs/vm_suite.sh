#!/bin/sh
# vm_suite.sh - the verbs suite, run inside the soft-RoCE VM by
# run_in_vm.sh (busybox sh; binaries in /loom/bin).  Every rank is a
# local process, and LOOM_TRANSPORT=verbs sends all of their traffic
# through the rxe0 device.
#
#  1. the transport in use is verbs (LOOM_DEBUG=info names it);
#  2. every collective (the perf binaries with -c 1) on 2, 3 and 4 ranks,
#     at sizes that go eager and rendezvous: #wrong 0 everywhere;
#  3. the multi-process tests: allreduce (every type and op) and
#     point-to-point/groups on 2, 3 and 4 ranks;
#  4. the kill test: a rank SIGKILLed mid-allreduce, every survivor fails
#     cleanly, naming it, within 5 s; one SIGSTOPped, within LOOM_TIMEOUT;
#  5. selection: ranks on two "hosts", all transports allowed: the probe
#     measures verbs and TCP between them and the faster carries the data;
#  6. figures (not pass/fail unless LOOM_VM_BW_MIN is set): ib_write_bw
#     against sendrecv_perf on the same device, and a 64 MiB allreduce
#     over verbs and over TCP;
#  7. the NIC each rank opens: the one the topology gives it (closest to
#     its GPU), else the first device with an active port; loom-info
#     --job shows the NICs in use;
#  8. ranks whose collective calls differ: every rank fails at once,
#     naming the rank that differs and both calls;
#  9. what a peer can reach through the transport's registrations
#     (verbs_access): a receive buffer only by RDMA write and only until
#     its transfer ends, send buffers and loom_mem_register's memory not
#     at all, and only its own credit word;
# 10. GPUDirect RDMA (dmabuf registrations of device memory) on rxe, with
#     a fake CUDA driver: auto falls back cleanly, =1 fails clearly.
# LOOM_VM_QUICK=1 skips 3 and 6; LOOM_VM_SECTIONS="N ..." runs only those.  Ends with "N passed, N failed".
pass=0 fail=0
# LOOM_VM_SECTIONS="5 6": only those sections (default: all).
want() { [ -z "${LOOM_VM_SECTIONS:-}" ] || case " $LOOM_VM_SECTIONS " in *" $1 "*) true ;; *) false ;; esac; }
ok() { pass=$((pass + 1)); echo "ok   - $*"; }
bad() { fail=$((fail + 1)); echo "FAIL - $*"; }
export LOOM_DEBUG=none
export LOOM_TRANSPORT=verbs
tmp=/tmp/suite
mkdir -p $tmp

run() { # run NRANKS PROG ARGS...: output in $out, status in $rc
    n=$1
    shift
    out=$(timeout 300 loomrun -n "$n" --timeout 280 "$@" 2>&1)
    rc=$?
}
wrong_ok() { # every data row's two #wrong columns are 0, and there are rows
    awk '!/^#/ && NF >= 13 { rows++; if ($9 != 0 || $13 != 0) bad++ }
         END { exit !(rows > 0 && bad == 0) }'
}

echo "# $(uname -r); $(rdma link show 2>&1 | head -1)"

# 1. The transport in use.
if want 1; then
out=$(LOOM_DEBUG=info timeout 120 loomrun -n 3 --timeout 100 sendrecv_perf -b 8 -e 8 -n 1 -w 0 2>&1)
if echo "$out" | grep -q "transport verbs (0 peer(s) over shm, 2 over verbs, 0 over tcp)"; then
    ok "LOOM_TRANSPORT=verbs: every peer over verbs ($(echo "$out" | grep -o 'verbs: using [^,]*, GID index [0-9]* ([^)]*)' | head -1))"
else
    bad "LOOM_TRANSPORT=verbs: the communicator does not report verbs"
    echo "$out" | tail -20
fi
fi

# 2. Every collective, 2, 3 and 4 ranks: 4, 92, 2116, 48668 and 1119364
#    bytes (odd counts; eager and rendezvous), in and out of place.
if want 2; then
for n in 2 3 4; do
    for b in all_reduce reduce_scatter all_gather alltoall broadcast reduce gather scatter sendrecv; do
        root=
        case $b in broadcast | reduce | gather | scatter) root="-r $((n - 1))" ;; esac
        run $n ${b}_perf -b 4 -e 2M -f 23 -n 1 -w 0 -c 1 $root
        if [ $rc -eq 0 ] && echo "$out" | wrong_ok && echo "$out" | grep -q "Out of bounds values : 0 OK"; then
            ok "${b}_perf on $n ranks over verbs: #wrong 0"
        else
            bad "${b}_perf on $n ranks over verbs (exit $rc)"
            echo "$out" | grep -v '^#' | tail -15
        fi
    done
done
# Every algorithm of allreduce, and small chunks (many messages in
# flight, credits exhausted and returned), on 3 ranks.
for a in ring recursive_doubling halving_doubling tree; do
    LOOM_ALGO=allreduce:$a run 3 all_reduce_perf -b 4 -e 2M -f 23 -n 2 -w 0 -c 1
    if [ $rc -eq 0 ] && echo "$out" | wrong_ok; then ok "all_reduce_perf, LOOM_ALGO=allreduce:$a, 3 ranks: #wrong 0"
    else bad "all_reduce_perf, LOOM_ALGO=allreduce:$a, 3 ranks (exit $rc)"; echo "$out" | grep -v '^#' | tail -8; fi
done
LOOM_CHUNK_SIZE=4K run 4 all_reduce_perf -b 1M -e 4M -f 4 -n 2 -w 0 -c 1
if [ $rc -eq 0 ] && echo "$out" | wrong_ok; then ok "all_reduce_perf, 4K chunks, 4 ranks: #wrong 0"
else bad "all_reduce_perf, 4K chunks, 4 ranks (exit $rc)"; echo "$out" | grep -v '^#' | tail -8; fi
fi

# 3. The multi-process tests.
if want 3; then
if [ -z "${LOOM_VM_QUICK:-}" ]; then
    for n in 2 3 4; do
        run $n mp_allreduce quick
        if [ $rc -eq 0 ]; then ok "mp_allreduce on $n ranks over verbs: $(echo "$out" | grep 'rank 0 of')"
        else bad "mp_allreduce on $n ranks over verbs (exit $rc)"; echo "$out" | tail -10; fi
        run $n mp_p2p
        if [ $rc -eq 0 ]; then ok "mp_p2p on $n ranks over verbs: $(echo "$out" | grep 'rank 0 of')"
        else bad "mp_p2p on $n ranks over verbs (exit $rc)"; echo "$out" | tail -10; fi
    done
    # Ranks that forced different algorithms: the schedules in the tags
    # are compared, eager and rendezvous, and both ranks fail at once
    # (LOOM_TIMEOUT 30 s, so a timeout fails the check).
    for count in 1024 1048576; do
        t0=$(date +%s)
        LOOM_TIMEOUT=30000 run 2 mp_allreduce forced allreduce:ring allreduce:halving_doubling $count
        secs=$(($(date +%s) - t0))
        if [ "$(echo "$out" | grep -c '^rank [01] (allreduce:[a-z_]*): peers disagree')" = 2 ] &&
            echo "$out" | grep -q 'where this rank runs (allreduce, ' && [ $secs -lt 30 ]; then
            ok "set_algo differing over verbs, $count floats: both ranks fail in ${secs}s, naming the schedules"
        else bad "set_algo differing over verbs, $count floats (${secs}s)"; echo "$out" | tail -6; fi
    done
    # Registrations end with loom_mem_deregister (and Loom's own when
    # idle): new memory at an old address is never written through a
    # stale registration.
    for n in 2 3; do
        run $n mp_memreg 4
        if [ $rc -eq 0 ]; then ok "mp_memreg on $n ranks over verbs: $(echo "$out" | grep 'rank 0 of')"
        else bad "mp_memreg on $n ranks over verbs (exit $rc)"; echo "$out" | tail -10; fi
    done
fi
fi

# 4. The kill test.
# "stop": the victim is SIGSTOPped (alive, its queue pairs still answered
# by the kernel, saying nothing): the survivors fail by LOOM_TIMEOUT (3 s).
if want 4; then
for nv in "2 1 kill 20000 5000" "4 1 kill 20000 5000" "4 3 kill 20000 5000" "2 1 stop 3000 6000"; do
    set -- $nv
    n=$1 victim=$2 mode=$3 limit=$5
    rm -rf $tmp/out $tmp/stamp*
    LOOM_TIMEOUT=$4 timeout 200 loomrun -n $n --keep-going --timeout 180 --output $tmp/out \
        mp_kill $victim $tmp/stamp $((4 << 20)) $mode >/dev/null 2>&1
    good=1 worst=0 r=0
    while [ $r -lt $n ]; do
        if [ $r -ne $victim ]; then
            line=$(cat $tmp/out/rank.$r.out 2>/dev/null)
            case "$line" in
            *": OK after "*) ;;
            *) good=0; echo "  rank $r: ${line:-no output}"; tail -3 $tmp/out/rank.$r.err 2>/dev/null
               # A sanitizer's report: where it happened (Loom's frames).
               grep -E 'Sanitizer|loom|verbs\.c|/src/' $tmp/out/rank.$r.err 2>/dev/null | head -20 ;;
            esac
            ms=$(echo "$line" | sed -n 's/.*after \([0-9.]*\) ms.*/\1/p')
            [ -n "$ms" ] && worst=$(echo "$ms $worst" | awk '{print ($1>$2)?$1:$2}')
        fi
        r=$((r + 1))
    done
    if [ $good -eq 1 ] && awk "BEGIN{exit !($worst < $limit)}"; then
        ok "$mode rank $victim of $n mid-allreduce over verbs: every survivor failed cleanly, slowest after $worst ms"
    else
        bad "$mode rank $victim of $n mid-allreduce over verbs (slowest $worst ms)"
    fi
done
fi

# 5. Selection between verbs and TCP: 4 ranks on 2 "hosts" (LOOM_HOSTNAME
#    from the rank), every transport allowed.  The probe measures the
#    inter-host pair over verbs and over TCP; the faster at 1 MiB must
#    carry every inter-host peer's data (shared memory within a host), and
#    the collectives must be right after the switch.
if want 5; then
printf '#!/bin/sh\nexport LOOM_HOSTNAME=h$((LOOM_RANK / 2))\nexec "$@"\n' >$tmp/hosts2
chmod +x $tmp/hosts2
out=$(LOOM_TRANSPORT= LOOM_DEBUG=info timeout 300 loomrun -n 4 --timeout 280 \
    $tmp/hosts2 all_reduce_perf -b 4 -e 2M -f 23 -n 2 -w 0 -c 1 2>&1)
rc=$?
fig=$(echo "$out" | grep 'rank 0\]' | grep -o 'between hosts verbs alpha.*' | head -1)
ready=$(echo "$out" | grep 'rank 0\]' | grep -o 'transport [^ ]* ([0-9]* peer(s) over shm, [0-9]* over verbs, [0-9]* over tcp)' | head -1)
choice=${fig##*data over }
echo "# selection: $fig"
echo "# rank 0: $ready"
# verbs alpha A us beta B ns/B, tcp alpha C us beta D ns/B: the model's
# time at 1 MiB decides.
faster=$(echo "$fig" | awk '{ for (i = 1; i <= NF; i++) { if ($i == "alpha") a[++n] = $(i + 1); if ($i == "beta") b[n] = $(i + 1) } }
    END { if (n == 2) { v = a[1] + b[1] * 1048.576; t = a[2] + b[2] * 1048.576; print (v <= t) ? "verbs" : "tcp" } }')
if [ -n "$fig" ] && [ "$choice" = "$faster" ]; then
    ok "verbs and TCP both measured between hosts; the faster at 1 MiB ($choice) carries the data"
else
    bad "selection between verbs and TCP (figures: ${fig:-none}; faster: ${faster:-?})"
fi
case $choice in
verbs) want="(1 peer(s) over shm, 2 over verbs, 0 over tcp)" ;;
*) want="(1 peer(s) over shm, 0 over verbs, 2 over tcp)" ;;
esac
if echo "$ready" | grep -qF "$want"; then ok "rank 0 routes as chosen: $ready"
else bad "rank 0 routes ${ready:-?}, expected $want"; fi
if [ $rc -eq 0 ] && echo "$out" | grep -v '^loom\[' | wrong_ok; then ok "all_reduce_perf on 2 hosts x 2 ranks after the choice: #wrong 0"
else bad "all_reduce_perf on 2 hosts x 2 ranks after the choice (exit $rc)"; echo "$out" | grep -v '^#' | tail -8; fi
fi

# 6. Figures: the same device, the same VM, the same run.
if want 6; then
if [ -z "${LOOM_VM_QUICK:-}" ]; then
    sz=4194304
    gid=$(echo "$(LOOM_DEBUG=info timeout 60 loomrun -n 1 sendrecv_perf -b 8 -e 8 -n 1 -w 0 2>&1)" |
        sed -n 's/.*GID index \([0-9]*\).*/\1/p' | head -1)
    [ -n "$gid" ] || gid=1
    ibbw() { # ibbw EXTRA_FLAGS: ib_write_bw's average MB/s at $sz bytes
        ib_write_bw -d rxe0 -x $gid -s $sz -n 150 -F $1 >$tmp/srv 2>&1 &
        spid=$!
        sleep 1
        timeout 120 ib_write_bw -d rxe0 -x $gid -s $sz -n 150 -F $1 10.9.0.1 >$tmp/cli 2>&1
        wait $spid
        awk -v s=$sz '$1 == s && NF >= 5 { print $4 }' $tmp/cli | tail -1
    }
    uni=$(ibbw "")
    bi=$(ibbw "-b")
    echo "# ib_write_bw, $sz bytes, rxe0 GID $gid: unidirectional $uni MB/s, bidirectional (sum) $bi MB/s"
    grep -E "^ *$sz" $tmp/cli | sed 's/^/#   /'
    # sendrecv on 2 ranks: each sends to the other at once, so each
    # direction carries algbw (and the device both together).
    run 2 sendrecv_perf -b $sz -e $sz -n 40 -w 4 -c 0
    echo "$out" | grep -v '^# *$' | grep -E '^ *[0-9]|size' | sed 's/^/#   /'
    sr=$(echo "$out" | awk '!/^#/ && NF >= 13 && $6 > 0 { printf "%.2f\n", $1 / $6 }' | tail -1)
    echo "# sendrecv_perf over verbs, $sz bytes, 2 ranks: $sr MB/s each way"
    if awk "BEGIN{exit !(${sr:-0} > 0 && ${bi:-0} > 0 && ${uni:-0} > 0)}"; then
        echo "# ratio: Loom both ways / ib_write_bw -b = $(awk "BEGIN{printf \"%.2f\", 2*$sr/$bi}"); Loom one way / ib_write_bw one way = $(awk "BEGIN{printf \"%.2f\", $sr/$uni}")"
        if [ -n "${LOOM_VM_BW_MIN:-}" ]; then
            if awk "BEGIN{exit !(2*$sr/$bi >= $LOOM_VM_BW_MIN)}"; then ok "sendrecv over verbs >= $LOOM_VM_BW_MIN of ib_write_bw -b"
            else bad "sendrecv over verbs < $LOOM_VM_BW_MIN of ib_write_bw -b"; fi
        fi
    fi
    # A 64 MiB allreduce on 2 ranks: verbs, then TCP.
    for tr in verbs tcp; do
        LOOM_TRANSPORT=$tr run 2 all_reduce_perf -b 64M -e 64M -n 5 -w 1 -c 1
        echo "$out" | grep -E '^ *[0-9]' | sed "s/^/#   $tr: /"
        t=$(echo "$out" | awk '!/^#/ && NF >= 13 { print $6 }' | tail -1)
        eval "ar_$tr=\$t"
        if [ $rc -eq 0 ] && echo "$out" | wrong_ok; then ok "64 MiB allreduce over $tr on 2 ranks: #wrong 0, $t us"
        else bad "64 MiB allreduce over $tr on 2 ranks (exit $rc)"; echo "$out" | tail -5; fi
    done
    [ -n "$ar_verbs" ] && [ -n "$ar_tcp" ] &&
        echo "# 64 MiB allreduce, 2 ranks: verbs $ar_verbs us, tcp $ar_tcp us: verbs is $(awk "BEGIN{printf \"%.2f\", $ar_tcp/$ar_verbs}")x TCP's speed"
fi
fi

# 7. The NIC each rank opens.  The fixture is a server with 8 GPUs and 4
#    NICs whose second NIC, next to GPUs 2 and 3, is named rxe0: local
#    ranks 2 and 3 open it as theirs; ranks 0 and 1, whose NIC (mlx5_0)
#    this VM lacks, say so and take the first active device, rxe0 too.
if want 7; then
out=$(LOOM_DEBUG=info LOOM_TOPO_FILE=/loom/topo_rxe.xml timeout 120 loomrun -n 4 --timeout 100 \
    loom-info --job 2>&1)
rc=$?
good=1
for r in 0 1 2 3; do
    echo "$out" | grep -q "rank $r\] INFO .*verbs: using rxe0 " || { good=0; echo "# rank $r: no 'verbs: using rxe0'"; }
    fb=$(echo "$out" | grep -c "rank $r\] INFO .*the topology's NIC for this rank, mlx5_0, is not usable")
    case $r in 0 | 1) [ "$fb" = 1 ] || { good=0; echo "# rank $r: no fallback from mlx5_0"; } ;;
    *) [ "$fb" = 0 ] || { good=0; echo "# rank $r: fell back"; } ;; esac
    echo "$out" | grep -q "^  rank $r: local $r pid [0-9]* numa 0 gpu $r (cuda$r) nic 1 (rxe0, open)" ||
        { good=0; echo "# rank $r: loom-info does not show nic 1 (rxe0, open)"; }
done
if [ $rc -eq 0 ] && [ $good = 1 ]; then ok "each rank opens the topology's NIC, or the first active one where it is missing; loom-info shows them"
else bad "NIC choice (exit $rc)"; echo "$out" | grep -E 'verbs|  rank' | tail -12; fi
fi

# 8. Ranks whose collective calls differ (tests/mp/test_mismatch.sh over
#    verbs): the call's check rides in the eager header and in the
#    clear-to-send of a rendezvous; every rank fails with
#    LOOM_ERR_MISMATCH within a second (LOOM_TIMEOUT 30 s), and the
#    message names the rank that differs (or both, with 2 ranks) and
#    both calls.
if want 8; then
for n in 2 3; do
    for c in "count1k 1000 1024" "count1m 1000000 1048576" "op max sum" "bcast bcast sum"; do
        set -- $c
        cs=$1
        case $cs in
        op) oddc="loom_allreduce(count=1024, float32, max)"
            majc="loom_allreduce(count=1024, float32, sum)" ;;
        bcast) oddc="loom_broadcast(count=1024, float32, root=0)"
            majc="loom_allreduce(count=1024, float32, sum)" ;;
        *) oddc="loom_allreduce(count=$2, float32, sum)"
            majc="loom_allreduce(count=$3, float32, sum)" ;;
        esac
        if [ $n = 2 ]; then want_msg="rank 0 called $majc, rank 1 called $oddc"
        else want_msg="rank 1 called $oddc while ranks 0, 2 called $majc"; fi
        LOOM_TIMEOUT=30000 run $n mp_mismatch $cs 1
        good=1 worst=0 r=0
        while [ $r -lt $n ]; do
            line=$(echo "$out" | grep "^rank $r: $cs: LOOM_ERR_MISMATCH in " | head -1)
            ms=$(echo "$line" | sed -n 's/.* in \([0-9]*\)[.0-9]* ms.*/\1/p')
            if [ -z "$ms" ] || [ "$ms" -ge 1000 ] || ! echo "$line" | grep -qF "$want_msg"; then
                good=0
                echo "  rank $r: ${line:-no LOOM_ERR_MISMATCH}"
            fi
            [ -n "$ms" ] && [ "$ms" -gt "$worst" ] && worst=$ms
            r=$((r + 1))
        done
        if [ $good = 1 ]; then ok "mp_mismatch $cs on $n ranks over verbs: every rank LOOM_ERR_MISMATCH within $worst ms, naming both calls"
        else bad "mp_mismatch $cs on $n ranks over verbs (exit $rc)"; echo "$out" | grep '^rank' | tail -6; fi
    done
done
fi

# 9. Registrations and credit words (tests/verbs/verbs_access.c): each
#    of its checks counts here.
if want 9; then
out=$(timeout 240 verbs_access 2>&1)
rc=$?
echo "$out" | grep '^#'
okn=$(echo "$out" | grep -c '^ok ')
badn=$(echo "$out" | grep -c '^FAIL ')
echo "$out" | grep -E '^(ok|FAIL) ' | sed 's/ - / - verbs_access: /'
pass=$((pass + okn))
fail=$((fail + badn))
if [ $rc -ne 0 ] && [ "$badn" = 0 ]; then bad "verbs_access (exit $rc)"; echo "$out" | tail -5; fi
fi

# 10. GPUDirect RDMA on rxe (tests/gpu/gpudirect real, with the fake CUDA
#     driver of tests/gpu/cuda_fake.c, whose "dmabuf" is a memfd): the
#     soft-RoCE driver cannot register a dmabuf, so under the default
#     LOOM_GPUDIRECT=auto device memory falls back to staging, with the
#     reason, and no error; under LOOM_GPUDIRECT=1 the refusal is an
#     error naming the variable.
if want 10; then
if [ -f /loom/cuda/libcuda.so.1 ]; then
    out=$(LD_LIBRARY_PATH=/loom/cuda:$LD_LIBRARY_PATH LOOM_TRANSPORT=verbs timeout 120 \
        loomrun -n 2 --timeout 100 gpudirect real 2>&1); rc=$?
    path=$(echo "$out" | grep -m1 '^gpudirect path: ')
    if [ $rc -eq 0 ] && echo "$path" | grep -q 'staged through host memory' &&
        echo "$path" | grep -q 'ibv_reg_dmabuf_mr'; then
        ok "GPUDirect auto on rxe: falls back to staging, no error: ${path#gpudirect path: }"
    else bad "GPUDirect auto on rxe (exit $rc)"; echo "$out" | tail -8; fi
    out=$(LD_LIBRARY_PATH=/loom/cuda:$LD_LIBRARY_PATH LOOM_TRANSPORT=verbs LOOM_GPUDIRECT=1 \
        timeout 120 loomrun -n 2 --timeout 100 gpudirect real 2>&1); rc=$?
    if [ $rc -ne 0 ] && echo "$out" | grep -q 'loom_mem_register.*LOOM_GPUDIRECT=1' &&
        echo "$out" | grep -q 'loom_alltoall: LOOM_GPUDIRECT=1'; then
        ok "GPUDirect =1 on rxe: loom_mem_register and an alltoall on device buffers fail, naming LOOM_GPUDIRECT (exit $rc)"
    else bad "GPUDirect =1 on rxe (exit $rc)"; echo "$out" | tail -8; fi
    # The device-direct path itself, the NIC's dmabuf registration stood
    # in for (gpudirect.c): alltoall, allgather, broadcast on device
    # buffers through rxe0, results checked; then one rank staged.
    for mixed in 0 1; do
        for n in 2 3; do
            out=$(LD_LIBRARY_PATH=/loom/cuda:$LD_LIBRARY_PATH LOOM_TRANSPORT=verbs LOOM_CUDA_IPC=0 GD_MIXED=$mixed \
                LOOM_CUDA_PIPELINE_CHUNK=1M timeout 180 loomrun -n $n --timeout 170 gpudirect direct 2>&1); rc=$?
            if [ $rc -eq 0 ]; then
                ok "GPUDirect path on $n ranks over verbs$([ $mixed = 1 ] && echo ', rank 1 staged'): $(echo "$out" | grep -m1 'calls direct' | sed 's/^ok *//')"
            else bad "GPUDirect path on $n ranks over verbs, mixed=$mixed (exit $rc)"; echo "$out" | grep -v '^ok' | tail -12; fi
        done
    done
else
    echo "# no fake CUDA driver in the VM: GPUDirect not checked"
fi
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
