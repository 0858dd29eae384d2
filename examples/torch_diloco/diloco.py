#!/usr/bin/python3
"""DiLoCo in PyTorch over Loom, against DDP (torch's gloo, or the "loom"
backend) on the same data and compute budget.  See loom-python(7) and
examples/torch_diloco/README.

Each worker (a rank of loomrun, torchrun or run.sh's namespaces) trains a
small transformer language model, bytes in, on its own shard of a corpus
the project ships: its man pages.

  --mode diloco   every --inner H steps of AdamW, the pseudo-gradient
                  delta = global params - local params is summed over the
                  workers with a Loom allreduce (--codec int8, int4, ...:
                  compressed) and an outer Nesterov SGD step is taken:
                      mom = mu * mom + avg(delta)
                      global -= outer_lr * (avg(delta) + mu * mom)
                  With --overlap (the default) the allreduce of round t
                  runs in the background (iallreduce; the progress thread
                  and test() between steps move it) during round t+1, and
                  is applied at its end (one-step-delayed outer update):
                  local = global(new) - delta(t+1), then delta(t+1) is
                  sent.  No round's progress counts twice.  A worker
                  that starts a sum waits there, without progress, for
                  the slowest worker to start it too: up to a round
                  and rank 0's evaluation.  Loom fails an operation
                  that makes no progress for the communicator's timeout
                  (LOOM_TIMEOUT, 60 s by default), so the workers set
                  it from --timeout (default 600 s) unless LOOM_TIMEOUT
                  is set.  --straggle RANK:SECONDS slows one worker.
  --mode ddp      torch DistributedDataParallel, AdamW every step, over
                  --backend gloo (torch's) or loom (import loom.torch).

  --elastic       (diloco) a worker that dies is dropped: after each
                  sum the workers agree (loom_comm_agree) whether it
                  succeeded everywhere, and if not they shrink and sum
                  again among the survivors (who need a quorum:
                  LOOM_QUORUM in loom(7)); processes
                  started with --join (LOOM_ROOT and LOOM_JOB_KEY of the
                  job) are admitted between rounds (grow), and receive the
                  global parameters, the outer momentum and the round
                  (state_sync).  --crash-at ROUND:RANK makes that rank
                  SIGKILL itself at the end of round ROUND; --grow-at
                  ROUND:WORKERS makes the workers wait there until they
                  are WORKERS.

Rank 0 writes the CSV (--csv): step,wall_s,train_loss,eval_loss,
bytes_sent,mode,codec; bytes_sent is what this worker sent: the tx bytes
of --iface (measured in its network namespace), else what a ring
allreduce of the encoded data sends (2 (n-1)/n of it).  wall_s leaves out
rank 0's evaluations.  The last line is a summary:
  diloco: mode=... codec=... workers=... steps=... final_eval_loss=...
          bytes_sent=... wall_s=... comm_wait_s=...
"""
import argparse
import glob
import hashlib
import math
import os
import re
import signal
import sys
import time

os.environ.setdefault("LOOM_PROGRESS_THREAD", "1")
here = os.path.dirname(os.path.abspath(__file__))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import loom  # noqa: E402

FAILURES = (loom.RemoteError, loom.RevokedError, loom.TimeoutError)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a = p.add_argument
    a("--mode", choices=["diloco", "ddp"], default="diloco")
    a("--backend", choices=["gloo", "loom"], default="gloo", help="ddp: the torch backend")
    a("--codec", default="none", help="diloco: Loom codec of the pseudo-gradient (none, "
      "int8, int4, ...)")
    a("--overlap", dest="overlap", action="store_true", default=True)
    a("--no-overlap", dest="overlap", action="store_false")
    a("--steps", type=int, default=600, help="inner steps per worker (the compute budget)")
    a("--inner", type=int, default=30, help="H: inner steps per round (ddp: between evals)")
    a("--batch", type=int, default=16)
    a("--ctx", type=int, default=64)
    a("--dim", type=int, default=96)
    a("--layers", type=int, default=2)
    a("--heads", type=int, default=4)
    a("--lr", type=float, default=3e-3)
    a("--wd", type=float, default=0.01)
    a("--outer-lr", type=float, default=0.7)
    a("--outer-mom", type=float, default=0.5)
    a("--seed", type=int, default=1)
    a("--eval-batches", type=int, default=8)
    a("--corpus", default=os.path.join(here, "..", "..", "man"),
      help="directory of man pages (default: the source tree's man/)")
    a("--csv")
    a("--iface", help="count the tx bytes of this network interface")
    a("--threads", type=int, default=1, help="torch threads per worker")
    a("--elastic", action="store_true")
    a("--join", action="store_true")
    a("--crash-at")
    a("--grow-at")
    a("--quiet", action="store_true")
    a("--timeout", type=float, default=600,
      help="seconds an operation may wait without progress (the communicator's timeout; "
      "LOOM_TIMEOUT, where set, wins): with --overlap a worker waits in the background sum "
      "for the slowest worker to start it, up to a round and an evaluation")
    a("--straggle", metavar="RANK:SECONDS",
      help="rank RANK sleeps SECONDS after each inner step: a slower worker")
    o = p.parse_args()
    if o.mode == "ddp" and (o.elastic or o.join):
        p.error("--elastic and --join are for --mode diloco")
    if (o.join or o.crash_at or o.grow_at) and not o.elastic:
        p.error("--join, --crash-at and --grow-at need --elastic")
    if o.timeout <= 0:
        p.error("--timeout: a positive number of seconds")
    o.straggle_rank, o.straggle_s = -1, 0.0
    if o.straggle:
        try:
            sr, ss = o.straggle.split(":")
            o.straggle_rank, o.straggle_s = int(sr), float(ss)
        except ValueError:
            p.error("--straggle %r: RANK:SECONDS" % o.straggle)
    return o


