#include "cluster_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

namespace postspool::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::string NodeName(int i) {
  return "postspool-c" + std::to_string(::getpid()) + "-" + std::to_string(i) + "@localhost";
}

}  // namespace

BrokerCluster::BrokerCluster() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/postspool-cluster-XXXXXX";
  if (::mkdtemp(tmpl.data()) != nullptr) home_ = tmpl;
  // The shared cookie: Erlang insists on mode 0400.
  std::mt19937_64 rng(std::random_device{}());
  const std::string cookie_path = home_ + "/.erlang.cookie";
  {
    std::ofstream f(cookie_path, std::ios::trunc);
    f << "POSTSPOOLCLUSTER" << std::hex << rng() << rng();
  }
  ::chmod(cookie_path.c_str(), 0400);
  epmd_port_ = UnusedPort();
  std::string discovery = "cluster_formation.peer_discovery_backend = classic_config\n";
  for (int i = 0; i < kNodes; ++i) {
    discovery += "cluster_formation.classic_config.nodes." + std::to_string(i + 1) + " = " +
                 NodeName(i) + "\n";
  }
  for (int i = 0; i < kNodes; ++i) {
    BrokerProcess::Options o;
    o.node_name = NodeName(i);
    o.epmd_port = epmd_port_;
    o.home = home_;
    o.extra_config = discovery;
    o.tls = false;
    nodes_.push_back(std::make_unique<BrokerProcess>(o));
  }
}

BrokerCluster::~BrokerCluster() {
  Stop();
  if (!home_.empty() && std::getenv("POSTSPOOL_KEEP_BROKER_DIR") == nullptr) {
    std::error_code ec;
    std::filesystem::remove_all(home_, ec);
  }
}

Status BrokerCluster::Start(int timeout_s) {
  if (home_.empty() || epmd_port_ == 0) return Status(StatusCode::kIoError, "no directory or port");
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(timeout_s);
  const std::string port = std::to_string(epmd_port_);
  const pid_t parent = ::getpid();
  epmd_pid_ = ::fork();
  if (epmd_pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    const int null_fd = ::open("/dev/null", O_RDWR);
    ::dup2(null_fd, 0);
    ::dup2(null_fd, 1);
    ::dup2(null_fd, 2);
    ::close_range(3, ~0U, 0);
    ::execl("/usr/bin/epmd", "epmd", "-port", port.c_str(), "-address", "127.0.0.1",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  if (epmd_pid_ < 0) return Status::FromErrno(errno, "fork epmd");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  if (Status s = node(0).Start(timeout_s); !s.ok()) return s;
  const int left = static_cast<int>(
      std::chrono::duration_cast<std::chrono::seconds>(deadline - Clock::now()).count());
  return StartStopped(std::max(left, 30));
}

Status BrokerCluster::StartStopped(int timeout_s) {
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(timeout_s);
  std::vector<Status> results(kNodes);
  std::vector<std::thread> threads;
  for (int i = 0; i < kNodes; ++i) {
    if (node(i).running()) continue;
    threads.emplace_back([this, i, timeout_s, &results] { results[i] = node(i).Start(timeout_s); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < kNodes; ++i) {
    if (!results[i].ok()) {
      return Status(results[i].code(), "node " + std::to_string(i) + ": " + results[i].message());
    }
  }
  while (RunningNodes(0) < kNodes) {
    if (Clock::now() >= deadline) {
      return Status(StatusCode::kTimedOut, "the cluster does not report 3 running nodes; " +
                                               LogTails());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return Status::Ok();
}

int BrokerCluster::RunningNodes(int from) {
  std::string out;
  if (node(from).Ctl({"-q", "cluster_status", "--formatter", "json"}, &out) != 0) return 0;
  const size_t at = out.find("\"running_nodes\"");
  if (at == std::string::npos) return 0;
  const size_t end = out.find(']', at);
  const std::string list = out.substr(at, end == std::string::npos ? std::string::npos : end - at);
  int n = 0;
  for (int i = 0; i < kNodes; ++i) {
    if (list.find(NodeName(i)) != std::string::npos) ++n;
  }
  return n;
}

void BrokerCluster::Stop() {
  for (auto& n : nodes_) n->Stop().IgnoreError();
  if (epmd_pid_ > 0) {
    ::kill(epmd_pid_, SIGKILL);
    while (::waitpid(epmd_pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
    epmd_pid_ = -1;
  }
}

std::vector<std::string> BrokerCluster::urls() const {
  std::vector<std::string> u;
  for (const auto& n : nodes_) u.push_back(n->url());
  return u;
}

int BrokerCluster::NodeOf(const std::string& display_url) const {
  for (int i = 0; i < kNodes; ++i) {
    if (display_url.find(":" + std::to_string(nodes_[static_cast<size_t>(i)]->amqp_port()) + "/") !=
        std::string::npos) {
      return i;
    }
  }
  return -1;
}

std::string BrokerCluster::LogTails() const {
  std::string all;
  for (int i = 0; i < kNodes; ++i) {
    all += "=== node " + std::to_string(i) + "\n" + nodes_[static_cast<size_t>(i)]->LogTail(20);
  }
  return all;
}

}  // namespace postspool::testing
