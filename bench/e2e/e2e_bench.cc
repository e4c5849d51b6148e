// e2e_bench: postspool end to end against a real RabbitMQ, side by side with
// the baselines (README.md says what each figure means and its caveats).
//
// One run, one broker (started here, on loopback, with its own data
// directory), one durable queue bound with '#' to a durable topic exchange,
// emptied before each phase:
//   0. warm-up: messages published and thrown away (a broker just started
//      is slower for its first seconds);
//   1. broker ceiling: one long-lived rabbitmq-c publisher, confirms, a
//      window of unconfirmed messages, persistent v03 messages;
//   2. postspool end to end: postspoold plus many short-lived client
//      processes posting through libpostspool;
//   3. spool fallback: client processes while no daemon runs, then the
//      daemon starts and adopts and publishes what they spooled;
//   4. baseline: processes that open a broker connection for every post.
// Prints a table; writes every figure, with the machine's description, as
// JSON. It measures and reports; it never fails on a figure.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_flags.h"
#include "bench_report.h"
#include "bench_results.h"
#include "broker/broker_fixture.h"
#include "confirmed_publisher.h"
#include "e2e/daemon_process.h"
#include "machine_info.h"
#include "postspool.h"
#include "postspoold_path.h"
#include "process_fleet.h"
#include "progress_poller.h"
#include "sample_post.h"

namespace postspool::bench {
namespace {

using ::postspool::testing::AmqpTestClient;
using ::postspool::testing::BrokerProcess;
using ::postspool::testing::DaemonProcess;

constexpr char kExchange[] = "xs_bench";
constexpr char kQueue[] = "q_bench_e2e";
constexpr char kBrokerUser[] = "guest";  // the "source" postspoold puts in bodies
constexpr int kRpcTimeoutMs = 30000;
// How often the harness samples the queue's depth and the daemon's metrics
// file while it waits for the broker: the resolution of the times measured
// by the queue's depth. The daemon rewrites its metrics file in its periodic
// work, every 100 ms at best (kPeriodicWork in daemon/daemon.cc, whatever
// metrics_interval_ms says), so times measured by its counters are late by
// up to kMetricsResolutionMs.
constexpr int kPollIntervalMs = 10;
constexpr int kMetricsResolutionMs = 100;

void Progress(const char* format, ...) __attribute__((format(printf, 1, 2)));
void Progress(const char* format, ...) {
  std::fprintf(stderr, "[e2e_bench] ");
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fputc('\n', stderr);
}

// ---------------------------------------------------------------------------
// The phases.

class Bench {
 public:
  explicit Bench(BenchFlags flags) : flags_(std::move(flags)) {}

  int Run();

 private:
  Status StartBroker();
  Status ResetQueue();
  DaemonProcess::Options DaemonOptions() const;
  CeilingResult RunCeiling();
  EndToEndResult RunEndToEnd();
  SpoolResult RunSpool();
  BaselineResult RunBaseline();

