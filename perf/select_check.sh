#!/bin/bash
# select_check.sh - is the automatic choice close to the best forced one?
# For each collective, times every algorithm of it and the automatic
# choice in one job (the perf binary's -A: their batches take turns, so
# that the host's drift hits them alike, and each result is checked),
# REPEATS jobs per size range, and prints per size the median over the
# jobs of each one's out-of-place time, the best forced algorithm and
# auto/best.  Sizes up to 64K run 1000 iterations (after 100), 128K-2M
# 60 (after 10), larger ones 20 (after 5): three ranges, one job each; each time is the median of 10 batches (-S 10), so that one
# descheduled batch on a shared host does not decide a row.  PERF FLAGS
# can override.
# The "auto ran" column says what the automatic choice ran at that size
# ("slots": the shared arenas' small-message path, which no forced
# algorithm takes), read from the table each job's rank 0 logs at init
# (LOOM_DEBUG=info, which the jobs get unless LOOM_DEBUG is set): on
# several hosts the probe's figures, and with them a crossover, can
# differ from job to job, and on one host so can the sizes timed at
# init.  Where the jobs chose differently it lists each choice
# ("hierar/pairwi").  Without those lines (replays, another log level) it
# falls back on the table that `loom-info --job` prints in a job started
# the same way.  Rows where auto is more than 10% slower than the best
# are marked "!"; where auto ran the best forced algorithm itself in
# every job (marked "=") both times measure one schedule, and their gap
# is the host's noise, not the choice: those rows count as met.  Where
# auto is more than 10% slower but every algorithm it ran has its own
# median within 10% of the best, the choice was good and auto's time is
# a second, noisier sample: marked "~", met.
# Below each table, the near-ties that the jobs' tables marked for the
# collective (their rank 0's "selection: tie" lines: sizes where the
# model chose between two estimates within 10% by their worst case; see
# loom(7)), each with the number of jobs that logged it; the rows of
# those sizes are where the choice is expected to be close.
# With -s, each algorithm runs in a job of its own instead (the order
# still rotates from one repeat to the next): over TCP, one algorithm's
# traffic can leave the sockets in a state that slows the next one's
# (2 hosts x 2 over veth: hierarchical 512K allreduce 0.34 ms alone,
# 2 ms between the others' batches, with retransmissions and zero
# windows), which no job that runs one algorithm sees.
#
#   perf/select_check.sh [-s] [-c "COLLS"] [-b MIN] [-e MAX] [-f FACTOR]
#                        [-r REPEATS] [-l "LAUNCHER"] [-p DIR] [-- PERF FLAGS]
#
#   COLLS     "all_reduce all_gather reduce_scatter alltoall" (default)
#   MIN, MAX  8 and 64M;  FACTOR: 2;  REPEATS: 3
#   LAUNCHER  how to start a job, the perf binary appended:
#             "./loomrun -n 4 --bind core" (default), or for namespaces
#             "perf/netns_hosts.sh run 2"
#   DIR       runs nothing: prints the tables from files of earlier runs,
#             DIR/info (loom-info --job), and per collective DIR/COLL.algos
#             (the algorithms, auto last) and DIR/COLL.K, K < REPEATS (the
#             perf binary's output); the tests check the marks this way
# Exit status 1 when a row is marked or a run fails or reports #wrong.
set -u
colls="all_reduce all_gather reduce_scatter alltoall" minb=8 maxb=64M factor=2 reps=3
BUILDDIR=${BUILDDIR:-.}
launch="$BUILDDIR/loomrun -n 4 --bind core"
separate=0 replay=
while getopts "sc:b:e:f:r:l:p:h" o; do
    case $o in
    s) separate=1 ;; c) colls=$OPTARG ;; b) minb=$OPTARG ;; e) maxb=$OPTARG ;; f) factor=$OPTARG ;;
    r) reps=$OPTARG ;; l) launch=$OPTARG ;; p) replay=$OPTARG ;; h) sed -n '2,/^set -u/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ "${1:-}" = -- ] && shift
flags=("$@")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0
to_bytes() { # 64K -> 65536
    local v=${1%[KkMmGg]} u=${1##*[0-9]}
    case $u in K | k) echo $((v << 10)) ;; M | m) echo $((v << 20)) ;; G | g) echo $((v << 30)) ;; *) echo "$v" ;; esac
}
algos_of() { # the algorithms loom-info lists for a collective
    "$BUILDDIR/loom-info" | awk -v c="$1" '/^collectives and algorithms/ {s=1}
        s && $1 == c {f=1; next} f && /^ +algorithms/ {
        sub(/.*algorithms */, ""); gsub(/ \([^)]*\)/, ""); gsub(/,/, ""); print; exit}'
}
# The job's own selection table, as every rank of it uses it.
if [ -n "$replay" ]; then
    cp "$replay/info" "$tmp/info" || exit 2
