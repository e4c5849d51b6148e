// bench_tool: the measuring parts of the benchmark suite (bench/run.sh,
// bench/suite.py), one subcommand each. Every subcommand measures one thing
// and prints its figures as one JSON object on stdout; suite.py runs them,
// starts and stops postspoold, reads its /proc and metrics, and reports.
//
//   bench_tool broker [--url URL]   RabbitMQ (started on loopback unless URL
//                                   is given), driven by lines on stdin:
//                                   reset Q | depth Q | stop | start | quit
//   bench_tool fleet --mode M ...   N client processes x P posts each, one
//                                   call timed at a time; M is one of
//                                   libpostspool, retry-file, conn-per-post
//   bench_tool pingpong ...         the bare SOCK_SEQPACKET anchor
//   bench_tool ceiling ...          one long-lived publisher with confirms
//   bench_tool retry-drain ...      publishes and deletes retry files
//
// It measures and reports; it never fails on a figure.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <amqp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_results.h"
#include "broker/broker_fixture.h"
#include "confirmed_publisher.h"
#include "json_writer.h"
#include "pingpong.h"
#include "postspool.h"
#include "process_fleet.h"
#include "sample_post.h"

namespace postspool::bench {
namespace {

using ::postspool::testing::AmqpTestClient;
using ::postspool::testing::BrokerProcess;

constexpr char kBrokerUser[] = "guest";

// --name value pairs.
class Args {
 public:
  Args(int argc, char** argv, int first) {
    for (int i = first; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) continue;
      a = a.substr(2);
      if (const size_t eq = a.find('='); eq != std::string::npos) {
        values_[a.substr(0, eq)] = a.substr(eq + 1);
      } else if (i + 1 < argc && std::strncmp(argv[i + 1], "--", 2) != 0) {
        values_[a] = argv[++i];
      } else {
        // Not `= "1"`: GCC 12 at -O3 warns falsely (-Wrestrict) on that
        // assignment.
        values_.insert_or_assign(a, std::string(1, '1'));
      }
    }
  }
  std::string Str(const std::string& k, const std::string& def = "") const {
    const auto it = values_.find(k);
    return it == values_.end() ? def : it->second;
  }
  long Int(const std::string& k, long def) const {
    const auto it = values_.find(k);
    return it == values_.end() ? def : std::strtol(it->second.c_str(), nullptr, 10);
  }

 private:
  std::map<std::string, std::string> values_;
};

bool ParseBrokerUrl(const std::string& url, BrokerAddress* out) {
  std::vector<char> copy(url.begin(), url.end());
  copy.push_back('\0');
  amqp_connection_info info;
  if (amqp_parse_url(copy.data(), &info) != AMQP_STATUS_OK) return false;
  out->host = info.host;
  out->port = info.port;
  out->user = info.user;
  out->password = info.password;
  out->vhost = *info.vhost ? info.vhost : "/";
  return true;
}

void PinTo(long cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<int>(cpu), &set);
  (void)::sched_setaffinity(0, sizeof set, &set);
}

void LatencyJson(JsonWriter& w, const char* key, const LatencySummary& l) {
  w.Key(key).BeginObject();
  w.Field("count", l.count);
  w.Field("p50", l.p50_ms * 1e3).Field("p90", l.p90_ms * 1e3).Field("p99", l.p99_ms * 1e3);
  w.Field("p999", l.p999_ms * 1e3).Field("max", l.max_ms * 1e3).Field("mean", l.mean_ms * 1e3);
  w.EndObject();
}

// ---------------------------------------------------------------------------
// broker

