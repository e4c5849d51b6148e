// ring_bench: the per-uid shared-memory ring against the socket and the
// spool, measured side by side in one run (issue 7's figures). Starts its
// own postspoold (tests/e2e's DaemonProcess) with a broker URL nobody
// listens on: what is measured is the post call and the daemon's ingest
// (posts journaled per second), not publishing. Not a test: it prints a
// Markdown table and never fails on a threshold.
//
//   ring_bench [--posts N] [--quick] [--only-ring CLIENTS] [--only-start]
//
// 1. Post-call latency (p50, p99, p99.9) and posts/s of one client process
//    per transport: ring (the default path: a process's first post takes
//    the socket, the rest its lane), socket (use_ring = 0), spool
//    (socket_share_pct = 0).
// 2. The daemon's ingest through the ring with 1, 8 and 64 producer
//    processes: posts journaled per second, from the release of the
//    producers to the daemon's counter reaching every post, and the
//    daemon's CPU time per post over that interval.
// 3. The idle daemon's CPU use over 10 s.
// 4. Processes that start together on a fresh daemon (no ring made yet),
//    each posting 2,000 posts with the default 5 ms budget and no warm-up:
//    the share of posts that took the ring (issue 18.4).
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "e2e/daemon_process.h"
#include "postspool.h"
#include "postspoold_path.h"

namespace {

using postspool::testing::DaemonProcess;

int64_t NowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// The CPU time of every thread of a process, in seconds, from
// /proc/<pid>/task/*/schedstat (nanoseconds on a CPU: the clock ticks of
// /proc/<pid>/stat, 10 ms, are too coarse for a run of a fraction of a
// second).
double CpuSeconds(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  double ns = 0;
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(tasks, ec)) {
    std::ifstream f(entry.path() / "schedstat");
    double on_cpu = 0;
    if (f >> on_cpu) ns += on_cpu;
  }
  return ns / 1e9;
}

struct Shared {
  std::atomic<int> go{0};
  std::atomic<int> ready{0};
};

// Latencies of one producer's calls, in a shared mapping the parent reads.
struct Calls {
  int64_t start_ns = 0, end_ns = 0;
  int64_t count = 0, failures = 0, ring = 0, socket = 0, spool = 0;
  int64_t latency_ns[1];  // `count` of them (the mapping is sized for it)
};

size_t CallsBytes(int64_t posts) { return sizeof(Calls) + sizeof(int64_t) * static_cast<size_t>(posts); }

void Producer(const DaemonProcess& d, Shared* shared, Calls* calls, int64_t posts, int use_ring,
              int share, uint32_t budget_ms, int index, bool cold) {
  postspool_options opt;
  postspool_options_init(&opt);
  const std::string socket = d.socket_path(), spool = d.spool_dir();
  opt.socket_path = socket.c_str();
  opt.spool_dir = spool.c_str();
  opt.budget_ms = budget_ms;
  opt.use_ring = use_ring;
  opt.socket_share_pct = static_cast<uint32_t>(share);
  postspool_client* client = nullptr;
  if (postspool_open(&opt, &client) != 0) ::_exit(2);
  const std::string rel_prefix = "bench/ring/p" + std::to_string(index) + "/run03/output/file";
  char rel[256];
  struct postspool_post post;
  postspool_post_init(&post);
  post.has_size = 1;
  post.has_mode = 1;
  post.mode = 0644;
  // Two posts before the clock: the first takes the socket, the second
  // asks for the ring (as any process's do). A cold start has none.
  for (int i = 0; i < (cold ? 0 : 2); ++i) {
    std::snprintf(rel, sizeof rel, "%s-warm%d.nc", rel_prefix.c_str(), i);
    post.rel_path = rel;
    postspool_post(client, &post, nullptr);
  }
  shared->ready.fetch_add(1);
  while (shared->go.load() == 0) ::sched_yield();
  calls->start_ns = NowNs();
  for (int64_t i = 0; i < posts; ++i) {
    std::snprintf(rel, sizeof rel, "%s%06" PRId64 ".nc", rel_prefix.c_str(), i);
    post.rel_path = rel;
    post.size = static_cast<uint64_t>(i);
    postspool_post_result result;
    const int64_t t0 = NowNs();
    const int rc = postspool_post(client, &post, &result);
    calls->latency_ns[i] = NowNs() - t0;
    if (rc != 0) {
      ++calls->failures;
    } else if (result.transport == POSTSPOOL_TRANSPORT_RING) {
      ++calls->ring;
    } else if (result.transport == POSTSPOOL_TRANSPORT_SOCKET) {
      ++calls->socket;
    } else {
      ++calls->spool;
    }
  }
  calls->end_ns = NowNs();
  calls->count = posts;
  postspool_close(client);
  ::_exit(0);
}

struct RunResult {
  int64_t posts = 0, failures = 0, ring = 0, socket = 0, spool = 0;
  double p50_us = 0, p99_us = 0, p999_us = 0;
  double client_posts_per_s = 0;  // per client, mean
  double journaled_per_s = 0;     // the daemon's
  double daemon_cpu_us_per_post = 0;
  double seconds = 0;
};

