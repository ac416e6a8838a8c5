#!/usr/bin/env python3
"""Recovery times of a Weir cluster on this machine (docs/benchmarks.md, issue #13).

J1 (generator -> keyed WASM counter -> blackhole) at parallelism 2, checkpoints every 500 ms,
run by real `weir coordinator` / `weir worker` processes on loopback:

* worker kill: three one-slot workers (one spare); once checkpoint 3 is complete, SIGKILL a
  worker of the running attempt; measures detection (kill -> "is gone" in the coordinator's
  log), redeployment (-> the next "attempt N:" line) and resumption (-> the next checkpoint
  completed by the restored attempt, an upper bound on its first processed record).
* leader kill: two coordinators on etcd (lease TTL as given) running `--jobs N` copies of J1
  (default 1), 2N + 1 workers; once each job's checkpoint 3 is complete, SIGKILL the leader;
  measures election (kill -> "leading cluster" in the standby's log), redeployment of every
  job and resumption of every job as above (the slowest job's time).

  python3 examples/bench/cluster_recovery.py target/release/weir [--runs 3] [--lease-ttl 2]
      [--restart-delay-ms 1000] [--jobs 1]

Needs the wordcount_counter component built (cargo build --profile guest --target
wasm32-unknown-unknown -p wordcount-counter) and, for the leader kill, `etcd` on the PATH.
"""

import argparse
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPONENT = os.path.join(ROOT, "target/wasm32-unknown-unknown/guest/wordcount_counter.wasm")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Proc:
    """A process whose output lines are kept with the monotonic time they arrived."""

    def __init__(self, args, env=None):
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
        self.lines = []
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            with self.cv:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.cv.notify_all()

    def wait_line(self, pattern, after=0.0, timeout=120):
        """The (time, line) of the first line matching `pattern` that arrived after `after`."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cv:
            while True:
                for t, l in self.lines:
                    if t >= after and rx.search(l):
                        return t, l
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no line matching {pattern!r}:\n" + "\n".join(l for _, l in self.lines[-20:]))
                self.cv.wait(left)

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
            self.p.wait()


def checkpoints(d):
    """Ids of complete checkpoints under `d` (manifest present)."""
    out = set()
    for root, dirs, files in os.walk(d):
        name = os.path.basename(root)
        if name.startswith("chk-") and "_metadata" in files:
            out.add(int(name[4:]))
    return out


def wait_checkpoint(d, newer_than, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ids = [i for i in checkpoints(d) if i > newer_than]
        if ids:
            return time.monotonic(), min(ids)
        time.sleep(0.002)
    raise TimeoutError(f"no checkpoint after {newer_than} in {d}")


RESTART_DELAY_MS = 1000


def job_file(d, name="j1-recovery"):
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "job.toml")
    with open(path, "w") as f:
        f.write(f"""[job]
name = "{name}"
max_parallelism = 128

[checkpoint]
interval_ms = 500
dir = "checkpoints"

[restart]
strategy = "fixed-delay"
attempts = 10
delay_ms = {RESTART_DELAY_MS}

[[source]]
id = "gen"
type = "generator"
count = 2000000000
keys = 10000
parallelism = 2

[[operator]]
id = "count"
component = "{COMPONENT}"
parallelism = 2
inputs = [{{ from = "gen", partition = "hash" }}]

