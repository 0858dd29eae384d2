#!/bin/bash
# Scenarios of the failure model on a fixed schedule (mp_stops.c): ranks
# loop checked allreduces (65,537 floats, and just over 1 MiB by the
# shared-memory algorithm) while the driver stops (SIGSTOP), continues
# (SIGCONT) and kills them at given times, or while ranks kill themselves
# inside a shrink, a grow or a state sync.  Heartbeats are the default
# (500 ms: a rank silent for 3 s is declared failed).
#
#   a  4 ranks, rank 2 stopped at 1.5 s (inside a 256 KiB allreduce by
#      the shared-memory algorithm), continued at 4.8 s: declared
#      failed meanwhile, it must
#      find its communicator broken and be refused by shrink
#      (LOOM_ERR_REVOKED), while ranks 0, 1 and 3 go on with 3;
#   b  6 ranks, rank 0 stopped at 3.0 s, rank 1 at 5.3 s, rank 0
#      continued at 6.6 s and rank 1 at 9.2 s: both must end with
#      LOOM_ERR_REVOKED, never in a communicator of 1 or 2 ranks; the
#      others go on with 4;
#   c  several ranks stopped at once, rank 0 among them, continued in
#      every order (and once before the limit: nobody fails then);
#   d  a rank killed inside loom_comm_shrink: the coordinator, rank 0,
#      at once, and another rank later, once the survivors agreed, while
#      the new communicator connects; inside loom_comm_grow admitting a
#      joiner: rank 0 (the join service's holder), the joiner, a member;
#      the donors of a loom_state_sync killed while a receiver receives
#      (the receivers held an older revision: no rank may then accept
#      bytes that are not its revision's).
#
# Every run checks each process's exit against what the man pages
# promise: the survivors end together at the same step, in one
# communicator of the expected size; a rank declared failed leaves with
# LOOM_ERR_REVOKED from loom_comm_shrink; results are exact; no process
# goes on in a communicator that is not a majority of the one it shrank
# from; nothing hangs; and no process dies of a signal the test did not
# send.  A crash prints the process's backtrace (every thread, by gdb when
# installed; see crash.h) and, where a core was written, gdb's backtrace
# of the core.
#
# LOOM_STOPS_REPEAT=N runs scenario a N times (default 1) and, from
# N >= 3 on, the longer variants of c and d too; quick mode runs one
# order of c.  LOOM_STOPS_ONLY (a b c d-shrink d-grow d-sync) picks
# scenarios; LOOM_TEST_KEEP=1 keeps the runs' directories.
. "$(dirname "$0")/../lib.sh"
prog=$BUILDDIR/tests/mp/mp_stops
quick=${LOOM_TEST_QUICK:-0}
reps=${LOOM_STOPS_REPEAT:-1}
top=$(mktemp -d)
all_pids=()
cleanup() {
    for p in "${all_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    if [ -n "${LOOM_TEST_KEEP:-}" ]; then echo "kept $top"; else rm -rf "$top"; fi
}
# only NAME: whether LOOM_STOPS_ONLY (a list: a b c d-shrink d-grow
# d-sync) selects scenario NAME; all when unset.
only() { [ -z "${LOOM_STOPS_ONLY:-}" ] || [[ " $LOOM_STOPS_ONLY " == *" $1 "* ]]; }
trap cleanup EXIT
ulimit -c unlimited 2>/dev/null
# Heartbeats at their default: these schedules are written for it.
unset LOOM_HEARTBEAT_MS

now() { date +%s.%N; }
# sleep_until T: until T seconds after the job's clock started.
sleep_until() {
    local d
    d=$(awk -v a="$t0" -v t="$1" -v n="$(now)" 'BEGIN {d = a + t - n; if (d < 0) d = 0; printf "%.3f", d}')
    sleep "$d"
}

