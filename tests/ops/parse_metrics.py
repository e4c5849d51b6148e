#!/usr/bin/env python3
"""Parses Prometheus text-format metrics (a file, or stdin with "-") with the
reference parser (prometheus_client.parser), checks postspool's naming
conventions and that every metric has its # HELP line, and prints one "name value" line per sample.

Exit 0 if every line parsed and every name follows the conventions; 1 with
the reason on stderr otherwise. Used by tests/ops/ops_test.cc.
"""
import re
import sys

from prometheus_client.parser import text_string_to_metric_families

NAME = re.compile(r"^postspool_[a-z][a-z0-9_]*$")


def main() -> int:
    path = sys.argv[1]
    text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    if not text.endswith("\n"):
        print("the text does not end with a newline", file=sys.stderr)
        return 1
    problems = []
    # The parser normalises counter names (it adds _total), so the TYPE
    # lines are checked as written.
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) == 4 and parts[3] == "counter" and not parts[2].endswith("_total"):
                problems.append(f"{parts[2]}: a counter whose name does not end in _total")
    samples = 0
    seen = set()
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples += 1
                if s.name in seen:
                    problems.append(f"{s.name}: more than one sample")
                seen.add(s.name)
                if not NAME.match(s.name):
                    problems.append(f"{s.name}: not postspool_ and snake case")
                if family.type == "counter" and not s.name.endswith("_total"):
                    problems.append(f"{s.name}: a counter whose name does not end in _total")
                if family.type == "gauge" and s.name.endswith("_total"):
                    problems.append(f"{s.name}: a gauge named like a counter")
                if not family.documentation.strip():
                    problems.append(f"{s.name}: no # HELP line")
                if family.type not in ("counter", "gauge"):
                    problems.append(f"{s.name}: type {family.type} (no TYPE line?)")
                if s.value < 0 or s.value != int(s.value):
                    problems.append(f"{s.name}: value {s.value} is not a count")
                print(f"{s.name} {int(s.value)}")
    except ValueError as e:  # the parser's error for malformed text
        print(f"parse error: {e}", file=sys.stderr)
        return 1
    if samples == 0:
        problems.append("no samples")
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
