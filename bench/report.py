#!/usr/bin/env python3
"""The suite's Markdown table (markdown(results)) and plots
(`report.py results.json OUTDIR` draws them with matplotlib). Everything comes
from results.json, written by suite.py."""

import json
import os
import sys


def f(v, digits=1):
    if v is None:
        return "–"
    if isinstance(v, float):
        if abs(v) >= 1000:
            return "{:,.0f}".format(v)
        return "{:.{d}f}".format(v, d=digits)
    if isinstance(v, int):
        return "{:,}".format(v)
    return str(v)


def x(v):
    return "–" if v is None else "%.2f×" % v


def markdown(r):
    m = r.get("machine", {})
    fig = r.get("figures", {})
    out = []
    out.append("Run %s UTC, size `%s`, %s CPUs (%s), kernel %s, RabbitMQ %s, commit %s; "
               "load average before %s, after %s. **The machine was shared** (other builds "
               "and tests ran on the same 2 cores): figures move by tens of percent between "
               "runs. Ratios compare figures from the same run; values are medians over %s "
               "repetitions." % (m.get("date_utc"), r.get("size"), m.get("nproc"), m.get("cpu"),
                                 m.get("kernel"), r.get("broker", {}).get("rabbitmq_version"),
                                 m.get("git"),
                                 " ".join("%.2f" % v for v in m.get("loadavg_before", [])),
                                 " ".join("%.2f" % v for v in m.get("loadavg_after", [])),
                                 r.get("sizes", {}).get("reps")))
    out.append("")
    cost = fig.get("cost", {})
    if cost and "error" not in cost:
        out.extend(cost_table(cost))
    lat = fig.get("latency", {})
    if "runs" in lat:
        out.append("### Post-call latency (µs) and posts/s, against a bare SOCK_SEQPACKET "
                   "round trip")
        out.append("")
        out.append("| transport | durability | clients | placement | p50 | p90 | p99 | p99.9 | "
                   "posts/s | anchor p50 | anchor round trips/s | p50 ratio | posts/s ratio | "
                   "daemon CPU µs/post |")
        out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for key, s in lat["runs"].items():
            transport, durability, clients, placement = key.split("/")
            a = lat["anchor"].get("%s/%s" % (clients, placement), {})
            out.append("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                transport, durability, clients, placement, f(s.get("p50")), f(s.get("p90")),
                f(s.get("p99")), f(s.get("p999")), f(s.get("per_s")), f(a.get("p50")),
                f(a.get("per_s")), x(s.get("ratio_p50_to_anchor")),
                x(s.get("ratio_per_s_to_anchor")), f(s.get("daemon_cpu_us_per_post"))))
        out.append("")
        out.append("Placement: `same` = client and daemon (or anchor client and server) pinned "
                   "to CPU 0; `cross` = client on CPU 0, daemon on CPU 1; `none` = not pinned. "
                   "Daemon CPU = all its threads (ingest, spool adoption, forwarding to the "
                   "broker) until the posts are confirmed, from /proc, divided by the posts "
                   "(× 1,000 for the CPU time per 1,000 posts in µs → ms).")
        out.append("")
    sc = fig.get("syscalls", {})
    if sc and "error" not in sc:
        out.append("### Daemon syscalls per post (8 clients, socket, forwarding included)")
        out.append("")
        out.append("| durability | syscalls/post | context switches/post | task-clock µs/post | "
                   "top syscalls per post (strace -c) |")
        out.append("|---|---|---|---|---|")
        for d, s in sc.items():
            top = ", ".join("%s %s" % (k, v) for k, v in list(s.get("strace_per_post", {})
                                                              .items())[:8])
            out.append("| %s | %s | %s | %s | %s |" % (
                d, f(s.get("syscalls_per_post")), f(s.get("context_switches_per_post"), 2),
                f(s.get("task_clock_us_per_post")), top))
        out.append("")
    pr = fig.get("profile", {})
    if pr.get("top"):
        out.append("### Where the daemon's CPU goes: %s socket client(s)%s, %s posts (%s)"
                   % (pr.get("processes", 8), ", all on CPU 0" if pr.get("one_cpu") else "",
                      f(pr.get("posts")), pr.get("tool")))
        out.append("")
        out.append("Daemon CPU per post (all threads, from the samples): %s µs. Threads: "
                   % f(pr.get("cpu_us_per_post"))
                   + ", ".join("%s %.1f%%" % (t[1].strip(), t[0]) for t in pr["threads"]))
        out.append("")
        out.append("| self % | thread | object | symbol |")
        out.append("|---|---|---|---|")
        for row in pr["top"]:
            sym = row[-1].replace("|", "\\|")
            if len(sym) > 90:
                sym = sym[:87] + "..."
            out.append("| %.2f | %s | %s | `%s` |" % (row[0], row[1], row[2], sym))
        out.append("")
    sl = fig.get("short_lived", {})
    if "median" in sl:
        med = sl["median"]
        out.append("### Short-lived processes (each posts once and exits)")
        out.append("")
        if sl.get("note"):
            out.append("(" + sl["note"] + ")")
            out.append("")
        out.append("| process | p50 ms | p90 ms | p99 ms | processes/s, 8 at a time | "
                   "p50 ratio to `true` |")
        out.append("|---|---|---|---|---|---|")
        t = med.get("true", {}).get("p50_ms")
        for k in ("true", "postspool_post", "amqp_publish"):
            if k not in med:
                continue
            v = med[k]
            out.append("| %s | %s | %s | %s | %s | %s |" % (
                {"true": "`true`", "postspool_post": "`postspool post`",
                 "amqp_publish": "`amqp-publish -p` (one persistent message, no confirm)"}[k],
                f(v.get("p50_ms"), 2), f(v.get("p90_ms"), 2), f(v.get("p99_ms"), 2),
                f(v.get("processes_per_s_parallel_8")), x(ratio_(v.get("p50_ms"), t))))
        out.append("")
    rows = []
    e2e = fig.get("end_to_end", {})
    if "confirmed_posts_per_s" in e2e:
        rows.append(("End to end: 8 clients, confirmed posts/s (accepted)",
                     f(e2e.get("confirmed_posts_per_s")),
                     "broker ceiling, same count: " + f(e2e.get("ceiling_per_s")),
                     x(e2e.get("ratio_to_ceiling"))))
    c = fig.get("ceiling", {})
    if "messages_per_s" in c:
        rows.append(("Broker ceiling: rabbitmq-c, confirms, window 1,000, %s messages"
                     % f(c.get("messages")), f(c.get("messages_per_s")), "", ""))
    o = fig.get("outage", {})
    if "up_p50_us" in o:
        rows.append(("Outage: post-call p50 µs, broker down", f(o.get("down_p50_us")),
                     "broker up: " + f(o.get("up_p50_us")), x(o.get("ratio_down_to_up_p50"))))
        rows.append(("Outage: post-call p99 µs, broker down", f(o.get("down_p99_us")),
                     "broker up: " + f(o.get("up_p99_us")),
                     x(ratio_(o.get("down_p99_us"), o.get("up_p99_us")))))
        rows.append(("Outage: broker back → first confirmed post, s (median; max)",
                     "%s; %s" % (f(o.get("first_confirmed_after_return_s"), 2),
                                 f(o.get("first_confirmed_after_return_s_max"), 2)), "", ""))
    elif "skipped" in o:
        rows.append(("Outage", "skipped: " + o["skipped"], "", ""))
    b = fig.get("backlog", {})
    if "posts" in b and "skipped" not in b:
        rows.append(("Backlog of %s posts (broker down): built at posts/s" % f(b.get("posts")),
                     f((b.get("build") or {}).get("posts_per_s")), "", ""))
        rows.append(("Backlog: daemon peak RSS MiB (VmHWM)", f(b.get("daemon_rss_peak_mib")),
                     "", ""))
        rows.append(("Backlog: disk used MiB (journal + spool, allocated)",
                     f((b.get("disk_bytes") or 0) / 2**20), "", ""))
        rows.append(("Backlog: drain posts/s once the broker is back",
                     f(b.get("drain_posts_per_s")),
                     "ceiling, %s messages: %s" % (f((b.get("ceiling") or {}).get("messages")),
                                                   f((b.get("ceiling") or {})
                                                     .get("messages_per_s"))),
                     x(b.get("ratio_drain_to_ceiling"))))
        rows.append(("Backlog: broker back → first confirmed post, s",
                     f(b.get("first_confirmed_after_return_s"), 2), "", ""))
    bl = fig.get("baselines", {})
    cp = bl.get("connection_per_post")
    if cp:
        rows.append(("Baseline: a broker connection per post, 8 processes: p50 µs; posts/s",
                     "%s; %s" % (f(cp.get("p50")), f(cp.get("per_s"))), "", ""))
    for k, label in (("retry_file_no_sync", "no sync"), ("retry_file_fdatasync", "fdatasync")):
        s = bl.get(k)
        if s:
            rows.append(("Baseline: a retry file per post (%s), 8 processes: p50 µs; posts/s; "
                         "files left; janitor posts/s" % label,
                         "%s; %s; %s; %s" % (f(s.get("p50")), f(s.get("per_s")),
                                             f(s.get("files_left_for_the_janitor")),
                                             f(s.get("janitor_drain_posts_per_s"))), "", ""))
    if rows:
        out.append("### End to end, outage, backlog, baselines")
        out.append("")
        out.append("| figure | value | anchor | ratio |")
        out.append("|---|---|---|---|")
        for row in rows:
            out.append("| %s |" % " | ".join(row))
        out.append("")
    errors = {k: v["error"] for k, v in fig.items() if isinstance(v, dict) and "error" in v}
    if errors:
        out.append("Figures that failed: " + "; ".join("%s: %s" % kv for kv in errors.items()))
        out.append("")
    return "\n".join(out)


