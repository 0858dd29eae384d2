#!/bin/bash
# Bootstrap: every launcher environment Loom reads, the unique-id path,
# and the errors for an unreachable root and a mismatched job.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_boot
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
clean_env() { env -u LOOM_ROOT -u LOOM_RANK -u LOOM_SIZE -u LOOM_JOB_KEY -u RANK -u WORLD_SIZE \
    -u MASTER_ADDR -u MASTER_PORT -u SLURM_PROCID -u SLURM_NTASKS -u OMPI_COMM_WORLD_RANK \
    -u OMPI_COMM_WORLD_SIZE "$@"; }
# Start N ranks with per-rank variables given by a function, wait for all.
launch() { # launch N setter
    local n=$1 setter=$2 pids=() rc=0
    for r in $(seq 0 $((n - 1))); do
        ( eval "$($setter "$r" "$n")"; exec timeout 60 "$prog" env ) &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}
port=$(free_port)
torch() { echo "export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$1 WORLD_SIZE=$2"; }
check "torchrun variables (MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE), 3 ranks" clean_env bash -c "$(declare -f launch torch); prog=$prog port=$port; launch 3 torch"
slurm() { echo "export SLURM_PROCID=$1 SLURM_NTASKS=$2 SLURM_JOB_ID=4242$port SLURM_STEP_ID=0 SLURM_STEP_NODELIST=localhost"; }
check "Slurm variables (SLURM_PROCID/SLURM_NTASKS/SLURM_STEP_NODELIST), 3 ranks" clean_env bash -c "$(declare -f launch slurm); prog=$prog port=$port; launch 3 slurm"
ompi() { echo "export OMPI_COMM_WORLD_RANK=$1 OMPI_COMM_WORLD_SIZE=$2 OMPI_COMM_WORLD_LOCAL_SIZE=$2 OMPI_MCA_ess_base_jobid=77$port"; }
check "Open MPI variables (OMPI_COMM_WORLD_RANK/SIZE), 2 ranks" clean_env bash -c "$(declare -f launch ompi); prog=$prog port=$port; launch 2 ompi"
if command -v mpirun >/dev/null 2>&1; then
    check "under a real mpirun, 3 ranks" clean_env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        timeout 120 mpirun --oversubscribe -np 3 "$prog" env
fi
check "unique id passed to 4 forked ranks (loom_comm_init_rank)" timeout 60 "$prog" uid 4
check "loomrun environment, 5 ranks" timeout 60 "$LOOMRUN" -n 5 "$prog" env

# after_ms OUTPUT: the N of mp_boot expect's "... after N ms: ...".
after_ms() { sed -n 's/^.* after \([0-9]*\) ms: .*/\1/p' <<<"$1" | head -1; }
# A root nobody listens on: LOOM_ERR_CONNECT (13) at the deadline, naming
# the address and the real error (it said "Connection timed out": the
# deadline's own ETIMEDOUT replaced ECONNREFUSED), the retries logged at
# info with how long they go on.
dead=$(free_port)
log=$(mktemp)
out=$(clean_env LOOM_DEBUG=info LOOM_ROOT=127.0.0.1:$dead LOOM_RANK=1 LOOM_SIZE=2 LOOM_TIMEOUT=1500 \
    timeout 30 "$prog" expect 13 2500 "Connection refused (ECONNREFUSED)" "LOOM_TIMEOUT=1500 ms" 2>"$log")
rc=$? ms=$(after_ms "$out")
check "root nobody listens on: LOOM_ERR_CONNECT naming 127.0.0.1:$dead and ECONNREFUSED at the deadline ($out)" \
    [ $rc -eq 0 -a "${ms:-0}" -ge 1400 ]
check "the retries are logged at info, with the error and how long they go on ($(grep -m1 retrying "$log"))" \
    grep -q "INFO .*rendezvous root 127.0.0.1:$dead: Connection refused (ECONNREFUSED) on attempt 1; retrying, for 1\.[0-9] s more (LOOM_TIMEOUT=1500 ms)" "$log"
rm -f "$log"
# Rank 0 given a root address that is not this host's: it fails at once
# naming it (it listened on every address and waited instead).
# 203.0.113.0/24 is for documentation: no host has it.
out=$(clean_env LOOM_ROOT=203.0.113.77:$dead LOOM_RANK=0 LOOM_SIZE=2 LOOM_TIMEOUT=20000 \
    timeout 30 "$prog" expect 4 1000 "203.0.113.77:$dead" "is not an address of this host")
