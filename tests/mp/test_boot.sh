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

# An unreachable root: LOOM_ERR_CONNECT (13) within the deadline, naming it.
dead=$(free_port)
out=$(clean_env LOOM_ROOT=127.0.0.1:$dead LOOM_RANK=1 LOOM_SIZE=2 LOOM_TIMEOUT=1500 timeout 30 "$prog" expect 13 4000)
check "unreachable root: error naming 127.0.0.1:$dead within the timeout ($out)" [ $? -eq 0 ]
# A mismatched job: a rank with another job key is refused at once (12)
# and the real job's rank 0 gives up at its deadline with TIMEOUT (8).
p2=$(free_port)
clean_env LOOM_ROOT=127.0.0.1:$p2 LOOM_RANK=0 LOOM_SIZE=2 LOOM_JOB_KEY=jobA LOOM_TIMEOUT=3000 \
    timeout 30 "$prog" expect 8 6000 > "${TMPDIR:-/tmp}/loom-boot-$$.0" &
sleep 0.3
out=$(clean_env LOOM_ROOT=127.0.0.1:$p2 LOOM_RANK=1 LOOM_SIZE=2 LOOM_JOB_KEY=jobB LOOM_TIMEOUT=3000 \
    timeout 30 "$prog" expect 12 2000)
check "mismatched job key refused with LOOM_ERR_MISMATCH ($out)" [ $? -eq 0 ]
wait $!; rc=$?
check "the lone rank 0 times out with LOOM_ERR_TIMEOUT ($(cat "${TMPDIR:-/tmp}/loom-boot-$$.0"))" [ $rc -eq 0 ]
rm -f "${TMPDIR:-/tmp}/loom-boot-$$.0"
# A hello of another protocol version, shorter than this one's: refused
# at once, judged by its first words, not waited for until the deadline.
p4=$(free_port)
clean_env LOOM_ROOT=127.0.0.1:$p4 LOOM_RANK=0 LOOM_SIZE=2 LOOM_JOB_KEY=k LOOM_TIMEOUT=3000 \
    timeout 30 "$prog" expect 8 6000 >/dev/null &
sleep 0.3
out=$(timeout 10 python3 - "$p4" <<'PY'
import socket, struct, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
t0 = time.time()
s.sendall(struct.pack("<II", 0x4c4d4254, 3) + bytes(40))  # magic "LMBT", version 3
got = b""
while len(got) < 16 + 320:
    k = s.recv(4096)
    if not k:
        break
    got += k
magic, code = struct.unpack("<Ii", got[:8])
msg = got[16:].split(b"\0")[0].decode()
print("%d %.0f ms: %s" % (code, (time.time() - t0) * 1e3, msg))
PY
)
wait
check "a hello of protocol version 3 refused at once with LOOM_ERR_MISMATCH ($out)" \
    bash -c "[[ '$out' =~ ^12\ ([0-9]+)\ ms:\ .*version\ 3\ is\ not ]] && [ \${BASH_REMATCH[1]} -lt 1000 ]"
# Different job sizes on one root.
p3=$(free_port)
clean_env LOOM_ROOT=127.0.0.1:$p3 LOOM_RANK=0 LOOM_SIZE=2 LOOM_JOB_KEY=k LOOM_TIMEOUT=2000 \
    timeout 30 "$prog" expect 8 5000 >/dev/null &
sleep 0.3
out=$(clean_env LOOM_ROOT=127.0.0.1:$p3 LOOM_RANK=1 LOOM_SIZE=3 LOOM_JOB_KEY=k LOOM_TIMEOUT=2000 \
    timeout 30 "$prog" expect 12 2000)
check "a rank with another job size refused with LOOM_ERR_MISMATCH ($out)" [ $? -eq 0 ]
wait
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
