#!/usr/bin/env bash
# libpostspool-shim's cost, measured side by side in one run:
#  - the wall time of one process writing 1,000 small files (open, write,
#    close), of 200 separate `cp` runs (a bash loop), and of a user's job of
#    about 15 programs (the job of tests/shim's JobRunsPromptly tests, whose
#    timing is measured here and not asserted there: a threshold flakes
#    under load);
#  - each without the shim, with the shim (identity sha512, the default), and
#    with the shim posting no checksum (identity cod), against a running
#    postspoold (socket transport), and with the daemon down (spool);
#  - the time per post the shim adds: (with - without) / posts;
#  - the checksum's own cost per MiB, sha512 and md5 (nettle, the shim's code).
# Each figure is the median of REPEAT runs (default 5).
#
# Measure an optimised build. In a sanitizer build every program the shim is
# loaded into also loads the sanitizer runtimes, and the instrumented
# libpostspool.so carries about 120,000 relocations (against about 500) that
# the loader applies at each process start: some 20 ms of CPU and 1,100 page
# faults per program, which is neither the shim's nor a post's cost.
#
#   bench/shim/run.sh [BUILD_DIR]        (default: build)
#
# The daemon runs with a broker URL nobody listens on: it journals the posts
# and retries the broker in the background, so what is measured is the
# client side (the broker's own throughput is bench/e2e's subject).
set -euo pipefail

build=$(realpath "${1:-build}")
repeat=${REPEAT:-5}
shim="$build/client-lib/shim/libpostspool-shim.so"
tool="$build/bench/shim/shim_bench_tool"
daemon="$build/daemon/postspoold"
for f in "$shim" "$tool" "$daemon"; do
  [ -e "$f" ] || { echo "run.sh: $f is missing (ninja -C $build)" >&2; exit 1; }
done

root=$(mktemp -d /tmp/postspool-shim-bench-XXXXXX)
daemon_pid=
cleanup() {
  if [ -n "$daemon_pid" ]; then kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; fi
  rm -rf "$root"
}
trap cleanup EXIT
mkdir -p "$root/run" "$root/spool/incoming" "$root/spool/quarantine" "$root/journal" \
         "$root/down-spool" "$root/work"
cat > "$root/postspoold.conf" <<CONF
socket_path = $root/run/postspoold.sock
control_socket_path = $root/run/control.sock
spool_dir = $root/spool/incoming
quarantine_dir = $root/spool/quarantine
journal_dir = $root/journal
post_broker = amqp://guest:guest@127.0.0.1:9/
post_exchange = xs_bench
CONF
"$daemon" --config "$root/postspoold.conf" > "$root/postspoold.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$root/run/postspoold.sock" ] && break; sleep 0.1; done
[ -S "$root/run/postspoold.sock" ] || { echo "run.sh: postspoold did not start" >&2; cat "$root/postspoold.log" >&2; exit 1; }

# Runs "$@" in configuration $1: none (no shim), sha512, cod (the shim, no
# checksum), down (the shim with the daemon down: the spool).
run_as() {
  local config=$1
  shift
  local sock="$root/run/postspoold.sock" spool="$root/spool/incoming"
  local options="post_baseDir $root/work"
  case "$config" in
    none) "$@"; return ;;
    cod) options="$options; identity cod" ;;
    down) sock="$root/run/none.sock"; spool="$root/down-spool" ;;
  esac
  env LD_PRELOAD="$shim" POSTSPOOL_SHIM_OPTIONS="$options" POSTSPOOL_SOCKET="$sock" \
      POSTSPOOL_SPOOL_DIR="$spool" "$@"
}

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# Writing 1,000 files of 100 bytes from one process.
write_once() {
  rm -rf "$root/work/w"; mkdir -p "$root/work/w"
  run_as "$1" "$tool" write "$root/work/w" 1000 100
}
# 200 separate cp runs of a 100-byte file.
cp_once() {
  rm -rf "$root/work/c"; mkdir -p "$root/work/c"
  head -c 100 /dev/zero > "$root/src"
  local start end
  start=$(date +%s.%N)
  run_as "$1" bash -c 'for i in $(seq 200); do cp "$1" "$2/d$i"; done' bash "$root/src" "$root/work/c"
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN {printf "%.6f\n", b - a}'
}

# A user's job: coreutils, bash, dd, python3 and a 1,000-file writer, as the
# shim tests' JobRunsPromptly run it.
job_once() {
  rm -rf "$root/work/j"; mkdir -p "$root/work/j"
  local start end
  start=$(date +%s.%N)
  run_as "$1" bash -c 'set -e; cd "$1"; seq 1 5000 > a; cp a b; mv b c; ln -s c d; ln c e; rm d
    mkdir -p x/y; echo hi > x/y/z; bash -c "echo w > w"; dd if=a of=f bs=4096 status=none
    /usr/bin/python3 -c "open(\"p\", \"w\").write(\"p\")"; "$2" write . 40 100; rm -rf x; touch done' \
    bash "$root/work/j" "$tool" > /dev/null
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN {printf "%.6f\n", b - a}'
}

declare -A write_s cp_s job_s
for config in none sha512 cod down; do
  write_s[$config]=$(for _ in $(seq "$repeat"); do write_once "$config"; done | median)
  cp_s[$config]=$(for _ in $(seq "$repeat"); do cp_once "$config"; done | median)
  job_s[$config]=$(for _ in $(seq "$repeat"); do job_once "$config"; done | median)
done

head -c $((64 << 20)) /dev/urandom > "$root/big"
checksum=$("$tool" checksum "$root/big")

printf '%s\n' "libpostspool-shim cost ($(nproc) cores, $(uname -r), median of $repeat runs)"
printf '%-34s %12s %12s %12s %14s\n' "" "1000 files" "200 cp" "a job" "per post"
printf '%-34s %10.3f s %10.3f s %10.3f s %14s\n' "no shim" "${write_s[none]}" "${cp_s[none]}" "${job_s[none]}" "-"
for config in sha512 cod down; do
  case $config in
    sha512) label="shim, daemon up, sha512" ;;
    cod) label="shim, daemon up, no checksum (cod)" ;;
    down) label="shim, daemon down (spool), sha512" ;;
  esac
  per_write=$(awk -v a="${write_s[$config]}" -v b="${write_s[none]}" 'BEGIN {print (a - b) * 1e6 / 1000}')
  per_cp=$(awk -v a="${cp_s[$config]}" -v b="${cp_s[none]}" 'BEGIN {print (a - b) * 1e6 / 200}')
  printf '%-34s %10.3f s %10.3f s %10.3f s %5.1f / %5.0f us\n' "$label" "${write_s[$config]}" "${cp_s[$config]}" "${job_s[$config]}" "$per_write" "$per_cp"
done
echo "(per post: the 1000-file writer / one cp process, which also loads the shim and connects)"
echo "checksum cost, 64 MiB file in the page cache:"
echo "$checksum" | sed 's/^/  /'
