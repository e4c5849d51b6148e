#!/usr/bin/env bash
# The test command: installs what is needed (Debian 12, as root), then builds
# and runs every test in three builds:
#   build/       g++, optimised with assertions
#   build-san/   g++ with AddressSanitizer + UndefinedBehaviorSanitizer
#   build-fuzz/  clang with libFuzzer (+ ASan/UBSan); builds the fuzz targets
#                and runs each for FUZZ_SECONDS (default 20) on the seed
#                corpus in the repo
# Ends with one line "tests: N passed, N failed, N skipped" over all builds.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh

export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1"
fuzz_seconds="${FUZZ_SECONDS:-20}"
status=0

setup() {  # dir, then meson options
  local dir="$1"; shift
  if [ -d "$dir" ]; then
    meson setup --reconfigure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
}

run() {  # dir, then meson test options
  local dir="$1"; shift
  echo "=== $dir: build"
  ninja -C "$dir" >/dev/null || { echo "=== $dir: BUILD FAILED"; ninja -C "$dir" | tail -50; status=1; return; }
  echo "=== $dir: test"
  meson test -C "$dir" --print-errorlogs "$@" || status=1
}

# Warnings are errors here (the default is off, for packagers' builds).
setup build -Dwerror=true
run build

# -g1: line tables only, enough for the sanitizers' stack traces. Full debug
# information made this build's compile and link the longest step of the run.
setup build-san -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false -Dbench=false \
  -Dcpp_args=-g1 -Dc_args=-g1
# The packaging suite builds and installs the packages: once, in build/, is enough.
# The interop suite checks the wire format against the real sr3 subscriber, and
# the cluster suite (three RabbitMQ nodes, minutes of faults) the broker
# protocol, not memory safety: the sanitizers add nothing to them but time,
# so they run in build/ only, and their programs are not built here (meson
# test builds what the tests it runs need).
echo "=== build-san: build what the tests need, and test"
meson test -C build-san --print-errorlogs --no-suite packaging --no-suite interop --no-suite cluster \
  || status=1

CC=clang-14 CXX=clang++-14 setup build-fuzz -Dwerror=true -Dfuzz=true -Dfuzz_seconds="$fuzz_seconds" \
  -Db_sanitize=address,undefined -Db_lundef=false -Dbench=false
# Only the fuzz targets are built here (meson test builds what the tests it
# runs need): the rest of the project in clang with ASan would take minutes
# and run nothing that build-san does not run already.
echo "=== build-fuzz: build the fuzz targets and test"
meson test -C build-fuzz --print-errorlogs --suite fuzz || status=1

python3 scripts/test_summary.py build build-san build-fuzz || status=1
exit $status