def settings(o):
    """The communicator's settings: --timeout unless LOOM_TIMEOUT is set."""
    return {} if os.environ.get("LOOM_TIMEOUT") else {"timeout": o.timeout}


# -------------------------------------------------------------- the data
def corpus(d):
    """The man pages as text: comments dropped, request names taken off."""
    files = sorted(glob.glob(os.path.join(d, "man*", "*.[137]")))
    if not files:
        sys.exit("diloco.py: no man pages under %s (--corpus)" % d)
    out = []
    for f in files:
        for line in open(f, encoding="utf-8", errors="replace"):
            if line.startswith('.\\"'):
                continue
            if line.startswith("."):
                line = re.sub(r"^\.[A-Za-z]+\s?", "", line)
                line = re.sub(r"\b(Fl|Ar|Op|Ev|Xr|Nm|Fn|Fa|Dv|Er|Pq|Ql|Cm|Sx|Ns|Va|Vt|Ft|Li)\s",
                              "", line)
            line = line.replace("\\(em", "--").replace("\\-", "-").replace("\\&", "")
            if line.strip():
                out.append(line)
    data = torch.tensor(list("".join(out).encode("utf-8", "replace")), dtype=torch.uint8)
    n_eval = len(data) // 20
    return data[:-n_eval], data[-n_eval:]


class Shard:
    """A worker's part of the training text, read in random windows."""

    def __init__(self, text, worker, nworkers, ctx, batch, seed):
        n = len(text) // nworkers
        self.text = text[worker * n:(worker + 1) * n].long()
        self.ctx, self.batch = ctx, batch
        self.g = torch.Generator().manual_seed(seed * 1000 + worker)

    def next(self):
        i = torch.randint(0, len(self.text) - self.ctx - 1, (self.batch,), generator=self.g)
        x = torch.stack([self.text[j:j + self.ctx] for j in i.tolist()])
        y = torch.stack([self.text[j + 1:j + 1 + self.ctx] for j in i.tolist()])
        return x, y


def eval_batches(text, ctx, batch, n):
    t = text.long()
    step = max((len(t) - ctx - 1) // (n * batch), 1)
    starts = [k * step for k in range(n * batch)]
    xs = torch.stack([t[s:s + ctx] for s in starts]).view(n, batch, ctx)
    ys = torch.stack([t[s + 1:s + 1 + ctx] for s in starts]).view(n, batch, ctx)
    return list(zip(xs, ys))


# ------------------------------------------------------------- the model
class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        self.heads = heads

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class LM(nn.Module):
    """A small GPT: 256 byte tokens, learned positions, tied output."""

    def __init__(self, dim, layers, heads, ctx):
        super().__init__()
        self.tok = nn.Embedding(256, dim)
        self.pos = nn.Parameter(torch.zeros(ctx, dim))
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        # Not a buffer: DDP would broadcast it, and gloo has no bool.
        self.mask = torch.triu(torch.ones(ctx, ctx, dtype=torch.bool), 1)
        nn.init.normal_(self.tok.weight, std=0.02)
        nn.init.normal_(self.pos, std=0.02)

    def forward(self, x):
        h = self.tok(x) + self.pos[:x.shape[1]]
        for b in self.blocks:
            h = b(h, self.mask)
        return self.ln(h) @ self.tok.weight.t()


def loss_of(model, x, y):
    return F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))


