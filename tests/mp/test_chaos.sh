#!/bin/bash
# Chaos (mp_chaos.c): 8 ranks loop checked allreduces while, every 0.5-2 s,
# a random process is SIGKILLed (sometimes rank 0, the coordinator and
# join-service holder; sometimes SIGSTOPped first) or a new one is started
# and joins; at least 3 are kept alive.  Fails on a hang (no process
# completes a step for 15 s), a wrong result, or ranks that end a step
# with different bytes.  LOOM_CHAOS_SECONDS sets the length (default 20,
# 10 in quick mode); run it with 600 or more for the long version.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_chaos
dur=${LOOM_CHAOS_SECONDS:-20}
[ "${LOOM_TEST_QUICK:-0}" = 1 ] && [ -z "${LOOM_CHAOS_SECONDS:-}" ] && dur=10
dir=$(mktemp -d)
pids=()
cleanup() { kill -9 "${pids[@]}" 2>/dev/null; pkill -9 -f "$prog .* $dir" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT
# A port nothing uses now (a random one can be some connection's
# ephemeral port); loomrun's own words are kept for the report.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
"$LOOMRUN" -n 8 --keep-going --timeout $((dur + 300)) --root "127.0.0.1:$port" \
    -x LOOM_JOB_KEY="$key" --output "$dir/out" "$prog" member "$dir" >"$dir/loomrun.log" 2>&1 &
pids+=($!)
disown
now() { date +%s%N | cut -b1-13; }
alive() { # pids with progress files that still run (and are not stopped by us)
    for f in "$dir"/progress.*; do
        [ -e "$f" ] || continue
        p=${f##*.}
        [ -e "$dir/stopped.$p" ] && continue
        kill -0 "$p" 2>/dev/null && echo "$p"
    done
}
kills=0 stops=0 joins=0 hang=0
t_end=$(( $(date +%s) + dur ))
sleep 2
while [ "$(date +%s)" -lt "$t_end" ]; do
    sleep "$(awk -v r=$RANDOM 'BEGIN{printf "%.2f", 0.5 + 1.5 * r / 32767}')"
    mapfile -t live < <(alive)
    # Hang: no live process completed a step in 15 s.
    latest=0
    for p in "${live[@]}"; do
        t=$(cut -d' ' -f2 "$dir/progress.$p" 2>/dev/null); t=${t%.*}
        [ -n "$t" ] && [ "$t" -gt "$latest" ] && latest=$t
    done
    mono=$(awk '{printf "%.0f", $1 * 1000}' /proc/uptime)
    if [ "$latest" -gt 0 ] && [ $((mono - latest)) -gt 15000 ]; then
        hang=1; echo "  hang: no step for $((mono - latest)) ms"; break
    fi
    if [ "${#live[@]}" -gt 3 ] && [ $((RANDOM % 100)) -lt 55 ]; then
        v=${live[$((RANDOM % ${#live[@]}))]}
        if [ $((RANDOM % 100)) -lt 15 ]; then
            # Silent, not dead: found by heartbeats; killed for good later.
            touch "$dir/stopped.$v"; kill -STOP "$v" 2>/dev/null; stops=$((stops + 1))
            ( sleep 5; kill -9 "$v" 2>/dev/null ) &
            disown
        else
            kill -9 "$v" 2>/dev/null; kills=$((kills + 1))
        fi
    else
        LOOM_ROOT="127.0.0.1:$port" LOOM_JOB_KEY="$key" "$prog" join "$dir" \
            >"$dir/join.$joins.out" 2>&1 &
        pids+=($!); joins=$((joins + 1))
        disown
    fi
done
touch "$dir/stop"
for _ in $(seq 60); do [ -z "$(alive)" ] && break; sleep 0.5; done
steps=0 wrong=0 div=0 grows=0 shrinks=0 n=0
for f in "$dir"/summary.*; do
    [ -e "$f" ] || continue
    n=$((n + 1))
    line=$(cat "$f")
    get() { echo "$line" | sed -n "s/.* $1=\([0-9]*\).*/\1/p"; }
    [ "$(get steps)" -gt "$steps" ] && steps=$(get steps)
    wrong=$((wrong + $(get wrong))); div=$((div + $(get diverged)))
    [ "$(get grows)" -gt "$grows" ] && grows=$(get grows)
    [ "$(get shrinks)" -gt "$shrinks" ] && shrinks=$(get shrinks)
done
left=$(alive | wc -l)
# Every process that completed a step has a progress file: the 8 members
# and each newcomer admitted.
ran=$(ls "$dir"/progress.* 2>/dev/null | wc -l)
admitted=$((ran > 8 ? ran - 8 : 0))
quit=$(cat "$dir"/out/*.err "$dir"/join.*.out 2>/dev/null | grep -c 'leaving')
echo "  ${dur}s: $steps steps, $kills kills, $stops stops, $joins joins started and $admitted admitted, up to $grows grows and $shrinks shrinks per process, $n processes finished, $left still running, $quit left after a failed shrink, wrong $wrong, diverged $div"
if [ $hang = 0 ] && [ "$wrong" = 0 ] && [ "$div" = 0 ] && [ "$n" -ge 3 ] && [ "$steps" -gt 0 ]; then
    ok "chaos ${dur}s: $steps steps, $kills kills + $stops stops, $admitted of $joins joiners admitted, no hang, no wrong result, no divergence"
else
    bad "chaos ${dur}s (hang $hang, wrong $wrong, diverged $div, finished $n)"
    echo "  loomrun (port $port):"; tail -5 "$dir/loomrun.log" 2>/dev/null
    ls "$dir" "$dir/out" 2>&1 | head -20
    tail -5 "$dir"/out/*.err 2>/dev/null | tail -30
fi
finish
