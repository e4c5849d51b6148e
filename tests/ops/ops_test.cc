// The operator's commands against a real postspoold and a real RabbitMQ:
// `postspool status|drain|metrics|reconnect|log-level` through the control
// socket, with the broker up, down and frozen while a backlog builds, as
// root and as an ordinary user; the metrics parsed by Prometheus' own
// text-format parser; drain's progress bar in a pseudo-terminal.
//
// The binaries: $POSTSPOOLD, $POSTSPOOL_CLI; the parser: $PYTHON3 running
// $PARSE_METRICS (set by meson).
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "broker/broker_fixture.h"
#include "e2e/daemon_process.h"
#include "hostile/test_users.h"
#include "journal.h"
#include "postspool.h"
#include "segment_format.h"
#include "unique_fd.h"

namespace postspool::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// Occurrences of `what` in `text`.
size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Runs `args` (argv[0] is a path), stdout into *out (stderr into *err if
// given, else into *out too); returns the exit status, 128+signal, or -1.
int RunProgram(const std::vector<std::string>& args, std::string* out, std::string* err = nullptr,
        const std::string& input = "") {
  int out_pipe[2], err_pipe[2], in_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0 ||
      ::pipe2(in_pipe, O_CLOEXEC) != 0) {
    return -1;
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(in_pipe[0], 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err != nullptr ? err_pipe[1] : out_pipe[1], 2);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  ::close(in_pipe[0]);
  if (!input.empty()) {
    [[maybe_unused]] ssize_t w = ::write(in_pipe[1], input.data(), input.size());
  }
  ::close(in_pipe[1]);
  std::string o, e;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    if (::poll(fds, 2, 120000) <= 0) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? o : e).append(buf, static_cast<size_t>(n));
      }
    }
  }
  for (const pollfd& p : fds) {
    if (p.fd >= 0) ::close(p.fd);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  *out = o;
  if (err != nullptr) *err = e;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : -1;
}

class Ops : public ::testing::Test {
 protected:
  void SetUp() override {
    POSTSPOOL_REQUIRE_BROKER();
    broker_ = BrokerEnvironment::broker();
    static int n = 0;
    const std::string tag = std::to_string(++n) + "_" + std::to_string(::getpid());
    exchange_ = "xs_ops_" + tag;
    queue_ = "q_ops_" + tag;
    cli_ = Env("POSTSPOOL_CLI");
    ASSERT_FALSE(cli_.empty()) << "POSTSPOOL_CLI is not set (meson sets it)";
    ASSERT_TRUE(consumer_.Connect(broker_->url()).ok());
    ASSERT_TRUE(consumer_.DeclareExchange(exchange_).ok());
  }
  void TearDown() override {
    if (daemon_) daemon_->Stop();
    if (broker_ != nullptr && broker_->running()) {
      (void)consumer_.DeleteQueue(queue_);
      (void)consumer_.DeleteExchange(exchange_);
    }
  }

  void StartDaemon(const std::string& broker_url, std::vector<std::string> extra = {}) {
    DaemonProcess::Options o;
    o.broker_url = broker_url;
    o.exchange = exchange_;
    o.extra_config = std::move(extra);
    daemon_ = std::make_unique<DaemonProcess>(o);
    ASSERT_TRUE(daemon_->Start());
  }

  // `postspool ARGS --control-socket <the daemon's>`.
  int Cli(std::vector<std::string> args, std::string* out, std::string* err = nullptr) {
    args.insert(args.begin(), cli_);
    args.push_back("--control-socket");
    args.push_back(daemon_->control_socket_path());
    return RunProgram(args, out, err);
  }

