#!/usr/bin/env python3
"""The benchmark suite's smoke test (meson test --suite bench): runs
suite.py at its smallest size against a broker it starts, and checks that it
ran and wrote well-formed JSON with every figure present. No thresholds: the
figures of a smoke run on a busy CI machine mean nothing.

usage: smoke_test.py BENCH_TOOL POSTSPOOLD POSTSPOOL_CLI RING_BENCH"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

FIGURES = ["ceiling", "cost", "latency", "syscalls", "short_lived", "end_to_end", "outage",
           "backlog", "baselines"]


def main():
    tool, daemon, cli, ring_bench = sys.argv[1:5]
    if not os.path.exists("/usr/lib/rabbitmq/bin/rabbitmq-server"):
        print("SKIP: rabbitmq-server is not installed")
        return 77
    here = os.path.dirname(os.path.abspath(__file__))
    out = tempfile.mkdtemp(prefix="postspool-bench-smoke-")
    try:
        p = subprocess.run([sys.executable, os.path.join(here, "suite.py"), "--tool", tool,
                            "--postspoold", daemon, "--cli", cli, "--ring-bench", ring_bench,
                            "--size", "smoke",
                            "--out", out], stdout=subprocess.PIPE, text=True, timeout=600)
        print(p.stdout)
        if p.returncode != 0:
            print("FAIL: suite.py exited with %d" % p.returncode)
            return 1
        with open(os.path.join(out, "results.json")) as f:
            results = json.load(f)
        figures = results.get("figures", {})
        bad = []
        for name in FIGURES:
            fig = figures.get(name)
            if not isinstance(fig, dict) or not fig:
                bad.append("%s: missing" % name)
            elif "error" in fig:
                bad.append("%s: %s" % (name, fig["error"]))
        lat = figures.get("latency", {}).get("runs", {})
        for key in ("socket/accepted/1/same", "socket/synced/8/none", "spool/accepted/64/none"):
            if lat.get(key, {}).get("p50") is None:
                bad.append("latency %s: no p50" % key)
        cost = figures.get("cost", {})
        for key, field in (("socket_same", "p50_us"), ("socket_cross", "anchor_p50_us"),
                           ("socket_cross", "broker_cpu_us_per_post"),
                           ("socket_cross", "busy_broker_anchor_p50_us"),
                           ("socket_cross_no_broker", "p50_us"),
                           ("drain", "drain_posts_per_s"), ("process", "p50_ms"),
                           ("process", "daemon_cpu_us_per_post"),
                           ("ring_8", "journaled_per_s"), ("ring_1", "p50_us")):
            if cost.get(key, {}).get(field) is None:
                bad.append("cost %s: no %s" % (key, field))
        if not os.path.exists(os.path.join(out, "results.md")):
            bad.append("results.md not written")
        subprocess.run([sys.executable, os.path.join(here, "report.py"),
                        os.path.join(out, "results.json"), out], check=True)
        if bad:
            print("FAIL:\n  " + "\n  ".join(bad))
            return 1
        print("OK: every figure present")
        return 0
    finally:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