# start_job N [VAR=VALUE...]: starts N ranks in a fresh directory $dir,
# waits until every rank has its communicator (pid files), starts the
# clock t0.
start_job() {
    local n=$1
    shift
    run=$((run + 1))
    dir=$top/run$run
    mkdir -p "$dir/cores"
    nranks=$n
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    local xs=() v
    for v in "$@"; do xs+=(-x "$v"); done
    jenv=("$@")
    njoin=0
    killed=" " stopped=" "
    # Each rank in its own crash directory (crash.h): a core lands there.
    (cd "$dir/cores" && LOOM_TEST_CORE_DIR=$dir/cores LOOM_TIMEOUT=60000 exec "$LOOMRUN" \
        -n "$n" --keep-going --timeout 200 --root "127.0.0.1:$port" -x LOOM_JOB_KEY="$key" \
        "${xs[@]}" --output "$dir/out" "$prog" member "$dir") >"$dir/loomrun.log" 2>&1 &
    lpid=$!
    all_pids+=("$lpid")
    local k r
    for k in $(seq 600); do
        local have=0
        for r in $(seq 0 $((n - 1))); do [ -s "$dir/pid.$r" ] && have=$((have + 1)); done
        [ "$have" = "$n" ] && break
        kill -0 "$lpid" 2>/dev/null || break
        sleep 0.1
    done
    for r in $(seq 0 $((n - 1))); do
        pid[$r]=$(cat "$dir/pid.$r" 2>/dev/null)
        [ -n "${pid[$r]}" ] && all_pids+=("${pid[$r]}")
    done
    t0=$(now)
}

# act T ACTION RANK...: at T seconds, stop|cont|kill those ranks;
# stop-shared stops a rank once it is inside a shared-memory allreduce
# (within 1 s; its phase file says so).
act() {
    local t=$1 a=$2 r k
    shift 2
    sleep_until "$t"
    for r in "$@"; do
        case $a in
        stop-shared)
            for k in $(seq 2000); do
                [[ $(<"$dir/phase.$r") == big-shared* ]] && break
            done
            kill -STOP "${pid[$r]}"; stopped="$stopped$r " ;;
        stop) kill -STOP "${pid[$r]}"; stopped="$stopped$r " ;;
        cont) kill -CONT "${pid[$r]}" ;;
        kill) kill -9 "${pid[$r]}"; killed="$killed$r " ;;
        esac
    done
    if [[ $a == stop* ]]; then
        sleep 0.05
        for r in "$@"; do
            echo "  $(printf '%.1f' "$t") s: rank $r stopped in $(tr -d '\n' <"$dir/phase.$r" | sed 's/ *$//')"
        done
    fi
}

# join T: at T seconds, a new process asks to join.
join() {
    sleep_until "$1"
    local j=$njoin
    njoin=$((njoin + 1))
    # The joiner itself is $! (exec), so that a kill reaches it.
    ( (cd "$dir/cores" && exec env "${jenv[@]}" LOOM_TEST_CORE_DIR="$dir/cores" LOOM_TIMEOUT=60000 \
        LOOM_ROOT="127.0.0.1:$port" LOOM_JOB_KEY="$key" "$prog" join "$dir") \
        >"$dir/join.$j.out" 2>"$dir/join.$j.err" &
        echo $! >"$dir/join.$j.pid"
        wait $!
        echo $? >"$dir/join.$j.rc") 2>/dev/null &
    all_pids+=($!)
    for _ in $(seq 50); do [ -s "$dir/join.$j.pid" ] && break; sleep 0.02; done
    all_pids+=("$(cat "$dir/join.$j.pid" 2>/dev/null)")
}

# backtraces PID...: every thread of each process (gdb), for a hang.
backtraces() {
    local p
    command -v gdb >/dev/null || { echo "  (no gdb for backtraces)"; return; }
    for p in "$@"; do
        kill -0 "$p" 2>/dev/null || continue
        echo "  --- pid $p ($(tr -d '\0' </proc/$p/cmdline 2>/dev/null | head -c 60)), state $(awk '{print $3}' /proc/$p/stat 2>/dev/null)"
        timeout 60 gdb -nx -batch -p "$p" -ex "thread apply all bt" 2>&1 |
            grep -E '^(Thread|#)' | head -60
    done
}

