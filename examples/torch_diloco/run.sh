#!/bin/bash
# run.sh - DiLoCo in PyTorch over Loom (diloco.py) against DDP over
# torch's gloo, on the same data and compute budget: a CSV per run, a
# table (final eval loss, bytes sent, wall clock, wall clock to a common
# loss) and, with matplotlib, a plot of the eval loss against wall clock
# and against bytes sent.
#
#   run.sh [-n WORKERS] [--netns RATE] [--out DIR] [--runs LIST] [-- ARGS...]
#   run.sh --elastic [--out DIR] [-- ARGS...]
#
#   -n WORKERS    workers, default 4
#   --netns RATE  one worker per network namespace ("host", through
#                 perf/netns_hosts.sh: needs root and iproute2), each
#                 host's egress limited to RATE with tbf (100mbit, 1gbit);
#                 bytes sent are then measured on rank 0's link.  Without
#                 it the workers run on this host under loomrun.
#   --runs LIST   comma-separated: ddp:gloo, ddp:loom, diloco:CODEC
#                 (none, int8, int4, ...); default
#                 ddp:gloo,diloco:none,diloco:int8,diloco:int4
#   --elastic     instead: 3 workers under loomrun, int8; rank 2 is
#                 SIGKILLed at round 3, then a replacement is started and
#                 joins (the workers wait for it at round 6 at the
#                 latest); prints what each process saw.
#   ARGS          passed to every run (e.g. --steps 600 --inner 30)
#
# Python: PYTHON (default /usr/bin/python3); the loom package and libloom
# as installed, or from a build tree: BUILDDIR (then LOOM_LIBRARY and
# PYTHONPATH are set from it and loomrun is taken from there).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
n=4 rate= out=torch-diloco-out elastic=
runs=ddp:gloo,diloco:none,diloco:int8,diloco:int4
while [ $# -gt 0 ]; do
    case $1 in
    -n) n=$2; shift 2 ;;
    --netns) rate=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --elastic) elastic=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
PY=${PYTHON:-/usr/bin/python3}
if [ -n "${BUILDDIR:-}" ]; then
    export LOOM_LIBRARY=${LOOM_LIBRARY:-$BUILDDIR/.libs/libloom.so.0}
    export PYTHONPATH=$src/python${PYTHONPATH:+:$PYTHONPATH}
    LOOMRUN=${LOOMRUN:-$BUILDDIR/loomrun}
fi
LOOMRUN=${LOOMRUN:-loomrun}
mkdir -p "$out"
out=$(cd "$out" && pwd)
dl=$here/diloco.py

if [ -n "$elastic" ]; then
    port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    : >"$out/elastic.log"
    # The replacement starts once rank 2 is dead, and waits at the job's
    # rendezvous address until the workers admit it.
    ( for _ in $(seq 600); do
          grep -q 'SIGKILLs itself' "$out/elastic.log" 2>/dev/null && break
          sleep 0.2
      done
      env LOOM_ROOT="127.0.0.1:$port" LOOM_JOB_KEY="$key" \
          "$PY" "$dl" --elastic --join --codec int8 "$@" >"$out/joiner.log" 2>&1 ) &
    jp=$!
    rc=0
    "$LOOMRUN" -n 3 --keep-going --root "127.0.0.1:$port" -x LOOM_JOB_KEY="$key" \
        "$PY" "$dl" --elastic --codec int8 --crash-at 3:2 --grow-at 6:3 \
        --csv "$out/elastic.csv" "$@" >"$out/elastic.log" 2>&1 || rc=$?
    wait $jp || true
    echo "workers (loomrun exit $rc: 137 is rank 2's SIGKILL):"
    grep -E '^(elastic|diloco):' "$out/elastic.log" || tail -5 "$out/elastic.log"
    echo "replacement:"
    grep -E '^(elastic|diloco):' "$out/joiner.log" || tail -5 "$out/joiner.log"
    exit 0
fi

netns=$src/perf/netns_hosts.sh
if [ -n "$rate" ]; then
    [ "$(id -u)" -eq 0 ] || { echo "run.sh: --netns needs root" >&2; exit 2; }
    "$netns" up "$n" "$rate"
    trap '"$netns" down' EXIT
fi

launch() { # launch ARGS...: one job of n workers; rank 0's output on stdout
    if [ -z "$rate" ]; then
        "$LOOMRUN" -n "$n" "$PY" "$dl" "$@"
        return
    fi
    local port key h pids=() rc=0
    port=$((20000 + RANDOM % 10000))
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    for ((h = n - 1; h >= 0; h--)); do
        # Each host its own name (else Loom would join them through
        # shared memory), interface and torch rank.
        ip netns exec "loomh$h" env LOOM_ROOT="10.78.0.1:$port" LOOM_RANK=$h LOOM_SIZE="$n" \
            LOOM_JOB_KEY="$key" LOOM_HOSTNAME="host$h" LOOM_SOCKET_IFNAME="veth$h" \
            MASTER_ADDR=10.78.0.1 MASTER_PORT=$((port + 1)) RANK=$h WORLD_SIZE="$n" \
            LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 GLOO_SOCKET_IFNAME="veth$h" \
            "$PY" "$dl" --iface "veth$h" "$@" >"$out/.rank$h" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    cat "$out/.rank0"
    [ $rc -eq 0 ] || tail -5 "$out"/.rank[1-9]* >&2 2>/dev/null || true
    rm -f "$out"/.rank*
    return $rc
}

csvs=()
printf '# %d workers%s, args: %s\n' "$n" "${rate:+, one per host, ${rate} links}" "${*:-(defaults)}"
for r in ${runs//,/ }; do
    mode=${r%%:*} what=${r#*:}
    name=$(printf '%s' "$r" | tr ':' '_')
    csv=$out/$name.csv
    if [ "$mode" = ddp ]; then a=(--mode ddp --backend "$what"); else a=(--mode diloco --codec "$what"); fi
    echo "## $r" >&2
    if ! launch "${a[@]}" --csv "$csv" --quiet "$@" >"$out/$name.log" 2>&1; then
        echo "run.sh: run $r failed:" >&2
        tail -5 "$out/$name.log" >&2
        exit 1
    fi
    grep '^diloco: ' "$out/$name.log" | tail -1 >&2
    csvs+=("$csv")
done
"$PY" "$here/plot.py" "$out/loss.png" "${csvs[@]}" | tee "$out/table.txt"
