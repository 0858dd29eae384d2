#!/bin/bash
# Chaos (mp_chaos.c): 8 ranks (LOOM_CHAOS_RANKS) loop checked allreduces,
# small ones and shared-memory ones just over 1 MiB, while every 0.5-2 s
# the driver does one of:
#   - SIGKILL a random process (a third of the time rank 0, the
#     coordinator and join-service holder);
#   - SIGSTOP one to three processes at once (rank 0 among them half the
#     time), each continued (or, one time in seven, killed) at its own
#     random moment 0.5-6 s later: some before the heartbeat limit (3 s),
#     most after, in every order;
#   - leave a token that makes the next process to enter loom_comm_shrink,
#     loom_comm_grow or loom_state_sync SIGKILL itself inside it;
#   - start a new process that joins.
# A majority of the current communicator is always left running, and at
# least 3 processes.  LOOM_CHAOS_SECONDS sets the length (default 20, 10
# in quick mode); run it with 600 for the long version.
#
# Fails on: a hang (no process completes a step for 15 s, processes
# still running 60 s after the stop, or a shrink or agreement that gave
# up after LOOM_TIMEOUT); a wrong result or ranks that end a
# step with different bytes; a crash (a process dead of a signal the
# driver did not send, or a sanitizer's report: its backtrace and that
# of its core are printed); a job of one (a process that goes on in a
# communicator that is not a majority of the one it shrank from); a
# process that leaves although it was never stopped (a false failure);
# or any exit the man pages do not promise (mp_chaos.c lists them).
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_chaos
dur=${LOOM_CHAOS_SECONDS:-20}
[ "${LOOM_TEST_QUICK:-0}" = 1 ] && [ -z "${LOOM_CHAOS_SECONDS:-}" ] && dur=10
nr=${LOOM_CHAOS_RANKS:-8}
dir=$(mktemp -d)
mkdir -p "$dir/cores"
ulimit -c unlimited 2>/dev/null
lpid=
cleanup() {
    local f p
    [ -n "$lpid" ] && kill -9 "$lpid" 2>/dev/null
    for f in "$dir"/progress.* "$dir"/join.*.pid; do
        [ -e "$f" ] || continue
        p=${f##*/progress.}
        [[ $f == *.pid ]] && p=$(cat "$f" 2>/dev/null)
        [ -n "$p" ] && kill -9 "$p" 2>/dev/null
    done
    if [ -n "${LOOM_TEST_KEEP:-}" ]; then echo "kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT
# A port nothing uses now (a random one can be some connection's
# ephemeral port); loomrun's own words are kept for the report.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
export LOOM_TEST_CORE_DIR=$dir/cores LOOM_TIMEOUT=60000
(cd "$dir/cores" && exec "$LOOMRUN" -n "$nr" --keep-going --timeout $((dur + 300)) \
    --root "127.0.0.1:$port" -x LOOM_JOB_KEY="$key" --output "$dir/out" "$prog" member "$dir") \
    >"$dir/loomrun.log" 2>&1 &
lpid=$!
ms() { awk '{printf "%.0f", $1 * 1000}' /proc/uptime; }
rnd() { awk -v r=$RANDOM -v a="$1" -v b="$2" 'BEGIN{printf "%.0f", a + (b - a) * r / 32767}'; }
# Processes with progress files that still run and are not stopped by us
# (the process that wrote the file: pids wrap in a long run, so its start
# time, the file's fifth field, must be the running one's).
alive() {
    local f p
    for f in "$dir"/progress.*; do
        [ -e "$f" ] || continue
        p=${f##*.}
        [ -e "$dir/stopped.$p" ] && continue
        if [ -e "$dir/doomed.$p" ]; then
            # Back for good once it completed a step after the continue.
            [ "$(cut -d' ' -f2 "$f" 2>/dev/null | cut -d. -f1)" -gt \
              "$(cat "$dir/doomed.$p" 2>/dev/null || echo 0)" ] 2>/dev/null || continue
            rm -f "$dir/doomed.$p"
        fi
        [ "$(awk '{print $3}' /proc/$p/stat 2>/dev/null)" = Z ] && continue
        [ "$(sed 's/^.*) //' /proc/$p/stat 2>/dev/null | cut -d' ' -f20)" = \
          "$(cut -d' ' -f5 "$f" 2>/dev/null)" ] || continue
        kill -0 "$p" 2>/dev/null && echo "$p"
    done
}
# The current communicator's size, as the live processes last reported it.
cursize() {
    local p s=0 v
    for p in "$@"; do
        v=$(cut -d' ' -f4 "$dir/progress.$p" 2>/dev/null)
        [ -n "$v" ] && [ "$v" -gt "$s" ] && s=$v
    done
    echo "$s"
}
rank0() {
    local p
    for p in "$@"; do
        [ "$(cut -d' ' -f3 "$dir/progress.$p" 2>/dev/null)" = 0 ] && { echo "$p"; return; }
    done
}
kills=0 stops=0 groups=0 with0=0 conts=0 stopkills=0 tokens=0 joins=0 hang=0
killed=" "
# Pending continues: lines "DUE_MS PID cont|kill STOPPED_MS" in $dir/due.
# A process continued after DOOM_MS stopped may have been declared
# failed (the limit is 3 s; a busy host's heartbeats come late): it
# leaves the job once it finds out, so it counts as gone (doomed.PID,
# holding the time of the continue) until it completes a step.  Counted
# as running, it let the driver stop or kill others until fewer than
# half of the communicator could go on; they then rightly left, as if
# falsely declared failed (two 600 s runs).
DOOM_MS=2000
: >"$dir/due"
run_due() {
    local t
    t=$(ms)
    local keep=() line d p a
    while read -r d p a s; do
        [ -z "$d" ] && continue
        if [ "$d" -le "$t" ]; then
            if [ "$a" = kill ]; then
                kill -9 "$p" 2>/dev/null; killed="$killed$p "; stopkills=$((stopkills + 1))
            else
                kill -CONT "$p" 2>/dev/null; conts=$((conts + 1))
                [ $((t - s)) -ge $DOOM_MS ] && echo "$t" >"$dir/doomed.$p"
            fi
            rm -f "$dir/stopped.$p"
        else
            keep+=("$d $p $a $s")
        fi
    done <"$dir/due"
    printf '%s\n' "${keep[@]}" | grep . >"$dir/due.new"
    mv "$dir/due.new" "$dir/due"
}
backtraces() { # every thread of each process PID (gdb), for a hang
    local p
    command -v gdb >/dev/null || { echo "  (no gdb for backtraces)"; return; }
    for p in "$@"; do
        echo "  --- pid $p, step time rank size: $(cat "$dir/progress.$p" 2>/dev/null)"
        timeout 60 gdb -nx -batch -p "$p" -ex "thread apply all bt" 2>&1 |
            grep -E '^(Thread|#)' | head -40 | sed 's/^/    /'
    done
}
t_end=$(( $(ms) + dur * 1000 ))
sleep 2
next=$(ms)
while [ "$(ms)" -lt "$t_end" ]; do
    sleep 0.1
    run_due
    [ "$(ms)" -lt "$next" ] && continue
    next=$(( $(ms) + $(rnd 500 2000) ))
    mapfile -t live < <(alive)
    # Hang: no live process completed a step in 15 s.
    latest=0
    for p in "${live[@]}"; do
        t=$(cut -d' ' -f2 "$dir/progress.$p" 2>/dev/null); t=${t%.*}
        [ -n "$t" ] && [ "$t" -gt "$latest" ] && latest=$t
    done
    mono=$(ms)
    if [ "$latest" -gt 0 ] && [ $((mono - latest)) -gt 15000 ]; then
        hang=1; echo "  hang: no step for $((mono - latest)) ms; the backtraces of the live processes:"
        backtraces "${live[@]}"
        break
    fi
    nl=${#live[@]}
    size=$(cursize "${live[@]}")
    [ "$size" -lt "$nl" ] && size=$nl
    # Failures not yet shrunk away count against the majority: the
    # stopped, and a token not yet taken.
    nstop=$(ls "$dir"/stopped.* 2>/dev/null | wc -l)
    ntok=$(ls "$dir"/die.* 2>/dev/null | wc -l)
    room=$(( (nl - ntok) - size / 2 - 1 ))   # how many may fail now, keeping a majority
    [ $((nl - ntok - 3)) -lt "$room" ] && room=$((nl - ntok - 3))
    dice=$((RANDOM % 100))
    # The first actions are one of each kind, so that a short run has
    # them all: a stop with rank 0, a token, a kill, a join.
    case $((kills + groups + tokens + joins)) in
    0) dice=40 ;;
    1) dice=60 ;;
    2) dice=0 ;;
    3) dice=99 ;;
    esac
    if [ "$room" -ge 1 ] && [ $dice -lt 35 ]; then
        v=${live[$((RANDOM % nl))]}
        r0=$(rank0 "${live[@]}")
        [ -n "$r0" ] && [ $((RANDOM % 3)) = 0 ] && v=$r0
        kill -9 "$v" 2>/dev/null; killed="$killed$v "; kills=$((kills + 1))
    elif [ "$room" -ge 1 ] && [ $dice -lt 55 ]; then
        k=$((1 + RANDOM % 3))
        [ "$k" -gt "$room" ] && k=$room
        mapfile -t pick < <(printf '%s\n' "${live[@]}" | shuf -n "$k")
        r0=$(rank0 "${live[@]}")
        if [ -n "$r0" ] && { [ $((RANDOM % 2)) = 0 ] || [ "$groups" = 0 ]; } &&
            [[ " ${pick[*]} " != *" $r0 "* ]]; then
            pick[0]=$r0
        fi
        [[ " ${pick[*]} " == *" $r0 "* ]] && [ -n "$r0" ] && with0=$((with0 + 1))
        groups=$((groups + 1))
        for v in "${pick[@]}"; do
            touch "$dir/stopped.$v"
            echo "$v" >>"$dir/ever_stopped"
            kill -STOP "$v" 2>/dev/null; stops=$((stops + 1))
            a=cont
            [ $((RANDOM % 7)) = 0 ] && a=kill
            echo "$(( $(ms) + $(rnd 500 6000) )) $v $a $(ms)" >>"$dir/due"
        done
    elif [ "$room" -ge 1 ] && [ "$ntok" = 0 ] && [ $dice -lt 65 ]; then
        ph=(shrink grow sync)
        touch "$dir/die.${ph[$((RANDOM % 3))]}"; tokens=$((tokens + 1))
    else
        j=$joins
        (LOOM_ROOT="127.0.0.1:$port" LOOM_JOB_KEY="$key" "$prog" join "$dir" \
            >"$dir/join.$j.out" 2>"$dir/join.$j.err" &
         echo $! >"$dir/join.$j.pid"
         wait $!
         echo $? >"$dir/join.$j.rc") 2>/dev/null &
        joins=$((joins + 1))
    fi
