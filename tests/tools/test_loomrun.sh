#!/usr/bin/env bash
# shellcheck disable=SC2016 # the ranks' scripts expand in the ranks
# test_loomrun.sh - behaviour tests of the loomrun launcher.
#
#   LOOMRUN=/path/to/loomrun bash tests/tools/test_loomrun.sh
#
# LOOMRUN defaults to ./loomrun.  Every run of loomrun is bounded by
# timeout(1) and every wait for a background process is a bounded poll, so
# a broken loomrun fails the tests instead of hanging them.  The last line
# is "N passed, M failed"; the exit status is 0 only if nothing failed.
set -u

if [ -z "${LOOMRUN:-}" ]; then
    LOOMRUN=./loomrun
    # From another directory, the build tree's top holds it.
    [ -x "$LOOMRUN" ] || LOOMRUN=$(dirname "$0")/../../loomrun
fi
case $LOOMRUN in
/*) ;;
*) LOOMRUN=$PWD/$LOOMRUN ;;
esac
if [ ! -x "$LOOMRUN" ]; then
    echo "test_loomrun.sh: '$LOOMRUN' is not an executable (set LOOMRUN)" >&2
    exit 1
fi
for tool in timeout pgrep; do
    if ! command -v "$tool" >/dev/null; then
        echo "test_loomrun.sh: needs $tool" >&2
        exit 1
    fi
done

T=$(mktemp -d "${TMPDIR:-/tmp}/loomrun-test.XXXXXX") || exit 1
# Every rank runs as `bash -c SCRIPT "$TAG"` and sleeps "$SLP" seconds, so
# processes left behind can be found (and killed) by these unique strings.
TAG=loomrun-test-rank-$$
SLP=47.$$
LIMIT=30 # seconds any single loomrun run may take before it counts as hung
export TAG SLP

tagged_pids() {
    pgrep -f -- "$TAG|sleep $SLP" 2>/dev/null
}

kill_tagged() {
    local p
    for p in $(tagged_pids); do kill -KILL "$p" 2>/dev/null; done
}

cleanup() {
    local p
    for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null; done
    kill_tagged
    rm -rf "$T"
}
trap cleanup EXIT

# Inside a test (a subshell): report and end that test.
fail() {
    echo "    FAIL: $*" >&2
    local p
    for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null; done
    kill_tagged
    exit 1
}

now_ms() {
    local t=${EPOCHREALTIME//[!0-9]/} # microseconds, locale-independent
    echo $((t / 1000))
}

# lr ARGS...: run loomrun bounded; sets RC and MS (elapsed milliseconds);
# stdout and stderr go to $D/out and $D/err.
lr() {
    local t0
    t0=$(now_ms)
    timeout -k 5 "$LIMIT" "$LOOMRUN" "$@" >"$D/out" 2>"$D/err" </dev/null
    RC=$?
    MS=$(($(now_ms) - t0))
    if [ "$MS" -ge $((LIMIT * 1000)) ]; then
        fail "loomrun $* hung (stopped after ${LIMIT}s)"
    fi
}

expect_rc() {
    [ "$RC" -eq "$1" ] || fail "expected exit status $1, got $RC" \
        "(stderr: $(head -c 600 "$D/err"))"
}

expect_faster() { # MS_LIMIT WHAT
    [ "$MS" -lt "$1" ] || fail "$2 took ${MS} ms (limit $1 ms)"
}

expect_grep() { # PATTERN FILE
    grep -Eq -- "$1" "$2" || fail "no line matching '$1' in $2:" \
        "$(head -c 600 "$2")"
}

# wait_gone PID SECONDS: poll until PID has exited; false if it did not.
wait_gone() {
    local i
    for ((i = 0; i < $2 * 20; i++)); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.05
    done
    return 1
}

# wait_files GLOB COUNT SECONDS
wait_files() {
    local i files
    for ((i = 0; i < $3 * 20; i++)); do
        files=$(compgen -G "$1" | wc -l)
        [ "$files" -ge "$2" ] && return 0
        sleep 0.05
    done
    return 1
}

# No rank process (nor its sleep) may remain; they get 3 s to vanish.
expect_no_leftovers() {
    local i
    for ((i = 0; i < 60; i++)); do
        [ -z "$(tagged_pids)" ] && return 0
        sleep 0.05
    done
    fail "processes left behind: $(tagged_pids | tr '\n' ' ')"
}

# ---------------------------------------------------------------- tests

t_env() {
    local script='echo "$LOOM_RANK $LOOM_SIZE $LOOM_LOCAL_RANK $LOOM_LOCAL_SIZE $LOOM_ROOT $LOOM_JOB_KEY" >"$D/env.$$"'
    lr -n 4 bash -c "$script" "$TAG"
    expect_rc 0
    local files
    files=$(compgen -G "$D/env.*" | wc -l)
    [ "$files" -eq 4 ] || fail "expected 4 ranks to report, got $files"
    cat "$D"/env.* >"$D/all"
    local ranks
    ranks=$(cut -d' ' -f1 "$D/all" | sort -n | tr '\n' ' ')
    [ "$ranks" = "0 1 2 3 " ] || fail "LOOM_RANK values: '$ranks'"
    awk '$2 != 4 || $3 != $1 || $4 != 4 { bad = 1 } END { exit bad }' \
        "$D/all" || fail "LOOM_SIZE/LOCAL_RANK/LOCAL_SIZE wrong: $(cat "$D/all")"
    [ "$(cut -d' ' -f5 "$D/all" | sort -u | wc -l)" -eq 1 ] ||
        fail "ranks see different LOOM_ROOT: $(cat "$D/all")"
    [ "$(cut -d' ' -f6 "$D/all" | sort -u | wc -l)" -eq 1 ] ||
        fail "ranks see different LOOM_JOB_KEY: $(cat "$D/all")"
    local root key port
    read -r _ _ _ _ root key <"$D/all"
    [[ $root =~ ^127\.0\.0\.1:([0-9]+)$ ]] || fail "LOOM_ROOT '$root'"
    port=${BASH_REMATCH[1]}
    if [ "$port" -lt 1 ] || [ "$port" -gt 65535 ]; then fail "port $port"; fi
    [[ $key =~ ^[0-9a-f]{32}$ ]] || fail "LOOM_JOB_KEY '$key'"

    # torch's env:// variables: RANK and LOCAL_RANK equal LOOM_RANK, the
    # sizes LOOM_SIZE, MASTER_ADDR the root's host and MASTER_PORT
    # another port.
    lr -n 3 bash -c 'echo "$LOOM_RANK $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT ${LOOM_ROOT##*:}"' "$TAG"
    expect_rc 0
    awk '$1 != $2 || $1 != $3 || $4 != 3 || $5 != 3 || $6 != "127.0.0.1" || $7 !~ /^[0-9]+$/ || $7 == $8 { bad = 1 }
        END { exit bad || NR != 3 }' "$D/out" || fail "torch's variables: $(cat "$D/out")"
    [ "$(cut -d' ' -f7 "$D/out" | sort -u | wc -l)" -eq 1 ] || fail "ranks see different MASTER_PORT"
    lr -n 1 --root 127.0.0.1:4567 -x MASTER_ADDR=elsewhere bash -c 'echo "$MASTER_ADDR:$MASTER_PORT"' "$TAG"
    expect_rc 0
    [ "$(cat "$D/out")" = "elsewhere:4568" ] || fail "MASTER_ADDR by -x, MASTER_PORT after --root's: $(cat "$D/out")"
    lr -n 1 -x RANK=3 true
    expect_rc 2

    # A second launch gets a fresh key.
    lr -n 1 bash -c 'echo "$LOOM_JOB_KEY"' "$TAG"
    expect_rc 0
    [[ $(cat "$D/out") =~ ^[0-9a-f]{32}$ ]] || fail "key '$(cat "$D/out")'"
    [ "$(cat "$D/out")" != "$key" ] || fail "two launches share a job key"
}

t_env_inherited() {
    # loomrun's environment passes through; an inherited LOOM_JOB_KEY is
    # kept; stale LOOM_RANK/LOOM_SIZE are replaced; --root is used as given.
    local script='echo "$LOOM_RANK $LOOM_SIZE $LOOM_JOB_KEY $LOOM_ROOT $PASS_ME"'
    LOOM_JOB_KEY=preset-key LOOM_RANK=99 LOOM_SIZE=99 PASS_ME=through \
        lr -n 2 --root 10.1.2.3:4567 bash -c "$script" "$TAG"
    expect_rc 0
    sort "$D/out" >"$D/sorted"
    printf '%s\n' "0 2 preset-key 10.1.2.3:4567 through" \
        "1 2 preset-key 10.1.2.3:4567 through" >"$D/want"
    cmp -s "$D/sorted" "$D/want" || fail "got: $(cat "$D/sorted")"
}

t_x() {
    local script='echo "$LOOM_RANK:$FOO:$BAZ:${EMPTY-unset}:$OVR:$TWICE"'
    OVR=old lr -n 3 -x FOO=bar -x 'BAZ=a b=c' -x EMPTY= -x OVR=new \
        -xTWICE=1 -x TWICE=2 bash -c "$script" "$TAG"
    expect_rc 0
    sort "$D/out" >"$D/sorted"
    printf '%s\n' "0:bar:a b=c::new:2" "1:bar:a b=c::new:2" \
        "2:bar:a b=c::new:2" >"$D/want"
    cmp -s "$D/sorted" "$D/want" || fail "got: $(cat "$D/sorted")"
}

t_exit_status() {
    lr -n 4 bash -c 'if [ "$LOOM_RANK" = 2 ]; then sleep 0.3; exit 3; fi
        sleep "$SLP"; touch "$D/survived.$LOOM_RANK"' "$TAG"
    expect_rc 3
    expect_faster 5000 "stopping the ranks that sleep ${SLP%.*} s"
    expect_grep '^loomrun: rank 2 \(pid [0-9]+\) exited with status 3; stopping the other ranks$' "$D/err"
    [ "$(grep -c . "$D/err")" -eq 1 ] || fail "expected one line: $(cat "$D/err")"
    expect_no_leftovers
    ! compgen -G "$D/survived.*" >/dev/null || fail "a rank ran to its end"
}

t_killed_rank() {
    lr -n 3 bash -c 'if [ "$LOOM_RANK" = 1 ]; then sleep 0.3; kill -KILL $$; fi
        sleep "$SLP"' "$TAG"
    expect_rc 137
    expect_faster 5000 "stopping the ranks that sleep ${SLP%.*} s"
    expect_grep '^loomrun: rank 1 \(pid [0-9]+\) killed by signal 9 \(Killed\); stopping the other ranks$' "$D/err"
    expect_no_leftovers
}

t_grace() {
    # The others ignore SIGTERM, so only SIGKILL after --grace ends them.
    lr -n 3 --stop-delay 0 --grace 1 bash -c 'trap "" TERM
        if [ "$LOOM_RANK" = 0 ]; then sleep 0.2; exit 1; fi
        sleep "$SLP"' "$TAG"
    expect_rc 1
    [ "$MS" -ge 1000 ] || fail "SIGKILL came before the grace period (${MS} ms)"
    expect_faster 5000 "a 1 s grace period"
    expect_no_leftovers
}

t_stop_delay() {
    # Ranks that see the failure print their own error and exit within
    # --stop-delay (default 2 s): no SIGTERM interrupts them.
    lr -n 3 bash -c 'if [ "$LOOM_RANK" = 1 ]; then sleep 0.2; exit 3; fi
        trap "echo \"rank \$LOOM_RANK: terminated\" >&2; exit 143" TERM
        sleep 0.8; echo "rank $LOOM_RANK: my own error" >&2; exit 1' "$TAG"
    expect_rc 3
    expect_grep '^rank 0: my own error$' "$D/err"
    expect_grep '^rank 2: my own error$' "$D/err"
    ! grep -q terminated "$D/err" || fail "SIGTERM within the stop delay: $(cat "$D/err")"
    [ "$(grep -c . "$D/err")" -eq 3 ] || fail "expected 3 lines: $(cat "$D/err")"
    expect_no_leftovers

    # Ranks that do not exit get SIGTERM once --stop-delay has passed.
    lr -n 3 --stop-delay 0.5 bash -c 'if [ "$LOOM_RANK" = 1 ]; then exit 3; fi
        trap "echo \"rank \$LOOM_RANK: terminated\" >&2; exit 143" TERM
        sleep "$SLP"' "$TAG"
    expect_rc 3
    [ "$MS" -ge 500 ] || fail "SIGTERM came before the stop delay (${MS} ms)"
    expect_faster 5000 "a 0.5 s stop delay"
    expect_grep '^rank 0: terminated$' "$D/err"
    expect_grep '^rank 2: terminated$' "$D/err"
    expect_no_leftovers
}

t_keep_going() {
    lr -n 4 --keep-going bash -c 'if [ "$LOOM_RANK" = 0 ]; then exit 5; fi
        sleep 1; echo "done $LOOM_RANK" >"$D/kg.$LOOM_RANK"' "$TAG"
    expect_rc 5
    local r
    for r in 1 2 3; do
        [ "$(cat "$D/kg.$r" 2>/dev/null)" = "done $r" ] ||
            fail "rank $r did not finish under --keep-going"
    done
    expect_grep '^loomrun: rank 0 \(pid [0-9]+\) exited with status 5$' "$D/err"
    ! grep -q stopping "$D/err" || fail "--keep-going stopped ranks"

    # A failure that is not the first one keeps the first one's status.
    lr -n 3 --keep-going bash -c 'case $LOOM_RANK in 0) exit 4;;
        1) sleep 0.5; exit 6;; esac; exit 0' "$TAG"
    expect_rc 4
}

t_prefix() {
    lr -n 3 --prefix bash -c 'echo "out $LOOM_RANK"; echo "err $LOOM_RANK" >&2
        for i in $(seq 1 200); do echo "line $i"; done
        head -c 10000 /dev/zero | tr "\0" x; echo
        printf "partial %s" "$LOOM_RANK"' "$TAG"
    expect_rc 0
    local r bad
    bad=$(grep -Ev '^\[[0-2]\] ' "$D/out" | head -3)
    [ -z "$bad" ] || fail "stdout lines without a prefix: $bad"
    [ "$(wc -l <"$D/out")" -eq $((3 * 203)) ] ||
        fail "expected $((3 * 203)) stdout lines, got $(wc -l <"$D/out")"
    for r in 0 1 2; do
        [ "$(grep -cx "\[$r\] out $r" "$D/out")" -eq 1 ] || fail "no '[$r] out $r'"
        [ "$(grep -cx "\[$r\] partial $r" "$D/out")" -eq 1 ] ||
            fail "partial last line of rank $r not flushed with a newline"
        [ "$(grep -cxE "\[$r\] x{10000}" "$D/out")" -eq 1 ] ||
            fail "a 10000-byte line of rank $r was not kept whole"
        grep "^\[$r\] line " "$D/out" | sed "s/^\[$r\] line //" >"$D/seq.$r"
        seq 1 200 | cmp -s - "$D/seq.$r" || fail "rank $r lines out of order"
    done
    sort "$D/err" >"$D/sorted"
    printf '%s\n' "[0] err 0" "[1] err 1" "[2] err 2" >"$D/want"
    cmp -s "$D/sorted" "$D/want" || fail "stderr: $(cat "$D/err")"

    # Without --prefix output is passed on untouched.
    lr -n 2 bash -c 'echo "plain $LOOM_RANK"' "$TAG"
    sort "$D/out" >"$D/sorted"
    printf '%s\n' "plain 0" "plain 1" >"$D/want"
    cmp -s "$D/sorted" "$D/want" || fail "plain output: $(cat "$D/out")"
}

t_output() {
    local dir=$D/o/nested/dir # created by loomrun, parents included
    lr -n 3 --output "$dir" bash -c 'echo "out-$LOOM_RANK"
        echo "err-$LOOM_RANK" >&2' "$TAG"
    expect_rc 0
    [ ! -s "$D/out" ] || fail "--output still wrote to stdout: $(cat "$D/out")"
    local r
    for r in 0 1 2; do
        [ "$(cat "$dir/rank.$r.out" 2>/dev/null)" = "out-$r" ] ||
            fail "$dir/rank.$r.out is wrong or missing"
        [ "$(cat "$dir/rank.$r.err" 2>/dev/null)" = "err-$r" ] ||
            fail "$dir/rank.$r.err is wrong or missing"
    done
}

t_timeout() {
    # Rank 0 ignores SIGTERM, so the job ends only by SIGKILL.
    lr -n 3 --timeout 1 --grace 1 bash -c '
        [ "$LOOM_RANK" = 0 ] && trap "" TERM; sleep "$SLP"' "$TAG"
    expect_rc 124
    [ "$MS" -ge 1000 ] || fail "--timeout 1 ended after ${MS} ms"
    expect_faster 6000 "--timeout 1 --grace 1"
    expect_grep 'timed out' "$D/err"
    expect_no_leftovers
}

t_signal_forwarding() {
    "$LOOMRUN" -n 3 bash -c '
        trap "echo usr1 >>\"$D/usr1.$LOOM_RANK\"" USR1
        trap "echo term >\"$D/term.$LOOM_RANK\"; exit 0" TERM
        touch "$D/ready.$LOOM_RANK"
        while :; do sleep 0.05; done' "$TAG" >"$D/out" 2>"$D/err" </dev/null &
    local pid=$!
    wait_files "$D/ready.*" 3 10 || fail "the ranks did not start"
    kill -USR1 "$pid"
    wait_files "$D/usr1.*" 3 5 || fail "SIGUSR1 was not forwarded to every rank"
    kill -0 "$pid" 2>/dev/null || fail "loomrun ended on SIGUSR1"
    kill -TERM "$pid"
    wait_gone "$pid" 10 || fail "loomrun did not end after SIGTERM"
    wait "$pid"
    RC=$?
    expect_rc 0 # every rank trapped TERM and exited 0
    local r
    for r in 0 1 2; do
        [ "$(cat "$D/term.$r" 2>/dev/null)" = term ] || fail "rank $r saw no SIGTERM"
    done
    expect_no_leftovers
}

t_sigint() {
    env --default-signal=INT true 2>/dev/null || { echo "    (skipped: env --default-signal)"; return 0; }
    # A background job starts with SIGINT ignored; env puts it back.
    env --default-signal=INT "$LOOMRUN" -n 2 bash -c '
        touch "$D/ready.$LOOM_RANK"; sleep "$SLP"' "$TAG" \
        >"$D/out" 2>"$D/err" </dev/null &
    local pid=$!
    wait_files "$D/ready.*" 2 10 || fail "the ranks did not start"
    kill -INT "$pid"
    wait_gone "$pid" 10 || fail "loomrun did not end after SIGINT"
    wait "$pid"
    RC=$?
    expect_rc 130
    expect_no_leftovers

    # Ranks that ignore SIGINT: the second one kills everything.
    rm -f "$D"/ready.*
    env --default-signal=INT "$LOOMRUN" -n 2 bash -c 'trap "" INT
        touch "$D/ready.$LOOM_RANK"; sleep "$SLP"' "$TAG" \
        >"$D/out" 2>"$D/err" </dev/null &
    pid=$!
    wait_files "$D/ready.*" 2 10 || fail "the ranks did not start"
    kill -INT "$pid"
    sleep 0.3
    kill -0 "$pid" 2>/dev/null || fail "loomrun ended on the first SIGINT"
    [ -n "$(tagged_pids)" ] || fail "the ranks ended on an ignored SIGINT"
    kill -INT "$pid"
    wait_gone "$pid" 5 || fail "loomrun did not end after a second SIGINT"
    wait "$pid"
    RC=$?
    expect_rc 137
    expect_no_leftovers
}

t_missing_program() {
    lr -n 2 loomrun-no-such-program-$$
    expect_rc 127
    expect_grep "loomrun-no-such-program-$$" "$D/err"
    expect_grep 'No such file or directory' "$D/err"

    printf '#!/bin/sh\necho hi\n' >"$D/not-executable"
    chmod 644 "$D/not-executable"
    lr -n 2 "$D/not-executable"
    expect_rc 127
    expect_grep 'not-executable.*Permission denied' "$D/err"
}

t_path_lookup() {
    mkdir -p "$D/bin"
    printf '#!/bin/sh\necho "found $LOOM_RANK"\n' >"$D/bin/loomrun-test-prog"
    chmod 755 "$D/bin/loomrun-test-prog"
    PATH=$D/bin:$PATH lr -n 2 loomrun-test-prog
    expect_rc 0
    [ "$(sort "$D/out" | tr '\n' ' ')" = "found 0 found 1 " ] ||
        fail "got: $(cat "$D/out")"
    # A script without "#!" runs under /bin/sh, as with execvp(3).
    printf 'echo "plain script $LOOM_RANK $1"\n' >"$D/bin/loomrun-test-sh"
    chmod 755 "$D/bin/loomrun-test-sh"
    PATH=$D/bin:$PATH lr -n 2 loomrun-test-sh arg1
    expect_rc 0
    [ "$(sort "$D/out" | tr '\n' ' ')" = "plain script 0 arg1 plain script 1 arg1 " ] ||
        fail "got: $(cat "$D/out") $(cat "$D/err")"
}

t_bad_options() {
    local -a cases=(
        "--bogus|--bogus -n 2 touch $D/ran"
        "-q|-q -n 2 touch $D/ran"
        "-n|-n 0 touch $D/ran"
        "-n|-n abc touch $D/ran"
        "-n|-n 4097 touch $D/ran"
        "-n|-n -3 touch $D/ran"
        "-n|touch $D/ran"
        "PROGRAM|-n 2"
        "--timeout|-n 2 --timeout -1 touch $D/ran"
        "--timeout|-n 2 --timeout soon touch $D/ran"
        "--grace|-n 2 --grace x touch $D/ran"
        "--stop-delay|-n 2 --stop-delay -1 touch $D/ran"
        "-x|-n 2 -x NOEQUALS touch $D/ran"
        "-x|-n 2 -x 1BAD=x touch $D/ran"
        "--root|-n 2 --root host:99999 touch $D/ran"
        "--output|-n 2 --output"
        "--prefix|-n 2 --prefix=yes touch $D/ran"
    )
    local c name args
    for c in "${cases[@]}"; do
        name=${c%%|*}
        read -r -a args <<<"${c#*|}"
        lr "${args[@]}"
        [ "$RC" -eq 2 ] || fail "'loomrun ${args[*]}' exited $RC, expected 2"
        grep -qF -- "$name" "$D/err" ||
            fail "'loomrun ${args[*]}' did not name '$name': $(cat "$D/err")"
        [ ! -s "$D/out" ] || fail "'loomrun ${args[*]}' wrote to stdout"
        [ ! -e "$D/ran" ] || fail "'loomrun ${args[*]}' ran the program"
    done

    lr --help
    expect_rc 0
    expect_grep '^Usage: loomrun' "$D/out"
    lr --version
    expect_rc 0
    expect_grep '^loomrun ' "$D/out"
}

t_success_and_args() {
    lr -n 1 true
    expect_rc 0
    lr -n 64 --prefix bash -c 'echo "$LOOM_RANK"' "$TAG"
    expect_rc 0
    [ "$(grep -cE '^\[([0-9]+)\] \1$' "$D/out")" -eq 64 ] ||
        fail "64 ranks: $(head -5 "$D/out")"
    # Options after PROGRAM belong to PROGRAM.
    lr -n 2 printf '%s\n' -n --prefix
    expect_rc 0
    [ "$(tr '\n' ' ' <"$D/out")" = "-n --prefix -n --prefix " ] ||
        fail "arguments after PROGRAM: $(cat "$D/out")"
}

t_stdin() {
    # Ranks read /dev/null, so a rank reading stdin does not hang the job.
    local t0
    t0=$(now_ms)
    echo "not for the ranks" | timeout -k 5 10 "$LOOMRUN" -n 2 cat >"$D/out" 2>"$D/err"
    RC=$?
    MS=$(($(now_ms) - t0))
    expect_rc 0
    [ ! -s "$D/out" ] || fail "ranks read loomrun's stdin: $(cat "$D/out")"
}

# ---------------------------------------------------------------- driver

PASSED=0
FAILED=0
run() {
    local name=$1
    D=$T/$name
    mkdir -p "$D"
    export D
    if ("$name"); then
        PASSED=$((PASSED + 1))
        echo "ok   - $name"
    else
        FAILED=$((FAILED + 1))
        echo "FAIL - $name"
    fi
    kill_tagged
}

run t_env
run t_env_inherited
run t_x
run t_exit_status
run t_killed_rank
run t_grace
run t_stop_delay
run t_keep_going
run t_prefix
run t_output
run t_timeout
run t_signal_forwarding
run t_sigint
run t_missing_program
run t_path_lookup
run t_bad_options
run t_success_and_args
run t_stdin

echo "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
