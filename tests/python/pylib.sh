# tests/python/pylib.sh - shared by the Python tests (after tests/lib.sh):
# the interpreter, the package of the source tree and the libloom of the
# build tree, or exit 77 (skipped) saying why they cannot be had.
#   need_python MODULE...: skip unless the interpreter imports them all
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3 || true)
[ -n "$PY" ] || { echo "no Python interpreter (set PYTHON): skipping"; exit 77; }
if [ "${LOOM_TEST_SANITIZERS:-no}" = yes ] || [ "${LOOM_TEST_TSAN:-no}" = yes ]; then
    # ctypes would load an ASan- or TSan-built libloom into an interpreter
    # that was not started with the sanitizer runtime first, which both
    # refuse.
    echo "a sanitizer build: Python cannot load this libloom (ASan must be the first"
    echo "library of the process); the Python tests run in the plain build: skipping"
    exit 77
fi
LOOM_LIBRARY=$BUILDDIR/.libs/libloom.so.0
[ -f "$LOOM_LIBRARY" ] || { echo "no shared libloom in $BUILDDIR/.libs (--disable-shared?): skipping"; exit 77; }
export LOOM_LIBRARY
export PYTHONPATH=$SRCDIR/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONDONTWRITEBYTECODE=1
need_python() {
    local m
    for m in "$@"; do
        "$PY" -c "import $m" 2>/dev/null || {
            echo "$PY cannot import $m (Debian: python3-$m): skipping"; exit 77; }
    done
}
# free_port: a TCP port that nobody uses now, nor the one after it (under
# torchrun the store takes the port and Loom's rendezvous the next), from
# below the ephemeral range: a port the kernel hands out for port-0 binds
# and outgoing connections (a unique id's root, the store's clients) could
# otherwise be the next one, and a job's root find it taken.
free_port() {
    "$PY" -c '
import random, socket
lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(500):
    p = random.randrange(10000, max(10002, lo - 2))
    try:
        held = []
        for q in (p, p + 1):
            s = socket.socket()
            s.bind(("127.0.0.1", q))
            held.append(s)
    except OSError:
        continue
    print(p)
    break'
}
quick() { [ "${LOOM_TEST_QUICK:-0}" = 1 ]; }