def evaluate(model, batches):
    with torch.no_grad():
        return sum(loss_of(model, x, y).item() for x, y in batches) / len(batches)


# ------------------------------------------------------------- counting
def tx_bytes(iface):
    if not iface:
        return None
    for line in open("/proc/self/net/dev"):
        name, _, rest = line.partition(":")
        if name.strip() == iface:
            return int(rest.split()[8])
    return None


class Log:
    """Rank 0's CSV rows and the clock without evaluations."""

    def __init__(self, o, rank, codec):
        self.o, self.rank, self.codec = o, rank, codec
        self.t0 = time.time()
        self.paused = 0.0
        self.sent_model = 0
        self.tx0 = tx_bytes(o.iface)
        self.comm_wait = 0.0
        self.f = None
        if rank == 0 and o.csv:
            self.f = open(o.csv, "w")
            self.f.write("step,wall_s,train_loss,eval_loss,bytes_sent,mode,codec\n")

    def wall(self):
        return time.time() - self.t0 - self.paused

    def sent(self):
        tx = tx_bytes(self.o.iface)
        return tx - self.tx0 if tx is not None and self.tx0 is not None else self.sent_model

    def row(self, step, train_loss, model, batches):
        if self.rank != 0:
            return None
        t = time.time()
        ev = evaluate(model, batches)
        self.paused += time.time() - t
        if self.f:
            self.f.write("%d,%.3f,%.4f,%.4f,%d,%s,%s\n" % (
                step, self.wall(), train_loss, ev, self.sent(), self.o.mode,
                self.codec if self.o.mode == "diloco" else self.o.backend))
            self.f.flush()
        if not self.o.quiet:
            print("step %d wall %.1fs train %.3f eval %.3f sent %d" % (
                step, self.wall(), train_loss, ev, self.sent()), flush=True)
        return ev


def cosine_lr(o, step):
    """Warm up over 2% of the steps, then cosine down to a tenth."""
    w = max(o.steps // 50, 1)
    if step < w:
        return o.lr * (step + 1) / w
    p = (step - w) / max(o.steps - w, 1)
    return o.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def flat(params):
    return torch.cat([p.detach().reshape(-1) for p in params])


def unflat(vec, params):
    o = 0
    for p in params:
        n = p.numel()
        p.data.copy_(vec[o:o + n].view_as(p))
        o += n


def phash(vec):
    return hashlib.sha256(vec.numpy().tobytes()).hexdigest()[:16]


# ---------------------------------------------------------------- DDP
def run_ddp(o, train_text, batches):
    import torch.distributed as dist
    if o.backend == "loom":
        import loom.torch  # noqa: F401
    dist.init_process_group(o.backend)
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(o.seed)
    model = LM(o.dim, o.layers, o.heads, o.ctx)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=o.lr, weight_decay=o.wd)
    data = Shard(train_text, rank, n, o.ctx, o.batch, o.seed)
    nparam = flat(model.parameters()).numel()
    log = Log(o, rank, "none")
    ev = log.row(0, float("nan"), model, batches)
    dist.barrier()
    log.t0 = time.time()
    for s in range(o.steps):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(o, s)
        x, y = data.next()
        opt.zero_grad()
        loss = loss_of(ddp, x, y)
        loss.backward()
        opt.step()
        log.sent_model += 2 * (n - 1) * nparam * 4 // n
        if (s + 1) % o.inner == 0 or s + 1 == o.steps:
            ev = log.row(s + 1, loss.item(), model, batches)
    final = flat(model.parameters())
    summary(o, rank, n, "none", ev, log, final)
    dist.destroy_process_group()


