#!/bin/bash
# The DiLoCo example (examples/diloco): a tiny configuration on 2 ranks in
# every mode.  Training must work (the eval loss falls to below 60% of
# where it started, for data-parallel and DiLoCo alike), compression must
# cost little (int8 DiLoCo ends within 3% of uncompressed DiLoCo, int4
# with error feedback and overlap within 5%), DiLoCo must send far fewer
# bytes than data-parallel training, the CSV must have its header and one
# row per evaluation, and bad options must fail.
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

out=$(timeout 60 "$LOOMRUN" -n 2 --timeout 50 "$bin" "${tiny[@]}" --codec no_such_codec 2>&1)
check "an unknown codec fails" [ $? -ne 0 ]
check "... and names it" grep -q no_such_codec <<<"$out"
out=$(timeout 60 "$LOOMRUN" -n 1 "$bin" --mode sgd 2>&1)
check "an unknown mode fails" [ $? -ne 0 ]
finish