// The posts the daemon journaled, asked now over its control socket (the
// `metrics` request): the metrics file is written every
// metrics_interval_ms, and waiting for it would add up to that interval to
// the measured time (100 ms against 0.3 s for 400,000 ring posts). Falls
// back to the file if the control socket does not answer.
uint64_t Journaled(const DaemonProcess& d) {
  std::string text;
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string path = d.control_socket_path();
  const timeval timeout{2, 0};
  if (fd >= 0 && path.size() < sizeof addr.sun_path) {
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    const std::string request = "{\"request\":\"metrics\"}\n";
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0 &&
        ::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
            static_cast<ssize_t>(request.size())) {
      std::string reply;
      char buf[16384];
      ssize_t n;
      while (reply.find('\n') == std::string::npos && (n = ::read(fd, buf, sizeof buf)) > 0) {
        reply.append(buf, static_cast<size_t>(n));
      }
      const nlohmann::json j = nlohmann::json::parse(reply, nullptr, false);
      if (j.is_object() && j.value("ok", false) && j.contains("text") && j["text"].is_string()) {
        text = j["text"].get<std::string>();
      }
    }
  }
  if (fd >= 0) ::close(fd);
  std::map<std::string, uint64_t> m;
  if (text.empty()) {
    m = d.Metrics();
  } else {
    std::istringstream lines(text);
    m = DaemonProcess::ParseMetrics(lines);
  }
  return m["ring_posts_journaled_total"] + m["socket_posts_journaled_total"] +
         m["spool_posts_journaled_total"];
}

