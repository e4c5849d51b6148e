#!/usr/bin/env python3
"""The postspool benchmark suite (bench/run.sh runs it; bench/README.md says
what every figure means).

It starts (or is given) a RabbitMQ broker, starts postspoold processes of its
own in a temporary directory tree, runs bench_tool (bench/e2e/bench_tool.cc)
for each measurement, and reads the daemon's CPU time, peak RSS and threads
from /proc, its syscalls with perf (linux-perf), its counters from its metrics
file. Every figure is printed side by side with its anchor from the same run,
as a ratio, with the median over --reps repetitions. It writes results.json,
results.md and the plots (plot.py) into --out. It reports figures; it never
fails on one.
"""

import argparse
import contextlib
import datetime
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

EXCHANGE = "xs_bench"
QUEUE = "q_bench"
# A broker nobody listens on (the discard port on loopback): the daemon
# journals and acks, its forwarder waits to connect (as ring_bench does).
NO_BROKER_URL = "amqp://guest:guest@127.0.0.1:9/"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")

# Transports of the post-call figures. A transport is a parameter: each is a
# function from a running daemon to the libpostspool options that make the
# client use it (the ring slots in here as one more entry once it exists).
TRANSPORTS = {
    # The per-uid shared-memory ring: a process's first post takes the
    # socket (the ring is asked for on that connection), the others its
    # lane; a full lane falls back to the socket (the figures count which
    # transport took each post).
    "ring": lambda d: {"socket": d.socket_path, "spool": d.spool_dir, "use_ring": 1},
    # The daemon's socket (use_ring = 0; the client falls back to the spool
    # only if the socket fails).
    "socket": lambda d: {"socket": d.socket_path, "spool": d.spool_dir, "use_ring": 0},
    # No socket at that path: every post goes to the spool directory, which
    # the running daemon adopts.
    "spool": lambda d: {"socket": d.root + "/run/no-such.sock", "spool": d.spool_dir, "use_ring": 0},
}


# The goals of the cost figure (fig_cost), shown beside its figures.
COST_GOALS = {
    "socket_same": "p50 ≤ 1.5× the bare round trip",
    "socket_cross": "p50 ≤ 1.5× the bare round trip",
    "daemon_cpu": "≤ 5 µs per socket post",
    "drain": "≥ 0.95× the single publisher; forwarder ≤ 2 µs CPU per message",
    "process": "≤ 1.3× `true`",
    "ring_8": "every run ≥ 1M/s, median ≥ 1.5M/s",
    "ring_1": "p50 ≤ 1 µs",
}


def log(msg):
    print("[suite %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def task_cpu_s(pid, tid):
    """One thread's time on a CPU so far, in seconds, from
    /proc/<pid>/task/<tid>/schedstat (ns: finer than the clock ticks of
    /proc/<pid>/stat). Raises OSError, ValueError or IndexError when it
    cannot be read (the thread ended)."""
    with open("/proc/%s/task/%s/schedstat" % (pid, tid)) as f:
        return int(f.read().split()[0]) / 1e9


def cpu_delta(before, after):
    """{thread: CPU seconds} spent between two Daemon.threads_cpu_s()
    readings: a thread started in between counts whole, one that ended is
    left out (its last reading is gone)."""
    return {k: after.get(k, 0) - before.get(k, 0) for k in after}


def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) else None


def paired_p50_ratio(runs, anchors):
    """The median over repetitions of each run's p50 over its own anchor's,
    measured just before it. On a VM whose speed changes for seconds at a
    time, a pair measured back to back shares the machine's state; the
    medians of each side, taken apart, can come from different states."""
    return median(ratio(r["latency_us"]["p50"], a["latency_us"]["p50"])
                  for r, a in zip(runs, anchors) if "latency_us" in r and "latency_us" in a)


# ---------------------------------------------------------------------------
# The broker, through `bench_tool broker` (reset / depth / stop / start).

class Broker:
    def __init__(self, tool, url):
        args = [tool, "broker"] + (["--url", url] if url else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)
        hello = json.loads(self.proc.stdout.readline() or '{"error": "broker helper died"}')
        if "error" in hello:
            raise RuntimeError("broker: " + hello["error"])
        self.info = hello
        self.url = hello["url"]
        self.own = hello["own"]

    def command(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if not reply.startswith("ok"):
            raise RuntimeError("broker %s: %s" % (line, reply))
        return reply[3:]

    def reset(self):
        self.command("reset %s %s" % (QUEUE, EXCHANGE))

    def depth(self):
        return int(self.command("depth " + QUEUE))

    def cpu_s(self):
        """The CPU time of our broker's Erlang VM (every thread, task_cpu_s),
        in seconds; None when the broker is not ours or not found (its
        command line names its data directory)."""
        data_dir = self.info.get("data_dir")
        if not data_dir:
            return None
        total, found = 0, False
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    cmd = f.read()
                if b"beam" not in cmd.split(b"\0")[0] or data_dir.encode() not in cmd:
                    continue
                for tid in os.listdir("/proc/%s/task" % pid):
                    total += task_cpu_s(pid, tid)
                found = True
            except (OSError, ValueError, IndexError):
                continue
        return total if found else None

    def close(self):
        try:
            self.command("quit") if False else None
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError):
            pass
        self.proc.wait(timeout=120)


# ---------------------------------------------------------------------------
# postspoold, in its own directory tree (as tests/e2e/daemon_process.cc).