  json Status(int* rc = nullptr) {
    std::string out, err;
    const int r = Cli({"status", "--json"}, &out, &err);
    if (rc != nullptr) *rc = r;
    json j = json::parse(out, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << "status --json printed: " << out << err;
    return j;
  }

  void Post(int count, const std::string& prefix = "p") {
    for (int i = 0; i < count; ++i) {
      std::string out;
      ASSERT_EQ(RunProgram({cli_, "post", "--socket", daemon_->socket_path(), "--spool-dir",
                     daemon_->spool_dir(), "--rel-path",
                     "ops/" + prefix + std::to_string(i) + ".txt"},
                    &out),
                0)
          << out;
    }
  }

  // The CLI prints each post's transport. One process posts `count` posts
  // (the ring is asked for on the first), with a budget no loaded machine
  // runs out of: a post that went to the spool after its socket ack came
  // late would be counted by the daemon under the socket (the spooled copy
  // is dropped as a duplicate) and the test's count would be wrong.
  void PostOnce(int count, const std::string& prefix, const std::string& socket,
                std::map<std::string, int>* by_transport) {
    std::string lines;
    for (int i = 0; i < count; ++i) {
      lines += "{\"relPath\": \"ops/" + prefix + std::to_string(i) + ".txt\"}\n";
    }
    std::string o, e;
    ASSERT_EQ(RunProgram({cli_, "post", "--json", "--socket", socket, "--spool-dir",
                          daemon_->spool_dir(), "--budget-ms", "10000"},
                         &o, &e, lines),
              0)
        << o << e;
    std::istringstream in(o);
    for (std::string id, transport; in >> id >> transport;) ++(*by_transport)[transport];
  }
  // `ring` posts as a client posts by default (the ring), `socket` with the
  // ring off, `spool` to a socket nobody listens on; counts what the CLI
  // says took each.
  void PostThroughEachTransport(int ring, int socket, int spool,
                                std::map<std::string, int>* by_transport) {
    PostOnce(ring, "r", daemon_->socket_path(), by_transport);
    ::setenv("POSTSPOOL_RING", "0", 1);
    PostOnce(socket, "s", daemon_->socket_path(), by_transport);
    ::unsetenv("POSTSPOOL_RING");
    PostOnce(spool, "f", daemon_->root() + "/run/nobody-listens.sock", by_transport);
  }

  // Polls status until `pred` holds (at most `budget`); the last status.
  template <typename Pred>
  json WaitStatus(Pred pred, std::chrono::seconds budget = 60s) {
    const Clock::time_point end = Clock::now() + budget;
    json j;
    do {
      j = Status();
      if (!j.is_discarded() && pred(j)) return j;
      std::this_thread::sleep_for(100ms);
    } while (Clock::now() < end);
    ADD_FAILURE() << "status never got there; last: " << j.dump(2);
    return j;
  }

  BrokerProcess* broker_ = nullptr;
  AmqpTestClient consumer_;
  std::string exchange_, queue_, cli_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(Ops, StatusIsHealthyAndCountsEveryPostWithTheBrokerUp) {
  ASSERT_TRUE(consumer_.DeclareBoundQueue(queue_, exchange_).ok());
  StartDaemon(broker_->url());
  Post(20);
  const json j = WaitStatus([](const json& s) { return s["posts"]["confirmed"] == 20; });
  // By socket, or by spool when a post's time budget ran out on a loaded
  // machine: each counted once.
  EXPECT_EQ(j["posts"]["received"]["ring"].get<int>() + j["posts"]["received"]["socket"].get<int>() +
                j["posts"]["received"]["spool"].get<int>(),
            20);
  EXPECT_EQ(j["posts"]["journaled"], 20);
  EXPECT_GE(j["posts"]["published"].get<int>(), 20);
  EXPECT_EQ(j["posts"]["unroutable_dropped"], 0);
  EXPECT_EQ(j["broker"]["state"], "connected");
  // The URL is shown without its password.
  const std::string url = j["broker"]["url"];
  EXPECT_EQ(url.find(":guest@"), std::string::npos) << url;
  EXPECT_NE(url.find("guest@127.0.0.1"), std::string::npos) << url;
  EXPECT_EQ(j["daemon"]["state"], "running");
  EXPECT_EQ(j["daemon"]["pid"], daemon_->pid());
  const json s = WaitStatus([](const json& x) { return x["backlog"]["posts"] == 0; });
  EXPECT_TRUE(s["backlog"]["posts_exact"].get<bool>());
  EXPECT_TRUE(s["backlog"]["oldest_unconfirmed_age_s"].is_null());
  // The backlog's bytes, not the journal's: the segment of the 20
  // confirmed posts is still there.
  EXPECT_EQ(s["backlog"]["bytes"], 0);
  EXPECT_GT(s["backlog"]["journal_bytes"].get<uint64_t>(), 0u);
  std::string out;
  EXPECT_EQ(Cli({"status"}, &out), 0) << out;
  EXPECT_NE(out.find("health      healthy"), std::string::npos) << out;
  EXPECT_NE(out.find("confirmed 20"), std::string::npos) << out;
  std::vector<ReceivedMessage> got;
  ASSERT_TRUE(consumer_.GetAll(queue_, &got).ok());
  EXPECT_EQ(got.size(), 20u);
}

// Each number of status against a count the test knows: the transport of
// each post (the CLI prints it), the journal's records, the rate window.
TEST_F(Ops, StatusCountsEveryTransportAndTheBacklogsOwnBytes) {
  StartDaemon("amqp://guest:guest@127.0.0.1:" + std::to_string(UnusedPort()) + "/");
  // A fresh daemon knows its backlog is empty: exactly 0, not "at least".
  const json fresh = WaitStatus([](const json& s) { return s["rates"].contains("window_s"); });
  EXPECT_EQ(fresh["backlog"]["posts"], 0);
  EXPECT_TRUE(fresh["backlog"]["posts_exact"].get<bool>());
  EXPECT_EQ(fresh["backlog"]["bytes"], 0);
  std::string out;
  Cli({"status"}, &out);
  EXPECT_NE(out.find("backlog     0 posts (0 B)"), std::string::npos) << out;
  EXPECT_EQ(out.find("at least"), std::string::npos) << out;

  std::map<std::string, int> by_transport;
  PostThroughEachTransport(9, 7, 5, &by_transport);
  EXPECT_EQ(by_transport["spool"], 5);
  EXPECT_EQ(by_transport["ring"] + by_transport["socket"] + by_transport["spool"], 21)
      << "transports printed: ring " << by_transport["ring"] << ", socket "
      << by_transport["socket"] << ", spool " << by_transport["spool"];

  const json j = WaitStatus([](const json& s) {
    return s["posts"]["journaled"] == 21 && s["backlog"]["posts"] == 21 &&
           s["backlog"]["posts_exact"] == true;
  });
  EXPECT_EQ(j["posts"]["received"]["ring"], by_transport["ring"]);
  EXPECT_EQ(j["posts"]["received"]["socket"], by_transport["socket"]);
  EXPECT_EQ(j["posts"]["received"]["spool"], by_transport["spool"]);
  // Nothing is confirmed: the backlog is every record in the journal.
  UniqueFd dir(::open(daemon_->journal_dir().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  std::vector<uint64_t> seqs;
  ASSERT_TRUE(daemon::ListJournalSegments(dir.get(), &seqs).ok());
  uint64_t records_bytes = 0;
  for (const uint64_t seq : seqs) {
    struct stat st {};
    ASSERT_EQ(::fstatat(dir.get(), daemon::JournalSegmentName(seq).c_str(), &st, 0), 0);
    records_bytes += static_cast<uint64_t>(st.st_size) - segment::kHeaderBytes;
  }
  EXPECT_EQ(j["backlog"]["bytes"].get<uint64_t>(), records_bytes);
  // The rates: every post came after the first sample; within the minute
  // the window covers, received over the window is all of them once a
  // sample (one a second) was taken after the last.
  const json r = WaitStatus([](const json& s) {
    const json& rates = s["rates"];
    return s["daemon"]["uptime_s"].get<double>() >= 55 ||
           std::abs(rates["received_per_s"].get<double>() * rates["window_s"].get<double>() - 21) <
               0.01;
  });
  if (r["daemon"]["uptime_s"].get<double>() < 55) {
    EXPECT_NEAR(r["rates"]["received_per_s"].get<double>() * r["rates"]["window_s"].get<double>(),
                21.0, 0.01)
        << r["rates"].dump();
    EXPECT_NEAR(r["rates"]["journaled_per_s"].get<double>() * r["rates"]["window_s"].get<double>(),
                21.0, 0.01)
        << r["rates"].dump();
  } else {
    std::printf("[ note ] the machine was too slow to check the rates within their minute\n");
  }
  Cli({"status"}, &out);
  const std::string want = "received 21 (ring " + std::to_string(by_transport["ring"]) +
                           ", socket " + std::to_string(by_transport["socket"]) + ", spool 5), journaled 21";
  EXPECT_NE(out.find(want), std::string::npos) << out;
  EXPECT_NE(out.find("backlog     21 posts ("), std::string::npos) << out;
}

// Issue 19: with the broker up, every number of status --json against a
// count the test knows once everything is confirmed: N posts through the
// ring, M through the socket, K through the spool; and the metrics file
// says the same as status.
TEST_F(Ops, StatusNumbersEqualTheKnownCountsOnceEverythingIsConfirmed) {
  ASSERT_TRUE(consumer_.DeclareBoundQueue(queue_, exchange_).ok());
  StartDaemon(broker_->url());
  std::map<std::string, int> by_transport;
  PostThroughEachTransport(12, 8, 6, &by_transport);
  constexpr int kAll = 12 + 8 + 6;
  EXPECT_EQ(by_transport["spool"], 6);
  EXPECT_EQ(by_transport["ring"] + by_transport["socket"] + by_transport["spool"], kAll);
  const json j = WaitStatus([](const json& s) {
    return s["posts"]["confirmed"] == kAll && s["backlog"]["posts"] == 0 &&
           s["backlog"]["in_flight"] == 0;
  });
  const json& p = j["posts"];
  EXPECT_EQ(p["received"]["ring"], by_transport["ring"]);
  EXPECT_EQ(p["received"]["socket"], by_transport["socket"]);
  EXPECT_EQ(p["received"]["spool"], by_transport["spool"]);
  EXPECT_EQ(p["journaled"], kAll);
  EXPECT_EQ(p["confirmed"], kAll);
  // Every publication is a first one or a counted republication.
  EXPECT_EQ(p["published"].get<uint64_t>(), kAll + p["republished"].get<uint64_t>());
  EXPECT_EQ(p["nacked"], 0);
  EXPECT_EQ(p["unroutable"], 0);
  EXPECT_EQ(p["unroutable_dropped"], 0);
  EXPECT_EQ(p["spool_duplicates_dropped"], 0);
  EXPECT_EQ(p["shim_posts_dropped"], 0);
  EXPECT_EQ(j["backlog"]["posts"], 0);
  EXPECT_TRUE(j["backlog"]["posts_exact"].get<bool>());
  EXPECT_EQ(j["backlog"]["bytes"], 0);
  EXPECT_TRUE(j["healthy"].get<bool>()) << j["unhealthy_reasons"].dump();
  std::vector<ReceivedMessage> got;
  ASSERT_TRUE(consumer_.GetAll(queue_, &got).ok());
  EXPECT_EQ(got.size(), static_cast<size_t>(kAll));

  // The metrics file (written every 100 ms) names the same numbers.
  std::map<std::string, uint64_t> m;
  for (int i = 0; i < 50; ++i) {
    m = daemon_->Metrics();
    if (m["confirmed_total"] == kAll && m["backlog_posts"] == 0) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(m["ring_posts_journaled_total"], p["received"]["ring"].get<uint64_t>());
  EXPECT_EQ(m["socket_posts_journaled_total"], p["received"]["socket"].get<uint64_t>());
  EXPECT_EQ(m["spool_posts_journaled_total"], p["received"]["spool"].get<uint64_t>());
  EXPECT_EQ(m["confirmed_total"], p["confirmed"].get<uint64_t>());
  EXPECT_EQ(m["published_total"], p["published"].get<uint64_t>());
  EXPECT_EQ(m["republished_total"], p["republished"].get<uint64_t>());
  EXPECT_EQ(m["nacked_total"], p["nacked"].get<uint64_t>());
  EXPECT_EQ(m["unroutable_total"], p["unroutable"].get<uint64_t>());
  EXPECT_EQ(m["shim_posts_dropped_total"], p["shim_posts_dropped"].get<uint64_t>());
  EXPECT_EQ(m["backlog_posts"], j["backlog"]["posts"].get<uint64_t>());
  EXPECT_EQ(m["publish_in_flight"], j["backlog"]["in_flight"].get<uint64_t>());
  std::printf("[ figures ] ring %d, socket %d, spool %d; published %llu, republished %llu\n",
              by_transport["ring"], by_transport["socket"], by_transport["spool"],
              static_cast<unsigned long long>(m["published_total"]),
              static_cast<unsigned long long>(m["republished_total"]));
}

TEST_F(Ops, BrokerDownIsUnhealthyAndShutdownCountsEveryUnconfirmedPost) {
  StartDaemon("amqp://guest:secret@127.0.0.1:" + std::to_string(UnusedPort()) + "/");
  Post(12);
  int rc = -1;
  const json j = WaitStatus([](const json& s) {
    return s["backlog"]["posts"] == 12 && s["backlog"]["posts_exact"] == true &&
           s["broker"].contains("last_error") &&
           s["backlog"]["oldest_unconfirmed_age_s"].is_number();
  });
  Status(&rc);
  EXPECT_EQ(rc, 1) << "unhealthy is exit 1";
  EXPECT_FALSE(j["healthy"].get<bool>());
  EXPECT_EQ(j["broker"]["state"], "waiting");
  EXPECT_NE(j["broker"]["last_error"].get<std::string>().find("refused"), std::string::npos)
      << j["broker"].dump();
  EXPECT_EQ(j["broker"]["url"].get<std::string>().find("secret"), std::string::npos);
  EXPECT_GE(j["broker"]["connect_failures_in_row"].get<int>(), 1);
  EXPECT_GT(j["backlog"]["journal_bytes"].get<uint64_t>(), 0u);
  std::string out, err;
  EXPECT_EQ(Cli({"status"}, &out), 1);
  EXPECT_NE(out.find("UNHEALTHY: the broker connection is waiting"), std::string::npos) << out;
  EXPECT_NE(out.find("backlog     12 posts"), std::string::npos) << out;
  EXPECT_EQ(Cli({"drain", "--timeout", "1s"}, &out, &err), 1) << out << err;
  EXPECT_NE(err.find("drain timed out"), std::string::npos) << err;
  EXPECT_NE(out.find("12 posts left"), std::string::npos) << out;
  // The shutdown counts the 12 journaled posts, not the (empty) window.
  EXPECT_EQ(daemon_->Stop(), 0);
  const std::string log = daemon_->LogText();
  EXPECT_NE(log.find("drain deadline passed with 12 journaled posts unconfirmed"), std::string::npos)
      << log;
  EXPECT_NE(log.find("every journaled post: 12 stay in"), std::string::npos) << log;
  EXPECT_EQ(Cli({"status"}, &out, &err), 3) << "a stopped daemon cannot be reached";
}

TEST_F(Ops, UnroutablePostsAreCountedInStatusAndTheLog) {
  // No queue bound: the broker returns every post (publish_mandatory).
  StartDaemon(broker_->url());
  Post(3);
  const json j = WaitStatus([](const json& s) { return s["posts"]["unroutable_dropped"] == 3; });
  EXPECT_EQ(j["posts"]["unroutable"], 3);
  EXPECT_EQ(j["posts"]["confirmed"], 0);
  EXPECT_TRUE(j["posts"].contains("last_unroutable_drop_unix_ms"));
  EXPECT_EQ(j["backlog"]["posts"], 0) << "dropped posts are no backlog";
  EXPECT_EQ(daemon_->Stop(), 0);
  const std::string log = daemon_->LogText();
  EXPECT_NE(log.find("3 posts were dropped as unroutable since start"), std::string::npos) << log;
  // Each drop line states how many since start; the last says 3.
  // (No std::regex: GCC 12 warns falsely inside it under ASan.)
  std::string last;
  const std::string marker = "unroutable posts (";
  for (size_t at = log.find(marker); at != std::string::npos; at = log.find(marker, at + 1)) {
    const size_t from = at + marker.size();
    const size_t to = log.find(" since start)", from);
    if (to != std::string::npos) last = log.substr(from, to - from);
  }
  EXPECT_EQ(last, "3") << log;
}

TEST_F(Ops, DrainWaitsForAFrozenBrokerAndDrawsAProgressBarOnATerminal) {
  ASSERT_TRUE(consumer_.DeclareBoundQueue(queue_, exchange_).ok());
  // path_silent_ms far away: this test is about what status and drain show
  // while the connection stays up; the forwarder would otherwise leave the
  // silent connection after 5 s (tests/cluster checks that), and on a slow
  // build the status below can come later than that.
  StartDaemon(broker_->url(), {"heartbeat_s = 60", "health_confirm_stall_ms = 1500",
                               "path_silent_ms = 600000"});
  WaitStatus([](const json& s) { return s["broker"]["state"] == "connected"; });
  broker_->Pause();
  Post(40);
  // Frozen: the connection looks open, but nothing is confirmed.
  const json frozen = WaitStatus([](const json& s) {
    return s["backlog"]["posts"] == 40 && s["healthy"] == false;
  });
  EXPECT_EQ(frozen["broker"]["state"], "connected");
  EXPECT_NE(frozen["unhealthy_reasons"].dump().find("confirmed nothing for"), std::string::npos)
      << frozen.dump(2);
  int rc = -1;
  Status(&rc);
  EXPECT_EQ(rc, 1);
  // drain in a pseudo-terminal.
  int master = -1;
  const pid_t pid = ::forkpty(&master, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string sock = daemon_->control_socket_path();
    ::execl(cli_.c_str(), cli_.c_str(), "drain", "--timeout", "120s", "--control-socket",
            sock.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  std::string screen;
  const auto read_some = [&](int ms) {
    pollfd p{master, POLLIN, 0};
    const Clock::time_point end = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < end && ::poll(&p, 1, 100) >= 0) {
      if ((p.revents & (POLLIN | POLLHUP)) == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(master, buf, sizeof buf);
      if (n <= 0) return false;
      screen.append(buf, static_cast<size_t>(n));
    }
    return true;
  };
  // The bar while the broker is frozen: 40 posts left. Wait for two bars.
  for (int i = 0; i < 100 && screen.find("40 posts left", screen.find("40 posts left") + 1) ==
                                 std::string::npos;
       ++i) {
    if (!read_some(100)) break;
  }
  broker_->Resume();
  while (read_some(1000)) {
    if (screen.find("drained") != std::string::npos) break;
  }
  read_some(500);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ::close(master);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << screen;
  EXPECT_NE(screen.find("\r["), std::string::npos) << "a bar redrawn in place: " << screen;
  EXPECT_NE(screen.find("40 posts left"), std::string::npos) << screen;
  EXPECT_NE(screen.find("] 100%"), std::string::npos) << screen;
  EXPECT_NE(screen.find("to go"), std::string::npos) << screen;
  EXPECT_NE(screen.find("drained: everything journaled"), std::string::npos) << screen;
  const json thawed = WaitStatus([](const json& x) { return x["healthy"] == true; });
  EXPECT_EQ(thawed["backlog"]["posts"], 0);
  EXPECT_EQ(thawed["posts"]["confirmed"], 40);
  std::vector<ReceivedMessage> got;
  ASSERT_TRUE(consumer_.GetAll(queue_, &got).ok());
  EXPECT_GE(got.size(), 40u);
}

TEST_F(Ops, DrainPrintsPlainLinesWithoutATerminal) {
  // A backlog left by a run without a broker, drained by the next run.
  StartDaemon("amqp://guest:guest@127.0.0.1:" + std::to_string(UnusedPort()) + "/");
  Post(25);
  WaitStatus([](const json& s) { return s["backlog"]["posts"] == 25; });
  ASSERT_EQ(daemon_->Stop(), 0);
  ASSERT_TRUE(consumer_.DeclareBoundQueue(queue_, exchange_).ok());
  DaemonProcess::Options o;
  o.broker_url = broker_->url();
  o.exchange = exchange_;
  daemon_->Reconfigure(o);
  ASSERT_TRUE(daemon_->Start());
  std::string out, err;
  EXPECT_EQ(Cli({"drain", "--timeout", "120s"}, &out, &err), 0) << out << err;
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_NE(out.find("drain: "), std::string::npos) << out;
  EXPECT_NE(out.find("drained: everything journaled"), std::string::npos) << out;
  const json j = Status();
  EXPECT_EQ(j["backlog"]["posts"], 0);
  EXPECT_EQ(j["posts"]["confirmed"], 25) << "the last run's backlog, confirmed by this one";
  std::vector<ReceivedMessage> got;
  ASSERT_TRUE(consumer_.GetAll(queue_, &got).ok());
  EXPECT_EQ(got.size(), 25u);
}

TEST_F(Ops, AnOrdinaryUserMayReadStatusButNotChangeState) {
  std::string why;
  if (!CanCreateUsers(&why)) GTEST_SKIP() << why;
  TestUser user;
  ASSERT_TRUE(CreateUser("psops", &user, &why)) << why;
  ASSERT_TRUE(consumer_.DeclareBoundQueue(queue_, exchange_).ok());
  StartDaemon(broker_->url());
  // The test tree is 0700 (mkdtemp): let the user reach the socket.
  ASSERT_EQ(::chmod(daemon_->root().c_str(), 0711), 0);
  ASSERT_EQ(::chmod((daemon_->root() + "/run").c_str(), 0755), 0);
  WaitStatus([](const json& s) { return s["broker"]["state"] == "connected"; });
  const std::string sock = daemon_->control_socket_path();
  const auto as_user = [&](std::vector<std::string> args) {
    args.insert(args.begin(), cli_);
    args.push_back("--control-socket");
    args.push_back(sock);
    ChildAs child(user, {}, [args] {
      std::vector<char*> argv;
      for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      const int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 1);
      ::execv(argv[0], argv.data());
      return 127;
    });
    return child.Wait(60000);
  };
  EXPECT_EQ(as_user({"status"}), 0) << "status is for every user";
  EXPECT_EQ(as_user({"metrics"}), 0);
  EXPECT_EQ(as_user({"reconnect"}), 1) << "a state change is refused";
  EXPECT_EQ(as_user({"log-level", "debug"}), 1);
  std::string out;
  const json j = Status();
  EXPECT_EQ(j["daemon"]["log_level"], "info") << "the refused change did not happen";
  EXPECT_EQ(Cli({"log-level", "debug"}, &out), 0) << "root may: " << out;
  EXPECT_EQ(Status()["daemon"]["log_level"], "debug");
  EXPECT_EQ(Cli({"reconnect"}, &out), 0) << out;
  ASSERT_EQ(Cli({"metrics"}, &out), 0);
  EXPECT_NE(out.find("postspool_control_requests_denied_total 2\n"), std::string::npos) << out;
  const std::string log = daemon_->LogText();
  EXPECT_NE(log.find("refused \"reconnect\" from uid " + std::to_string(user.uid)),
            std::string::npos)
      << log;
  daemon_->Stop();
  DeleteUser(user);
}

TEST_F(Ops, MetricsParseWithThePrometheusParserFromTheSocketAndTheFile) {
  ASSERT_TRUE(consumer_.DeclareBoundQueue(queue_, exchange_).ok());
  // The unit's UMask=0077: the metrics file is 0644 all the same, for a
  // node_exporter of another user (packaging/README.md).
  const mode_t umask_before = ::umask(077);
  StartDaemon(broker_->url());
  ::umask(umask_before);
  Post(7);
  WaitStatus([](const json& s) { return s["posts"]["confirmed"] == 7; });
  const std::string python = Env("PYTHON3"), script = Env("PARSE_METRICS");
  ASSERT_FALSE(python.empty() || script.empty()) << "PYTHON3 and PARSE_METRICS (meson sets them)";
  std::string text, err;
  ASSERT_EQ(Cli({"metrics"}, &text), 0) << text;
  // Socket text through the parser (stdin).
  std::string parsed;
  ASSERT_EQ(RunProgram({python, script, "-"}, &parsed, &err, text), 0) << err << text;
  std::map<std::string, uint64_t> socket_values;
  std::istringstream lines(parsed);
  std::string name;
  uint64_t value = 0;
  while (lines >> name >> value) socket_values[name] = value;
  EXPECT_EQ(socket_values["postspool_confirmed_total"], 7u);
  EXPECT_EQ(socket_values["postspool_ring_posts_journaled_total"] +
                socket_values["postspool_socket_posts_journaled_total"] +
                socket_values["postspool_spool_posts_journaled_total"],
            7u);
  // Every metric has its # HELP line (the parser above checks it is
  // there), and # HELP comes before # TYPE, as Prometheus writes it.
  EXPECT_EQ(Count(text, "\n# HELP postspool_") + (text.rfind("# HELP ", 0) == 0 ? 1 : 0),
            socket_values.size())
      << text;
  EXPECT_EQ(text.rfind("# HELP postspool_", 0), 0u) << text;
  EXPECT_EQ(socket_values["postspool_backlog_posts"], 0u);
  EXPECT_GE(socket_values["postspool_control_requests_total"], 1u);
  // The file (node_exporter's textfile collector): the same names, and
  // never a partial file while the daemon rewrites it every 100 ms.
  const std::string file = daemon_->root() + "/metrics.prom";
  struct stat st {};
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  ASSERT_EQ(RunProgram({python, script, file}, &parsed, &err), 0) << err;
  std::map<std::string, uint64_t> file_values;
  std::istringstream flines(parsed);
  while (flines >> name >> value) file_values[name] = value;
  ASSERT_EQ(file_values.size(), socket_values.size());
  for (const auto& [n, v] : socket_values) EXPECT_TRUE(file_values.count(n)) << n;
  const std::string last_line = "postspool_control_requests_denied_total ";
  for (int i = 0; i < 300; ++i) {
    std::ifstream in(file);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string t = ss.str();
    ASSERT_TRUE(!t.empty() && t.back() == '\n' && t.find(last_line) != std::string::npos)
        << "read " << i << " saw a partial file: " << t.size() << " bytes";
    std::this_thread::sleep_for(10ms);
  }
}

TEST_F(Ops, ControlSocketAnswersBadRequestsAndBoundsIdleClients) {
  StartDaemon(broker_->url(), {"control_connections_max = 2", "control_timeout_ms = 1000"});
  const std::string path = daemon_->control_socket_path();
  const auto connect_to = [&path] {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    timeval tv{10, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
  };
  const auto read_all = [](int fd) {
    std::string s;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, static_cast<size_t>(n));
    return s;
  };
  const auto ask = [&](const std::string& request) {
    const int fd = connect_to();
    [[maybe_unused]] ssize_t w = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    const std::string r = read_all(fd);
    ::close(fd);
    return json::parse(r, nullptr, false);
  };
  json r = ask("not json\n");
  EXPECT_EQ(r["ok"], false);
  EXPECT_NE(r["error"].get<std::string>().find("one JSON object"), std::string::npos);
  r = ask(R"({"request":"format-disk"})" "\n");
  EXPECT_EQ(r["ok"], false);
  EXPECT_NE(r["error"].get<std::string>().find("unknown request"), std::string::npos);
  r = ask(R"({"request":"log-level","level":7})" "\n");
  EXPECT_EQ(r["ok"], false);
  r = ask(std::string(10000, 'x'));
  EXPECT_EQ(r["ok"], false);
  EXPECT_NE(r["error"].get<std::string>().find("longer than"), std::string::npos);
  // Two idle clients take every slot: a third is told "busy".
  const int idle1 = connect_to(), idle2 = connect_to();
  std::this_thread::sleep_for(200ms);
  r = ask(R"({"request":"status"})" "\n");
  EXPECT_EQ(r["ok"], false);
  EXPECT_NE(r.value("error", "").find("busy"), std::string::npos) << r.dump();
  // The idle ones are closed after control_timeout_ms, then status works.
  EXPECT_EQ(read_all(idle1), "");
  EXPECT_EQ(read_all(idle2), "");
  ::close(idle1);
  ::close(idle2);
  r = ask(R"({"request":"status"})" "\n");
  EXPECT_EQ(r["ok"], true) << r.dump();
  std::string text;
  ASSERT_EQ(Cli({"metrics"}, &text), 0);
  EXPECT_NE(text.find("postspool_control_requests_malformed_total 4\n"), std::string::npos) << text;
  EXPECT_NE(text.find("postspool_control_connections_refused_total 1\n"), std::string::npos) << text;
}

TEST_F(Ops, UnderSystemdLinesCarryPrioritiesAndStatusShowsTheBacklog) {
  DaemonProcess::Options o;
  o.broker_url = "amqp://guest:guest@127.0.0.1:" + std::to_string(UnusedPort()) + "/";
  o.exchange = exchange_;
  daemon_ = std::make_unique<DaemonProcess>(o);
  // What systemd does: stderr is a stream whose device and inode are in
  // JOURNAL_STREAM, and NOTIFY_SOCKET is a datagram socket.
  const std::string log = daemon_->log_path();
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(log_fd, 0);
  struct stat st;
  ASSERT_EQ(::fstat(log_fd, &st), 0);
  ::close(log_fd);
  const std::string notify_path = daemon_->root() + "/notify.sock";
  const int notify = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", notify_path.c_str());
  ASSERT_EQ(::bind(notify, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  const std::string stream = std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  ::setenv("JOURNAL_STREAM", stream.c_str(), 1);
  ::setenv("NOTIFY_SOCKET", notify_path.c_str(), 1);
  const bool started = daemon_->Start();
  ::unsetenv("JOURNAL_STREAM");
  ::unsetenv("NOTIFY_SOCKET");
  ASSERT_TRUE(started);
  Post(4);
  std::string messages, found;
  const Clock::time_point end = Clock::now() + 30s;
  while (found.empty() && Clock::now() < end) {
    pollfd p{notify, POLLIN, 0};
    if (::poll(&p, 1, 500) <= 0) continue;
    char buf[512];
    const ssize_t n = ::recv(notify, buf, sizeof buf, 0);
    if (n <= 0) continue;
    const std::string m(buf, static_cast<size_t>(n));
    messages += m + "\n";
    if (m.find("backlog 4 posts") != std::string::npos) found = m;
  }
  ::close(notify);
  EXPECT_NE(messages.find("READY=1"), std::string::npos) << messages;
  ASSERT_FALSE(found.empty()) << messages;
  EXPECT_NE(found.find("STATUS=accepting posts; backlog 4 posts"), std::string::npos) << found;
  EXPECT_NE(found.find("broker waiting"), std::string::npos) << found;
  const std::string text = daemon_->LogText();
  EXPECT_EQ(text.rfind("<6>info: ", 0), 0u) << text;
  EXPECT_NE(text.find("\n<4>warning: forwarder: cannot use broker"), std::string::npos) << text;
}

TEST_F(Ops, ReconnectEndsTheBackOffWait) {
  // Delays of up to 60 s, with full jitter.
  StartDaemon("amqp://guest:guest@127.0.0.1:" + std::to_string(UnusedPort()) + "/",
              {"reconnect_delay_initial_ms = 60000", "reconnect_delay_max_ms = 60000"});
  // Wait for a draw that leaves at least 20 s to the next attempt (5 in 6
  // draws do), so that an attempt within the next 15 s is the reconnect's.
  json j;
  const Clock::time_point end = Clock::now() + 300s;
  do {
    j = WaitStatus([](const json& s) { return s["broker"]["state"] == "waiting"; });
    if (j["broker"]["next_attempt_in_ms"].get<int64_t>() >= 20000) break;
    const int failures = j["broker"]["connect_failures_in_row"];
    WaitStatus([failures](const json& s) {
      return s["broker"]["connect_failures_in_row"].get<int>() > failures;
    }, 70s);
  } while (Clock::now() < end);
  ASSERT_GE(j["broker"]["next_attempt_in_ms"].get<int64_t>(), 20000) << j.dump(2);
  const int failures = j["broker"]["connect_failures_in_row"];
  std::string out;
  ASSERT_EQ(Cli({"reconnect"}, &out), 0) << out;
  const json after = WaitStatus([failures](const json& s) {
    return s["broker"]["connect_failures_in_row"].get<int>() > failures;
  }, 15s);
  EXPECT_GT(after["broker"]["connect_failures_in_row"].get<int>(), failures);
  EXPECT_NE(daemon_->LogText().find("reconnect requested through the control socket"),
            std::string::npos);
}

// broker_standby: with two brokers listed (here the same broker under two
// names), a second connection is opened, warmed by one swap, and shown.
TEST_F(Ops, TwoBrokersKeepAReadyStandbyConnectionThatStatusShows) {
  ASSERT_TRUE(consumer_.DeclareBoundQueue(queue_, exchange_).ok());
  const std::string first = broker_->url();
  std::string second = first;
  const size_t at = second.find("127.0.0.1");
  ASSERT_NE(at, std::string::npos) << second;
  second.replace(at, 9, "localhost");
  StartDaemon(first + ", " + second);
  Post(20);
  const json j = WaitStatus([](const json& s) {
    return s["posts"]["confirmed"] == 20 && s["broker"]["standby_ready"] == true;
  });
  // It swapped once to warm the standby: it publishes on the second now.
  EXPECT_NE(j["broker"]["url"].get<std::string>().find("localhost"), std::string::npos)
      << j.dump(2);
  const std::string standby = j["broker"]["standby"];
  EXPECT_NE(standby.find("127.0.0.1"), std::string::npos) << standby;
  EXPECT_EQ(standby.find(":guest@"), std::string::npos) << "no password: " << standby;
  std::string out;
  EXPECT_EQ(Cli({"status"}, &out), 0) << out;
  EXPECT_NE(out.find("standby " + standby + " (ready to take over)"), std::string::npos) << out;
  ASSERT_EQ(Cli({"metrics"}, &out), 0) << out;
  EXPECT_NE(out.find("\npostspool_broker_standby_connected 2\n"), std::string::npos) << out;
  Post(5);
  WaitStatus([](const json& s) { return s["posts"]["confirmed"] == 25; });
  std::vector<ReceivedMessage> got;
  ASSERT_TRUE(consumer_.GetAll(queue_, &got).ok());
  EXPECT_EQ(got.size(), 25u);
}

TEST_F(Ops, ExitCodesForUsageErrorsAndAnUnreachableDaemon) {
  std::string out, err;
  EXPECT_EQ(RunProgram({cli_, "status", "--control-socket", "/nonexistent/control.sock"}, &out, &err), 3);
  EXPECT_NE(err.find("cannot reach postspoold"), std::string::npos) << err;
  EXPECT_EQ(RunProgram({cli_, "drain", "--timeout", "soon"}, &out, &err), 2);
  EXPECT_NE(err.find("--timeout takes a duration"), std::string::npos) << err;
  EXPECT_EQ(RunProgram({cli_, "status", "--frobnicate"}, &out, &err), 2);
  EXPECT_EQ(RunProgram({cli_, "metrics", "--json"}, &out, &err), 2);
  EXPECT_EQ(RunProgram({cli_, "log-level", "loud"}, &out, &err), 2);
  // A missing value is said as such by every command, and a usage error is
  // one line and where the usage is, not the whole usage.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"drain", "--timeout"}, {"status", "--control-socket"},
        {"metrics", "--control-socket"}, {"post", "--rel-path"}, {"verify", "--quarantine-dir"}}) {
    EXPECT_EQ(RunProgram({cli_, args[0], args[1]}, &out, &err), 2) << args[0];
    EXPECT_NE(err.find(args[1] + " needs a value"), std::string::npos) << args[0] << ": " << err;
    EXPECT_EQ(Count(err, "\n"), 2u) << args[0] << ": " << err;
    EXPECT_NE(err.find("(usage: postspool " + args[0] + " --help)"), std::string::npos) << err;
  }
  EXPECT_EQ(RunProgram({cli_, "status", "--frobnicate"}, &out, &err), 2);
  EXPECT_EQ(err, "postspool status: unknown option \"--frobnicate\"\n(usage: postspool status --help)\n");
  EXPECT_EQ(RunProgram({cli_, "frobnicate"}, &out, &err), 2);
  EXPECT_EQ(err, "postspool: unknown command \"frobnicate\"\n(usage: postspool --help)\n");
  // --version, which the man page lists, and post's help names the ring.
  EXPECT_EQ(RunProgram({cli_, "--version"}, &out, &err), 0);
  EXPECT_EQ(out, "postspool " + std::to_string(POSTSPOOL_VERSION_MAJOR) + "." +
                     std::to_string(POSTSPOOL_VERSION_MINOR) + "\n");
  EXPECT_EQ(RunProgram({cli_, "post", "--help"}, &out, &err), 0);
  EXPECT_NE(out.find("ring|socket|spool"), std::string::npos) << out;
}

}  // namespace
}  // namespace postspool::testing
