"""The membership calls of the loom package with a real failure and a real
newcomer (tests/python/test_python.sh): 3 ranks under loomrun
--keep-going; rank 2 SIGKILLs itself; the survivors see the failure as
loom.RemoteError or loom.RevokedError, find it with get_failed(), agree
on the broken communicator, shrink() to 2 ranks, admit a process that
waits in Communicator.join() (started by the test with the job's
LOOM_ROOT and LOOM_JOB_KEY, argument --join) with grow(), and hand it
the state with state_sync().  Every process prints "ok"/"FAIL" lines.
"""
import os
import signal
import sys
import time

import numpy as np

import loom

fails = 0


def check(ok, what):
    global fails
    tag = "joiner" if joiner else "rank %d" % me
    # One write per line: the ranks share loomrun's stdout.
    os.write(1, ("%s - [%s] %s\n" % ("ok  " if ok else "FAIL", tag, what)).encode())
    if not ok:
        fails += 1


def state_and_check(c, revision):
    """state_sync of two tensors, then an allreduce on c."""
    st = [np.zeros(6, np.float32), np.zeros(2, np.int64)]
    if revision:
        st[0][:] = np.arange(6) * 0.5
        st[1][:] = [41, 42]
    rev = c.state_sync(st, revision)
    check(rev == 9 and np.array_equal(st[0], np.arange(6, dtype=np.float32) * 0.5)
          and list(st[1]) == [41, 42], "state_sync: revision %d and the members' state" % rev)
    v = np.array([c.rank], np.int64)
    c.allreduce(v)
    check(v[0] == 3, "allreduce on the grown communicator: %d" % v[0])


joiner = "--join" in sys.argv
me = -1
if joiner:
    t0 = time.time()
    c = loom.Communicator.join(timeout=60)
    check(c.rank == 2 and c.size == 3,
          "join() admitted as rank %d of %d after %.1f s" % (c.rank, c.size, time.time() - t0))
    state_and_check(c, 0)
    c.close()
    sys.exit(1 if fails else 0)

comm = loom.Communicator.from_env()
me = comm.rank
x = np.ones(8, np.float32)
comm.allreduce(x)
check(comm.size == 3 and np.all(x == 3), "3 ranks before the failure")
comm.barrier()
if me == 2:
    os.kill(os.getpid(), signal.SIGKILL)

t0 = time.time()
err = req = None
while time.time() - t0 < 30:
    try:
        req = comm.iallreduce(np.ones(1024, np.float32))
        while not req.test():
            pass
    except loom.Error as e:
        err = e
        break
check(isinstance(err, (loom.RemoteError, loom.RevokedError)),
      "the failure raised %s after %.1f s: %s" % (type(err).__name__, time.time() - t0, err))
if req is not None and req.done:
    # test() saw the failure: wait() raises it again.
    try:
        req.wait()
        again = None
    except loom.Error as e:
        again = e
    check(again is err, "wait() after a failed test() raises the same error")
else:
    check(True, "the failure came from iallreduce itself")
res, who = comm.get_error()
check(res in (loom.ERR_REMOTE, loom.ERR_REVOKED), "get_error(): %d, rank %d" % (res, who))
flag = comm.agree(1, loom.MIN)
check(flag == 1, "agree() on the broken communicator: %d" % flag)
new = comm.shrink()
check(comm.get_failed() == [2], "get_failed(): %s" % comm.get_failed())
check(new.size == 2 and new.rank == me, "shrink(): rank %d of %d" % (new.rank, new.size))
comm.close()
v = np.array([1.0])
new.allreduce(v)
check(v[0] == 2.0, "allreduce on the survivors")

# Wait for the newcomer: every member must see it before all call grow().
t0 = time.time()
while True:
    n = np.array([new.pending_joins()], np.int32)
    new.allreduce(n, "min")
    if n[0] >= 1 or time.time() - t0 > 40:
        break
    time.sleep(0.1)
check(n[0] == 1, "pending_joins(): %d" % n[0])
grown = new.grow()
check(grown is not None and grown.size == 3 and grown.rank == me,
      "grow(): %r" % (grown,))
new.close()
state_and_check(grown, 9)
grown.close()
sys.exit(1 if fails else 0)
