#!/bin/sh
# Runs one libFuzzer target over a fresh, temporary output corpus and then
# the seed corpus kept in the repository. libFuzzer writes the inputs it
# finds to the FIRST corpus directory, so the seed corpus must not be first:
# the repository stays unchanged. Crashing inputs go to <artifact dir>.
#
# usage: run_fuzz.sh <fuzzer> <seed corpus dir> <artifact dir> [libFuzzer options...]
# e.g.   run_fuzz.sh ./fuzz_segment_reader tests/fuzz/corpus/fuzz_segment_reader \
#            /tmp/artifacts -max_total_time=20
# Exits with the fuzzer's status, except that libFuzzer's default error
# status 77 means "skipped" to meson and the TAP/automake conventions: the
# fuzzer is told to use 1 instead, and a 77 that still comes back becomes 1.
set -u

if [ $# -lt 3 ]; then
  echo "usage: $0 <fuzzer> <seed corpus dir> <artifact dir> [libFuzzer options...]" >&2
  exit 2
fi
fuzzer=$1
seed_dir=$2
artifact_dir=$3
shift 3

if [ ! -d "$seed_dir" ]; then
  echo "$0: no seed corpus at $seed_dir" >&2
  exit 2
fi
mkdir -p "$artifact_dir" || exit 2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/postspool-fuzz.XXXXXX") || exit 2
trap 'rm -rf "$tmp"; exit 143' TERM
trap 'rm -rf "$tmp"; exit 130' INT

"$fuzzer" -artifact_prefix="$artifact_dir/" -error_exitcode=1 -timeout_exitcode=1 "$@" \
  "$tmp" "$seed_dir"
status=$?
rm -rf "$tmp"
if [ "$status" -eq 77 ]; then
  status=1
fi
if [ "$status" -ne 0 ]; then
  echo "$0: $fuzzer failed with status $status; a crashing input, if any, is in $artifact_dir" >&2
fi
exit "$status"