# end_job T: at T seconds every process is told to stop; waits for them
# (30 s at most: more is a hang), then reads what each rank did into
# st[r] (exit status, 128+N for signal N), last[r] (its last line) and
# checks what holds in every scenario.  Sets good=0 on a failure.
end_job() {
    sleep_until "$1"
    touch "$dir/stop"
    local k r p hung=0
    for k in $(seq 300); do
        kill -0 "$lpid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$lpid" 2>/dev/null; then
        hung=1
        echo "  HANG: ranks still running 30 s after the stop; their backtraces:"
        for r in $(seq 0 $((nranks - 1))); do
            p=${pid[$r]}
            [ -n "$p" ] && kill -0 "$p" 2>/dev/null || continue
            echo "  rank $r doing: $(tr -d '\n' <"$dir/phase.$r" 2>/dev/null)"
            kill -CONT "$p" 2>/dev/null
            backtraces "$p"
        done
        kill -9 "${pid[@]}" 2>/dev/null
    fi
    for k in $(seq 300); do
        [ "$(ls "$dir"/join.*.rc 2>/dev/null | wc -l)" -ge "$njoin" ] && break
        sleep 0.1
    done
    for j in $(seq 0 $((njoin - 1))); do
        [ -e "$dir/join.$j.rc" ] && continue
        hung=1
        p=$(cat "$dir/join.$j.pid" 2>/dev/null)
        echo "  HANG: joiner $j still running 30 s after the stop: $(tail -1 "$dir/join.$j.out" 2>/dev/null)"
        [ -n "$p" ] && { backtraces "$p"; kill -9 "$p"; }
    done
    wait "$lpid" 2>/dev/null
    good=1 crashes=0
    [ $hung = 1 ] && good=0
    local line code sig
    for r in $(seq 0 $((nranks - 1))); do
        st[$r]=0
        line=$(grep "^loomrun: rank $r (pid" "$dir/loomrun.log" | head -1)
        code=$(sed -n 's/.*exited with status \([0-9]*\).*/\1/p' <<<"$line")
        sig=$(sed -n 's/.*killed by signal \([0-9]*\).*/\1/p' <<<"$line")
        [ -n "$code" ] && st[$r]=$code
        [ -n "$sig" ] && st[$r]=$((128 + sig))
        last[$r]=$(grep -E '^(END|LEFT|MINORITY|BAD) ' "$dir/out/rank.$r.out" 2>/dev/null | tail -1)
        check_one "rank $r" "${st[$r]}" "${last[$r]}" "$dir/out/rank.$r.err" "$dir/out/rank.$r.out" \
            "$([[ "$killed" == *" $r "* ]] || grep -q '^t=.* DIE in' "$dir/out/rank.$r.out" 2>/dev/null && echo 1)"
    done
    for j in $(seq 0 $((njoin - 1))); do
        jst[$j]=$(cat "$dir/join.$j.rc" 2>/dev/null || echo none)
        jlast[$j]=$(grep -E '^(END|LEFT|MINORITY|BAD) ' "$dir/join.$j.out" 2>/dev/null | tail -1)
        check_one "joiner $j" "${jst[$j]}" "${jlast[$j]}" "$dir/join.$j.err" "$dir/join.$j.out" \
            "$([[ "$killed" == *" j "* ]] && echo 1)"
    done
    # Those that ended did so together: one communicator, one step.
    local ends sizes steps
    ends=$(cat "$dir"/out/rank.*.out "$dir"/join.*.out 2>/dev/null | grep -c '^END ')
    sizes=$(cat "$dir"/out/rank.*.out "$dir"/join.*.out 2>/dev/null | sed -n 's/^END .* size=\([0-9]*\) .*/\1/p' | sort -u)
    steps=$(cat "$dir"/out/rank.*.out "$dir"/join.*.out 2>/dev/null | sed -n 's/^END .* steps=\([0-9]*\) .*/\1/p' | sort -u)
    if [ "$(wc -w <<<"$sizes")" -gt 1 ] || [ "$(wc -w <<<"$steps")" -gt 1 ] ||
        { [ "$ends" -gt 0 ] && [ "$sizes" != "$ends" ]; }; then
        good=0
        echo "  $ends processes ended, in communicators of size $(echo $sizes) at steps $(echo $steps): not one group"
    fi
    end_size=${sizes:-0}
}

