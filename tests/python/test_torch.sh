#!/bin/bash
# The torch.distributed backend "loom" (python/loom/torch.py):
# init_process_group("loom") under torchrun (env://, the communicator made
# through torch's store) on 2 and 4 ranks, every call against references
# (tests/python/torch_backend.py calls); DDP over "loom" against DDP over
# "gloo" on the same model and data, parameters equal within float
# rounding and identical on every rank, and DDP with compress_hook;
# new_group made from the default group's communicator (groups); and
# under loomrun (whose env:// variables torch reads), a rank SIGKILLed
# during DDP training: the others raise, they do not hang.  Skipped
# without torch, and in a sanitizer build.
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/pylib.sh"
need_python torch numpy
here=$SRCDIR/tests/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

torchrun() { # torchrun N MODES: torch's launcher, rank 0's lines on stdout
    # Debian's torchrun on Python 3.11 needs --redirects/--tee (see
    # loom-python(7)); rank 0's output is then in the log directory.
    local n=$1 modes=$2 port
    port=$(free_port)
    timeout 240 nice "$PY" -m torch.distributed.run --nproc_per_node "$n" --master_port "$port" \
        --redirects 1 --tee 1 --log_dir "$tmp/logs.$n" "$here/torch_backend.py" "$modes" \
        >"$tmp/out.$n" 2>&1
}

sizes="2 4"
for n in $sizes; do
    modes=calls,ddp
    # DDP on 4 ranks too, unless quick.
    [ "$n" = 4 ] && quick && modes=calls
    torchrun "$n" "$modes"
    rc=$?
    out=$(sed -n 's/^\[default[0-9]*\]://p' "$tmp/out.$n")
    if [ "$rc" = 0 ] && grep -qx "$modes: all passed" <<<"$out"; then
        ok "torchrun, $n ranks: $modes ($(grep -c '^ok ' <<<"$out") checks on rank 0)"
    else
        bad "torchrun, $n ranks: $modes (exit $rc)"
        # The checks that failed and the exceptions first, then the end.
        grep -E 'FAIL|Traceback|Error|Exception' "$tmp/out.$n" |
            grep -vE 'ChildFailedError|torch/distributed/(run|launcher)' | head -20
        grep -v '^ok ' "$tmp/out.$n" | grep -v '^\s*$' | tail -12
    fi
    # What the DDP comparison measured.
    grep -E "DDP loom vs gloo|compress_hook\('int8'\): par" <<<"$out" | sed 's/^/# /'
done

# new_group on 4 ranks: {0,1}, {2,3} and {1,2,3}, each made from the
# default group's communicator (loom_comm_create_group), no rendezvous.
torchrun 4 groups
rc=$?
out=$(sed -n 's/^\[default[0-9]*\]://p' "$tmp/out.4")
if [ "$rc" = 0 ] && grep -qx "groups: all passed" <<<"$out" && ! grep -q FAIL "$tmp/out.4"; then
    ok "torchrun, 4 ranks: new_group {0,1}, {2,3}, {1,2,3}: collectives right, made from the default communicator ($(grep -o 'made [0-9]* comm[^(]*rendezvous' <<<"$out"))"
else
    bad "torchrun, 4 ranks: groups (exit $rc)"
    grep -E 'FAIL|Traceback|Error' "$tmp/out.4" | head -10
fi

out=$(timeout 120 nice "$LOOMRUN" -n 3 --keep-going --timeout 110 "$PY" "$here/torch_backend.py" kill 2>&1)
rc=$?
echo "$out" | grep -E '^(ok|FAIL)' | sed 's/^/# /'
check "a rank SIGKILLed under DDP: loomrun reports it (exit $rc)" [ "$rc" = 137 ]
if grep -qx 'kill: all passed' <<<"$out" && ! grep -q '^FAIL' <<<"$out" &&
    [ "$(grep -c 'exited with status\|Segmentation\|Abort' <<<"$out")" = 0 ]; then
    ok "a rank SIGKILLed under DDP: the others raise at once and exit 0"
else
    bad "a rank SIGKILLed under DDP: the others raise at once and exit 0"
    tail -20 <<<"$out"
fi
finish