# ------------------------------------------------------------- DiLoCo
class Worker:
    def __init__(self, o, train_text, batches):
        self.o, self.batches, self.train_text = o, batches, train_text
        self.codec = None if o.codec == "none" else loom.Codec(o.codec)
        self.shrinks = self.grows = 0
        self.joined_step = -1
        if o.join:
            t0 = time.time()
            self.comm = loom.Communicator.join(**settings(o))
            print("elastic: joined as rank %d of %d after %.1f s" % (
                self.comm.rank, self.comm.size, time.time() - t0), flush=True)
        else:
            self.comm = loom.Communicator.from_env(**settings(o))
        torch.manual_seed(o.seed)
        self.model = LM(o.dim, o.layers, o.heads, o.ctx)
        self.params = list(self.model.parameters())
        self.glob = flat(self.params)                  # the global parameters
        self.mom = torch.zeros_like(self.glob)         # the outer momentum
        self.base = self.glob.clone()                  # local params at the round's start
        self.n = self.glob.numel()
        self.opt = torch.optim.AdamW(self.params, lr=o.lr, weight_decay=o.wd)
        # [round, its last step, workers whose deltas the sum in flight holds]
        self.round = torch.zeros(3, dtype=torch.int64)
        self.pending = None  # (request, send, out, contributors) of the round in flight
        self.data = None
        self.log = Log(o, self.comm.rank, o.codec)
        self.enc_bytes = self.codec.max_encoded_bytes(self.n) if self.codec else 4 * self.n
        if o.join:
            self.sync_state(joiner=True)

    def reshard(self):
        c = self.comm
        self.data = Shard(self.train_text, c.rank, c.size, self.o.ctx, self.o.batch,
                          self.o.seed + 7919 * int(self.round[0]))

    # -- failures and newcomers
    def shrink(self, why):
        old = self.comm
        self.comm = old.shrink()
        try:
            old.close()
        except loom.Error:
            old.abort()
        self.shrinks += 1
        print("elastic: rank %d of %d after a failure (%s)" % (
            self.comm.rank, self.comm.size, str(why).splitlines()[0][:120]), flush=True)
        self.log.rank = self.comm.rank
        self.reshard()

    def sync_state(self, joiner=False):
        """Hand the newcomers the global state (members: revision = round + 1)."""
        st = [self.glob, self.mom, self.round]
        rev = self.comm.state_sync(st, 0 if joiner else int(self.round[0]) + 1)
        if joiner:
            unflat(self.glob, self.params)
            self.base = self.glob.clone()
            self.joined_step = int(self.round[1])
        self.reshard()
        return rev

    def admit(self, r):
        """At a round's end: admit waiting processes (all members agree)."""
        if not self.o.elastic:
            return
        want = None
        if self.o.grow_at:
            gr, gw = (int(v) for v in self.o.grow_at.split(":"))
            if r == gr:
                want = gw
        t0 = time.time()
        while True:
            # Fault tolerant: a failure now is found at the next sum.
            waiting = self.comm.agree(self.comm.pending_joins(), loom.MIN)
            if waiting or want is None or self.comm.size >= want or time.time() - t0 > 120:
                break
            time.sleep(0.2)
        if not waiting:
            return
        before = self.comm.size
        new = self.comm.grow()
        if new is None:
            return
        self.comm.close()
        self.comm = new
        self.grows += 1
        self.log.rank = new.rank
        # The newcomers send zeros with this round's sum, which is
        # divided by the members that worked in the round.
        self.round[2] = min(before, new.size)
        self.sync_state()
        print("elastic: rank %d of %d after admitting %d" % (new.rank, new.size, waiting),
              flush=True)

    # -- the rounds
    def start_sum(self, delta, contributors):
        out = torch.empty_like(delta)
        send = delta.clone()
        try:
            req = self.comm.iallreduce(send, "sum", out=out, codec=self.codec)
        except FAILURES:
            if not self.o.elastic:
                raise
            req = None  # finish_sum() sees it and recovers
        self.pending = [req, send, out, contributors]
        self.log.sent_model += 2 * (self.comm.size - 1) * self.enc_bytes // self.comm.size

    def finish_sum(self):
        """Wait for the sum in flight and return the average delta.  With
        --elastic the workers then agree (fault tolerant) whether it
        succeeded everywhere; if not, they shrink and all sum again, among
        the survivors, so that every one applies the same average."""
        req, send, out, k = self.pending
        self.pending = None
        t = time.time()
        while True:
            ok = 1
            try:
                if req is None:
                    ok = 0
                else:
                    req.wait()
            except FAILURES:
                if not self.o.elastic:
                    raise
                ok = 0
            if not self.o.elastic or self.comm.agree(ok, loom.MIN) == 1:
                break
            self.shrink("a sum failed")
            k = self.comm.size
            try:
                req = self.comm.iallreduce(send, "sum", out=out, codec=self.codec)
            except FAILURES:
                req = None
        self.log.comm_wait += time.time() - t
        return out / k

    def outer_step(self, avg):
        mu, lr = self.o.outer_mom, self.o.outer_lr
        self.mom.mul_(mu).add_(avg)
        self.glob.sub_(lr * (avg + mu * self.mom))

    def poke(self):
        """Between inner steps: let Loom move the round in flight on."""
        if self.pending is not None:
            try:
                self.pending[0].test()
            except loom.Error:
                pass  # finish_sum() sees it again and recovers

    def run(self):
        o = self.o
        if self.data is None:
            self.reshard()
        first = int(self.round[0])
        rounds = (o.steps + o.inner - 1) // o.inner
        if not o.join:
            self.log.row(0, float("nan"), self.model, self.batches)
            self.comm.barrier()
        elif o.overlap:
            # The members start the sum of the round that just ended: a
            # newcomer takes part with zeros.
            self.start_sum(torch.zeros_like(self.glob), int(self.round[2]))
        self.log.t0 = time.time()
        ev = float("nan")
        loss = torch.tensor(float("nan"))
        for r in range(first, rounds):
            for s in range(r * o.inner, min((r + 1) * o.inner, o.steps)):
                for g in self.opt.param_groups:
                    g["lr"] = cosine_lr(o, s)
                x, y = self.data.next()
                self.opt.zero_grad()
                loss = loss_of(self.model, x, y)
                loss.backward()
                self.opt.step()
                if self.comm.rank == o.straggle_rank:
                    time.sleep(o.straggle_s)
                self.poke()
            step = min((r + 1) * o.inner, o.steps)
            if o.crash_at:
                cr, ck = (int(v) for v in o.crash_at.split(":"))
                if r + 1 == cr and self.comm.rank == ck and not o.join:
                    print("elastic: rank %d SIGKILLs itself at round %d" % (ck, cr), flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
            # This round's progress: from where it started.
            delta = self.base - flat(self.params)
            if o.overlap:
                if self.pending is not None:
                    self.outer_step(self.finish_sum())
                    unflat(self.glob - delta, self.params)  # keep this round's progress
                self.round[0], self.round[1], self.round[2] = r + 1, step, self.comm.size
                self.admit(r + 1)
                self.start_sum(delta, int(self.round[2]))
                self.base = flat(self.params)
            else:
                self.start_sum(delta, self.comm.size)
                self.outer_step(self.finish_sum())
                unflat(self.glob, self.params)
                self.base = self.glob.clone()
                self.round[0], self.round[1] = r + 1, step
                self.admit(r + 1)
            if not (o.overlap and step == o.steps):  # that one after the last sum
                ev = self.log.row(step, loss.item(), self.eval_model(), self.batches)
        if self.pending is not None:
            # The last round's sum: every worker applies it and ends on the
            # global parameters.
            self.outer_step(self.finish_sum())
            unflat(self.glob, self.params)
            if self.comm.rank == 0:
                ev = evaluate(self.model, self.batches)
                if self.log.f:
                    self.log.f.write("%d,%.3f,%.4f,%.4f,%d,%s,%s\n" % (
                        o.steps, self.log.wall(), loss.item(), ev, self.log.sent(), o.mode,
                        o.codec))
                    self.log.f.flush()
        summary(o, self.comm.rank, self.comm.size, o.codec, ev, self.log, self.glob)
        if o.elastic:
            hashes = self.comm.allgather(torch.tensor(list(bytes.fromhex(phash(self.glob))),
                                                      dtype=torch.uint8))
            agree = all(torch.equal(h, hashes[0]) for h in hashes)
            print("elastic: rank=%d of %d joined=%d joined_step=%d shrinks=%d grows=%d "
                  "params_agree=%d params_hash=%s" % (
                      self.comm.rank, self.comm.size, int(o.join), self.joined_step,
                      self.shrinks, self.grows, int(agree), phash(self.glob)), flush=True)
        self.comm.close()

    def eval_model(self):
        """The global parameters, in a model for rank 0's evaluation."""
        if self.comm.rank != 0:
            return self.model
        if not hasattr(self, "_evm"):
            self._evm = LM(self.o.dim, self.o.layers, self.o.heads, self.o.ctx)
        unflat(self.glob, list(self._evm.parameters()))
        return self._evm


def summary(o, rank, n, codec, ev, log, final):
    if rank != 0:
        return
    print("diloco: mode=%s %s=%s workers=%d steps=%d inner=%d final_eval_loss=%.4f "
          "bytes_sent=%d bytes_how=%s wall_s=%.2f comm_wait_s=%.2f params=%d hash=%s" % (
              o.mode, "codec" if o.mode == "diloco" else "backend",
              codec if o.mode == "diloco" else o.backend, n, o.steps, o.inner, ev, log.sent(),
              "iface" if log.tx0 is not None else "model", log.wall(), log.comm_wait,
              final.numel(), phash(final)), flush=True)


def main():
    o = parse()
    torch.set_num_threads(o.threads)
    train_text, eval_text = corpus(o.corpus)
    batches = eval_batches(eval_text, o.ctx, o.batch, o.eval_batches)
    if o.mode == "ddp":
        run_ddp(o, train_text, batches)
    else:
        Worker(o, train_text, batches).run()


if __name__ == "__main__":
    main()