# check_one WHO STATUS LASTLINE ERRFILE OUTFILE KILLED: one process's
# exit against the man pages.
check_one() {
    local who=$1 s=$2 line=$3 err=$4 out=$5 k=$6
    local crashed=0
    if [ "$s" -ge 129 ] 2>/dev/null && [ "$s" != 137 ]; then crashed=1; fi
    [ "$s" = 137 ] && [ -z "$k" ] && { good=0; echo "  $who was SIGKILLed by nobody here"; }
    grep -qE '^CRASH pid|ERROR: AddressSanitizer|runtime error:|ERROR: LeakSanitizer' "$err" 2>/dev/null && crashed=1
    if [ $crashed = 1 ]; then
        good=0 crashes=$((crashes + 1))
        echo "  CRASH: $who exit status $s; its standard error (backtrace):"
        grep -vE '^\[New LWP|^\[Thread debugging|^Using host libthread' "$err" | tail -60 | sed 's/^/    /'
        local c
        for c in $(find "$dir/cores" -type f -name 'core*' 2>/dev/null); do
            echo "  core $c:"
            command -v gdb >/dev/null &&
                timeout 60 gdb -nx -batch -ex bt "$prog" "$c" 2>&1 | grep '^#' | head -30 | sed 's/^/    /'
        done
        return
    fi
    [ "$s" = 137 ] && return
    case "$s:$line" in
    0:END*) ;;
    3:"LEFT "*"result=LOOM_ERR_REVOKED"*) ;;
    3:"LEFT "*"call=loom_comm_join"*) ;;
    4:MINORITY*) good=0; echo "  $who went on in a minority: $line" ;;
    *) good=0; echo "  $who: exit status $s, last line: ${line:-none}"
       grep -E '^(BAD|t=.* ERR)' "$out" 2>/dev/null | head -5 | sed 's/^/    /'
       tail -3 "$err" 2>/dev/null | sed 's/^/    /' ;;
    esac
}

# outcome R: a word for rank R's end: end<size>, left, minority, killed,
# crashed, bad.
outcome() {
    local r=$1
    case "${st[$r]}:${last[$r]}" in
    0:END*) echo "end$(sed -n 's/.* size=\([0-9]*\) .*/\1/p' <<<"${last[$r]}")" ;;
    3:LEFT*) echo left ;;
    4:*) echo minority ;;
    137:*) echo killed ;;
    1[3-9][0-9]:*) echo crashed ;;
    *) echo "bad(${st[$r]})" ;;
    esac
}
outcomes() {
    local r o=""
    for r in $(seq 0 $((nranks - 1))); do o="$o $r:$(outcome "$r")"; done
    echo "${o# }"
}
# What a rank that was declared failed saw: its first error and its shrink.
seen() {
    echo "    rank $1: $(grep -m1 ' ERR ' "$dir/out/rank.$1.out" | sed 's/^t=[0-9]* orig=[0-9]* //' | cut -c1-150)"
    echo "    rank $1: $(cut -c1-160 <<<"${last[$1]}")"
}
verdict() { # verdict NAME EXPECTED-OUTCOMES
    local got
    got=$(outcomes)
    if [ $good = 1 ] && [ "$got" = "$2" ]; then
        ok "$1: $got"
    else
        bad "$1: got $got, expected $2 (crashes $crashes)"
        grep -h '^LEFT\|^MINORITY\|^BAD' "$dir"/out/rank.*.out 2>/dev/null | head -8 | sed 's/^/    /'
    fi
}
run=0

# --- a: one rank stopped during the large allreduces, past the limit.
# The allreduce by the shared-memory algorithm is of 256 KiB here: the
# size of the outsider's report.
only a && for i in $(seq "$reps"); do
    start_job 4 STOPS_BIG=65536
    act 1.5 stop-shared 2
    act 4.8 cont 2
    end_job 7.0
    [ "$(outcome 2)" = left ] && seen 2
    verdict "a$i: 4 ranks, rank 2 stopped 1.5-4.8 s during shared-memory allreduces" \
        "0:end3 1:end3 2:left 3:end3"
done

# The same with every control thread running 30 ms late after each wait
# (stall_ctrl.c, as on a busy machine): the resumed rank's engine then
# meets its peers' closed arenas before its control thread has read that
# it was declared failed.
stall=$BUILDDIR/tests/mp/.libs/stall_ctrl.so
if only a && [ "$reps" -ge 3 ] && [ -f "$stall" ]; then
    for i in $(seq "$reps"); do
        start_job 4 STOPS_BIG=65536 LD_PRELOAD="$stall" STALL_CTRL_MS=30
        act 1.5 stop-shared 2
        act 4.8 cont 2
        end_job 7.0
        [ "$(outcome 2)" = left ] && seen 2
        verdict "a$i, late control threads: 4 ranks, rank 2 stopped 1.5-4.8 s during shared-memory allreduces" \
            "0:end3 1:end3 2:left 3:end3"
    done