int BrokerCommand(const Args& args) {
  BrokerProcess broker;
  std::string url = args.Str("url");
  const bool own = url.empty();
  JsonWriter hello;
  hello.BeginObject();
  if (own) {
    std::string why;
    if (!BrokerProcess::Installed(&why)) {
      std::printf("{\"error\": \"RabbitMQ is not installed\"}\n");
      return 1;
    }
    const int64_t t0 = MonotonicNs();
    if (Status s = broker.Start(); !s.ok()) {
      std::printf("{\"error\": \"broker start failed\"}\n");
      std::fprintf(stderr, "%s\n%s\n", s.ToString().c_str(), broker.LogTail().c_str());
      return 1;
    }
    hello.Field("start_s", Seconds(MonotonicNs() - t0));
    url = broker.url();
  }
  BrokerAddress address;
  if (!ParseBrokerUrl(url, &address)) {
    std::printf("{\"error\": \"bad broker URL\"}\n");
    return 1;
  }
  std::string version;
  {
    AmqpConnection probe;
    if (probe.Open(address, 30000).ok()) version = probe.ServerProperty("version");
  }
  hello.Field("url", url).Field("own", own).Field("rabbitmq_version", version);
  hello.Field("data_dir", own ? broker.dir() : std::string());
  hello.EndObject();
  std::string text = hello.text();
  for (char& c : text) if (c == '\n') c = ' ';
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);

  AmqpTestClient admin;
  bool admin_up = false;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd, arg, arg2;
    in >> cmd >> arg >> arg2;
    std::string reply = "ok";
    if (cmd == "quit") break;
    if (cmd == "reset") {  // reset QUEUE EXCHANGE: an empty durable queue bound with '#'
      Status s = admin_up ? Status::Ok() : admin.Connect(url);
      admin_up = s.ok();
      if (s.ok()) s = admin.DeclareExchange(arg2);
      if (s.ok()) s = admin.DeleteQueue(arg);
      if (s.ok()) s = admin.DeclareBoundQueue(arg, arg2, "#");
      if (!s.ok()) {
        admin.Disconnect();
        admin_up = false;
        reply = "error " + s.ToString();
      }
    } else if (cmd == "depth") {
      AmqpConnection c;
      uint32_t n = 0;
      Status s = c.Open(address, 5000);
      if (s.ok()) s = c.QueueMessageCount(arg, &n);
      reply = s.ok() ? "ok " + std::to_string(n) : "error " + s.ToString();
    } else if (cmd == "stop" && own) {
      admin.Disconnect();
      admin_up = false;
      const int64_t t0 = MonotonicNs();
      Status s = broker.Stop();
      reply = s.ok() ? "ok " + std::to_string(Seconds(MonotonicNs() - t0))
                     : "error " + s.ToString();
    } else if (cmd == "start" && own) {
      const int64_t t0 = MonotonicNs();
      Status s = broker.Start();
      // While it was down, its port (a free port of the ephemeral range) may
      // have been taken for a moment, by another program's outgoing
      // connection or another test's broker on a shared machine: try again.
      for (int attempt = 1; !s.ok() && attempt < 5; ++attempt) {
        std::fprintf(stderr, "bench_tool broker: start failed (%s); again in 1 s\n",
                     s.ToString().substr(0, 200).c_str());
        std::this_thread::sleep_for(std::chrono::seconds(1));
        s = broker.Start();
      }
      reply = s.ok() ? "ok " + std::to_string(Seconds(MonotonicNs() - t0))
                     : "error " + s.ToString();
    } else {
      reply = "error unknown command (or not our broker): " + line;
    }
    for (char& c : reply) if (c == '\n') c = ' ';
    std::printf("%s\n", reply.c_str());
    std::fflush(stdout);
  }
  admin.Disconnect();
  if (own) broker.Stop().IgnoreError();
  return 0;
}

// ---------------------------------------------------------------------------
// fleet

int PostThroughLibpostspool(const Args& args, int process, std::span<PostOutcome> outcomes) {
  const std::string socket_path = args.Str("socket");
  const std::string spool_dir = args.Str("spool");
  postspool_options options;
  postspool_options_init(&options);
  options.socket_path = socket_path.c_str();
  options.spool_dir = spool_dir.c_str();
  options.budget_ms = static_cast<uint32_t>(args.Int("budget-ms", 5));
  options.sync_spool = static_cast<int>(args.Int("sync-spool", 0));
  options.use_ring = static_cast<int>(args.Int("use-ring", 0));
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
    std::memcpy(o.id, result.id, sizeof o.id);
    if (o.rc != POSTSPOOL_OK) std::snprintf(o.detail, sizeof o.detail, "%s", postspool_last_error());
  }
  postspool_close(client);
  return 0;
}

// What a job does today when it cannot reach the broker: one file per post
// (the v03 body), for a janitor to publish later.
int PostToRetryFiles(const Args& args, int process, std::span<PostOutcome> outcomes) {
  const std::string dir = args.Str("retry-dir");
  const bool sync = args.Int("sync", 0) != 0;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const PostId id = NewPostId();
    const v03::Encoded m = EncodeV03(MakeSamplePost(process, static_cast<int>(i)), id, kBrokerUser);
    const std::string path = dir + "/" + MessageIdText(id) + ".json";
    PostOutcome& o = outcomes[i];
    CallTimer timer(&o);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    bool ok = fd >= 0;
    if (ok) {
      ok = ::write(fd, m.body.data(), m.body.size()) == static_cast<ssize_t>(m.body.size());
      if (ok && sync) ok = ::fdatasync(fd) == 0;
      ok = ::close(fd) == 0 && ok;
    }
    timer.Finish();
    o.rc = ok ? 0 : 1;
    o.transport = 0;
    PostIdToBytes(id, o.id);
  }
  return 0;
}

