#!/usr/bin/env bash
# Installs the Debian 12 packages postspool needs to build, test and run.
# Run as root. Skips apt entirely when everything is already installed.
set -euo pipefail

packages=(
  # build
  meson ninja-build pkg-config g++ python3
  # libraries (and flatc, which generates code at build time)
  liburing-dev librabbitmq-dev libxxhash-dev libflatbuffers-dev flatbuffers-compiler
  # man pages
  scdoc
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # the postspool tool and the daemon's control socket: JSON in and out
  nlohmann-json3-dev
  # fuzzing: clang with libFuzzer and the sanitizer runtimes
  clang-14 libclang-rt-14-dev
  # the broker the integration tests and the run command start on loopback
  rabbitmq-server amqp-tools
  # the packaging test (tests/packaging): build, check and install the packages
  debhelper lintian rpm fakeroot
  # the benchmark suite (bench/run.sh): its plots, the daemon's syscall counts
  python3-matplotlib linux-perf strace
  # libpostspool-shim hashes with nettle (static, hidden); its tests run
  # rsync and a gfortran-built program under it (coreutils, tar, bash and
  # python3 are in every Debian system already)
  nettle-dev rsync gfortran
  # the metrics test parses the Prometheus text format with its reference parser
  python3-prometheus-client
  # tests/interop runs the unmodified sr3 subscriber of
  # ../shared/third_party/sarracenia with Debian's python3 (its README)
  python3-amqp python3-appdirs python3-humanfriendly python3-humanize
  python3-jsonpickle python3-psutil python3-paramiko python3-watchdog python3-xattr
  python3-magic python3-netifaces python3-dateparser python3-pkg-resources python3-requests
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages are installed"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}" >&2
  echo "install-deps: run as root (or: sudo apt-get install ${missing[*]})" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The package's own service is not wanted: tests start their own broker.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}"