elif only a && [ "$reps" -ge 3 ]; then
    echo "skip - a with late control threads: no $stall (sanitizers or no shared libraries)"
fi

# --- b: two ranks stopped in turn, rank 0 first.
if only b; then
    start_job 6
    act 3.0 stop 0
    act 5.3 stop 1
    act 6.6 cont 0
    act 9.2 cont 1
    end_job 11.5
    for r in 0 1; do [ "$(outcome $r)" = left ] && seen $r; done
    verdict "b: 6 ranks, rank 0 stopped 3.0-6.6 s, rank 1 5.3-9.2 s: neither goes on alone" \
        "0:left 1:left 2:end4 3:end4 4:end4 5:end4"
fi

# --- c: several stopped at once, rank 0 among them, continued in turn.
orders=("0 3" "3 0" "0,3")
[ "$quick" = 1 ] && orders=("3 0")
only c || orders=()
for o in "${orders[@]}"; do
    start_job 6
    act 1.5 stop 0 3
    if [[ $o == *,* ]]; then
        act 4.8 cont 0 3
    else
        set -- $o
        act 4.8 cont "$1"
        act 5.6 cont "$2"
    fi
    end_job 7.5
    verdict "c: 6 ranks, ranks 0 and 3 stopped at 1.5 s, continued ${o/,/ and } from 4.8 s" \
        "0:left 1:end4 2:end4 3:left 4:end4 5:end4"
done
if only c && [ "$reps" -ge 3 ]; then
    for o in "0 1 5" "0 5 1" "1 0 5" "1 5 0" "5 0 1" "5 1 0"; do
        set -- $o
        start_job 8
        act 1.5 stop 0 1 5
        act 4.8 cont "$1"
        act 5.4 cont "$2"
        act 6.0 cont "$3"
        end_job 8.0
        verdict "c: 8 ranks, ranks 0, 1 and 5 stopped at 1.5 s, continued in the order $o" \
            "0:left 1:left 2:end5 3:end5 4:end5 5:left 6:end5 7:end5"
    done
    # Stopped for less than the limit: nobody is failed.
    start_job 6
    act 1.5 stop 0 3
    act 2.5 cont 3 0
    end_job 4.5
    verdict "c: 6 ranks, ranks 0 and 3 stopped for 1 s (under the 3 s limit): all go on" \
        "0:end6 1:end6 2:end6 3:end6 4:end6 5:end6"
fi

# --- d: kills inside shrink, grow and state sync.
if only d-shrink; then
    start_job 6 STOPS_DIE=shrink:0:3
    act 1.5 kill 4
    end_job 4.5
    verdict "d: 6 ranks, rank 4 killed, then rank 0 (the coordinator) killed inside the shrink" \
        "0:killed 1:end4 2:end4 3:end4 4:killed 5:end4"
    if [ "$reps" -ge 3 ]; then
        start_job 6 STOPS_DIE=shrink:3:3
        act 1.5 kill 0
        end_job 4.5
        verdict "d: 6 ranks, rank 0 killed, then rank 3 killed inside the shrink" \
            "0:killed 1:end4 2:end4 3:killed 4:end4 5:end4"
    fi
fi

# Later in the shrink: once the survivors agreed, while the new
# communicator connects and times its collectives.
if only d-shrink; then
    delays="60"
    [ "$reps" -ge 3 ] && delays="20 60 150"
    for ms in $delays; do
        start_job 6 STOPS_KILL_IN=shrink:1:$ms:3
        act 1.5 kill 4
        killed=" 3 4 "
        end_job 4.5
        verdict "d: 6 ranks, rank 4 killed, then rank 3 killed ${ms} ms into rank 1's shrink" \
            "0:end4 1:end4 2:end4 3:killed 4:killed 5:end4"
    done
fi