RunResult Run(const DaemonProcess& d, int producers, int64_t per_producer, int use_ring, int share,
              uint32_t budget_ms, bool cold = false) {
  auto* shared = static_cast<Shared*>(
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  new (shared) Shared();
  std::vector<Calls*> calls;
  std::vector<pid_t> pids;
  const uint64_t before = Journaled(d);
  for (int p = 0; p < producers; ++p) {
    void* m = ::mmap(nullptr, CallsBytes(per_producer), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    calls.push_back(static_cast<Calls*>(m));
    const pid_t pid = ::fork();
    if (pid == 0) Producer(d, shared, calls.back(), per_producer, use_ring, share, budget_ms, p, cold);
    pids.push_back(pid);
  }
  while (shared->ready.load() < producers) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The warm-up posts are journaled before the clock starts.
  const uint64_t warm = before + (cold ? 0 : 2ull * static_cast<uint64_t>(producers));
  for (int i = 0; i < 500 && Journaled(d) < warm; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const double cpu0 = CpuSeconds(d.pid());
  const int64_t t0 = NowNs();
  shared->go.store(1);
  for (pid_t pid : pids) ::waitpid(pid, nullptr, 0);
  // The daemon has journaled everything (asked every millisecond).
  const uint64_t want = warm + static_cast<uint64_t>(producers) * static_cast<uint64_t>(per_producer);
  int64_t t1 = NowNs();
  uint64_t got = 0;
  while ((got = Journaled(d)) < want && NowNs() - t1 < 60'000'000'000) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  t1 = NowNs();
  const double cpu1 = CpuSeconds(d.pid());
  RunResult r;
  std::vector<int64_t> all;
  double rate_sum = 0;
  for (Calls* c : calls) {
    r.posts += c->count;
    r.failures += c->failures;
    r.ring += c->ring;
    r.socket += c->socket;
    r.spool += c->spool;
    all.insert(all.end(), c->latency_ns, c->latency_ns + c->count);
    rate_sum += static_cast<double>(c->count) / (static_cast<double>(c->end_ns - c->start_ns) / 1e9);
    ::munmap(c, CallsBytes(per_producer));
  }
  ::munmap(shared, sizeof(Shared));
  std::sort(all.begin(), all.end());
  auto pct = [&](double q) {
    return all.empty() ? 0.0 : static_cast<double>(all[static_cast<size_t>(q * static_cast<double>(all.size() - 1))]) / 1000.0;
  };
  r.p50_us = pct(0.5);
  r.p99_us = pct(0.99);
  r.p999_us = pct(0.999);
  r.client_posts_per_s = rate_sum / producers;
  r.seconds = static_cast<double>(t1 - t0) / 1e9;
  r.journaled_per_s = static_cast<double>(got - warm) / r.seconds;
  r.daemon_cpu_us_per_post = (cpu1 - cpu0) * 1e6 / static_cast<double>(std::max<uint64_t>(got - warm, 1));
  if (got < want) std::fprintf(stderr, "ring_bench: the daemon journaled %" PRIu64 " of %" PRIu64 "\n", got - warm, want - warm);
  return r;
}

std::unique_ptr<DaemonProcess> StartDaemon(const std::string& lane_bytes,
                                           const std::string& metrics_interval = "100") {
  DaemonProcess::Options o;
  o.broker_url = "amqp://guest:guest@127.0.0.1:9/";  // nobody: ingest only
  o.exchange = "xs_ring_bench";
  o.extra_config = {"ring_lane_bytes = " + lane_bytes, "disk_bytes_max = 16 GiB",
                    "disk_bytes_per_uid_max = 16 GiB", "journal_segment_bytes_max = 256 MiB",
                    "log_level = warning", "metrics_interval_ms = " + metrics_interval};
  auto d = std::make_unique<DaemonProcess>(o);
  if (!d->Start()) {
    std::fprintf(stderr, "ring_bench: postspoold did not start\n");
    std::exit(1);
  }
  return d;
}

void Row(const char* what, const RunResult& r) {
  std::printf("| %s | %.2f | %.2f | %.2f | %.0f | %.0f | %.2f | ring %" PRId64 ", socket %" PRId64
              ", spool %" PRId64 ", failed %" PRId64 " |\n",
              what, r.p50_us, r.p99_us, r.p999_us, r.client_posts_per_s, r.journaled_per_s,
              r.daemon_cpu_us_per_post, r.ring, r.socket, r.spool, r.failures);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t posts = 200000;
  bool quick = false;
  int only_ring = 0;  // > 0: only the ring with this many clients (for profiling)
  bool only_start = false;  // only part 4, processes starting together
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--posts") == 0 && i + 1 < argc) posts = std::atoll(argv[++i]);
    else if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--only-ring") == 0 && i + 1 < argc) only_ring = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--only-start") == 0) only_start = true;
    else {
      std::fprintf(stderr, "usage: ring_bench [--posts N] [--quick] [--only-ring CLIENTS] [--only-start]\n");
      return 2;
    }
  }
  if (quick) posts = 5000;
  if (std::getenv("POSTSPOOLD") == nullptr) ::setenv("POSTSPOOLD", POSTSPOOLD_PATH, 0);
  ::signal(SIGPIPE, SIG_IGN);
  std::printf("ring_bench: %" PRId64 " posts per client run; %ld CPUs; no broker (ingest only)\n\n",
              posts, ::sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("| run | p50 µs | p99 µs | p99.9 µs | posts/s per client | daemon journaled/s | daemon CPU µs/post | transports |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  if (only_ring > 0) {
    auto d = StartDaemon("1 MiB");
    std::fprintf(stderr, "ring_bench: postspoold pid %d\n", static_cast<int>(d->pid()));
    Row("ring", Run(*d, only_ring, posts, 1, 60, 1000));
    d->Stop();
    return 0;
  }
  if (!only_start) {
    auto d = StartDaemon("1 MiB");
    Row("ring, 1 client", Run(*d, 1, posts, 1, 60, 1000));
    Row("socket, 1 client", Run(*d, 1, posts / 4, 0, 60, 1000));
    Row("spool, 1 client", Run(*d, 1, posts / 4, 0, 0, 1000));
    for (int producers : {8, 64}) {
      const int64_t each = std::max<int64_t>(posts / producers * (producers == 8 ? 4 : 2), 1000);
      Row(producers == 8 ? "ring, 8 clients" : "ring, 64 clients", Run(*d, producers, each, 1, 60, 1000));
    }
    d->Stop();
  }
  if (!only_start) {
    // Idle: a daemon whose rings were used (a producer posted, then went
    // away) and that now has nothing to do, with the default metrics
    // interval (5 s). The forwarder's reconnect attempts to the absent
    // broker (every 1.5 s at most) are part of the figure.
    auto d = StartDaemon("32 KiB", "5000");
    (void)Run(*d, 2, 1000, 1, 60, 1000);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const double c0 = CpuSeconds(d->pid());
    const int idle_s = quick ? 2 : 20;
    std::this_thread::sleep_for(std::chrono::seconds(idle_s));
    const double c1 = CpuSeconds(d->pid());
    std::printf("\nidle daemon (rings made, metrics every 5 s, no broker): %.3f s of CPU in %d s "
                "(%.3f %% of a CPU)\n", c1 - c0, idle_s, (c1 - c0) * 100.0 / idle_s);
    d->Stop();
  }
  std::printf("\nprocesses starting together on a fresh daemon, 2,000 posts each, 5 ms budget:\n\n");
  std::printf("| processes | posts | ring | socket | spool | failed | ring share |\n|---|---|---|---|---|---|---|\n");
  for (int producers : {16, 64}) {
    auto d = StartDaemon("32 KiB");
    const RunResult r = Run(*d, producers, quick ? 200 : 2000, 1, 60, 5, /*cold=*/true);
    std::printf("| %d | %" PRId64 " | %" PRId64 " | %" PRId64 " | %" PRId64 " | %" PRId64 " | %.1f %% |\n",
                producers, r.posts, r.ring, r.socket, r.spool, r.failures,
                100.0 * static_cast<double>(r.ring) / static_cast<double>(std::max<int64_t>(r.posts, 1)));
    std::fflush(stdout);
    d->Stop();
  }
  return 0;
}
