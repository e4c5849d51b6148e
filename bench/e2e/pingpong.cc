#include "pingpong.h"

#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <vector>

#include "bench_results.h"
#include "json_writer.h"
#include "process_fleet.h"

namespace postspool::bench {
namespace {

void PinTo(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)::sched_setaffinity(0, sizeof set, &set);
}

// The server's CPU and the clients' CPU for a placement; -1: not pinned.
void Placement(const std::string& placement, int* server_cpu, int* client_cpu) {
  *server_cpu = -1;
  *client_cpu = -1;
  if (placement == "same") {
    *server_cpu = 0;
    *client_cpu = 0;
  } else if (placement == "cross") {
    *server_cpu = 1;
    *client_cpu = 0;
  }
}

// One process, one epoll loop: accepts, and answers every request with a
// reply of reply_bytes, until `clients` connections have come and gone.
[[noreturn]] void Serve(int listen_fd, int clients, int reply_bytes, int cpu) {
  PinTo(cpu);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = listen_fd;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, listen_fd, &ev);
  std::vector<char> request(65536);
  std::vector<char> reply(static_cast<size_t>(reply_bytes), 'a');
  int closed = 0;
  epoll_event events[64];
  while (closed < clients) {
    const int n = ::epoll_wait(ep, events, 64, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) ::_exit(3);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == listen_fd) {
        const int c = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) continue;
        epoll_event cev{};
        cev.events = EPOLLIN;
        cev.data.fd = c;
        ::epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
        continue;
      }
      const ssize_t got = ::recv(fd, request.data(), request.size(), 0);
      if (got <= 0) {
        ::close(fd);
        ++closed;
        continue;
      }
      (void)::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
    }
  }
  ::_exit(0);
}

int Client(const std::string& path, const PingPongOptions& o, int cpu,
           std::span<PostOutcome> outcomes) {
  PinTo(cpu);
  const int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return 2;
  std::vector<char> request(static_cast<size_t>(o.request_bytes), 'r');
  std::vector<char> reply(4096);
  for (PostOutcome& out : outcomes) {
    out.start_ns = MonotonicNs();
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) < 0 ||
        ::recv(fd, reply.data(), reply.size(), 0) <= 0) {
      out.rc = 1;
      out.latency_ns = MonotonicNs() - out.start_ns;
      return 3;
    }
    out.latency_ns = MonotonicNs() - out.start_ns;
    out.rc = 0;
  }
  ::close(fd);
  return 0;
}

// A process's time on a CPU so far, in ns (/proc/<pid>/schedstat, as the
// daemon's CPU figures are measured); -1 when it cannot be read.
int64_t CpuNs(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/schedstat");
  int64_t ns = -1;
  if (!(in >> ns)) return -1;
  return ns;
}

}  // namespace

std::string RunPingPong(const PingPongOptions& o) {
  char dir_template[] = "/tmp/postspool-pingpong-XXXXXX";
  const char* dir = ::mkdtemp(dir_template);
  JsonWriter w;
  w.BeginObject();
  w.Field("clients", o.clients).Field("round_trips_per_client", o.round_trips);
  w.Field("request_bytes", o.request_bytes).Field("reply_bytes", o.reply_bytes);
  w.Field("placement", o.placement);
  if (dir == nullptr) {
    w.Field("error", std::string("mkdtemp: ") + std::strerror(errno)).EndObject();
    return w.text();
  }
  const std::string path = std::string(dir) + "/s";
  const int listen_fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  if (::bind(listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd, 1024) != 0) {
    w.Field("error", std::string("bind/listen: ") + std::strerror(errno)).EndObject();
    return w.text();
  }
  int server_cpu, client_cpu;
  Placement(o.placement, &server_cpu, &client_cpu);
  const pid_t server = ::fork();
  if (server == 0) Serve(listen_fd, o.clients, o.reply_bytes, server_cpu);
  ::close(listen_fd);
  ProcessFleet fleet(o.clients, o.round_trips);
  Status s = fleet.Fork([&](int, std::span<PostOutcome> out) {
    return Client(path, o, client_cpu, out);
  });
  int64_t server_cpu_ns = -1;
  if (s.ok()) {
    fleet.Release();
    fleet.Wait();
    server_cpu_ns = CpuNs(server);
  }
  ::kill(server, SIGKILL);
  int status;
  ::waitpid(server, &status, 0);
  ::unlink(path.c_str());
  ::rmdir(dir);
  if (!s.ok()) {
    w.Field("error", s.ToString()).EndObject();
    return w.text();
  }
  const FleetFigures f = Figures(fleet, 0);
  w.Field("ok", f.ok).Field("failed", f.failed + f.not_run);
  w.Field("seconds", f.seconds).Field("per_s", f.posts_per_s);
  // The anchor of the daemon's CPU per socket post: what the bare server
  // spends on a CPU (user and kernel) per round trip.
  if (server_cpu_ns >= 0 && f.ok > 0) {
    w.Field("server_cpu_us_per_round_trip",
            static_cast<double>(server_cpu_ns) / 1e3 / static_cast<double>(f.ok));
  }
  w.Key("latency_us").BeginObject();
  w.Field("p50", f.latency_all.p50_ms * 1e3).Field("p90", f.latency_all.p90_ms * 1e3);
  w.Field("p99", f.latency_all.p99_ms * 1e3).Field("p999", f.latency_all.p999_ms * 1e3);
  w.Field("max", f.latency_all.max_ms * 1e3).Field("mean", f.latency_all.mean_ms * 1e3);
  w.EndObject();
  w.EndObject();
  return w.text();
}

}  // namespace postspool::bench