check "rank 0 with a root address not on its host: LOOM_ERR_INVALID_ARGUMENT at once, naming it ($out)" \
    [ $? -eq 0 ]
# A rank that never comes: every rank registered says which one, when the
# first deadline passes (rank 0's, here), not just "deadline passed".
pm=$(free_port)
f0=$(mktemp)
clean_env LOOM_ROOT=127.0.0.1:$pm LOOM_RANK=0 LOOM_SIZE=4 LOOM_TIMEOUT=1500 \
    timeout 30 "$prog" expect 8 2500 "never registered: ranks 2-3" "2 of 4 ranks" >"$f0" &
p0=$!
sleep 0.3
out=$(clean_env LOOM_ROOT=127.0.0.1:$pm LOOM_RANK=1 LOOM_SIZE=4 LOOM_TIMEOUT=1500 \
    timeout 30 "$prog" expect 8 2500 "never registered: ranks 2-3" "rank 0's deadline")
rc=$?
wait $p0
rc0=$?
check "missing ranks: rank 0 names them at its deadline ($(cat "$f0"))" [ $rc0 -eq 0 ]
check "missing ranks: rank 1 is told which, when rank 0's deadline passes ($out)" [ $rc -eq 0 ]
rm -f "$f0"
# Time variables take units: LOOM_TIMEOUT=20s is 20 seconds, a bare number
# is still milliseconds, and a deadline under a second says so.
out=$(LOOM_TIMEOUT=20s LOOM_HEARTBEAT_MS=0.5s LOOM_SPIN_US=1ms timeout 60 "$LOOMRUN" -n 2 "$prog" env 2>&1)
check "LOOM_TIMEOUT=20s, LOOM_HEARTBEAT_MS=0.5s, LOOM_SPIN_US=1ms: the job runs" [ $? -eq 0 ]
out=$(LOOM_TIMEOUT=60000 timeout 60 "$LOOMRUN" -n 2 "$prog" env 2>&1)
check "LOOM_TIMEOUT=60000 (milliseconds, as ever): the job runs" [ $? -eq 0 ]
out=$(clean_env LOOM_ROOT=127.0.0.1:$dead LOOM_RANK=1 LOOM_SIZE=2 LOOM_TIMEOUT=20 \
    timeout 30 "$prog" expect 13 1000 "LOOM_TIMEOUT=20 ms (did you mean 20s?")
check "LOOM_TIMEOUT=20: the error says the deadline is 20 ms and asks about 20s ($out)" [ $? -eq 0 ]
out=$(clean_env LOOM_ROOT=127.0.0.1:$dead LOOM_RANK=1 LOOM_SIZE=2 LOOM_TIMEOUT=20sec \
    timeout 30 "$prog" expect 4 1000 "LOOM_TIMEOUT=20sec is invalid")
check "LOOM_TIMEOUT=20sec: LOOM_ERR_INVALID_ARGUMENT naming the variable and value ($out)" [ $? -eq 0 ]
# A mismatched job: a rank with another job key is refused at once (12),
# by the handshake (the root does not prove itself to it), and the real
# job's rank 0 gives up at its deadline with TIMEOUT (8).
hexkey() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
keyA=$(hexkey) keyB=$(hexkey)
p2=$(free_port)
clean_env LOOM_ROOT=127.0.0.1:$p2 LOOM_RANK=0 LOOM_SIZE=2 LOOM_JOB_KEY=$keyA LOOM_TIMEOUT=3000 \
    timeout 30 "$prog" expect 8 6000 > "${TMPDIR:-/tmp}/loom-boot-$$.0" &
sleep 0.3
out=$(clean_env LOOM_ROOT=127.0.0.1:$p2 LOOM_RANK=1 LOOM_SIZE=2 LOOM_JOB_KEY=$keyB LOOM_TIMEOUT=3000 \
    timeout 30 "$prog" expect 12 2000 "does not hold this job's key" "LOOM_JOB_KEY differs")
