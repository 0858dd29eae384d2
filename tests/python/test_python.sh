#!/bin/bash
# The loom Python package (python/loom) over the libloom of this build:
# every call against NumPy references on 1 to 4 ranks (tests/python/
# calls.py; on torch tensors too, bfloat16 included, where torch is
# installed), and the membership calls with a rank SIGKILLed and a
# newcomer admitted (tests/python/elastic.py).  Skipped where numpy is
# missing, and in a sanitizer build.
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/pylib.sh"
need_python numpy
here=$SRCDIR/tests/python
torch=
"$PY" -c 'import torch' 2>/dev/null && torch=--torch || echo "# torch not importable: numpy only"

out=$(nice "$PY" -c 'import loom; print(loom.library_path, loom.__version__)' 2>&1)
check "import loom loads the build tree's libloom ($out)" [ "$out" = "$LOOM_LIBRARY 0.1.0" ]
out=$(LOOM_LIBRARY=/nonexistent/libloom.so.0 "$PY" -c 'import loom' 2>&1)
check "a libloom that cannot be loaded: ImportError naming it" \
    grep -q 'ImportError: loom: cannot load libloom from LOOM_LIBRARY (/nonexistent/libloom.so.0)' <<<"$out"

# make install puts the package where the configured Python finds it and
# records the libdir: the installed package loads the installed libloom
# (here into a prefix of the test's own, given to make; libloom alone:
# libtool will not relink libloom-nccl, which links libloom, for a libdir
# other than the configured one).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL ${MAKE:-make} -s -C "$BUILDDIR" prefix="$tmp/pfx" \
    lib_LTLIBRARIES=libloom.la \
    install-libLTLIBRARIES install-dist_loompkgDATA install-loompy-libdir 2>&1)
rc=$?
pkg=$(find "$tmp/pfx" -name _install.py -path '*/loom/*' | head -1)
check "make install prefix=...: the package and its _install.py (exit $rc, ${pkg#"$tmp"/})" \
    test "$rc" = 0 -a -n "$pkg"
[ "$rc" = 0 ] || tail -5 <<<"$out"
if [ -n "$pkg" ]; then
    pp=$(dirname "$(dirname "$pkg")")
    out=$(cd / && env -u LOOM_LIBRARY PYTHONPATH="$pp" "$PY" -c '
import loom
print(loom.library_path)
print(sorted({l.split()[-1] for l in open("/proc/self/maps") if "libloom" in l}))' 2>&1)
    check "the installed package loads the installed libloom ($(tr '\n' ' ' <<<"$out"))" \
        [ "$out" = "$(printf '%s\n%s' "$tmp/pfx/lib/libloom.so.0" "['$tmp/pfx/lib/libloom.so.0.0.0']")" ]
fi

ranks="1 2 3 4"
quick && ranks="1 3"
for n in $ranks; do
    # torch on one rank count only: importing it takes a second per rank.
    t=
    if [ "$n" = 2 ] || { [ "$n" = 3 ] && quick; }; then t=$torch; fi
    out=$(timeout 200 nice "$LOOMRUN" -n "$n" --timeout 180 "$PY" "$here/calls.py" $t 2>&1)
    rc=$?
    sum=$(tail -1 <<<"$out" | grep -E '^[0-9]+ passed, 0 failed$')
    if [ "$rc" = 0 ] && [ -n "$sum" ]; then
        ok "every call on $n rank(s)${t:+ (and torch tensors)}: $sum"
    else
        bad "every call on $n rank(s)${t:+ (and torch tensors)} (exit $rc)"
        grep -v '^ok ' <<<"$out" | tail -20
    fi
done

# Communicator.from_env() under the other launchers' variables: Slurm's
# (two processes started here as srun would) and a real mpirun.
# One write per line (print() makes two under PYTHONUNBUFFERED=1, and the
# processes share the pipe).
prog='import loom, numpy as np, os
c = loom.Communicator.from_env()
x = np.ones(1)
c.allreduce(x)
os.write(1, ("rank %d of %d: %g\n" % (c.rank, c.size, x[0])).encode())'
clean() { env -u LOOM_ROOT -u LOOM_RANK -u LOOM_SIZE -u LOOM_JOB_KEY -u RANK -u WORLD_SIZE \
    -u MASTER_ADDR -u MASTER_PORT "$@"; }
job=$$.$RANDOM
out=$(for r in 0 1; do
    clean SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_STEP_NODELIST=127.0.0.1 SLURM_JOB_ID=$job \
        timeout 60 "$PY" -c "$prog" &
done; wait)
check "from_env() under Slurm's variables ($(sort <<<"$out" | tr '\n' ' '))" \
    [ "$(sort <<<"$out" | tr '\n' ' ')" = "rank 0 of 2: 2 rank 1 of 2: 2 " ]
if command -v mpirun >/dev/null 2>&1; then
    out=$(clean OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 120 \
        mpirun --oversubscribe -np 3 "$PY" -c "$prog" 2>&1)
    check "from_env() under mpirun ($(grep '^rank' <<<"$out" | sort | tr '\n' ' '))" \
        [ "$(grep '^rank' <<<"$out" | sort | tr '\n' ' ')" = "rank 0 of 3: 3 rank 1 of 3: 3 rank 2 of 3: 3 " ]
fi

# A failure and a newcomer.
port=$(free_port)
key=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
( sleep 1; env LOOM_ROOT="127.0.0.1:$port" LOOM_JOB_KEY="$key" \
    timeout 80 nice "$PY" "$here/elastic.py" --join >"$tmp/joiner" 2>&1 ) &
jp=$!
out=$(timeout 90 nice "$LOOMRUN" -n 3 --keep-going --timeout 85 --root "127.0.0.1:$port" \
    -x LOOM_JOB_KEY="$key" "$PY" "$here/elastic.py" 2>&1)
rc=$?
wait $jp
jrc=$?
all=$(printf '%s\n' "$out" "$(cat "$tmp/joiner")")
nok=$(grep -c '^ok ' <<<"$all")
check "elastic: loomrun reports rank 2 killed (exit $rc)" [ "$rc" = 137 ]
check "elastic: the newcomer exits 0 (exit $jrc)" [ "$jrc" = 0 ]
# 3 before the failure + 11 on each survivor + 3 on the newcomer.
if [ "$nok" -eq 28 ] && ! grep -q '^FAIL' <<<"$all"; then
    ok "elastic: failure seen, shrink, join, grow, state_sync ($nok checks)"
else
    bad "elastic: $nok checks passed of 28"
    grep -v '^ok ' <<<"$all" | tail -20
fi
finish