done
touch "$dir/stop"
# What is still stopped comes back now (and leaves, if it was declared
# failed); tokens not taken are withdrawn.
while read -r d p a s; do
    [ -n "$p" ] && kill -CONT "$p" 2>/dev/null && rm -f "$dir/stopped.$p" && conts=$((conts + 1))
done <"$dir/due"
rm -f "$dir"/die.* "$dir"/doomed.*
for _ in $(seq 120); do [ -z "$(alive)" ] && break; sleep 0.5; done
left_running=$(alive | wc -l)
if [ "$left_running" -gt 0 ]; then
    hang=1
    echo "  hang: $left_running processes still running 60 s after the stop; their backtraces:"
    backtraces $(alive)
fi
# Joiners that never got in are still waiting in loom_comm_join: not a
# failure (the job stopped admitting), but they go now.
waiting=0
for f in "$dir"/join.*.pid; do
    [ -e "$f" ] || continue
    j=${f%.pid}; j=${j##*.}
    p=$(cat "$f")
    if [ ! -e "$dir/join.$j.rc" ] && kill -0 "$p" 2>/dev/null; then
        if [ -e "$dir/progress.$p" ]; then continue; fi
        kill -9 "$p" 2>/dev/null; killed="$killed$p "; waiting=$((waiting + 1))
    fi
done
kill -9 $(alive) 2>/dev/null
wait "$lpid" 2>/dev/null
sleep 0.5

# Every process's end: PID STATUS (exit status, or 128+N for signal N).
# Every process's end: PID STATUS FILE (exit status, or 128+N for signal
# N; its standard error).  Members that exited 0 are not in loomrun's log.
ends=()
while read -r line; do
    r=$(sed -n 's/^loomrun: rank \([0-9]*\) .*/\1/p' <<<"$line")
    p=$(sed -n 's/.*(pid \([0-9]*\)).*/\1/p' <<<"$line")
    c=$(sed -n 's/.*exited with status \([0-9]*\).*/\1/p' <<<"$line")
    s=$(sed -n 's/.*killed by signal \([0-9]*\).*/\1/p' <<<"$line")
    [ -n "$c" ] && ends+=("$p $c $dir/out/rank.$r.err")
    [ -n "$s" ] && ends+=("$p $((128 + s)) $dir/out/rank.$r.err")
done < <(grep '^loomrun: rank' "$dir/loomrun.log")
for f in "$dir"/join.*.rc; do
    [ -e "$f" ] || continue
    ends+=("$(cat "${f%.rc}.pid") $(cat "$f") ${f%.rc}.err")
done
crashes=0 minority=0 false_fail=0 undoc=0 unexplained=0 lefts=0 timeouts=0
for e in "${ends[@]}"; do
    set -- $e
    p=$1 s=$2 f=$3
    if { [ "$s" -ge 129 ] && [ "$s" != 137 ]; } ||
        grep -qE "^CRASH pid $p |==$p==ERROR: (Address|Leak)Sanitizer|runtime error:" "$f" 2>/dev/null; then
        crashes=$((crashes + 1))
        echo "  CRASH: pid $p, exit status $s; its standard error:"
        [ -n "$f" ] && grep -vE '^\[New LWP|^\[Thread debugging|^Using host libthread' "$f" | tail -60 | sed 's/^/    /'
        for c in "$dir/cores/core.$p"/core*; do
            [ -e "$c" ] || continue
            echo "  its core, $c:"
            command -v gdb >/dev/null &&
                timeout 60 gdb -nx -batch -ex "thread apply all bt" "$prog" "$c" 2>&1 | grep -E '^(Thread|#)' | head -40 | sed 's/^/    /'
        done
        continue
    fi
    case $s in
    0) ;;
    137)
        [[ "$killed" == *" $p "* ]] || ls "$dir"/died.*."$p" >/dev/null 2>&1 ||
            { unexplained=$((unexplained + 1)); echo "  pid $p was SIGKILLed by nobody here"; } ;;
    3)
        lefts=$((lefts + 1))
        if grep -q "^LEFT pid $p: loom_comm_join" "$f" 2>/dev/null; then
            :
        elif grep -q "^LEFT pid $p: .*timed out" "$f" 2>/dev/null; then
            # A shrink or an agreement that did not complete within
            # LOOM_TIMEOUT: the job stood still that long.
            timeouts=$((timeouts + 1))
            echo "  pid $p: $(grep "^LEFT pid $p" "$f")"
        elif ! grep -qx "$p" "$dir/ever_stopped" 2>/dev/null; then
            false_fail=$((false_fail + 1))
            echo "  pid $p was declared failed but never stopped: $(grep "^LEFT pid $p" "$f")"
        fi ;;
    4) minority=$((minority + 1)); echo "  job of one: $(grep "^MINORITY pid $p" "$f")" ;;
    *) undoc=$((undoc + 1)); echo "  pid $p: exit status $s: $(grep -h "^BAD pid $p" "$f" | head -2)" ;;
    esac