def cost_table(c):
    """The daemon's own cost per post (suite.py fig_cost): figure, anchor of
    the same run, ratio, goal."""
    g = c.get("goals", {})
    rows = []
    for key, label in (("socket_same", "client and daemon on one CPU"),
                       ("socket_cross", "on two CPUs"),
                       ("socket_cross_no_broker", "on two CPUs, no broker (journaled, not "
                        "forwarded)")):
        s = c.get(key)
        if s is None:
            continue
        broker = s.get("broker_cpu_us_per_post")
        rows.append(("socket post p50 µs, %s" % label
                     + ("; the local broker's CPU µs per post: " + f(broker) if broker else ""),
                     f(s.get("p50_us")),
                     "bare SEQPACKET round trip, 280 B / 24 B: " + f(s.get("anchor_p50_us")),
                     x(s.get("ratio_p50_to_anchor")),
                     g.get(key, "not a goal: the daemon's path without the broker's work")))
    busy = c.get("socket_cross", {})
    if busy.get("busy_broker_anchor_p50_us") is not None:
        rows.append(("socket post p50 µs, on two CPUs (the row above), against the anchor "
                     "measured while the local broker is kept as busy",
                     f(busy.get("p50_us")),
                     "bare SEQPACKET round trip, 280 B / 24 B, while one rabbitmq-c publisher "
                     "on the daemon's CPU keeps the broker busy: "
                     + f(busy.get("busy_broker_anchor_p50_us")),
                     x(busy.get("ratio_p50_to_busy_broker_anchor")),
                     "not a goal: the broker's work on the same two CPUs, on both sides"))
    for key, label in (("socket_same", "until confirmed, same CPU"),
                       ("socket_cross", "until confirmed, cross CPU"),
                       ("socket_cross_no_broker", "cross CPU, no broker")):
        s = c.get(key)
        if s is None:
            continue
        cpu, anchor = s.get("daemon_cpu_us_per_post"), s.get("anchor_server_cpu_us_per_round_trip")
        rows.append(("daemon CPU µs per socket post, %s" % label,
                     f(cpu), "the bare server's CPU per round trip: " + f(anchor),
                     x(cpu / anchor if cpu and anchor else None),
                     g.get("daemon_cpu", "") if "no_broker" not in key else
                     "not a goal: without the forwarder's and the broker's work"))
        busy_cpu = s.get("busy_broker_anchor_server_cpu_us_per_round_trip")
        if busy_cpu is not None:
            rows.append(("daemon CPU µs per socket post, until confirmed, cross CPU (the row "
                         "above), against the anchor measured while the broker is kept as busy",
                         f(cpu), "the bare server's CPU per round trip, the broker busy: "
                         + f(busy_cpu), x(cpu / busy_cpu if cpu and busy_cpu else None),
                         "not a goal: the broker's work on the same two CPUs, on both sides"))
    d = c.get("drain", {})
    if "skipped" in d:
        rows.append(("backlog drain", "skipped: " + d["skipped"], "", "", g.get("drain", "")))
    elif d:
        rows.append(("backlog drain of %s posts, posts/s; forwarder CPU µs per message"
                     % f(d.get("posts")),
                     "%s; %s" % (f(d.get("drain_posts_per_s")),
                                 f(d.get("forwarder_cpu_us_per_post"), 2)),
                     "one rabbitmq-c publisher, confirms, window 1,000: "
                     + f(d.get("ceiling_per_s")), x(d.get("ratio_to_ceiling")),
                     g.get("drain", "")))
    p = c.get("process", {})
    if p:
        rows.append(("`postspool post` as a process, p50 ms of %s interleaved"
                     % f(p.get("count")), f(p.get("p50_ms"), 2),
                     "`true`: " + f(p.get("true_p50_ms"), 2), x(p.get("ratio_p50_to_true")),
                     g.get("process", "")))
        rows.append(("daemon CPU per post of those processes (one at a time, the daemon idle "
                     "in between), µs, all threads", f(p.get("daemon_cpu_us_per_post"), 1),
                     "", "", "not a goal: what a process that posts once costs the daemon"))
    r8 = c.get("ring_8", {})
    if r8:
        rows.append(("ring ingest, 8 producers, posts/s (median; each run)",
                     "%s; %s" % (f(r8.get("journaled_per_s")),
                                 ", ".join(f(r.get("journaled_per_s")) for r in r8.get("runs", []))),
                     "", "", g.get("ring_8", "")))
    r1 = c.get("ring_1", {})
    if r1:
        rows.append(("ring post p50 µs, 1 producer", f(r1.get("p50_us"), 2), "", "",
                     g.get("ring_1", "")))
    out = ["### The daemon's own cost per post, each figure beside its anchor", "",
           "| figure | postspool | anchor, same run | ratio | goal |", "|---|---|---|---|---|"]
    out += ["| %s |" % " | ".join(row) for row in rows]
    out.append("")
    reps = len(c.get("socket_same", {}).get("runs", []))
    if reps:
        out.append("The socket rows: %d repetitions, each run measured right after its anchor; "
                   "their p50 ratio is the median of the repetitions' ratios (the JSON also "
                   "has the ratio of the median p50s, `ratio_of_median_p50s`)." % reps)
        out.append("")
    return out


