#!/usr/bin/env python3
"""Draws e2e_bench's JSON as a PNG: posts/s of each path, and the latency
percentiles of a post call.

    python3 bench/e2e/plot.py bench-e2e.json bench-e2e.png

Needs matplotlib (Debian: python3-matplotlib). Without it, it says so and
exits 0: the plot is optional, the JSON and the table are the results.
"""
import json
import sys

RATES = [
    # (key in summary.posts_per_s, label, colour)
    ("broker_ceiling", "broker ceiling\n{ceiling} msgs", "tab:gray"),
    ("broker_ceiling_like_for_like", "broker ceiling\nfirst {like} msgs", "tab:gray"),
    ("postspool_end_to_end", "postspool\nend to end", "tab:blue"),
    ("postspool_accept", "postspool\naccept", "tab:cyan"),
    ("spool_accept", "spool\naccept", "tab:green"),
    ("spool_adopt_and_publish", "spool adoption\n+ publish", "tab:olive"),
    ("per_post_connection", "connection\nper post", "tab:red"),
]

LATENCIES = [
    # (key in summary.latency_ms, label)
    ("postspool_socket", "postspool, socket"),
    ("spool", "postspool, spool (no daemon)"),
    ("per_post_connection", "connection per post"),
]

PERCENTILES = ["p50", "p90", "p99", "max"]


def main(argv):
    if len(argv) != 3:
        print("usage: plot.py RESULTS.json OUT.png", file=sys.stderr)
        return 2
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: matplotlib is not installed (Debian: apt install python3-matplotlib); "
              "no plot drawn")
        return 0

    with open(argv[1]) as f:
        results = json.load(f)
    summary = results["summary"]
    machine = results.get("machine", {})
    config = results.get("config", {})

    fig, (ax_rate, ax_lat) = plt.subplots(1, 2, figsize=(16, 6))
    title = "postspool e2e_bench: {} cores, {}, RabbitMQ {}, io backend {}, budget {} ms".format(
        machine.get("nproc", "?"), machine.get("kernel", "?"),
        machine.get("rabbitmq_version", "?"), machine.get("daemon_io_backend", "?") or "?",
        config.get("budget_ms", "?"))
    fig.suptitle(title, fontsize=10)

    ceiling = results.get("broker_ceiling", {})
    names = {"ceiling": "{:,}".format(ceiling.get("messages", 0)),
             "like": "{:,}".format(ceiling.get("like_for_like_messages", 0))}
    rates = [(label.format(**names), summary["posts_per_s"].get(key) or 0, colour)
             for key, label, colour in RATES if key in summary["posts_per_s"]]
    values = [value for _, value, _ in rates]
    bars = ax_rate.bar(range(len(values)), values, color=[colour for _, _, colour in rates])
    ax_rate.set_xticks(range(len(values)))
    ax_rate.set_xticklabels([label for label, _, _ in rates], fontsize=8)
    ax_rate.set_yscale("log")
    ax_rate.set_ylabel("posts/s (log scale)")
    ax_rate.set_title("throughput")
    for bar, value in zip(bars, values):
        if value > 0:
            ax_rate.annotate("{:,.0f}".format(value), (bar.get_x() + bar.get_width() / 2, value),
                             ha="center", va="bottom", fontsize=8)

    width = 0.8 / len(PERCENTILES)
    for i, p in enumerate(PERCENTILES):
        ys = [max(summary["latency_ms"].get(key, {}).get(p) or 0, 1e-3) for key, _ in LATENCIES]
        xs = [x + (i - (len(PERCENTILES) - 1) / 2) * width for x in range(len(LATENCIES))]
        ax_lat.bar(xs, ys, width=width, label=p)
    ax_lat.set_xticks(range(len(LATENCIES)))
    ax_lat.set_xticklabels([label for _, label in LATENCIES], fontsize=8)
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("post call latency, ms (log scale)")
    ax_lat.set_title("latency of one post call")
    ax_lat.legend()

    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    print("plot.py: wrote " + argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
