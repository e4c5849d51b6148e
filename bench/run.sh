#!/usr/bin/env bash
# The postspool benchmark suite, one command:
#
#   ./bench/run.sh [--broker amqp://user:pass@host:port/] [--quick | --smoke] [--out DIR]
#                  [more suite.py flags, e.g. --reps 5 --backlog 200000 --only latency,outage]
#
# Builds a release build (build-rel/, or $BENCH_BUILD_DIR), starts RabbitMQ on
# loopback (its own data directory, free ports; stopped at the end) unless
# --broker is given, runs every figure, prints the Markdown table and writes
# DIR/results.json, DIR/results.md and DIR/*.png (default DIR:
# $build/bench-results). bench/README.md says what each figure means.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(dirname "$here")
build=${BENCH_BUILD_DIR:-$src/build-rel}
out=$build/bench-results
size=full
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) size=quick ;;
    --smoke) size=smoke ;;
    --out) out=$2; shift ;;
    --out=*) out=${1#--out=} ;;
    *) args+=("$1") ;;
  esac
  shift
done
if [ -z "${BENCH_NO_BUILD:-}" ]; then
  if [ ! -d "$build" ]; then
    # -Wno-error=restrict: GCC 12's false -Wrestrict at -O3 (see bench/e2e/README.md).
    meson setup "$build" "$src" --buildtype=release -Dcpp_args=-Wno-error=restrict >/dev/null
  fi
  ninja -C "$build" -j"${BENCH_JOBS:-2}" daemon/postspoold client-lib/tools/postspool \
    bench/e2e/bench_tool bench/ring/ring_bench >/dev/null
fi
mkdir -p "$out"
# Debian's python3, where python3-matplotlib is (not a pyenv or venv one).
py=${BENCH_PYTHON:-/usr/bin/python3}
[ -x "$py" ] || py=python3
"$py" "$here/suite.py" --tool "$build/bench/e2e/bench_tool" \
  --postspoold "$build/daemon/postspoold" --ring-bench "$build/bench/ring/ring_bench" --cli "$build/client-lib/tools/postspool" \
  --size "$size" --out "$out" ${args[@]+"${args[@]}"}
"$py" "$here/report.py" "$out/results.json" "$out"