int PostWithAConnectionEach(const Args& args, int process, std::span<PostOutcome> outcomes) {
  BrokerAddress address;
  if (!ParseBrokerUrl(args.Str("broker-url"), &address)) return 2;
  ConfirmedPublisher::Options options;
  options.exchange = args.Str("exchange");
  options.window_max = 1;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const PostId id = NewPostId();
    const v03::Encoded m = EncodeV03(MakeSamplePost(process, static_cast<int>(i)), id, kBrokerUser);
    const std::string message_id = MessageIdText(id);
    PostOutcome& o = outcomes[i];
    CallTimer timer(&o);
    ConfirmedPublisher publisher;
    Status s = publisher.Open(address, options);
    if (s.ok()) s = publisher.Publish(m.routing_key, m.body, message_id);
    if (s.ok()) s = publisher.WaitForConfirms();
    const bool acked = s.ok() && publisher.counters().acked == 1;
    publisher.Close();
    timer.Finish();
    o.rc = acked ? 0 : 1;
    PostIdToBytes(id, o.id);
  }
  return 0;
}

int FleetCommand(const Args& args) {
  const std::string mode = args.Str("mode", "libpostspool");
  const int processes = static_cast<int>(args.Int("processes", 1));
  const int posts = static_cast<int>(args.Int("posts", 1000));
  const long cpu = args.Int("cpu", -1);
  ProcessFleet fleet(processes, posts);
  Status s = fleet.Fork([&](int process, std::span<PostOutcome> out) {
    PinTo(cpu);
    if (mode == "libpostspool") return PostThroughLibpostspool(args, process, out);
    if (mode == "retry-file") return PostToRetryFiles(args, process, out);
    if (mode == "conn-per-post") return PostWithAConnectionEach(args, process, out);
    return 64;
  });
  if (!s.ok()) {
    std::printf("{\"error\": \"fork\"}\n");
    return 1;
  }
  // Tell the caller the processes exist (it may attach strace to the daemon
  // now), then wait for its go on stdin unless --go-now.
  if (args.Int("wait-for-go", 0) != 0) {
    std::fprintf(stderr, "ready\n");
    std::string line;
    std::getline(std::cin, line);
  }
  fleet.Release();
  fleet.Wait();
  const FleetFigures f = Figures(fleet, static_cast<double>(args.Int("budget-ms", 0)));
  JsonWriter w;
  w.BeginObject();
  w.Field("mode", mode).Field("processes", processes).Field("posts_per_process", posts);
  w.Field("cpu", cpu);
  w.Field("ok", f.ok).Field("failed", f.failed).Field("not_run", f.not_run);
  w.Field("failed_processes", f.failed_processes);
  w.Field("via_socket", f.via_socket).Field("via_spool", f.via_spool);
  w.Field("seconds", f.seconds).Field("posts_per_s", f.posts_per_s);
  w.Field("children_cpu_s", f.children_cpu_s);
  w.Field("over_budget", f.over_budget);
  LatencyJson(w, "latency_us", f.latency_all);
  LatencyJson(w, "latency_socket_us", f.latency_socket);
  LatencyJson(w, "latency_spool_us", f.latency_spool);
  w.Key("errors").BeginObject();
  for (const auto& [code, n] : f.errors) w.Field(std::to_string(code), n);
  w.EndObject();
  w.Key("first_failures").BeginArray();
  for (const auto& c : f.first_failures) w.Value(c.detail);
  w.EndArray();
  w.EndObject();
  std::printf("%s\n", w.text().c_str());
  return 0;
}

// ---------------------------------------------------------------------------
// ceiling, retry-drain

std::vector<v03::Encoded> SampleMessages() {
  std::vector<v03::Encoded> messages;
  for (int i = 0; i < 1024; ++i) {
    messages.push_back(EncodeV03(MakeSamplePost(i % 32, i / 32), NewPostId(), kBrokerUser));
  }
  return messages;
}

