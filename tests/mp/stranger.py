#!/usr/bin/env python3
"""A process without the job's secret that attacks every port a job listens on.

usage: stranger.py PIDFILE SECONDS SUMMARY [REPLAY]

PIDFILE lists the job's process ids (one per line; reread as it grows).
For SECONDS, every 20 ms, the listening TCP ports of those processes are
found with ss(8); each new port is attacked, and again every 2 s while it
listens:
  garbage    4 KiB of random bytes
  huge       openings and frames that claim huge lengths, kinds and ranks
  truncated  the first 20 bytes of a handshake's opening, then silence
  replay     the bytes REPLAY holds (a member's handshake, recorded
             from the wire) sent again
  idle       4 connections that send nothing, held to the end
  flood      50 connections opened and closed at once
Each attempt's outcome is recorded: how long the job took to close the
connection (or that it did not, by the end), and how many bytes it sent
back.  SUMMARY gets one JSON object: per port, attempts by kind and
outcome.
"""
import json
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time

pidfile, seconds, summary = sys.argv[1], float(sys.argv[2]), sys.argv[3]
replay = open(sys.argv[4], "rb").read() if len(sys.argv) > 4 and os.path.exists(sys.argv[4]) else b""
end = time.time() + seconds
lock = threading.Lock()
ports = {}  # port -> {"kinds": {kind: [outcomes]}, "first_seen": t}
held = []   # idle sockets, closed at the end


def record(port, kind, outcome):
    with lock:
        ports[port]["kinds"].setdefault(kind, []).append(outcome)


def connect(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(("127.0.0.1", port))
    return s


def until_closed(s, limit):
    """Seconds until the peer closed s (None if it did not within limit), bytes it sent."""
    t0 = time.time()
    got = 0
    s.settimeout(0.2)
    while time.time() - t0 < limit:
        try:
            k = s.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return time.time() - t0, got
        if not k:
            return time.time() - t0, got
        got += len(k)
    return None, got


def attempt(port, kind, payload, limit=12):
    try:
        s = connect(port)
    except OSError as e:
        record(port, kind, {"error": "connect: %s" % e.strerror})
        return
    try:
        if payload:
            s.sendall(payload)
        closed, got = until_closed(s, limit)
        record(port, kind, {"closed_s": None if closed is None else round(closed, 3), "bytes_back": got})
    except OSError as e:
        record(port, kind, {"closed_s": 0.0, "bytes_back": 0, "note": str(e)})
    finally:
        s.close()


def opening(kind, src, dst, stream):
    return struct.pack("<IIIiiI", 0x4c4d414f, 1, kind, src, dst, stream) + os.urandom(32)


def huge_payloads():
    return [
        # an opening claiming kinds and ranks far out of range
        struct.pack("<IIIiiI", 0x4c4d414f, 1, 0xffffffff, -1, 0x7fffffff, 0xffffffff) + b"\xff" * 32,
        # a control-plane frame header with a 4 GiB payload
        struct.pack("<IHHIIQI", 0x4c4d434d, 7, 0, 0, 0, 0xffffffffffffffff, 0xffffffff) + b"\xff" * 64,
        # a rendezvous hello (version 6) claiming a huge address
        struct.pack("<IIiiIi", 0x4c4d4254, 6, 1 << 30, 1 << 29, 0, 1) + b"h" * 64 +
        struct.pack("<I", 0xffffffff) + b"\xff" * 700,
        # a tcp stream header: 16 EiB message, 4 GiB piece
        struct.pack("<IHHQQQIi", 0x4c4d5450, 1, 0, 1, 0xffffffffffffffff, 0, 0xffffffff, 0),
    ]


def attack(port):
    while time.time() < end:
        t_round = time.time()
        threads = [threading.Thread(target=attempt, args=(port, "garbage", os.urandom(4096)))]
        for p in huge_payloads():
            threads.append(threading.Thread(target=attempt, args=(port, "huge", p)))
        threads.append(threading.Thread(target=attempt,
                                        args=(port, "truncated", opening(2, 1, 0, 0)[:20])))
        if replay:
            threads.append(threading.Thread(target=attempt, args=(port, "replay", replay)))
        for t in threads:
            t.start()
        # idle: held open, judged at the end
        for _ in range(4):
            try:
                s = connect(port)
                with lock:
                    held.append((port, s, time.time()))
            except OSError as e:
                record(port, "idle", {"error": "connect: %s" % e.strerror})
        # flood
        for _ in range(50):
            try:
                s = connect(port)
                s.close()
                record(port, "flood", {"closed_s": 0.0, "bytes_back": 0})
            except OSError as e:
                record(port, "flood", {"error": "connect: %s" % e.strerror})
        for t in threads:
            t.join()
        time.sleep(max(0.0, 2.0 - (time.time() - t_round)))
        if not listening_now(port):
            return


def job_pids():
    """The pids in PIDFILE and their descendants (a launcher's children)."""
    try:
        todo = [int(x) for x in open(pidfile).read().split()]
    except (OSError, ValueError):
        return set()
    seen = set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            for t in os.listdir("/proc/%d/task" % p):
                todo += [int(c) for c in open("/proc/%d/task/%s/children" % (p, t)).read().split()]
        except OSError:
            pass
    return seen


def listening():
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    pids = job_pids()
    found = set()
    for line in out.splitlines():
        f = line.split()
        if len(f) < 6 or "pid=" not in line:
            continue
        owners = {int(x.split(",")[0]) for x in line.split("pid=")[1:]}
        if owners & pids:
            found.add(int(f[3].rsplit(":", 1)[1]))
    return found


def listening_now(port):
    return port in listening()


workers = []
while time.time() < end:
    for p in listening():
        if p not in ports:
            ports[p] = {"kinds": {}, "first_seen": round(time.time() - (end - seconds), 3)}
            t = threading.Thread(target=attack, args=(p,), daemon=True)
            t.start()
            workers.append(t)
    time.sleep(0.02)
for t in workers:
    t.join(timeout=15)
# The idle connections: which the job closed, and when.
for port, s, t0 in held:
    s.setblocking(False)
    try:
        k = s.recv(1)
        closed = k == b""
    except BlockingIOError:
        closed = False
    except OSError:
        closed = True
    record(port, "idle", {"closed_by_job": closed, "held_s": round(time.time() - t0, 1)})
    s.close()
out = {"ports": {}}
for port, d in sorted(ports.items()):
    kinds = {}
    for kind, res in d["kinds"].items():
        kinds[kind] = {
            "attempts": len(res),
            "connect_errors": sum(1 for r in res if "error" in r),
            "closed_by_job": sum(1 for r in res if r.get("closed_s") is not None or r.get("closed_by_job")),
            "left_open": sum(1 for r in res if ("closed_s" in r and r["closed_s"] is None)),
            "max_close_s": max([r["closed_s"] for r in res if r.get("closed_s") is not None] or [0]),
            "bytes_back": sum(r.get("bytes_back", 0) for r in res),
            # idle connections held 7 s or more that the job never closed
            "idle_open_long": sum(1 for r in res if r.get("closed_by_job") is False and
                                  r.get("held_s", 0) >= 7),
        }
    out["ports"][str(port)] = {"first_seen_s": d["first_seen"], "kinds": kinds}
out["attempts"] = sum(k["attempts"] for p in out["ports"].values() for k in p["kinds"].values())
json.dump(out, open(summary, "w"), indent=1)
print("stranger: %d ports, %d attempts" % (len(out["ports"]), out["attempts"]))