class Daemon:
    def __init__(self, binary, broker_url, durability, extra=()):
        self.root = tempfile.mkdtemp(prefix="postspool-suite-")
        self.socket_path = self.root + "/run/postspoold.sock"
        self.control_path = self.root + "/run/control.sock"
        self.spool_dir = self.root + "/spool/incoming"
        self.journal_dir = self.root + "/journal"
        self.metrics_path = self.root + "/metrics.prom"
        self.log_path = self.root + "/postspoold.log"
        self.binary = binary
        self.proc = None
        with open(self.root + "/postspoold.conf", "w") as f:
            f.write("socket_path = %s\ncontrol_socket_path = %s\nspool_dir = %s\n"
                    "quarantine_dir = %s/spool/quarantine\njournal_dir = %s\n"
                    "metrics_file = %s\nmetrics_interval_ms = 100\npost_broker = %s\n"
                    "post_exchange = %s\ndurability = %s\n"
                    % (self.socket_path, self.control_path, self.spool_dir, self.root,
                       self.journal_dir, self.metrics_path, broker_url, EXCHANGE, durability))
            for line in extra:
                f.write(line + "\n")

    def start(self):
        log_file = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.binary, "--config", self.root + "/postspoold.conf"],
                                     stdout=log_file, stderr=log_file)
        deadline = time.time() + 10
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("postspoold exited: " + self.log_tail())
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.connect(self.socket_path)
                s.close()
                return
            except OSError:
                time.sleep(0.01)
        raise RuntimeError("postspoold did not come up: " + self.log_tail())

    @property
    def pid(self):
        return self.proc.pid

    def wait_connected(self, timeout_s=30):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.metrics().get("broker_connected") == 1:
                return True
            time.sleep(0.02)
        return False

    def metrics(self):
        out = {}
        try:
            with open(self.metrics_path) as f:
                for line in f:
                    if line.startswith("postspool_"):
                        name, _, value = line.partition(" ")
                        if "{" in name:
                            continue
                        try:
                            out[name[len("postspool_"):]] = int(float(value))
                        except ValueError:
                            pass
        except OSError:
            pass
        return out

    def threads_cpu_s(self):
        """{thread: CPU seconds}, from each thread's schedstat (task_cpu_s)."""
        per = {}
        for tid in os.listdir("/proc/%d/task" % self.pid):
            try:
                with open("/proc/%d/task/%s/comm" % (self.pid, tid)) as f:
                    comm = f.read().strip()
                cpu = task_cpu_s(self.pid, tid)
            except (OSError, ValueError, IndexError):
                continue
            name = "main (ingest)" if int(tid) == self.pid else "%s %s" % (comm, tid)
            per[name] = per.get(name, 0) + cpu
        return per

    def cpu_s(self):
        with open("/proc/%d/stat" % self.pid) as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def status_kib(self, key):
        with open("/proc/%d/status" % self.pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        return None

    def disk_bytes(self):
        total = 0
        for d in (self.journal_dir, self.spool_dir):
            for dirpath, _, files in os.walk(d):
                for name in files:
                    try:
                        total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
                    except OSError:
                        pass
        return total

    def pin(self, cpus):
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(self.pid)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def wait_confirmed(self, target, timeout_s):
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self.metrics().get("confirmed_total", 0) >= target:
                return True
            time.sleep(0.05)
        return False

    def log_tail(self, n=20):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)


# ---------------------------------------------------------------------------