done
steps=0 grows=0 shrinks=0 n=0
# The furthest step any process reached (the summaries only come from
# processes that stopped at the end).
for f in "$dir"/progress.*; do
    [ -e "$f" ] || continue
    t=$(cut -d' ' -f1 "$f")
    [ -n "$t" ] && [ "$t" -gt "$steps" ] && steps=$t
done
for f in "$dir"/summary.*; do
    [ -e "$f" ] || continue
    n=$((n + 1))
    line=$(cat "$f")
    get() { echo "$line" | sed -n "s/.* $1=\([0-9]*\).*/\1/p"; }
    [ "$(get steps)" -gt "$steps" ] && steps=$(get steps)
    [ "$(get grows)" -gt "$grows" ] && grows=$(get grows)
    [ "$(get shrinks)" -gt "$shrinks" ] && shrinks=$(get shrinks)
done
wrong=$(cat "$dir"/out/*.err "$dir"/join.*.err 2>/dev/null | grep -c '^BAD .*wrong')
div=$(cat "$dir"/out/*.err "$dir"/join.*.err 2>/dev/null | grep -c '^BAD .*different bytes')
ran=$(ls "$dir"/progress.* 2>/dev/null | wc -l)
admitted=$((ran > nr ? ran - nr : 0))
died=""
for ph in shrink grow sync; do died="$died $(ls "$dir"/died.$ph.* 2>/dev/null | wc -l) in $ph,"; done
echo "  ${dur}s on $nr ranks: $steps steps; $kills kills; $stops stops in $groups groups ($with0 with rank 0), $conts continued and $stopkills killed while stopped; kills inside calls:${died%,} ($tokens tokens); $joins joins started and $admitted admitted ($waiting still waiting at the end); up to $grows grows and $shrinks shrinks per process; $n processes finished, $lefts left after a refused shrink"
echo "  crashes $crashes, hangs $hang, timeouts $timeouts, wrong $wrong, diverged $div, jobs of one $minority, false failures $false_fail, other exits $undoc, unexplained kills $unexplained"
if [ $hang = 0 ] && [ "$timeouts" = 0 ] && [ "$wrong" = 0 ] && [ "$div" = 0 ] && [ "$crashes" = 0 ] && [ "$minority" = 0 ] &&
    [ "$false_fail" = 0 ] && [ "$undoc" = 0 ] && [ "$unexplained" = 0 ] && [ "$n" -ge 3 ] && [ "$steps" -gt 0 ]; then
    ok "chaos ${dur}s: $steps steps, $kills kills + $stops stops ($groups groups) + kills inside calls:${died%,}, $admitted of $joins joiners admitted; 0 crashes, 0 hangs, 0 wrong, 0 diverged, 0 jobs of one"
else
    bad "chaos ${dur}s (crashes $crashes, hang $hang, timeouts $timeouts, wrong $wrong, diverged $div, jobs of one $minority, false failures $false_fail, other exits $undoc, unexplained kills $unexplained, finished $n)"
    echo "  loomrun (port $port):"; tail -5 "$dir/loomrun.log" 2>/dev/null
    grep -h '^BAD\|^MINORITY' "$dir"/out/*.err "$dir"/join.*.err 2>/dev/null | head -10
fi
finish