else
    env -u LOOM_ALGO $launch "$BUILDDIR/loom-info" --job >"$tmp/info" 2>&1 ||
        { echo "loom-info --job failed:"; tail -5 "$tmp/info"; exit 1; }
fi
nranks=$(awk '/^topology: [0-9]+ ranks/ {print $2; exit}' "$tmp/info")
[ -n "$nranks" ] || { echo "no rank count in loom-info's output"; exit 1; }
for coll in $colls; do
    case $coll in
    all_reduce) lc=allreduce ;; all_gather) lc=allgather ;; reduce_scatter) lc=reduce_scatter ;;
    alltoall) lc=alltoall ;; broadcast) lc=broadcast ;; *) echo "unknown $coll"; exit 2 ;;
    esac
    # "ring from 0, shared from 256K" -> "ring 0 shared 262144"
    picks=$(awk -v c="$lc" '/^selection/ {s = 1; next} s && $1 == c {
        sub(/^ *[^ ]+ +/, ""); gsub(/,/, ""); gsub(/ from /, " "); print; exit}' "$tmp/info")
    picks=$(for w in $picks; do case $w in [0-9]*) to_bytes "$w" ;; *) echo "$w" ;; esac; done | xargs)
    # Blocking calls below these input sizes take the slots (0: none):
    # the slot size, or the collective's own limit measured at init.
    slots=$(awk -v c="$lc" '/blocking calls with input up to/ {
            l = $0; sub(/.*up to /, "", l); sub(/:.*/, "", l); getline
            if (index($0, c ",") || index($0, c ";")) lim = l }
        $1 == c ":" && $2 == "up" {l = $0; sub(/.*up to /, "", l); sub(/[, ].*/, "", l); lim = l}
        END {print lim ? lim : 0}' "$tmp/info")
    slots=$(to_bytes "$slots")
    runs=$reps
    if [ -n "$replay" ]; then
        algos=$(cat "$replay/$coll.algos") || exit 2
        for ((k = 0; k < reps; k++)); do cp "$replay/$coll.$k" "$tmp/$coll.$k" || exit 2; done
        runs=0
    else
        algos="$(algos_of $lc) auto"
    fi
    for ((k = 0; k < runs; k++)); do
        # Rotate the order each job: which algorithm warms up first and
        # starts the first batch must not favour one.
        set -- $algos
        na=$#
        order=()
        for ((i = 0; i < na; i++)); do
            j=$(( (i + k) % na + 1 ))
            order+=("${!j}")
        done
        # One job for all (-A a,b,c) or, with -s, one per algorithm.
        if [ $separate = 1 ]; then lists=("${order[@]}"); else lists=("$(IFS=,; echo "${order[*]}")"); fi
        : >"$tmp/$coll.$k"
        # Small sizes take many iterations to rise above the noise, large
        # ones few.
        for part in "0 64K 1000 100" "128K 2M 60 10" "4M 1G 20 5"; do
            set -- $part
            b=$(to_bytes $1) e=$(to_bytes $2) it=(-n $3 -w $4 -S 10)
            [ "$b" -ge "$(to_bytes $minb)" ] || b=$(to_bytes $minb)
            [ "$e" -le "$(to_bytes $maxb)" ] || e=$(to_bytes $maxb)
            [ "$b" -le "$e" ] || continue
            for list in "${lists[@]}"; do
                env -u LOOM_ALGO LOOM_DEBUG="${LOOM_DEBUG:-info}" $launch \
                    "$BUILDDIR/${coll}_perf" -b "$b" -e "$e" -f "$factor" \
                    "${it[@]}" -A "$list" "${flags[@]}" >"$tmp/run" 2>&1 ||
                    { echo "$coll job $k ($1-$2, $list) failed:"; tail -5 "$tmp/run"; status=1; }
                cat "$tmp/run" >>"$tmp/$coll.$k"
            done
        done
    done
    how="of $reps jobs"; [ $separate = 1 ] && how="of $reps jobs per algorithm, one algorithm each"
    echo "# $coll: median out-of-place time (us) $how; auto/best > 1.10 marked !,"
    echo "# auto running the best forced algorithm itself marked =, one within 10% of the best ~"
    awk -v algos="$algos" -v reps="$reps" -v dir="$tmp" -v coll="$coll" -v picks="$picks" \
        -v slots="$slots" -v p="$nranks" -v lc="$lc" '
    function median(a, n,   i, j, t) {
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function tob(v,   u, x) { # 64K -> 65536
        u = substr(v, length(v)); x = v + 0
        return u == "K" ? x * 1024 : u == "M" ? x * 1048576 : u == "G" ? x * 1073741824 : x
    }
    function pick(sz, Q, nq, lim,   key, inb, i, a) { # what a table ran for a perf size
        # The table is keyed by the count in bytes (per rank, except the
        # allreduce and the broadcast); the slots by the bytes a rank puts
        # in (small.c).
        key = coll == "all_reduce" || coll == "broadcast" ? sz : sz / p
        inb = coll == "all_gather" ? sz / p : sz
        if (inb <= lim) return "slots"
        for (i = 1; i < nq; i += 2) if (Q[i + 1] <= key) a = Q[i]
        return a
    }
    BEGIN {
        np = split(picks, P, " ")
        na = split(algos, A, " ")
        for (i = 1; i <= na; i++) known[A[i]] = 1
        for (k = 0; k < reps; k++) {
            f = dir "/" coll "." k
            nj = 0 # the table of the job whose rows follow (its rank 0 logs it at init)
            while ((getline line < f) > 0) {
                if (line ~ /rank 0\] INFO [0-9 :.-]+ selection: /) {
                    sub(/.* selection: /, "", line)
                    if (index(line, lc " ") == 1) {
                        sub(/^[^ ]+ /, "", line); gsub(/ \(chunks of [^)]*\)/, "", line)
                        gsub(/,/, "", line); gsub(/ from /, " ", line)
                        nj = split(line, J, " ")
                        for (i = 2; i <= nj; i += 2) J[i] = tob(J[i])
                        jslots = 0
                    } else if (line ~ /^slots /) {
                        sub(/^[^)]*\) /, "", line); gsub(/,/, "", line)
                        m = split(line, W, " ")
                        for (i = 1; i < m; i += 2) if (W[i] == lc) jslots = W[i + 1] + 0
                    }
                    continue
                }
                if (line ~ /^#/ || line !~ /^ *[0-9]/) continue
                nf = split(line, F, " ")
                a = F[14]
                if (nf != 14 || !(a in known)) continue
                sz = F[1]; sizes[sz] = 1; n[a, sz]++; T[a, sz, n[a, sz]] = F[6]
                if (F[9] != 0 || F[13] != 0) wrong[a] = 1
                if (a != "auto") continue
                # What auto ran in this job: its own table, or without one
                # (a replay, a log level below info) the table of loom-info.
                g = nj ? pick(sz, J, nj, jslots) : pick(sz, P, np, slots)
                if (!((sz, g) in got1)) { got1[sz, g] = 1; ng[sz]++; G[sz, ng[sz]] = g }
            }
        }
        printf "%12s", "size"
        for (i = 1; i <= na; i++) printf " %12s", substr(A[i], 1, 12)
        printf " %14s %14s %7s\n", "auto ran", "best forced", "auto/b"
        m = 0; for (s in sizes) S[++m] = s + 0
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (S[j] < S[i]) { t = S[i]; S[i] = S[j]; S[j] = t }
        bad = 0
        for (r = 1; r <= m; r++) {
            sz = S[r]; printf "%12d", sz; best = -1
            for (i = 1; i <= na; i++) {
                c = n[A[i], sz]; if (!c) { printf " %12s", "-"; continue }
                delete v; for (k = 1; k <= c; k++) v[k] = T[A[i], sz, k]
                med[A[i]] = median(v, c); printf " %12.1f", med[A[i]]
                if (A[i] != "auto" && (best < 0 || med[A[i]] < best)) { best = med[A[i]]; ba = A[i] }
            }
            ratio = best > 0 && ("auto" in med) ? med["auto"] / best : 0
            # Every choice auto made at this size, one per job where the
            # jobs differ ("hierar/pairwi").  Past 10%, choices whose own
            # forced times are all within it are met: the time of auto is
            # a second sample of those schedules.
            same = 1; near = 1; got = ""
            for (i = 1; i <= ng[sz]; i++) {
                g = G[sz, i]
                if (g != ba) same = 0
                if (!(g in med) || g == "auto" || med[g] / best > 1.10) near = 0
                got = got (i > 1 ? "/" : "") (ng[sz] > 1 ? substr(g, 1, 6) : g)
            }
            if (!ng[sz]) { same = 0; near = 0 }
            if (same) mark = " ="
            else if (ratio <= 1.10) mark = ""
            else mark = near ? " ~" : " !"
            if (mark == " !") bad = 1
            printf " %14s %14s %7.2f%s\n", substr(got, 1, 14), ba, ratio, mark
            delete med
        }
        for (a in wrong) { print "# " a ": #wrong was not 0"; bad = 1 }
        exit bad
    }' || status=1
    # The near-ties of each job's table, as its rank 0 logged them.
    for ((k = 0; k < reps; k++)); do
        awk -v lc="$lc" '/rank 0\] INFO [0-9 :.-]+ selection: tie / {
            l = $0; sub(/.* selection: tie /, "", l)
            if (index(l, lc " ") == 1) print substr(l, length(lc) + 2) }' "$tmp/$coll.$k" | sort -u
    done | sort | uniq -c | awk 'NR == 1 { print "# near-ties marked (jobs: span: tie):" }
                                 { n = $1; sub(/^ *[0-9]+ /, ""); printf "#   %d: %s\n", n, $0 }'
    echo
done
exit $status