class Suite:
    def __init__(self, args):
        self.a = args
        self.tool = args.tool
        self.results = {"figures": {}}
        self.fig = self.results["figures"]
        self.broker = None
        q = args.size
        # Sizes: smoke (CI: seconds), quick (a minute or two), full.
        self.sz = {
            "smoke": dict(reps=1, posts1=300, posts8=100, posts64=10, pingpong=2000,
                          ceiling=2000, warmup=500, short=10, e2e_posts=300, outage_posts=200,
                          backlog=10000, conn_posts=3, retry_posts=200, syscall_posts=200,
                          drain=10000, spawn=10, ring_posts=2000, profile_posts=100,
                          cost_reps=1),
            "quick": dict(reps=3, posts1=5000, posts8=2000, posts64=200, pingpong=10000,
                          ceiling=20000, warmup=5000, short=100, e2e_posts=2500,
                          outage_posts=3000, backlog=100000, conn_posts=25, retry_posts=2000,
                          syscall_posts=2000, drain=100000, spawn=100, ring_posts=50000,
                          profile_posts=5000, cost_reps=5),
            "full": dict(reps=3, posts1=20000, posts8=5000, posts64=500, pingpong=20000,
                         ceiling=50000, warmup=5000, short=300, e2e_posts=5000,
                         outage_posts=5000, backlog=1000000, conn_posts=50, retry_posts=5000,
                         syscall_posts=5000, drain=100000, spawn=100, ring_posts=200000,
                         profile_posts=20000, cost_reps=5),
        }[q]
        if args.backlog is not None:
            self.sz["backlog"] = args.backlog
        self.outage_s = args.outage_s if args.outage_s is not None else \
            {"smoke": 2.0, "quick": 10.0, "full": 20.0}[q]
        if args.reps is not None:
            self.sz["reps"] = self.sz["cost_reps"] = args.reps
        self.post_bytes = None

    # -- helpers ------------------------------------------------------------
    def run_tool(self, *argv, stdin=None):
        p = subprocess.run([self.tool] + [str(x) for x in argv], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, input=stdin)
        try:
            return json.loads(p.stdout)
        except json.JSONDecodeError:
            return {"error": "bench_tool %s: rc %d: %s %s" % (argv[0], p.returncode,
                                                              p.stdout[-300:], p.stderr[-300:])}

    def fleet(self, daemon, transport, processes, posts, cpu=-1, sync_spool=0, budget_ms=5):
        opts = TRANSPORTS[transport](daemon)
        return self.run_tool("fleet", "--mode", "libpostspool", "--processes", processes,
                             "--posts", posts, "--socket", opts["socket"], "--spool",
                             opts["spool"], "--cpu", cpu, "--sync-spool", sync_spool,
                             "--budget-ms", budget_ms, "--use-ring", opts["use_ring"])

    def pingpong(self, clients, round_trips, placement):
        return self.run_tool("pingpong", "--clients", clients, "--round-trips", round_trips,
                             "--placement", placement, "--request-bytes", self.a.request_bytes,
                             "--reply-bytes", self.a.reply_bytes)

    def new_daemon(self, durability, extra=()):
        d = Daemon(self.a.postspoold, self.broker.url, durability, extra)
        d.start()
        if not d.wait_connected():
            log("warning: postspoold not connected to the broker after 30 s")
        return d

    # -- figures ------------------------------------------------------------
    def machine(self):
        m = {"nproc": os.cpu_count(), "kernel": platform.release(),
             "loadavg_before": os.getloadavg(), "shared_machine": True,
             "date_utc": datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M:%S")}
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        m["cpu"] = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        try:
            m["git"] = subprocess.run(["git", "-C", os.path.dirname(__file__), "rev-parse",
                                       "--short", "HEAD"], capture_output=True,
                                      text=True).stdout.strip()
        except OSError:
            pass
        self.results["machine"] = m

    def reset_quietly(self):
        try:
            self.broker.reset()
        except RuntimeError as e:
            log("warning: emptying the queue failed (%s); going on" % e)

    @contextlib.contextmanager
    def broker_kept_busy(self, cpus):
        """While inside: one rabbitmq-c publisher with confirms (`ceiling`,
        window 1,000) pinned to `cpus` (the daemon's in the row it is the
        anchor of) keeps our local broker as busy as a serial socket client's
        posts do (it cannot keep up with either). An anchor measured inside
        it has the broker's work on the same CPUs as the daemon's row; the
        queue it filled is emptied after."""
        self.broker.reset()
        cpu_set = {int(c) for c in cpus.split(",")}
        p = subprocess.Popen([self.tool, "ceiling", "--broker-url", self.broker.url, "--exchange",
                              EXCHANGE, "--messages", "10000000", "--window", "1000"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             preexec_fn=lambda: os.sched_setaffinity(0, cpu_set))
        try:
            time.sleep(1.0)  # connected, its window full, the broker at work
            yield
        finally:
            p.terminate()
            p.wait()
            self.reset_quietly()

    def ceiling(self, messages):
        self.broker.reset()
        r = self.run_tool("ceiling", "--broker-url", self.broker.url, "--exchange", EXCHANGE,
                          "--messages", messages, "--window", 1000)
        self.broker.reset()
        return r

    def fig_ceiling(self):
        log("warm-up and broker ceiling")
        self.ceiling(self.sz["warmup"])
        reps = [self.ceiling(self.sz["ceiling"]) for _ in range(self.sz["reps"])]
        self.fig["ceiling"] = {"messages": self.sz["ceiling"], "window": 1000,
                               "runs": reps,
                               "messages_per_s": median(r.get("messages_per_s") for r in reps)}

    def fig_latency(self):
        """Post-call latency and posts/s, per transport, durability, clients,
        placement; anchors: the bare SOCK_SEQPACKET round trip."""
        sz = self.sz
        out = {"anchor": {}, "runs": {}}
        cases = [("1", "same", 1, sz["posts1"]), ("1", "cross", 1, sz["posts1"]),
                 ("8", "none", 8, sz["posts8"]), ("64", "none", 64, sz["posts64"])]
        for clients, placement, n, posts in cases:
            key = "%s/%s" % (clients, placement)
            reps = [self.pingpong(n, posts, placement) for _ in range(sz["reps"])]
            out["anchor"][key] = summarize_runs(reps, "per_s")
        for durability in ("accepted", "synced"):
            d = self.new_daemon(durability)
            try:
                for transport in TRANSPORTS:
                    for clients, placement, n, posts in cases:
                        key = "%s/%s/%s/%s" % (transport, durability, clients, placement)
                        log("latency " + key)
                        runs = []
                        cpu_per_post = []
                        for _ in range(sz["reps"]):
                            if placement == "same":
                                d.pin("0")
                                cpu = 0
                            elif placement == "cross":
                                d.pin("1")
                                cpu = 0
                            else:
                                d.pin("0-%d" % (os.cpu_count() - 1))
                                cpu = -1
                            before_m = d.metrics()
                            before_cpu = d.threads_cpu_s()
                            r = self.fleet(d, transport, n, posts, cpu=cpu,
                                           sync_spool=1 if durability == "synced" else 0)
                            ok = r.get("ok", 0)
                            target = before_m.get("confirmed_total", 0) + ok
                            # The daemon's CPU for these posts: until they are confirmed
                            # (ingest, adoption, forwarding).
                            d.wait_confirmed(target, 120)
                            after_cpu = d.threads_cpu_s()
                            r["daemon_cpu_s"] = cpu_delta(before_cpu, after_cpu)
                            total = sum(r["daemon_cpu_s"].values())
                            r["daemon_cpu_us_per_post"] = total / ok * 1e6 if ok else None
                            cpu_per_post.append(r["daemon_cpu_us_per_post"])
                            runs.append(r)
                        # Keep the queue small: a queue of hundreds of thousands of
                        # messages slows the broker and takes long to delete.
                        self.reset_quietly()
                        out["runs"][key] = summarize_runs(runs, "posts_per_s")
                        out["runs"][key]["daemon_cpu_us_per_post"] = median(cpu_per_post)
                        anchor = out["anchor"]["%s/%s" % (clients, placement)]
                        s = out["runs"][key]
                        s["ratio_p50_to_anchor"] = ratio(s["p50"], anchor["p50"])
                        s["ratio_per_s_to_anchor"] = ratio(s["per_s"], anchor["per_s"])
            finally:
                d.stop()
        self.fig["latency"] = out

    def fig_profile(self):
        """Where the daemon's CPU goes at 8 socket clients: `perf record -g`
        on its pid (every thread, forwarding included, at accepted
        durability) while 8 processes post, then the symbols with the most
        self time and each thread's share. Only with --only profile (perf
        must be allowed to sample the daemon: root, or perf_event_paranoid
        at most 1)."""
        d = self.new_daemon("accepted")
        procs = self.a.profile_processes
        cpu = 0 if self.a.profile_one_cpu else -1
        try:
            if self.a.profile_one_cpu:
                d.pin("0")
            data = d.root + "/perf.data"
            perf = subprocess.Popen(["perf", "record", "-q", "-g", "-F", "2999", "-o", data,
                                     "-p", str(d.pid)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)
            before = d.metrics().get("confirmed_total", 0)
            r = self.fleet(d, "socket", procs, self.sz["profile_posts"] * 8 // procs, cpu=cpu)
            d.wait_confirmed(before + r.get("ok", 0), 120)
            perf.send_signal(signal.SIGINT)
            perf.wait()
            out = {"posts": r.get("ok", 0), "via_spool": r.get("via_spool"),
                   "processes": procs, "one_cpu": self.a.profile_one_cpu,
                   "tool": "perf record -g -F 2999 -p <postspoold>; perf report --no-children"}

            def report(sort):
                p = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children",
                                    "-g", "none", "--percent-limit", "0.3", "--sort", sort],
                                   capture_output=True, text=True)
                rows = []
                for line in p.stdout.splitlines():
                    parts = line.split(None, 1)
                    if len(parts) == 2 and parts[0].endswith("%") and not line.startswith("#"):
                        rows.append([float(parts[0][:-1])] + parts[1].split(None, len(
                            sort.split(",")) - 1 + (1 if "sym" in sort else 0)))
                return rows

            # cpu-clock samples: the event count is the daemon's CPU time in ns.
            hdr = subprocess.run(["perf", "report", "-i", data, "--stdio", "--sort", "comm"],
                                 capture_output=True, text=True).stdout
            m = re.search(r"Event count \(approx\.\): (\d+)", hdr)
            out["cpu_us_per_post"] = int(m.group(1)) / 1e3 / out["posts"] \
                if m and out["posts"] else None
            out["threads"] = report("comm")
            out["top"] = report("comm,dso,sym")[:20]
            # Kept beside the results, for `perf report -i` with call graphs.
            shutil.copy(data, os.path.join(self.a.out, "perf.data"))
            self.fig["profile"] = out
        finally:
            d.stop()

    def fig_syscalls(self):
        """Syscalls and context switches of the daemon per post (perf stat on
        its pid, all threads), 8 clients, socket."""
        out = {}
        for durability in ("accepted", "synced"):
            d = self.new_daemon(durability)
            try:
                posts = self.sz["syscall_posts"]
                perf_out = d.root + "/perf.txt"
                perf = subprocess.Popen(["perf", "stat", "-x,", "-o", perf_out, "-e",
                                         "raw_syscalls:sys_enter,context-switches,task-clock",
                                         "-p", str(d.pid)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(0.3)
                before = d.metrics().get("confirmed_total", 0)
                r = self.fleet(d, "socket", 8, posts)
                d.wait_confirmed(before + r.get("ok", 0), 120)
                perf.send_signal(signal.SIGINT)
                perf.wait()
                counts = {}
                try:
                    with open(perf_out) as f:
                        for line in f:
                            parts = line.strip().split(",")
                            if len(parts) > 2 and parts[0] and parts[0][0].isdigit():
                                counts[parts[2]] = float(parts[0])
                except OSError:
                    pass
                ok = r.get("ok", 0) or 1
                out[durability] = {
                    "posts": r.get("ok", 0),
                    "tool": "perf stat -e raw_syscalls:sys_enter,context-switches (linux-perf)",
                    "syscalls_per_post": counts.get("raw_syscalls:sys_enter", 0) / ok
                    if counts else None,
                    "context_switches_per_post": counts.get("context-switches", 0) / ok
                    if counts else None,
                    "task_clock_us_per_post": counts.get("task-clock", 0) * 1e3 / ok
                    if counts else None,
                    "includes_forwarding": True,
                }
                # Which syscalls: strace -c on a second, smaller run (strace slows the
                # daemon a lot: only the counts are meaningful).
                st_out = d.root + "/strace.txt"
                st = subprocess.Popen(["strace", "-c", "-f", "-o", st_out, "-p", str(d.pid)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(0.5)
                before = d.metrics().get("confirmed_total", 0)
                r2 = self.fleet(d, "socket", 8, max(posts // 4, 10), budget_ms=1000)
                d.wait_confirmed(before + r2.get("ok", 0), 120)
                st.send_signal(signal.SIGINT)
                st.wait()
                top = {}
                try:
                    with open(st_out) as f:
                        for line in f:
                            parts = line.split()
                            if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                                calls = int(parts[3])
                                top[parts[-1]] = calls
                except (OSError, ValueError, IndexError):
                    pass
                ok2 = r2.get("ok", 0) or 1
                out[durability]["strace_per_post"] = {
                    k: round(v / ok2, 3) for k, v in sorted(top.items(), key=lambda kv: -kv[1])[:12]}
            finally:
                d.stop()
        self.fig["syscalls"] = out

    def time_processes(self, argv_list, count, env=None, parallel=1):
        """Wall time of `count` processes, each run to its end; sequential
        latency percentiles, then count processes `parallel` at a time."""
        env = env or os.environ.copy()
        lat = sorted(spawn_ms(argv_list(i), env) for i in range(count))
        t0 = time.perf_counter_ns()
        running = set()
        for i in range(count):
            while len(running) >= parallel:
                pid, _ = os.wait()
                running.discard(pid)
            argv = argv_list(i)
            running.add(os.posix_spawnp(argv[0], argv, env,
                                        file_actions=[(os.POSIX_SPAWN_OPEN, 1, "/dev/null",
                                                       os.O_WRONLY, 0)]))
        while running:
            pid, _ = os.wait()
            running.discard(pid)
        total = (time.perf_counter_ns() - t0) / 1e9
        return {"count": count, "p50_ms": pct(lat, 50), "p90_ms": pct(lat, 90),
                "p99_ms": pct(lat, 99), "processes_per_s_parallel_%d" % parallel: count / total}

    def fig_short_lived(self):
        log("short-lived processes")
        d = self.new_daemon("accepted")
        try:
            n = self.sz["short"]
            body = '{"pubTime":"20260101T000000.0","baseUrl":"file:/","relPath":"data/x.nc"}'
            host, port = "127.0.0.1", self.broker.url.rsplit(":", 1)[1].strip("/")
            out = {"runs": []}
            for _ in range(self.sz["reps"]):
                run = {
                    "true": self.time_processes(lambda i: ["true"], n, parallel=8),
                    "postspool_post": self.time_processes(
                        lambda i: [self.a.cli, "post", "--socket", d.socket_path,
                                   "--spool-dir", d.spool_dir, "--rel-path",
                                   "data/job/run/file%06d.nc" % i], n, parallel=8),
                    "amqp_publish": self.time_processes(
                        lambda i: ["amqp-publish", "--url=" + self.broker.url.rstrip("/"), "-e", EXCHANGE,
                                   "-r", "v03.data", "-p", "-b", body], n, parallel=8)
                    if shutil.which("amqp-publish") else None,
                }
                out["runs"].append(run)
            med = {}
            for k in ("true", "postspool_post", "amqp_publish"):
                vals = [r[k] for r in out["runs"] if r.get(k)]
                if vals:
                    med[k] = {f: median(v[f] for v in vals) for f in vals[0]}
            out["median"] = med
            if "true" in med and "postspool_post" in med:
                out["ratio_post_to_true_p50"] = ratio(med["postspool_post"]["p50_ms"],
                                                      med["true"]["p50_ms"])
            if "amqp_publish" in med and "postspool_post" in med:
                out["ratio_post_to_amqp_publish_p50"] = ratio(
                    med["postspool_post"]["p50_ms"], med["amqp_publish"]["p50_ms"])
        finally:
            d.stop()
        self.reset_quietly()
        self.fig["short_lived"] = out

    def fig_end_to_end(self):
        log("end to end against the ceiling")
        runs = []
        for _ in range(self.sz["reps"]):
            n = 8 * self.sz["e2e_posts"]
            ceil = self.ceiling(n)
            d = self.new_daemon("accepted")
            try:
                before = d.metrics().get("confirmed_total", 0)
                t0 = time.monotonic()
                r = self.fleet(d, "socket", 8, self.sz["e2e_posts"])
                accepted_s = time.monotonic() - t0
                ok = d.wait_confirmed(before + r.get("ok", 0), 300)
                t1 = time.monotonic()
                runs.append({"posts": r.get("ok", 0), "accept_s": accepted_s,
                             "confirmed_s": t1 - t0 if ok else None,
                             "confirmed_posts_per_s": r.get("ok", 0) / (t1 - t0) if ok else None,
                             "ceiling_same_count_per_s": ceil.get("messages_per_s"),
                             "forwarder_cpu_s": d.threads_cpu_s()})
            finally:
                d.stop()
            self.broker.reset()
        e2e = median(r["confirmed_posts_per_s"] for r in runs)
        c = median(r["ceiling_same_count_per_s"] for r in runs)
        self.fig["end_to_end"] = {"runs": runs, "confirmed_posts_per_s": e2e,
                                  "ceiling_per_s": c, "ratio_to_ceiling": ratio(e2e, c),
                                  "resolution_ms": 100}

    def fig_outage(self):
        if not self.broker.own:
            self.fig["outage"] = {"skipped": "the broker was given (--broker): not ours to stop"}
            return
        log("broker outage")
        out = {"runs": []}
        for _ in range(self.sz["reps"]):
            d = self.new_daemon("accepted")
            try:
                up = self.fleet(d, "socket", 1, self.sz["outage_posts"])
                self.broker.command("stop")
                t_down = time.monotonic()
                while d.metrics().get("broker_connected") == 1 and time.monotonic() - t_down < 30:
                    time.sleep(0.02)
                down = self.fleet(d, "socket", 1, self.sz["outage_posts"])
                # Stay down a while so that the back-off grows as in a real outage.
                time.sleep(max(0.0, self.outage_s - (time.monotonic() - t_down)))
                before = d.metrics().get("confirmed_total", 0)
                self.broker.command("start")
                t_up = time.monotonic()
                first = None
                series = []
                while time.monotonic() - t_up < 120:
                    m = d.metrics()
                    series.append((round(time.monotonic() - t_up, 3), m.get("confirmed_total", 0)))
                    if m.get("confirmed_total", 0) > before:
                        first = time.monotonic() - t_up
                        break
                    time.sleep(0.01)
                out["runs"].append({
                    "up_p50_us": up["latency_us"]["p50"], "up_p99_us": up["latency_us"]["p99"],
                    "down_p50_us": down["latency_us"]["p50"],
                    "down_p99_us": down["latency_us"]["p99"],
                    "down_via_spool": down.get("via_spool"), "down_failed": down.get("failed"),
                    "outage_s": time.monotonic() - t_down,
                    "first_confirmed_after_return_s": first,
                    "reconnect_delay_ms_at_return": d.metrics().get("reconnect_delay_ms")})
            finally:
                d.stop()
            self.broker.reset()
        rr = out["runs"]
        out["up_p50_us"] = median(r["up_p50_us"] for r in rr)
        out["down_p50_us"] = median(r["down_p50_us"] for r in rr)
        out["up_p99_us"] = median(r["up_p99_us"] for r in rr)
        out["down_p99_us"] = median(r["down_p99_us"] for r in rr)
        out["ratio_down_to_up_p50"] = ratio(out["down_p50_us"], out["up_p50_us"])
        out["first_confirmed_after_return_s"] = median(r["first_confirmed_after_return_s"]
                                                       for r in rr)
        out["first_confirmed_after_return_s_max"] = max(
            (r["first_confirmed_after_return_s"] or 1e9 for r in rr), default=None)
        self.fig["outage"] = out

    def backlog_drain(self, n, operator_view):
        """Builds a backlog of n posts (8 socket clients) while the broker is
        down, brings the broker back and times the drain: posts/s from the
        first confirm to the last, and the CPU time of each daemon thread
        from the broker's return until the last confirm. With operator_view,
        also what `postspool status` said on the way, peak RSS and disk."""
        per = max(n // 8, 1)
        n = per * 8
        out = {"posts": n}
        d = self.new_daemon("accepted")
        try:
            self.broker.command("stop")
            while d.metrics().get("broker_connected") == 1:
                time.sleep(0.02)
            t0 = time.monotonic()
            r = self.fleet(d, "socket", 8, per, budget_ms=50)
            out["build_s"] = time.monotonic() - t0
            out["build"] = {k: r.get(k) for k in ("ok", "failed", "via_socket", "via_spool",
                                                   "posts_per_s", "latency_us")}
            time.sleep(1.0)  # the spooled posts adopted, metrics written
            if operator_view:
                out["daemon_rss_peak_mib_during_build"] = (d.status_kib("VmHWM") or 0) / 1024
                out["disk_bytes"] = d.disk_bytes()
                out["metrics_before_return"] = {k: v for k, v in d.metrics().items()
                                                if "backlog" in k or k in ("journal_bytes",
                                                                           "disk_bytes")}
                out["status_while_down"] = self.status_text(d)
            target = r.get("ok", 0)
            cpu0 = d.threads_cpu_s()
            self.broker.command("start")
            t_up = time.monotonic()
            series = []
            first = None
            c_first = 0
            done = None
            c_done = 0
            last_status = 0
            while time.monotonic() - t_up < self.a.drain_timeout_s:
                c = d.metrics().get("confirmed_total", 0)
                now = time.monotonic() - t_up
                series.append((round(now, 2), c))
                if c > 0 and first is None:
                    first, c_first = now, c
                if c >= target:
                    done, c_done = now, c
                    break
                if now - last_status > 5:
                    last_status = now
                    log("draining: %d of %d confirmed (%.0f s)" % (c, target, now))
                    if operator_view and "status_during_drain" not in out and c > 0:
                        # What the operator sees mid-drain: postspool status.
                        out["status_during_drain"] = self.status_text(d)
                time.sleep(0.1)
            cpu1 = d.threads_cpu_s()
            out["daemon_cpu_s_during_drain"] = cpu_delta(cpu0, cpu1)
            forwarder = sum(v for k, v in out["daemon_cpu_s_during_drain"].items()
                            if k.startswith("ps-forwarder"))
            out["forwarder_cpu_us_per_post"] = forwarder / target * 1e6 if done and target \
                else None
            if operator_view:
                out["status_after_drain"] = self.status_text(d)
                out["daemon_rss_peak_mib"] = (d.status_kib("VmHWM") or 0) / 1024
            out["first_confirmed_after_return_s"] = first
            out["drained_s"] = done
            # The posts confirmed between the first sample that saw a confirm
            # and the one that saw them all, over the time between the two:
            # the metrics file is written every 100 ms, so a drain needs a
            # few intervals (the sizes see to that) to be measured at all.
            out["drain_posts_per_s"] = ((c_done - c_first) / (done - first)) \
                if done and first is not None and done > first else None
            out["series"] = series
        finally:
            d.stop()
        self.broker.reset()
        return out

    def status_text(self, d):
        st = subprocess.run([self.a.cli, "status", "--control-socket", d.control_path],
                            capture_output=True, text=True)
        return (st.stdout or st.stderr)[-2000:]

    def fig_backlog(self):
        if not self.broker.own:
            self.fig["backlog"] = {"skipped": "the broker was given (--broker): not ours to stop"}
            return
        n = self.sz["backlog"]
        log("backlog of %d posts while the broker is down" % n)
        ceiling = self.ceiling(min(n, self.a.backlog_ceiling_max))
        out = self.backlog_drain(n, operator_view=True)
        out["ceiling"] = ceiling
        out["ratio_drain_to_ceiling"] = ratio(out["drain_posts_per_s"],
                                              ceiling.get("messages_per_s"))
        self.fig["backlog"] = out

    def fig_cost(self):
        """The daemon's own cost per post: each figure beside its anchor, one
        run (interleaved repetitions), with the goal it is judged by."""
        sz = self.sz
        out = {"goals": COST_GOALS}
        # A socket post against a bare SOCK_SEQPACKET round trip of the same
        # placement, 280-byte request and 24-byte reply (a post and its ack);
        # the daemon's CPU per socket post until the broker confirmed it.
        # The same across two CPUs with no broker at all (the forwarder
        # waits to connect; posts are journaled and acked as always): what
        # the daemon's path costs without the broker's own work per post,
        # which on a small machine shares the client's and the daemon's CPUs.
        for key, placement, daemon_cpus, broker in (
                ("socket_same", "same", "0", True), ("socket_cross", "cross", "1", True),
                ("socket_cross_no_broker", "cross", "1", False)):
            log("cost: socket post, %s CPU%s" % (placement, "" if broker else ", no broker"))
            if broker:
                d = self.new_daemon("accepted")
            else:
                d = Daemon(self.a.postspoold, NO_BROKER_URL, "accepted")
                d.start()
            try:
                def bare_round_trip():
                    return self.run_tool(
                        "pingpong", "--clients", 1, "--round-trips", sz["posts1"],
                        "--placement", placement, "--request-bytes", 280, "--reply-bytes", 24)
                anchors, busy_anchors, runs, cpu, broker_cpu = [], [], [], [], []
                for _ in range(sz["cost_reps"]):
                    anchors.append(bare_round_trip())
                    if key == "socket_cross" and self.broker.own:
                        with self.broker_kept_busy(daemon_cpus):
                            busy_anchors.append(bare_round_trip())
                    d.pin(daemon_cpus)
                    before = d.metrics().get("confirmed_total", 0)
                    cpu0, b0 = d.threads_cpu_s(), self.broker.cpu_s()
                    r = self.fleet(d, "socket", 1, sz["posts1"], cpu=0)
                    if broker:
                        d.wait_confirmed(before + r.get("ok", 0), 120)
                    cpu1, b1 = d.threads_cpu_s(), self.broker.cpu_s()
                    r["daemon_cpu_s"] = cpu_delta(cpu0, cpu1)
                    ok = r.get("ok", 0)
                    cpu.append(sum(r["daemon_cpu_s"].values()) / ok * 1e6 if ok else None)
                    # The broker's CPU for the same posts, until it confirmed them.
                    broker_cpu.append((b1 - b0) / ok * 1e6 if broker and ok and b0 is not None
                                      and b1 is not None else None)
                    runs.append(r)
            finally:
                d.stop()
            self.reset_quietly()
            s = summarize_runs(runs, "posts_per_s")
            a = summarize_runs(anchors, "per_s")
            out[key] = {
                "p50_us": s["p50"], "anchor_p50_us": a["p50"],
                "ratio_p50_to_anchor": paired_p50_ratio(runs, anchors),
                "ratio_of_median_p50s": ratio(s["p50"], a["p50"]),
                "daemon_cpu_us_per_post": median(cpu),
                "broker_cpu_us_per_post": median(broker_cpu),
                "anchor_server_cpu_us_per_round_trip": median(
                    a.get("server_cpu_us_per_round_trip") for a in anchors),
                "runs": runs, "anchor_runs": anchors}
            if busy_anchors:
                b = summarize_runs(busy_anchors, "per_s")
                out[key].update({
                    "busy_broker_anchor_p50_us": b["p50"],
                    "ratio_p50_to_busy_broker_anchor": paired_p50_ratio(runs, busy_anchors),
                    "busy_broker_anchor_server_cpu_us_per_round_trip": median(
                        a.get("server_cpu_us_per_round_trip") for a in busy_anchors),
                    "busy_broker_anchor_runs": busy_anchors})
        # A backlog's drain against one rabbitmq-c publisher with confirms,
        # window 1,000, the same number of messages into an empty queue.
        if self.broker.own:
            runs = []
            for _ in range(sz["reps"]):
                log("cost: drain of %d posts" % sz["drain"])
                ceiling = self.ceiling(sz["drain"])
                r = self.backlog_drain(sz["drain"], operator_view=False)
                r.pop("series", None)
                r["ceiling_per_s"] = ceiling.get("messages_per_s")
                runs.append(r)
            rate = median(r["drain_posts_per_s"] for r in runs)
            ceil = median(r["ceiling_per_s"] for r in runs)
            out["drain"] = {"posts": sz["drain"], "drain_posts_per_s": rate,
                            "ceiling_per_s": ceil, "ratio_to_ceiling": ratio(rate, ceil),
                            "forwarder_cpu_us_per_post": median(
                                r["forwarder_cpu_us_per_post"] for r in runs),
                            "runs": runs}
        else:
            out["drain"] = {"skipped": "the broker was given (--broker): not ours to stop"}
        # `postspool post` as a process against `true`: each spawned and
        # reaped in turn (interleaved, so that both see the same machine).
        # And what the daemon spends on such a post, one at a time with the
        # daemon idle in between (all its threads, from before the first
        # until 200 ms after the last; that all were confirmed is checked
        # after). Its metrics file is rewritten every 5 s here, not every
        # 100 ms as elsewhere in the suite: a rewrite (a new file, a rename)
        # costs the daemon more than a post.
        log("cost: postspool post as a process")
        d = self.new_daemon("accepted", extra=("metrics_interval_ms = 5000",))
        try:
            post, true = [], []
            confirmed0 = d.metrics().get("confirmed_total", 0)
            cpu0 = d.threads_cpu_s()
            for i in range(sz["spawn"]):
                true.append(spawn_ms(["true"]))
                post.append(spawn_ms([self.a.cli, "post", "--socket", d.socket_path,
                                      "--spool-dir", d.spool_dir, "--rel-path",
                                      "data/job/file%06d.nc" % i]))
            time.sleep(0.2)
            daemon_cpu = cpu_delta(cpu0, d.threads_cpu_s())
            confirmed = d.wait_confirmed(confirmed0 + sz["spawn"], 30)
            post.sort()
            true.sort()
            out["process"] = {"count": sz["spawn"], "p50_ms": pct(post, 50),
                              "true_p50_ms": pct(true, 50),
                              "ratio_p50_to_true": ratio(pct(post, 50), pct(true, 50)),
                              "daemon_cpu_s": daemon_cpu,
                              "daemon_cpu_us_per_post":
                                  sum(daemon_cpu.values()) / sz["spawn"] * 1e6
                                  if confirmed else None}
            if not confirmed:
                log("warning: the posts of `postspool post` were not all confirmed in 30 s")
        finally:
            d.stop()
        self.reset_quietly()
        # The ring: ring_bench's ingest with 8 producers (journaled/s, no
        # broker) and one producer's post-call p50.
        for producers in (8, 1):
            log("cost: ring, %d producer(s)" % producers)
            runs = [self.ring_bench(producers) for _ in range(sz["reps"])]
            out["ring_%d" % producers] = {
                "runs": runs,
                "journaled_per_s": median(r.get("journaled_per_s") for r in runs),
                "journaled_per_s_min": min((r["journaled_per_s"] for r in runs
                                            if r.get("journaled_per_s")), default=None),
                "p50_us": median(r.get("p50_us") for r in runs)}
        self.fig["cost"] = out

    def ring_bench(self, producers):
        """One `ring_bench --only-ring N` run, parsed from its table row."""
        p = subprocess.run([self.a.ring_bench, "--only-ring", str(producers), "--posts",
                            str(self.sz["ring_posts"])], capture_output=True, text=True)
        for line in p.stdout.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells and cells[0] == "ring" and len(cells) >= 7:
                return {"p50_us": float(cells[1]), "p99_us": float(cells[2]),
                        "journaled_per_s": float(cells[5]),
                        "daemon_cpu_us_per_post": float(cells[6]), "transports": cells[7]}
        return {"error": "ring_bench rc %d: %s" % (p.returncode, (p.stderr or p.stdout)[-300:])}

    def fig_baselines(self):
        log("baselines: a connection per post; a retry file per post")
        out = {}
        runs = []
        for _ in range(self.sz["reps"]):
            runs.append(self.run_tool("fleet", "--mode", "conn-per-post", "--processes", 8,
                                      "--posts", self.sz["conn_posts"], "--broker-url",
                                      self.broker.url, "--exchange", EXCHANGE))
        out["connection_per_post"] = summarize_runs(runs, "posts_per_s")
        self.broker.reset()
        for sync in (0, 1):
            runs = []
            drains = []
            files = []
            for _ in range(self.sz["reps"]):
                rdir = tempfile.mkdtemp(prefix="postspool-retry-")
                runs.append(self.run_tool("fleet", "--mode", "retry-file", "--processes", 8,
                                          "--posts", self.sz["retry_posts"], "--retry-dir", rdir,
                                          "--sync", sync))
                files.append(len(os.listdir(rdir)))
                drains.append(self.run_tool("retry-drain", "--retry-dir", rdir, "--broker-url",
                                            self.broker.url, "--exchange", EXCHANGE))
                shutil.rmtree(rdir, ignore_errors=True)
                self.broker.reset()
            s = summarize_runs(runs, "posts_per_s")
            s["files_left_for_the_janitor"] = median(files)
            s["janitor_drain_posts_per_s"] = median(x.get("posts_per_s") for x in drains)
            out["retry_file_" + ("fdatasync" if sync else "no_sync")] = s
        self.fig["baselines"] = out

    def run(self):
        self.machine()
        t0 = time.monotonic()
        self.broker = Broker(self.tool, self.a.broker)
        self.results["broker"] = self.broker.info
        log("broker %s" % self.broker.url)
        try:
            self.broker.reset()
            steps = [self.fig_ceiling, self.fig_cost, self.fig_latency, self.fig_syscalls, self.fig_short_lived,
                     self.fig_end_to_end, self.fig_outage, self.fig_backlog, self.fig_baselines,
                     self.fig_profile]
            for step in steps:
                name = step.__name__[4:]
                if self.a.only and name not in self.a.only.split(","):
                    continue
                if name == "profile" and not self.a.only:
                    continue  # perf record: only when asked for
                try:
                    step()
                except Exception as e:  # a figure that failed is reported, the rest still run
                    log("%s failed: %r" % (name, e))
                    self.fig[name] = {"error": repr(e)}
        finally:
            self.broker.close()
        self.results["machine"]["loadavg_after"] = os.getloadavg()
        self.results["total_s"] = time.monotonic() - t0
        self.results["size"] = self.a.size
        self.results["sizes"] = self.sz
        return self.results


def spawn_ms(argv, env=None):
    """Milliseconds from posix_spawn to the process reaped (stdout to /dev/null)."""
    t0 = time.perf_counter_ns()
    pid = os.posix_spawnp(argv[0], argv, env or os.environ,
                          file_actions=[(os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0)])
    os.waitpid(pid, 0)
    return (time.perf_counter_ns() - t0) / 1e6


def pct(sorted_values, p):
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, int(round(p / 100.0 * (len(sorted_values) - 1))))
    return sorted_values[i]


def summarize_runs(runs, rate_key):
    """The median over repetitions of each percentile and of the rate."""
    ok = [r for r in runs if "latency_us" in r]
    s = {"reps": len(runs), "errors": [r["error"] for r in runs if "error" in r]}
    for p in ("p50", "p90", "p99", "p999", "max"):
        s[p] = median(r["latency_us"][p] for r in ok)
    s["per_s"] = median(r.get(rate_key) for r in ok)
    for k in ("via_socket", "via_spool", "failed"):
        if any(k in r for r in ok):
            s[k] = sum(r.get(k, 0) for r in ok)
    s["runs"] = runs
    return s


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tool", required=True)
    ap.add_argument("--postspoold", required=True)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--ring-bench", help="ring_bench (default: ../ring/ring_bench beside --tool)")
    ap.add_argument("--broker", default="", help="amqp://... of a broker to use (none: start one)")
    ap.add_argument("--size", choices=("smoke", "quick", "full"), default="full")
    ap.add_argument("--reps", type=int)
    ap.add_argument("--backlog", type=int, help="posts in the backlog figure")
    ap.add_argument("--backlog-ceiling-max", type=int, default=1000000,
                    help="messages of the ceiling the drain is compared with (at most)")
    ap.add_argument("--outage-s", type=float,
                    help="how long the broker stays down in the outage figure "
                    "(default: 2 s smoke, 10 s quick, 20 s full)")
    ap.add_argument("--drain-timeout-s", type=float, default=900)
    ap.add_argument("--request-bytes", type=int, default=400)
    ap.add_argument("--reply-bytes", type=int, default=32)
    ap.add_argument("--only", default="", help="comma list of figures to run")
    ap.add_argument("--profile-processes", type=int, default=8,
                    help="posting processes in the profile figure")
    ap.add_argument("--profile-one-cpu", action="store_true",
                    help="profile with the daemon and the posting processes on CPU 0")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if not a.ring_bench:
        a.ring_bench = os.path.join(os.path.dirname(os.path.abspath(a.tool)), "..", "ring",
                                    "ring_bench")
    os.makedirs(a.out, exist_ok=True)
    res = Suite(a).run()
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import report
    md = report.markdown(res)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