if only d-grow; then
    start_job 5 STOPS_GROW=1 STOPS_DIE=grow:0:2
    join 1.0
    end_job 6.0
    j="joiner:${jst[0]}:$(cut -d' ' -f1 <<<"${jlast[0]}")"
    verdict "d: 5 ranks, rank 0 (holder of the join service) killed inside the grow admitting a joiner; $j" \
        "0:killed 1:end5 2:end5 3:end5 4:end5"
    if [ "$j" != "joiner:0:END" ]; then
        bad "d: the joiner was not admitted by the next holder: ${jlast[0]:-no end line}"
        grep -v '^t=.* \(sync\|start\)' "$dir/join.0.out" | tail -4 | sed 's/^/    /'
    fi
fi

# A communicator that grew loses a rank: its members and the newcomer
# shrink together (the newcomer's links and settings came from the
# holder, the members' from their own creation).
if only d-grow; then
    for v in 0 2; do
        start_job 4 STOPS_GROW=1
        join 1.0
        act 3.0 kill $v
        end_job 5.5
        exp="0:end4 1:end4 2:end4 3:end4"
        exp=${exp/$v:end4/$v:killed}
        verdict "d: 4 ranks and a joiner admitted, then rank $v killed: the 4 left shrink together; joiner ${jst[0]}:$(cut -d' ' -f1 <<<"${jlast[0]}")" \
            "$exp"
    done
fi

# A newcomer, or a member, killed while the grow admits the newcomer:
# loom_comm_grow(3) admits the others without a newcomer that disappears.
if only d-grow; then
    delays="30"
    [ "$reps" -ge 3 ] && delays="5 30 100"
    for ms in $delays; do
        start_job 5 STOPS_GROW=1 STOPS_KILL_IN=grow:1:$ms:j
        killed=" j "
        join 1.0
        end_job 5.0
        verdict "d: 5 ranks, the joiner killed ${ms} ms into rank 1's grow; joiner ${jst[0]}" \
            "0:end5 1:end5 2:end5 3:end5 4:end5"
        start_job 5 STOPS_GROW=1 STOPS_KILL_IN=grow:1:$ms:3
        killed=" 3 "
        join 1.0
        end_job 5.0
        verdict "d: 5 ranks, rank 3 killed ${ms} ms into rank 1's grow admitting a joiner; joiner ${jst[0]}:$(cut -d' ' -f1 <<<"${jlast[0]}")" \
            "0:end5 1:end5 2:end5 3:killed 4:end5"
    done
fi

if only d-sync; then
    mib=64
    [ "$quick" = 1 ] && mib=32
    # Ranks 0 and 1 hold revision 7, ranks 2-4 revision 6: 0 and 1 are
    # the donors; rank 3 kills both once bytes arrive.  Then 2-4 shrink and
    # sync among themselves: what they accept must be their revision's
    # bytes.
    start_job 5 STOPS_STATE_MIB=$mib STOPS_OLD=2,3,4 STOPS_SYNC_STEP=1 STOPS_KILL_ON_RECEIVE=3:0,1
    killed=" 0 1 "
    end_job 5.0
    verdict "d: 5 ranks, both donors of a $mib MiB state sync killed during it" \
        "0:killed 1:killed 2:end3 3:end3 4:end3"
    grep -h 'sync\|BAD\|KILLED' "$dir"/out/rank.[234].out | cut -c1-200 | sed 's/^/    /' | head -14
    start_job 5 STOPS_STATE_MIB=$mib STOPS_OLD=2,3,4 STOPS_SYNC_STEP=1 STOPS_KILL_ON_RECEIVE=3:1
    killed=" 1 "
    end_job 5.0
    revs=$(cat "$dir"/out/rank.*.out | sed -n 's/^END .*state=ok revision=\([0-9]*\)$/\1/p' | sort | uniq -c | xargs)
    if [ "$revs" = "4 7" ]; then
        ok "d: one of two donors killed during a $mib MiB state sync: after the shrink all 4 hold revision 7's bytes"
    else
        bad "d: one of two donors killed during a $mib MiB state sync: END states: ${revs:-none}"
    fi
    verdict "d: 5 ranks, donor 1 of 2 killed during a $mib MiB state sync" \
        "0:end4 1:killed 2:end4 3:end4 4:end4"
fi
finish
