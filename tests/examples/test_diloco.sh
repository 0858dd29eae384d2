#!/bin/bash
# The DiLoCo example (examples/diloco): a tiny configuration on 2 ranks in
# every mode.  Training must work (the eval loss falls to below 60% of
# where it started, for data-parallel and DiLoCo alike), compression must
# cost little (int8 DiLoCo ends within 3% of uncompressed DiLoCo, int4
# with error feedback and overlap within 5%), DiLoCo must send far fewer
# bytes than data-parallel training, the CSV must have its header and one
# row per evaluation, and bad options must fail.  Elastic runs lose a
# worker (a plain one, then rank 0) and admit a replacement from outside:
# the survivors must go on, the replacement must receive the state, and
# all must end with the same parameters and a loss close to a run without
# faults.
. "$(dirname "$0")/../lib.sh"
bin=$BUILDDIR/examples/diloco/diloco
[ -x "$bin" ] || { echo "$bin not built: skipping"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tiny=(--steps 200 --inner 20 --hidden 64 --shard 4096 --eval 1024 --quiet)

run() { # run NAME ARGS...: the summary fields in $NAME_*; status in $rc
    local name=$1; shift
    out=$(timeout 120 "$LOOMRUN" -n 2 --timeout 110 "$bin" "${tiny[@]}" --csv "$tmp/$name.csv" "$@" 2>&1)
    rc=$?
    line=$(grep '^diloco: ' <<<"$out" | tail -1)
    for k in initial_eval_loss final_eval_loss bytes_sent; do
        printf -v "${name}_$k" '%s' "$(sed -n "s/.* $k=\([^ ]*\).*/\1/p" <<<"$line")"
    done
    if [ "$rc" -eq 0 ] && [ -n "$line" ]; then ok "$name runs ($line)"; else bad "$name runs (exit $rc)"; tail -5 <<<"$out"; fi
}
# awk test: exits 0 when the expression holds.
holds() { awk -v a="$1" -v b="$2" "BEGIN { exit !($3) }"; }

run ddp --mode ddp
run dl --mode diloco
run dl8 --mode diloco --codec int8
run dl4 --mode diloco --codec int4 --ef --overlap

check "ddp: eval loss falls ($ddp_initial_eval_loss -> $ddp_final_eval_loss)" \
    holds "$ddp_final_eval_loss" "$ddp_initial_eval_loss" "a != \"\" && a < 0.6 * b"
check "diloco: eval loss falls ($dl_initial_eval_loss -> $dl_final_eval_loss)" \
    holds "$dl_final_eval_loss" "$dl_initial_eval_loss" "a != \"\" && a < 0.6 * b"
check "diloco within 5% of ddp ($dl_final_eval_loss, $ddp_final_eval_loss)" \
    holds "$dl_final_eval_loss" "$ddp_final_eval_loss" "a != \"\" && a < 1.05 * b"
check "int8 diloco within 3% of uncompressed ($dl8_final_eval_loss, $dl_final_eval_loss)" \
    holds "$dl8_final_eval_loss" "$dl_final_eval_loss" "a != \"\" && (a - b) / b < 0.03 && (b - a) / b < 0.03"
check "int4+ef overlapped diloco within 5% of uncompressed ($dl4_final_eval_loss, $dl_final_eval_loss)" \
    holds "$dl4_final_eval_loss" "$dl_final_eval_loss" "a != \"\" && (a - b) / b < 0.05 && (b - a) / b < 0.05"
# 10 rounds of the delta against 200 steps of gradients: 20x fewer bytes,
# int8 about 4x fewer again.
check "diloco sends 20x fewer bytes than ddp ($dl_bytes_sent, $ddp_bytes_sent)" \
    holds "$dl_bytes_sent" "$ddp_bytes_sent" "a > 0 && a * 20 <= b"
check "int8 sends under 30% of uncompressed ($dl8_bytes_sent, $dl_bytes_sent)" \
    holds "$dl8_bytes_sent" "$dl_bytes_sent" "a > 0 && a < 0.3 * b"

check "CSV header" grep -qx 'step,wall_s,train_loss,eval_loss,bytes_sent,mode,codec' "$tmp/dl8.csv"
check "CSV: a row per round and step 0" [ "$(grep -c ',diloco,int8$' "$tmp/dl8.csv")" -eq 11 ]
check "CSV: the last row is step 200 with the final loss" \
    awk -F, -v l="$dl8_final_eval_loss" 'END { exit !($1 == 200 && $4 + 0 == l + 0) }' "$tmp/dl8.csv"
check "CSV: ddp rows" grep -q '^200,.*,ddp,none$' "$tmp/ddp.csv"

# Elastic: 3 workers; one is SIGKILLed before a round's allreduce (the
# others shrink and average among themselves), then a replacement started
# from outside with the job's LOOM_ROOT and LOOM_JOB_KEY is admitted at a
# later round (at the latest: --grow-at makes the others wait for it) and
# receives the state.  Once a plain worker dies, once rank
# 0 (the coordinator, join-service holder and CSV writer), with int8.
out=$(timeout 120 "$LOOMRUN" -n 3 --timeout 110 "$bin" "${tiny[@]}" --steps 400 2>&1)
ref=$(sed -n 's/^diloco: .* final_eval_loss=\([^ ]*\).*/\1/p' <<<"$out")
check "3-rank reference run ($ref)" [ -n "$ref" ]
all_same() { [ "$(grep -c . <<<"$2")" -eq "$1" ] && [ "$(sort -u <<<"$2" | wc -l)" -eq 1 ]; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
elastic() { # elastic NAME CRASH_ROUND:RANK GROW_ROUND ARGS...
    local name=$1 crash=$2 grow=$3; shift 3
    local port key
    port=$(free_port)
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    # The replacement waits at the rendezvous address until admitted.
    ( sleep 0.5; env LOOM_ROOT="127.0.0.1:$port" LOOM_JOB_KEY="$key" LOOM_TIMEOUT=100000 \
        timeout 110 "$bin" "${tiny[@]}" --steps 400 --elastic --join "$@" >"$tmp/$name.joiner" 2>&1 ) &
    local jp=$!
    out=$(timeout 120 "$LOOMRUN" -n 3 --keep-going --timeout 110 --root "127.0.0.1:$port" \
        -x LOOM_JOB_KEY="$key" "$bin" "${tiny[@]}" --steps 400 --elastic --crash-at "$crash" \
        --grow-at "$grow:3" --csv "$tmp/$name.csv" "$@" 2>&1)
    wait "$jp"
    local sum j hashes loss
    sum=$(grep '^diloco: ' <<<"$out" | tail -1)
    j=$(grep '^elastic: rank=' "$tmp/$name.joiner")
    check "$name: the survivors shrank once, grew once and agree ($sum)" \
        grep -q 'ranks=3 .*shrinks=1 grows=1 params_agree=1' <<<"$sum"
    if [ -z "$sum" ]; then
        echo "  workers (port $port):"; grep -v '^loom\[' <<<"$out" | tail -8
        echo "  replacement:"; tail -5 "$tmp/$name.joiner"
    fi
    # It is admitted at the first round boundary after it arrives, and
    # --grow-at makes the workers wait for it at round $grow at the latest.
    local js
    js=$(sed -n 's/.*joined=1 joined_step=\([0-9]*\) .*/\1/p' <<<"$j")
    check "$name: the replacement was admitted by round $grow, step $((grow * 20)) ($j)" \
        holds "$js" "$((grow * 20))" 'a != "" && a > 0 && a <= b && a % 20 == 0'
    hashes=$( (grep '^elastic: rank=' <<<"$out"; echo "$j") | sed -n 's/.*params_hash=\([0-9a-f]*\).*/\1/p')
    check "$name: 3 processes end with the same parameters ($(sort -u <<<"$hashes" | tr '\n' ' '))" \
        all_same 3 "$hashes"
    loss=$(sed -n 's/.* final_eval_loss=\([^ ]*\).*/\1/p' <<<"$sum")
    check "$name: final loss within 3% of the 3-rank run without faults ($loss, $ref)" \
        holds "$loss" "$ref" "a != \"\" && (a - b) / b < 0.03 && (b - a) / b < 0.03"
    check "$name: the CSV goes on to step 400 after the changes" \
        awk -F, 'END { exit !($1 == 400) }' "$tmp/$name.csv"
}
elastic crash2 3:2 6
elastic crash0 2:0 5 --codec int8

out=$(timeout 60 "$LOOMRUN" -n 1 "$bin" --elastic --overlap 2>&1)
check "--elastic with --overlap is refused" grep -q 'cannot be combined' <<<"$out"
out=$(timeout 60 "$LOOMRUN" -n 2 --timeout 50 "$bin" "${tiny[@]}" --codec no_such_codec 2>&1)
check "an unknown codec fails" [ $? -ne 0 ]
check "... and names it" grep -q no_such_codec <<<"$out"
out=$(timeout 60 "$LOOMRUN" -n 1 "$bin" --mode sgd 2>&1)
check "an unknown mode fails" [ $? -ne 0 ]
finish