check "mismatched job key refused with LOOM_ERR_MISMATCH by the handshake ($out)" [ $? -eq 0 ]
wait $!; rc=$?
check "the lone rank 0 times out with LOOM_ERR_TIMEOUT ($(cat "${TMPDIR:-/tmp}/loom-boot-$$.0"))" [ $rc -eq 0 ]
rm -f "${TMPDIR:-/tmp}/loom-boot-$$.0"
# A process that does not begin with the handshake (an older Loom, or
# anything else) is dropped at once, without an answer: nothing is read
# from it but the handshake's first bytes; the root logs it with its
# address.
p4=$(free_port)
f4=$(mktemp)
clean_env LOOM_ROOT=127.0.0.1:$p4 LOOM_RANK=0 LOOM_SIZE=2 LOOM_JOB_KEY=$keyA LOOM_TIMEOUT=3000 \
    LOOM_DEBUG=warn timeout 30 "$prog" expect 8 6000 >/dev/null 2>"$f4" &
sleep 0.3
out=$(timeout 10 python3 - "$p4" <<'PY'
import socket, struct, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
t0 = time.time()
s.sendall(struct.pack("<II", 0x4c4d4254, 5) + bytes(1200))  # a version 5 hello
got = b""
try:
    while True:
        k = s.recv(4096)
        if not k:
            break
        got += k
except ConnectionResetError:
    pass
print("%d bytes, closed after %.0f ms" % (len(got), (time.time() - t0) * 1e3))
PY
)
wait
check "a hello without the handshake dropped at once, unanswered ($out)" \
    bash -c "[[ '$out' =~ ^0\ bytes,\ closed\ after\ ([0-9]+)\ ms ]] && [ \${BASH_REMATCH[1]} -lt 1000 ]"
check "... and the root logged the refusal with the address ($(grep -m1 refused "$f4"))" \
    grep -q "refused a connection from 127.0.0.1:[0-9]*: not a Loom handshake" "$f4"
rm -f "$f4"
# LOOM_JOB_KEY that is not a secret, and a job across hosts without one:
# refused at once, naming the variable.
out=$(clean_env LOOM_ROOT=127.0.0.1:$p4 LOOM_RANK=1 LOOM_SIZE=2 LOOM_JOB_KEY=jobA \
    timeout 30 "$prog" expect 4 1000 "LOOM_JOB_KEY is shorter than 32 hex digits" "openssl rand")
check "LOOM_JOB_KEY=jobA: LOOM_ERR_INVALID_ARGUMENT at once, naming it ($out)" [ $? -eq 0 ]
out=$(clean_env LOOM_ROOT=203.0.113.77:$p4 LOOM_RANK=1 LOOM_SIZE=2 \
    timeout 30 "$prog" expect 5 1000 "is on another host and the job has no secret" "LOOM_JOB_KEY")
check "a root on another host and no LOOM_JOB_KEY: refused at once, naming LOOM_JOB_KEY ($out)" \
    [ $? -eq 0 ]
# Different job sizes on one root, with a key and without one (without,
# the key came from the root address and the size, and the message was
# "carries another job's key"): every rank is refused at once, naming
# both sizes.
for key in $keyA ""; do
    p3=$(free_port)
    f0=$(mktemp)
    clean_env LOOM_ROOT=127.0.0.1:$p3 LOOM_RANK=0 LOOM_SIZE=2 ${key:+LOOM_JOB_KEY=$key} LOOM_TIMEOUT=5000 \
        timeout 30 "$prog" expect 12 2000 "says the job has 3 ranks, the job has 2" >"$f0" &
    p0=$!
    sleep 0.3
    out=$(clean_env LOOM_ROOT=127.0.0.1:$p3 LOOM_RANK=1 LOOM_SIZE=3 ${key:+LOOM_JOB_KEY=$key} LOOM_TIMEOUT=5000 \
        timeout 30 "$prog" expect 12 1000 "rank 1 (pid" "says the job has 3 ranks, the job has 2")
    rc=$?
    wait $p0
    rc0=$?
    check "LOOM_SIZE=3 against 2${key:- (no LOOM_JOB_KEY)}: rank 1 refused at once, naming both sizes ($out)" [ $rc -eq 0 ]
    check "LOOM_SIZE=3 against 2${key:- (no LOOM_JOB_KEY)}: rank 0 refused too, not left to time out ($(cat "$f0"))" [ $rc0 -eq 0 ]
    rm -f "$f0"
