#!/usr/bin/env bash
# The run command: on a fresh Debian 12 machine, as root, installs what is
# needed, builds, starts a RabbitMQ on loopback if none answers on
# localhost:5672, starts postspoold on its defaults, posts a few posts with
# the `postspool` tool and shows them arriving at a queue bound to the
# exchange. Leaves the daemon (and the broker it started) running;
# `./scripts/run-local.sh stop` stops them.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
state="$root/run"           # pid files and logs of what this script started
mkdir -p "$state"

stop() {
  for name in postspoold rabbitmq; do
    if [ -f "$state/$name.pid" ] && kill -0 "$(cat "$state/$name.pid")" 2>/dev/null; then
      echo "stopping $name (pid $(cat "$state/$name.pid"))"
      kill -TERM "$(cat "$state/$name.pid")"
      for _ in $(seq 1 100); do kill -0 "$(cat "$state/$name.pid")" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$state/$name.pid"
  done
}
if [ "${1:-}" = "stop" ]; then stop; exit 0; fi

./scripts/install-deps.sh
[ -d build ] || meson setup build >/dev/null
ninja -C build >/dev/null
echo "built: build/daemon/postspoold, build/client-lib/tools/postspool"

broker_up() { (exec 3<>/dev/tcp/127.0.0.1/5672) 2>/dev/null; }
if broker_up; then
  echo "a broker answers on localhost:5672; using it"
else
  echo "starting RabbitMQ on 127.0.0.1:5672 (data in $state/rabbitmq)"
  mkdir -p "$state/rabbitmq"
  (
    export HOME="$state/rabbitmq" RABBITMQ_NODENAME="postspool-demo@localhost" \
      RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT=5672 \
      RABBITMQ_MNESIA_BASE="$state/rabbitmq/mnesia" RABBITMQ_LOG_BASE="$state/rabbitmq/log" \
      RABBITMQ_ENABLED_PLUGINS_FILE="$state/rabbitmq/enabled_plugins" \
      RABBITMQ_PID_FILE="$state/rabbitmq/rabbitmq.pid"
    echo "[]." > "$state/rabbitmq/enabled_plugins"
    setsid /usr/lib/rabbitmq/bin/rabbitmq-server > "$state/rabbitmq/console.log" 2>&1 &
    echo $! > "$state/rabbitmq.pid"
  )
  for _ in $(seq 1 120); do broker_up && break; sleep 0.5; done
  broker_up || { echo "RabbitMQ did not start; see $state/rabbitmq/console.log" >&2; exit 1; }
fi

if [ -S /run/postspool/postspoold.sock ] && [ -f "$state/postspoold.pid" ] && kill -0 "$(cat "$state/postspoold.pid")" 2>/dev/null; then
  echo "postspoold already running (pid $(cat "$state/postspoold.pid"))"
else
  # Its defaults: socket /run/postspool/postspoold.sock, spool
  # /var/spool/postspool/incoming, journal /var/lib/postspool/journal,
  # broker amqp://guest:guest@localhost/, exchange xs_guest.
  build/daemon/postspoold > "$state/postspoold.log" 2>&1 &
  echo $! > "$state/postspoold.pid"
  echo "started postspoold (pid $!, log $state/postspoold.log)"
fi
for _ in $(seq 1 100); do
  grep -q '^postspool_broker_connected 1' /run/postspool/metrics.prom 2>/dev/null && break
  sleep 0.1
done

# A queue bound to the exchange with '#' (amqp-consume declares it, and it
# goes away with the consumer), to watch the posts arrive.
printf '#!/bin/sh\ncat\necho\n' > "$state/show-message.sh"   # one message body per line
chmod +x "$state/show-message.sh"
amqp-consume --server localhost --port 5672 -q postspool-demo -e xs_guest -r '#' -c 3 \
  "$state/show-message.sh" > "$state/demo-received.txt" 2>&1 &
consumer=$!
sleep 1

for i in 1 2 3; do
  build/client-lib/tools/postspool post --rel-path "demo/run-local/file$i.txt" --size $((i * 100)) --mode 644
done
for _ in $(seq 1 100); do kill -0 $consumer 2>/dev/null || break; sleep 0.1; done
kill $consumer 2>/dev/null || true
echo "--- arrived at queue postspool-demo (exchange xs_guest, binding '#'):"
cat "$state/demo-received.txt"
echo "--- postspoold is running: log $state/postspoold.log, metrics /run/postspool/metrics.prom"
echo "--- stop it (and the broker this script started): ./scripts/run-local.sh stop"