  BenchFlags flags_;
  MachineInfo machine_;
  BrokerProcess broker_;
  BrokerAddress address_;
  AmqpTestClient admin_;
  CeilingResult ceiling_;
  EndToEndResult e2e_;
  SpoolResult spool_;
  BaselineResult baseline_;
};

Status Bench::StartBroker() {
  std::string why;
  if (!BrokerProcess::Installed(&why)) {
    return Status(StatusCode::kNotFound, "RabbitMQ is not installed: " + why);
  }
  Progress("starting RabbitMQ (5-20 s)");
  const int64_t t0 = MonotonicNs();
  if (Status s = broker_.Start(); !s.ok()) return s;
  machine_.broker_start_s = Seconds(MonotonicNs() - t0);
  address_.port = broker_.amqp_port();
  Progress("RabbitMQ up on %s in %.1f s", broker_.url().c_str(), machine_.broker_start_s);
  if (Status s = admin_.Connect(broker_.url()); !s.ok()) return s;
  if (Status s = admin_.DeclareExchange(kExchange); !s.ok()) return s;
  AmqpConnection probe;
  if (Status s = probe.Open(address_, kRpcTimeoutMs); !s.ok()) return s;
  machine_.rabbitmq_version = probe.ServerProperty("version");
  machine_.rabbitmq_platform = probe.ServerProperty("platform");
  return Status::Ok();
}

// An empty durable queue bound with '#' to the exchange.
Status Bench::ResetQueue() {
  if (Status s = admin_.DeleteQueue(kQueue); !s.ok()) return s;
  return admin_.DeclareBoundQueue(kQueue, kExchange, "#");
}

DaemonProcess::Options Bench::DaemonOptions() const {
  DaemonProcess::Options o;
  o.broker_url = broker_.url();
  o.exchange = kExchange;
  o.io_backend = flags_.io_backend;
  o.durability = flags_.durability;
  o.extra_config = flags_.daemon_config;
  return o;
}

CeilingResult Bench::RunCeiling() {
  CeilingResult r;
  r.messages = static_cast<uint64_t>(flags_.ceiling_messages);
  r.window = flags_.ceiling_window;
  // The bodies and routing keys of the posts of 32 processes, encoded
  // before the clock starts: the figure is the broker's, not the encoder's.
  std::vector<v03::Encoded> messages;
  for (int i = 0; i < 1024; ++i) {
    messages.push_back(EncodeV03(MakeSamplePost(i % 32, i / 32), NewPostId(), kBrokerUser));
  }
  for (const v03::Encoded& m : messages) r.body_bytes_mean += static_cast<double>(m.body.size());
  r.body_bytes_mean /= static_cast<double>(messages.size());
  r.routing_key = messages[0].routing_key;
  ConfirmedPublisher::Options options;
  options.exchange = kExchange;
  options.window_max = r.window;

  // A freshly started broker is slower for its first seconds; every phase
  // runs after this warm-up (whose messages are then thrown away).
  if (flags_.warmup_messages > 0) {
    Progress("warming the broker up: %d messages", flags_.warmup_messages);
    ConfirmedPublisher warmup;
    Status s = ResetQueue();
    if (s.ok()) s = warmup.Open(address_, options);
    const int64_t t0 = MonotonicNs();
    for (int i = 0; i < flags_.warmup_messages && s.ok(); ++i) {
      const v03::Encoded& m = messages[static_cast<size_t>(i) % messages.size()];
      s = warmup.Publish(m.routing_key, m.body, MessageIdText(NewPostId()));
    }
    if (s.ok()) s = warmup.WaitForConfirms();
    r.warmup_messages_per_s = PerSecond(warmup.counters().acked, MonotonicNs() - t0);
    warmup.Close();
    if (!s.ok()) {
      r.error = "warm-up: " + s.ToString();
      return r;
    }
  }

  if (Status s = ResetQueue(); !s.ok()) {
    r.error = s.ToString();
    return r;
  }
  Progress("broker ceiling: %d messages, window %u", flags_.ceiling_messages, r.window);
  std::vector<std::string> ids;
  ids.reserve(r.messages);
  for (uint64_t i = 0; i < r.messages; ++i) ids.push_back(MessageIdText(NewPostId()));
  ConfirmedPublisher publisher;
  if (Status s = publisher.Open(address_, options); !s.ok()) {
    r.error = s.ToString();
    return r;
  }
  r.ran = true;
  std::vector<uint64_t> milestones;
  for (int tenth = 1; tenth <= 10; ++tenth) milestones.push_back(r.messages * tenth / 10);
  r.like_for_like_messages =
      std::min<uint64_t>(r.messages, uint64_t(flags_.clients) * uint64_t(flags_.posts_per_client));
  milestones.push_back(r.like_for_like_messages);
  std::sort(milestones.begin(), milestones.end());
  milestones.erase(std::unique(milestones.begin(), milestones.end()), milestones.end());
  size_t next_milestone = 0;
  const int64_t t0 = MonotonicNs();
  publisher.set_on_confirms([&](const PublishCounters& c) {
    const uint64_t settled = c.acked + c.nacked;
    while (next_milestone < milestones.size() && settled >= milestones[next_milestone]) {
      r.progress.emplace_back(milestones[next_milestone], Seconds(MonotonicNs() - t0));
      ++next_milestone;
    }
  });
  Status s;
  for (uint64_t i = 0; i < r.messages && s.ok(); ++i) {
    const v03::Encoded& m = messages[i % messages.size()];
    s = publisher.Publish(m.routing_key, m.body, ids[i]);
  }
  if (s.ok()) s = publisher.WaitForConfirms();
  const int64_t t1 = MonotonicNs();
  if (!s.ok()) r.error = s.ToString();
  r.counters = publisher.counters();
  r.seconds = Seconds(t1 - t0);
  r.messages_per_s = PerSecond(r.counters.acked, t1 - t0);
  for (const auto& [n, seconds] : r.progress) {
    if (n != r.like_for_like_messages) continue;
    r.like_for_like_seconds = seconds;
    r.like_for_like_messages_per_s = seconds > 0 ? static_cast<double>(n) / seconds : 0;
  }
  if (Status qs = publisher.connection().QueueMessageCount(kQueue, &r.queue_depth); !qs.ok()) {
    r.error += qs.ToString();
  }
  publisher.Close();
  return r;
}

// The body of a client process: posts through libpostspool.
int PostThroughLibpostspool(const std::string& socket_path, const std::string& spool_dir,
                            uint32_t budget_ms, int process, std::span<PostOutcome> outcomes) {
  postspool_options options;
  postspool_options_init(&options);
  options.socket_path = socket_path.c_str();
  options.spool_dir = spool_dir.c_str();
  options.budget_ms = budget_ms;
  postspool_client* client = nullptr;
  if (postspool_open(&options, &client) != POSTSPOOL_OK) return 2;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const SamplePost sample = MakeSamplePost(process, static_cast<int>(i));
    struct postspool_post post;
    postspool_post_init(&post);
    ToClientPost(sample, &post);
    postspool_post_result result;
    PostOutcome& o = outcomes[i];
    CallTimer timer(&o);
    o.rc = postspool_post(client, &post, &result);
    timer.Finish();
    o.transport = o.rc == POSTSPOOL_OK ? result.transport : 0;
    // The library sets the id before it tries a transport: a failed call
    // has one too (and its post may still reach the broker).
    std::memcpy(o.id, result.id, sizeof o.id);
    if (o.rc != POSTSPOOL_OK) {
      std::snprintf(o.detail, sizeof o.detail, "%s", postspool_last_error());
    }
  }
  postspool_close(client);
  return 0;
}

EndToEndResult Bench::RunEndToEnd() {
  EndToEndResult r;
  if (Status s = ResetQueue(); !s.ok()) {
    r.error = s.ToString();
    return r;
  }
  DaemonProcess daemon(DaemonOptions());
  const int64_t t_start = MonotonicNs();
  if (!daemon.Start()) {
    r.error = "postspoold did not start (its log is on stderr)";
    return r;
  }
  r.daemon_start_ms = Seconds(MonotonicNs() - t_start) * 1e3;
  // Measure a daemon that is connected to the broker, as a node's
  // long-running daemon is.
  for (int i = 0; i < 1500 && daemon.Metrics()["broker_connected"] != 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  Progress("postspool end to end: %d client processes x %d posts, budget %u ms",
           flags_.clients, flags_.posts_per_client, flags_.budget_ms);
  ProcessFleet fleet(flags_.clients, flags_.posts_per_client);
  const std::string socket_path = daemon.socket_path();
  const std::string spool_dir = daemon.spool_dir();
  const uint32_t budget_ms = flags_.budget_ms;
  if (Status s = fleet.Fork([&](int process, std::span<PostOutcome> out) {
        return PostThroughLibpostspool(socket_path, spool_dir, budget_ms, process, out);
      });
      !s.ok()) {
    r.error = s.ToString();
    return r;
  }
  ProgressPoller poller(&daemon, address_, kQueue, kPollIntervalMs);
  if (Status s = poller.Start(); !s.ok()) {
    r.error = s.ToString();
    return r;
  }
  r.ran = true;
  const double cpu_before = ProcessCpuSeconds(daemon.pid());
  fleet.Release();
  fleet.Wait();
  r.fleet = Figures(fleet, flags_.budget_ms);
  r.queued_at_last_post = poller.Latest().queue_depth;
  r.complete = poller.WaitFor(r.fleet.ok, flags_.drain_timeout_s);
  const double cpu_after = ProcessCpuSeconds(daemon.pid());
  poller.Stop();
  if (cpu_before >= 0 && cpu_after >= 0) r.daemon_cpu_s = cpu_after - cpu_before;
  const int64_t first = fleet.first_start_ns();
  const uint64_t target = r.fleet.ok;
  const int64_t t_confirmed =
      poller.FirstTime([&](const auto& s) { return s.confirmed >= target; });
  const int64_t t_queue = poller.FirstTime([&](const auto& s) { return s.queue_depth >= target; });
  if (t_confirmed > 0) {
    r.confirmed_seconds = Seconds(t_confirmed - first);
    r.confirmed_posts_per_s = PerSecond(target, t_confirmed - first);
  }
  if (t_queue > 0) {
    r.queue_seconds = Seconds(t_queue - first);
    r.queue_posts_per_s = PerSecond(target, t_queue - first);
  }
  r.series = poller.samples();
  r.series_origin_ns = first;
  if (!r.complete) {
    r.error = "the broker had not confirmed every post after " +
              std::to_string(flags_.drain_timeout_s) + " s";
  }
  Progress("checking what reached the queue");
  r.delivery = CheckDelivery(fleet, kQueue, &admin_);
  r.metrics = daemon.Metrics();
  machine_.daemon_io_backend = IoBackendFromLog(daemon.LogText());
  r.daemon_exit = daemon.Stop();
  return r;
}

SpoolResult Bench::RunSpool() {
  SpoolResult r;
  if (Status s = ResetQueue(); !s.ok()) {
    r.error = s.ToString();
    return r;
  }
  DaemonProcess daemon(DaemonOptions());  // not started yet
  std::error_code ec;
  std::filesystem::create_directories(daemon.spool_dir(), ec);
  if (ec) {
    r.error = "create " + daemon.spool_dir() + ": " + ec.message();
    return r;
  }
  Progress("spool fallback: %d client processes x %d posts, no daemon", flags_.spool_clients,
           flags_.spool_posts_per_client);
  ProcessFleet fleet(flags_.spool_clients, flags_.spool_posts_per_client);
  const std::string socket_path = daemon.socket_path();
  const std::string spool_dir = daemon.spool_dir();
  const uint32_t budget_ms = flags_.budget_ms;
  if (Status s = fleet.Fork([&](int process, std::span<PostOutcome> out) {
        return PostThroughLibpostspool(socket_path, spool_dir, budget_ms, process, out);
      });
      !s.ok()) {
    r.error = s.ToString();
    return r;
  }
  r.ran = true;
  fleet.Release();
  fleet.Wait();
  r.fleet = Figures(fleet, flags_.budget_ms);
  for (const auto& e : std::filesystem::directory_iterator(spool_dir, ec)) {
    ++r.spool_files;
    r.spool_bytes += e.is_regular_file() ? e.file_size() : 0;
  }

  Progress("spool adoption: starting postspoold on %llu spooled posts",
           static_cast<unsigned long long>(r.fleet.ok));
  ProgressPoller poller(&daemon, address_, kQueue, kPollIntervalMs);
  if (Status s = poller.Start(); !s.ok()) {
    r.error = s.ToString();
    return r;
  }
  const int64_t t0 = MonotonicNs();
  if (!daemon.Start()) {
    r.error = "postspoold did not start (its log is on stderr)";
    return r;
  }
  r.daemon_start_ms = Seconds(MonotonicNs() - t0) * 1e3;
  const double cpu_before = ProcessCpuSeconds(daemon.pid());
  const uint64_t target = r.fleet.ok;
  r.complete = poller.WaitFor(target, flags_.drain_timeout_s);
  const double cpu_after = ProcessCpuSeconds(daemon.pid());
  poller.Stop();
  if (cpu_before >= 0 && cpu_after >= 0) r.daemon_cpu_s = cpu_after - cpu_before;
  const int64_t t_adopted = poller.FirstTime([&](const auto& s) { return s.adopted >= target; });
  const int64_t t_confirmed =
      poller.FirstTime([&](const auto& s) { return s.confirmed >= target; });
  const int64_t t_queue = poller.FirstTime([&](const auto& s) { return s.queue_depth >= target; });
  if (t_adopted > 0) {
    r.adopted_seconds = Seconds(t_adopted - t0);
    r.adopted_posts_per_s = PerSecond(target, t_adopted - t0);
  }
  if (t_confirmed > 0) {
    r.confirmed_seconds = Seconds(t_confirmed - t0);
    r.confirmed_posts_per_s = PerSecond(target, t_confirmed - t0);
  }
  if (t_queue > 0) {
    r.queue_seconds = Seconds(t_queue - t0);
    r.queue_posts_per_s = PerSecond(target, t_queue - t0);
  }
  if (!r.complete) {
    r.error = "the broker had not confirmed every spooled post after " +
              std::to_string(flags_.drain_timeout_s) + " s";
  }
  Progress("checking what reached the queue");
  r.delivery = CheckDelivery(fleet, kQueue, &admin_);
  for (const auto& e : std::filesystem::directory_iterator(spool_dir, ec)) {
    (void)e;
    ++r.spool_files_left;
  }
  r.metrics = daemon.Metrics();
  r.daemon_exit = daemon.Stop();
  return r;
}

// The body of a baseline process: a broker connection per post.
int PostWithAConnectionEach(const BrokerAddress& address, int process,
                            std::span<PostOutcome> outcomes) {
  ConfirmedPublisher::Options options;
  options.exchange = kExchange;
  options.window_max = 1;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const PostId id = NewPostId();
    const v03::Encoded m =
        EncodeV03(MakeSamplePost(process, static_cast<int>(i)), id, kBrokerUser);
    const std::string message_id = MessageIdText(id);
    PostOutcome& o = outcomes[i];
    CallTimer timer(&o);
    ConfirmedPublisher publisher;
    Status s = publisher.Open(address, options);
    if (s.ok()) s = publisher.Publish(m.routing_key, m.body, message_id);
    if (s.ok()) s = publisher.WaitForConfirms();
    const bool acked = s.ok() && publisher.counters().acked == 1;
    if (!acked) {
      std::snprintf(o.detail, sizeof o.detail, "%s",
                    s.ok() ? "nacked by the broker" : s.ToString().c_str());
    }
    publisher.Close();
    timer.Finish();
    o.rc = acked ? 0 : 1;
    PostIdToBytes(id, o.id);
  }
  return 0;
}

BaselineResult Bench::RunBaseline() {
  BaselineResult r;
  if (Status s = ResetQueue(); !s.ok()) {
    r.error = s.ToString();
    return r;
  }
  Progress("baseline: %d processes x %d posts, one broker connection per post",
           flags_.baseline_processes, flags_.baseline_posts_per_process);
  ProcessFleet fleet(flags_.baseline_processes, flags_.baseline_posts_per_process);
  const BrokerAddress address = address_;
  if (Status s = fleet.Fork([&](int process, std::span<PostOutcome> out) {
        return PostWithAConnectionEach(address, process, out);
      });
      !s.ok()) {
    r.error = s.ToString();
    return r;
  }
  r.ran = true;
  fleet.Release();
  fleet.Wait();
  r.fleet = Figures(fleet, 0);
  AmqpConnection probe;
  if (Status s = probe.Open(address_, kRpcTimeoutMs); s.ok()) {
    if (Status qs = probe.QueueMessageCount(kQueue, &r.queue_depth); !qs.ok()) {
      r.error = qs.ToString();
    }
  } else {
    r.error = s.ToString();
  }
  return r;
}

int Bench::Run() {
  const int64_t t0 = MonotonicNs();
  DescribeMachine(&machine_);
  machine_.postspoold_path = std::getenv("POSTSPOOLD");
  if (Status s = StartBroker(); !s.ok()) {
    std::fprintf(stderr, "e2e_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  ceiling_ = RunCeiling();
  e2e_ = RunEndToEnd();
  spool_ = RunSpool();
  baseline_ = RunBaseline();
  admin_.Disconnect();
  Progress("stopping RabbitMQ");
  broker_.Stop().IgnoreError();
  machine_.loadavg_after = LoadAverage();

  BenchResults results;
  results.flags = flags_;
  results.machine = machine_;
  results.poll_interval_ms = kPollIntervalMs;
  results.metrics_resolution_ms = kMetricsResolutionMs;
  results.ceiling = ceiling_;
  results.e2e = e2e_;
  results.spool = spool_;
  results.baseline = baseline_;
  results.total_seconds = Seconds(MonotonicNs() - t0);
  PrintTable(results);
  std::ofstream out(flags_.json_path, std::ios::trunc);
  out << ResultsJson(results);
  out.close();
  if (!out) {
    std::fprintf(stderr, "e2e_bench: cannot write %s\n", flags_.json_path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace postspool::bench

int main(int argc, char** argv) {
  using namespace postspool::bench;
  BenchFlags flags;
  std::string error;
  if (!ParseFlags(argc, argv, &flags, &error)) {
    std::fprintf(stderr, "e2e_bench: %s\n%s", error.c_str(), Usage(argv[0]).c_str());
    return 2;
  }
  if (flags.help) {
    std::printf("%s", Usage(argv[0]).c_str());
    return 0;
  }
  // A write to a connection the broker closed must be an error, not a
  // signal that kills the harness.
  ::signal(SIGPIPE, SIG_IGN);
  // DaemonProcess runs $POSTSPOOLD.
  if (std::getenv("POSTSPOOLD") == nullptr) ::setenv("POSTSPOOLD", POSTSPOOLD_PATH, 1);
  if (::access(std::getenv("POSTSPOOLD"), X_OK) != 0) {
    std::fprintf(stderr, "e2e_bench: postspoold not found at %s (build it, or set POSTSPOOLD)\n",
                 std::getenv("POSTSPOOLD"));
    return 1;
  }
  Bench bench(std::move(flags));
  return bench.Run();
}
