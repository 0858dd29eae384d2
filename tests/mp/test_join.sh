#!/bin/bash
# Joining a running job (mp_join.c): a new process connects to the job's
# rendezvous address, the members admit it with loom_comm_grow, it gets
# the shared state by loom_state_sync, and an allreduce on the grown
# communicator is checked; then the same with the rank holding the join
# service killed while the newcomer waits (the next rank takes over).
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_join
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in 2 4; do
    for mode in grow holder; do
        [ "$mode" = holder ] && [ "$n" -lt 3 ] && continue
        rm -rf "$tmp/out" "$tmp/joiner.out"
        timeout 120 "$LOOMRUN" -n "$n" --keep-going --timeout 100 --output "$tmp/out" \
            "$prog" "$mode" "$tmp/joiner.out" 4 >/dev/null 2>&1
        members=$(cat "$tmp"/out/rank.*.out 2>/dev/null | grep -c '^OK member')
        want=$n
        [ "$mode" = holder ] && want=$((n - 1))
        j=$(cat "$tmp/joiner.out" 2>/dev/null)
        g=$(cat "$tmp"/out/rank.*.out 2>/dev/null | sed -n 's/.*grow_ms=\([0-9.]*\).*/\1/p' | sort -n | tail -1)
        if [ "$members" = "$want" ] && [ "${j%% *}" = OK ]; then
            ok "$mode on $n ranks: newcomer admitted (${j#OK joiner }), slowest grow $g ms, state synced and checked"
        else
            bad "$mode on $n ranks: $members of $want members OK; joiner: ${j:-nothing}"
            cat "$tmp"/out/rank.*.out 2>/dev/null | grep -v '^OK' | head -5
        fi
    done
done
finish