def ratio_(a, b):
    return a / b if a is not None and b else None


def plots(r, outdir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: matplotlib is not installed (python3-matplotlib): no plots",
              file=sys.stderr)
        return []
    made = []
    fig = r.get("figures", {})
    lat = fig.get("latency", {})
    if "runs" in lat:
        # Latency percentiles per transport (1 client, pinned) with the anchors.
        rows = []
        for key, s in lat["runs"].items():
            t, d, c, p = key.split("/")
            if c == "1":
                rows.append(("%s %s\n%s" % (t, d, p), s))
        for p in ("same", "cross"):
            a = lat["anchor"].get("1/" + p)
            if a:
                rows.append(("bare\nround trip\n" + p, a))
        pcts = ("p50", "p90", "p99", "p999")
        fig1, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4.5))
        width = 0.2
        for i, pc in enumerate(pcts):
            ax.bar([j + i * width for j in range(len(rows))],
                   [s.get(pc) or 0 for _, s in rows], width, label=pc)
        ax.set_xticks([j + 1.5 * width for j in range(len(rows))])
        ax.set_xticklabels([n for n, _ in rows], fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("post-call latency, µs (log)")
        ax.set_title("One client: post-call latency per transport and durability")
        ax.legend()
        fig1.tight_layout()
        path = os.path.join(outdir, "latency.png")
        fig1.savefig(path, dpi=80)
        plt.close(fig1)
        made.append(path)
        # Throughput against the number of clients.
        fig2, ax = plt.subplots(figsize=(7, 4.5))
        series = {}
        for key, s in lat["runs"].items():
            t, d, c, p = key.split("/")
            if p == "cross":
                continue
            series.setdefault("%s %s" % (t, d), []).append((int(c), s.get("per_s") or 0))
        anchor = [(int(k.split("/")[0]), a.get("per_s") or 0) for k, a in lat["anchor"].items()
                  if not k.endswith("cross")]
        series["bare round trip"] = anchor
        for name, pts in series.items():
            pts.sort()
            ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=name,
                    linestyle="--" if name.startswith("bare") else "-")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent client processes")
        ax.set_ylabel("posts/s accepted")
        ax.set_title("Throughput against the number of clients")
        ax.legend(fontsize=8)
        fig2.tight_layout()
        path = os.path.join(outdir, "throughput.png")
        fig2.savefig(path, dpi=80)
        plt.close(fig2)
        made.append(path)
    b = fig.get("backlog", {})
    if b.get("series"):
        fig3, ax = plt.subplots(figsize=(7, 4.5))
        ts = [t for t, _ in b["series"]]
        cs = [c for _, c in b["series"]]
        ax.plot(ts, cs, label="postspoold: confirmed posts")
        cr = (b.get("ceiling") or {}).get("messages_per_s")
        first = b.get("first_confirmed_after_return_s") or 0
        if cr:
            end = first + b["posts"] / cr
            ax.plot([first, end], [0, b["posts"]], linestyle="--",
                    label="broker ceiling (%.0f/s)" % cr)
        ax.set_xlabel("seconds since the broker came back")
        ax.set_ylabel("posts confirmed")
        ax.set_title("Drain of a backlog of %s posts" % "{:,}".format(b["posts"]))
        ax.legend()
        fig3.tight_layout()
        path = os.path.join(outdir, "drain.png")
        fig3.savefig(path, dpi=80)
        plt.close(fig3)
        made.append(path)
    return made


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        results = json.load(fh)
    outdir = sys.argv[2] if len(sys.argv) > 2 else os.path.dirname(sys.argv[1])
    for p in plots(results, outdir):
        print(p)