int CeilingCommand(const Args& args) {
  BrokerAddress address;
  if (!ParseBrokerUrl(args.Str("broker-url"), &address)) return 2;
  const uint64_t n = static_cast<uint64_t>(args.Int("messages", 50000));
  ConfirmedPublisher::Options options;
  options.exchange = args.Str("exchange");
  options.window_max = static_cast<uint32_t>(args.Int("window", 1000));
  const std::vector<v03::Encoded> messages = SampleMessages();
  std::vector<std::string> ids;
  ids.reserve(n);
  for (uint64_t i = 0; i < n; ++i) ids.push_back(MessageIdText(NewPostId()));
  ConfirmedPublisher publisher;
  Status s = publisher.Open(address, options);
  const int64_t t0 = MonotonicNs();
  for (uint64_t i = 0; i < n && s.ok(); ++i) {
    const v03::Encoded& m = messages[i % messages.size()];
    s = publisher.Publish(m.routing_key, m.body, ids[i]);
  }
  if (s.ok()) s = publisher.WaitForConfirms();
  const int64_t t1 = MonotonicNs();
  JsonWriter w;
  w.BeginObject();
  w.Field("messages", n).Field("window", options.window_max);
  w.Field("acked", publisher.counters().acked).Field("nacked", publisher.counters().nacked);
  w.Field("seconds", Seconds(t1 - t0));
  w.Field("messages_per_s", PerSecond(publisher.counters().acked, t1 - t0));
  w.Field("body_bytes", messages[0].body.size());
  if (!s.ok()) w.Field("error", s.ToString());
  w.EndObject();
  publisher.Close();
  std::printf("%s\n", w.text().c_str());
  return 0;
}

// The janitor of the retry-file baseline: publishes every file of a
// directory with confirms (window 1,000) and deletes those confirmed.
int RetryDrainCommand(const Args& args) {
  BrokerAddress address;
  if (!ParseBrokerUrl(args.Str("broker-url"), &address)) return 2;
  const std::string dir = args.Str("retry-dir");
  ConfirmedPublisher::Options options;
  options.exchange = args.Str("exchange");
  options.window_max = 1000;
  const std::string routing_key = EncodeV03(MakeSamplePost(0, 0), NewPostId(), kBrokerUser).routing_key;
  ConfirmedPublisher publisher;
  const int64_t t0 = MonotonicNs();
  Status s = publisher.Open(address, options);
  uint64_t files = 0;
  std::vector<std::string> batch;
  auto flush = [&]() {
    if (s.ok()) s = publisher.WaitForConfirms();
    if (s.ok()) {
      for (const std::string& p : batch) ::unlink(p.c_str());
    }
    batch.clear();
  };
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (!s.ok()) break;
    std::ifstream f(e.path());
    std::stringstream body;
    body << f.rdbuf();
    const std::string name = e.path().filename().string();
    s = publisher.Publish(routing_key, body.str(), name.substr(0, name.find('.')));
    batch.push_back(e.path().string());
    ++files;
    if (batch.size() >= 1000) flush();
  }
  flush();
  const int64_t t1 = MonotonicNs();
  JsonWriter w;
  w.BeginObject();
  w.Field("files", files).Field("acked", publisher.counters().acked);
  w.Field("seconds", Seconds(t1 - t0));
  w.Field("posts_per_s", PerSecond(publisher.counters().acked, t1 - t0));
  if (!s.ok()) w.Field("error", s.ToString());
  w.EndObject();
  publisher.Close();
  std::printf("%s\n", w.text().c_str());
  return 0;
}

int PingPongCommand(const Args& args) {
  PingPongOptions o;
  o.clients = static_cast<int>(args.Int("clients", 1));
  o.round_trips = static_cast<int>(args.Int("round-trips", 10000));
  o.request_bytes = static_cast<int>(args.Int("request-bytes", o.request_bytes));
  o.reply_bytes = static_cast<int>(args.Int("reply-bytes", o.reply_bytes));
  o.placement = args.Str("placement", "none");
  std::printf("%s\n", RunPingPong(o).c_str());
  return 0;
}

}  // namespace
}  // namespace postspool::bench

int main(int argc, char** argv) {
  using namespace postspool::bench;
  ::signal(SIGPIPE, SIG_IGN);
  const std::string cmd = argc > 1 ? argv[1] : "";
  const Args args(argc, argv, 2);
  if (cmd == "broker") return BrokerCommand(args);
  if (cmd == "fleet") return FleetCommand(args);
  if (cmd == "pingpong") return PingPongCommand(args);
  if (cmd == "ceiling") return CeilingCommand(args);
  if (cmd == "retry-drain") return RetryDrainCommand(args);
  std::fprintf(stderr,
               "usage: %s broker|fleet|pingpong|ceiling|retry-drain [--flag value]...\n"
               "(bench/run.sh runs it; bench/README.md says what each measures)\n",
               argv[0]);
  return 2;
}