[[sink]]
id = "out"
type = "blackhole"
parallelism = 2
inputs = [{{ from = "count" }}]
""")
    return path


def worker(weir, d, name, coordinators, secret):
    return Proc([weir, "worker", "--coordinator", coordinators, "--name", name, "--slots", "1",
                 "--secret-file", secret, "--dir", os.path.join(d, name)])


def member_to_kill(log_line):
    m = re.search(r"on (w\d) \(", log_line)
    return m.group(1)


def worker_kill(weir):
    d = tempfile.mkdtemp(prefix="weir-recovery-")
    procs = {}
    try:
        secret = os.path.join(d, "secret")
        open(secret, "w").write("0123456789abcdef0123456789abcdef")
        addr = f"127.0.0.1:{free_port()}"
        c = Proc([weir, "coordinator", job_file(d), "--listen", addr, "--workers", "3", "--secret-file", secret,
                  "--heartbeat-timeout-ms", "5000"])
        procs["c"] = c
        for w in ("w1", "w2", "w3"):
            procs[w] = worker(weir, d, w, addr, secret)
        _, line = c.wait_line(r"attempt \d+:")
        chk = os.path.join(d, "checkpoints")
        wait_checkpoint(chk, 2)
        victim = member_to_kill(line)
        before = max(checkpoints(chk))
        t0 = time.monotonic()
        procs[victim].kill()
        t_detect, _ = c.wait_line(rf"worker {victim} \(.*is gone", after=t0)
        t_deploy, _ = c.wait_line(r"attempt \d+:", after=t_detect)
        t_resumed, _ = wait_checkpoint(chk, before)
        return t_detect - t0, t_deploy - t0, t_resumed - t0
    finally:
        for p in procs.values():
            p.kill()
        shutil.rmtree(d, ignore_errors=True)


def leader_kill(weir, ttl, jobs=1):
    d = tempfile.mkdtemp(prefix="weir-recovery-")
    procs = {}
    try:
        ep = f"http://127.0.0.1:{free_port()}"
        peer = f"http://127.0.0.1:{free_port()}"
        procs["etcd"] = Proc(["etcd", "--name", "b", "--data-dir", os.path.join(d, "etcd"),
                              "--listen-client-urls", ep, "--advertise-client-urls", ep,
                              "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                              "--initial-cluster", f"b={peer}"])
        procs["etcd"].wait_line(r"ready to serve client requests")
        secret = os.path.join(d, "secret")
        open(secret, "w").write("0123456789abcdef0123456789abcdef")
        a, b = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        names = [f"j1-recovery-{k}" for k in range(jobs)] if jobs > 1 else ["j1-recovery"]
        files = [job_file(os.path.join(d, n), n) for n in names]
        workers = 2 * jobs + 1

        def coordinator(addr):
            return Proc([weir, "coordinator", *files, "--listen", addr, "--workers", str(workers),
                         "--secret-file", secret, "--etcd", ep, "--cluster", "bench", "--lease-ttl-secs", str(ttl)])

        procs["c1"] = coordinator(a)
        procs["c1"].wait_line(r"leading cluster")
        procs["c2"] = coordinator(b)
        procs["c2"].wait_line(r"standby")
        for k in range(workers):
            procs[f"w{k + 1}"] = worker(weir, d, f"w{k + 1}", f"{a},{b}", secret)
        chks = [os.path.join(d, n, "checkpoints") for n in names]
        for chk in chks:
            wait_checkpoint(chk, 2)
        before = [max(checkpoints(chk)) for chk in chks]
        t0 = time.monotonic()
        procs["c1"].kill()
        t_elected, _ = procs["c2"].wait_line(r"leading cluster", after=t0)
        t_deploy = max(procs["c2"].wait_line(rf"job `{n}` attempt \d+:", after=t_elected)[0] for n in names)
        t_resumed = max(wait_checkpoint(chk, b4)[0] for chk, b4 in zip(chks, before))
        return t_elected - t0, t_deploy - t0, t_resumed - t0
    finally:
        for p in procs.values():
            p.kill()
        shutil.rmtree(d, ignore_errors=True)


def summary(name, rows, cols):
    print(f"{name} ({len(rows)} runs), seconds after the kill, median (min-max):")
    for i, col in enumerate(cols):
        v = [r[i] for r in rows]
        print(f"  {col:<28} {statistics.median(v):6.2f} ({min(v):.2f}-{max(v):.2f})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("weir")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--lease-ttl", type=int, default=2)
    ap.add_argument("--restart-delay-ms", type=int, default=1000, help="the job's fixed restart delay")
    ap.add_argument("--jobs", type=int, default=1, help="jobs the coordinators run, for the leader kill")
    args = ap.parse_args()
    global RESTART_DELAY_MS
    RESTART_DELAY_MS = args.restart_delay_ms
    print(f"restart delay {RESTART_DELAY_MS} ms")
    weir = os.path.abspath(args.weir)
    rows = [worker_kill(weir) for _ in range(args.runs)]
    summary("worker SIGKILL", rows, ["detected (connection closed)", "redeployed", "first checkpoint after"])
    if shutil.which("etcd"):
        rows = [leader_kill(weir, args.lease_ttl, args.jobs) for _ in range(args.runs)]
        summary(f"leader SIGKILL (lease TTL {args.lease_ttl} s, {args.jobs} job(s))", rows,
                ["standby elected", "every job redeployed", "every job's checkpoint after"])
    else:
        print("leader SIGKILL: skipped (no etcd on the PATH)")


if __name__ == "__main__":
    main()