done
# Two jobs started by hand on one root port, without keys: they merged
# (job A's rank 0 with job B's rank 1, both exit 0).  Now job B's rank 0
# fails at once on the taken address and tells job A's root, which
# refuses its job: no rank of either job gets a communicator.
p5=$(free_port)
d5=$(mktemp -d)
for jr in A0 B0 B1 A1; do
    clean_env LOOM_ROOT=127.0.0.1:$p5 LOOM_RANK=${jr#?} LOOM_SIZE=2 LOOM_TIMEOUT=2000 \
        timeout 30 "$prog" env >"$d5/$jr.out" 2>&1 &
    echo $! >"$d5/$jr.pid"
    sleep 0.2
done
for jr in A0 B0 B1 A1; do wait "$(cat "$d5/$jr.pid")"; echo $? >"$d5/$jr.rc"; done
check "two jobs on one root port: none of the 4 ranks gets a communicator (exit codes $(cat "$d5"/A0.rc "$d5"/B0.rc "$d5"/B1.rc "$d5"/A1.rc | tr '\n' ' '))" \
    [ "$(cat "$d5"/*.rc | grep -c '^0$')" = 0 ]
check "two jobs on one root port: job B's rank 0 fails on the address in use ($(grep -m1 -o 'cannot listen.*EADDRINUSE[^:]*' "$d5/B0.out"))" \
    grep -q "address in use (EADDRINUSE): is another job's root there?" "$d5/B0.out"
check "two jobs on one root port: job A's rank 0 is refused, told of the second rank 0 ($(grep -m1 -o 'refused the job: .*' "$d5/A0.out" | cut -c1-100))" \
    grep -q "refused the job: a second rank 0 (pid [0-9]* on .*) found this job's root address 127.0.0.1:$p5 in use" "$d5/A0.out"
rm -rf "$d5"
# Other orders: job A's rank 0 and job B's rank 1 make a whole job of two,
# which runs; then the other two come, A's rank 1 or B's rank 0 first.
# They merged: the mixed job ran to its end and exited 0 (the late two
# failed, one only at LOOM_TIMEOUT).  Now the root address stays held
# (the root's socket goes to the join service), and a rendezvous hello
# there with the job's key is refused at once and revokes the job.
late_pair() { # late_pair FIRST SECOND: the late ranks' order (A1 B0 or B0 A1)
    local p d jr mode first=$1
    p=$(free_port)
    d=$(mktemp -d)
    for jr in A0 B1 "$@"; do
        mode="train 8"
        case $jr in B0 | A1) mode="expect 0 3500" ;; esac
        # shellcheck disable=SC2086 # mode is words
        clean_env LOOM_ROOT=127.0.0.1:$p LOOM_RANK=${jr#?} LOOM_SIZE=2 LOOM_TIMEOUT=3000 \
            timeout 30 "$prog" $mode >"$d/$jr.out" 2>&1 &
        echo $! >"$d/$jr.pid"
        [ $jr = B1 ] && sleep 1
        sleep 0.3
    done
    for jr in A0 B1 A1 B0; do wait "$(cat "$d/$jr.pid")"; echo $? >"$d/$jr.rc"; done
    local msg="after a job with its key had formed without it: two jobs on one root address"
    check "two jobs, one formed and running, $first comes: refused at once, told why ($(head -c 220 "$d/$first.out"))" \
        bash -c 'grep -q "after [0-9]* ms: .*$2" "$1/$3.out" &&
                 [ "$(sed -n "s/.* after \([0-9]*\) ms.*/\1/p" "$1/$3.out")" -lt 1000 ]' _ "$d" "$msg" "$first"
    check "... the mixed job that ran is revoked on both its ranks, not left to exit 0 ($(cat "$d/A0.rc" "$d/B1.rc" | tr '\n' ' '); $(cat "$d/A0.out" "$d/B1.out" | cut -c1-140 | tr '\n' ' '))" \
        bash -c '[ "$(cat "$1/A0.rc")" = 1 ] && [ "$(cat "$1/B1.rc")" = 1 ] &&
                 grep -q "peers disagree .*two jobs on one root address" "$1/A0.out" &&
                 grep -q "peers disagree .*revoked by rank 0: .*two jobs share" "$1/B1.out"' _ "$d"
    check "... and neither late rank gets a communicator (exit codes $(cat "$d/A1.rc" "$d/B0.rc" | tr '\n' ' '))" \
        bash -c '! grep -q "^success" "$1/A1.out" "$1/B0.out"' _ "$d"
    rm -rf "$d"
}
late_pair A1 B0
late_pair B0 A1
# Settings that choose each rank's paths, set differently on one rank of
# three: every rank is refused at the rendezvous with LOOM_ERR_MISMATCH
# (12) naming the variable, at once, not after LOOM_TIMEOUT (20 s here:
# before the check they waited it out in the first collective, or called
# a live peer failed).
tf1=$(mktemp) tf2=$(mktemp)
printf 'alpha_intra 3e-6\nbeta_intra 1e-10\n' >"$tf1"
printf 'alpha_intra 4e-6\nbeta_intra 1e-10\n' >"$tf2"
one_rank() { # one_rank RANK VAR=VALUE [OTHERS=VALUE]: VAR on RANK only (OTHERS elsewhere)
    LOOM_TIMEOUT=20000 timeout 60 "$LOOMRUN" -n 3 bash -c \
        'if [ "$LOOM_RANK" = "$1" ]; then export "$2"; elif [ -n "$3" ]; then export "$3"; fi
         shift 3; exec "$@"' x "$@" "$prog" expect 12 3000 2>/dev/null
}
for set in "1 LOOM_SHM_SMALL=0" "2 LOOM_ALGO=allreduce:ring" "0 LOOM_CHUNK_SIZE=1M" \
    "1 LOOM_HEARTBEAT_MS=0" "2 LOOM_SHM_SIZE=8M" "1 LOOM_PROBE=0" "2 LOOM_TRANSPORT=tcp" "2 LOOM_SHM_CMA=1M" \
    "1 LOOM_TUNING_FILE=$tf1" "1 LOOM_TUNING_FILE=$tf2 LOOM_TUNING_FILE=$tf1"; do
    read -r rk var others <<<"$set"
    out=$(one_rank "$rk" "$var" "$others")
    rc=$?
    n=$(grep -c "^peers disagree .* after [0-9]* ms: .*${var%%=*} differs between ranks" <<<"$out")
    check "${var%%=*} different on rank $rk of 3${others:+ (set on the others too)}: all 3 refused at once, naming it ($(head -1 <<<"$out"))" \
        [ $rc -eq 0 -a "$n" = 3 ]
done
out=$(LOOM_CHUNK_SIZE=1M LOOM_TUNING_FILE=$tf1 timeout 60 "$LOOMRUN" -n 3 "$prog" env 2>&1)
check "the same settings on every rank: the job runs" [ $? -eq 0 ]
rm -f "$tf1" "$tf2"
check "LOOM_SOCKET_IFNAME=lo: data over the named interface" \
    env LOOM_SOCKET_IFNAME=lo timeout 60 "$LOOMRUN" -n 3 "$prog" env
out=$(LOOM_SOCKET_IFNAME==nosuchif0 LOOM_TIMEOUT=2000 timeout 60 "$LOOMRUN" -n 2 "$prog" env 2>&1)
check "LOOM_SOCKET_IFNAME naming no interface: an error that says so" \
    bash -c "grep -q 'LOOM_SOCKET_IFNAME' <<<'$out'"
# Logging: LOOM_DEBUG=info lines carry the rank; LOOM_DEBUG_FILE with %r
# gives one file per rank.
logdir=$(mktemp -d)
LOOM_DEBUG=info LOOM_DEBUG_FILE="$logdir/loom.%r.log" timeout 60 "$LOOMRUN" -n 2 "$prog" env
check "LOOM_DEBUG_FILE=%r: one log per rank, lines prefixed with the rank" \
    bash -c "grep -q 'rank 0\] INFO .*communicator ready' '$logdir/loom.0.log' &&
             grep -q 'rank 1\] INFO .*communicator ready' '$logdir/loom.1.log'"
rm -rf "$logdir"
out=$(clean_env timeout 10 "$prog" expect 5 1000)
check "no launcher environment: LOOM_ERR_INVALID_USAGE naming the variables ($out)" [ $? -eq 0 ]
finish
