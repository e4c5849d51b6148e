#include "control.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"

namespace postspool::daemon {
namespace {

using Clock = std::chrono::steady_clock;

// The supplementary groups of the peer (SO_PEERGROUPS, Linux 4.13): at
// most this many are looked at.
constexpr size_t kPeerGroupsMax = 4096;

bool InDaemonGroup(int fd, gid_t primary) {
  const gid_t daemon_gid = ::getegid();
  if (primary == daemon_gid) return true;
  std::vector<gid_t> groups(64);
  for (;;) {
    socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      break;
    }
    if (errno != ERANGE || len / sizeof(gid_t) <= groups.size() ||
        len / sizeof(gid_t) > kPeerGroupsMax) {
      return false;
    }
    groups.resize(len / sizeof(gid_t));
  }
  return std::find(groups.begin(), groups.end(), daemon_gid) != groups.end();
}

}  // namespace

ControlServer::~ControlServer() { Stop(); }

Status ControlServer::Start(const Options& options, Handler handler, Tick tick) {
  options_ = options;
  handler_ = std::move(handler);
  tick_ = std::move(tick);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options.path.size() >= sizeof addr.sun_path) {
    return Status(StatusCode::kInvalidArgument, "control_socket_path is too long: " + options.path);
  }
  std::memcpy(addr.sun_path, options.path.c_str(), options.path.size() + 1);
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status::FromErrno(errno, "socket");
  struct stat st;
  if (::lstat(options.path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status(StatusCode::kAlreadyExists, "control_socket_path " + options.path +
                                                    " exists and is not a socket; not touching it");
    }
    // Stale: this daemon holds the journal lock (see ListenOn in daemon.cc).
    ::unlink(options.path.c_str());
  }
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    return Status::FromErrno(errno, "bind " + options.path);
  }
  if (::chmod(options.path.c_str(), options.mode) != 0) {
    return Status::FromErrno(errno, "chmod " + options.path);
  }
  if (::lstat(options.path.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + options.path);
  socket_dev_ = st.st_dev;
  socket_ino_ = st.st_ino;
  if (::listen(fd.get(), 64) != 0) return Status::FromErrno(errno, "listen on " + options.path);
  stop_fd_.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!stop_fd_.valid()) return Status::FromErrno(errno, "eventfd");
  listen_fd_ = std::move(fd);
  clients_.reserve(options_.connections_max);
  thread_ = std::thread([this] {
    ::pthread_setname_np(::pthread_self(), "ps-control");
    Run();
  });
  return Status::Ok();
}

void ControlServer::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(stop_fd_.get(), &one, sizeof one);
  thread_.join();
  clients_.clear();
  listen_fd_.reset();
  struct stat st;
  if (::lstat(options_.path.c_str(), &st) == 0 && st.st_dev == socket_dev_ &&
      st.st_ino == socket_ino_) {
    ::unlink(options_.path.c_str());
  }
}

void ControlServer::Run() {
  Clock::time_point next_tick = Clock::now();
  std::vector<pollfd> fds;
  for (;;) {
    Clock::time_point now = Clock::now();
    if (now >= next_tick) {
      if (tick_) tick_();
      next_tick = now + std::chrono::seconds(1);
    }
    // Clients past their time are closed.
    std::erase_if(clients_, [now](const Client& c) { return now >= c.deadline; });
    Clock::time_point wake = next_tick;
    fds.clear();
    fds.push_back(pollfd{stop_fd_.get(), POLLIN, 0});
    const bool accepting = now >= accept_paused_until_;
    fds.push_back(pollfd{listen_fd_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    if (!accepting) wake = std::min(wake, accept_paused_until_);
    for (const Client& c : clients_) {
      fds.push_back(pollfd{c.fd.get(), static_cast<short>(c.replying ? POLLOUT : POLLIN), 0});
      wake = std::min(wake, c.deadline);
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
    const int ready = ::poll(fds.data(), fds.size(), wait <= 0 ? 0 : static_cast<int>(wait) + 1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      PS_LOG_ERROR("control socket: poll failed: %s; control socket closed", std::strerror(errno));
      return;
    }
    if ((fds[0].revents & POLLIN) != 0) return;
    // The clients first (fds[2...] are clients_ in order), then new ones.
    std::vector<bool> keep(clients_.size(), true);
    for (size_t i = 0; i < clients_.size(); ++i) {
      const short rev = fds[i + 2].revents;
      if (rev == 0) continue;
      Client& c = clients_[i];
      if (!c.replying && (rev & (POLLIN | POLLHUP | POLLERR)) != 0) {
        keep[i] = OnReadable(&c);
      } else if (c.replying && (rev & (POLLOUT | POLLHUP | POLLERR)) != 0) {
        keep[i] = OnWritable(&c);
      }
    }
    size_t i = 0;
    std::erase_if(clients_, [&](const Client&) { return !keep[i++]; });
    if ((fds[1].revents & POLLIN) != 0) Accept();
  }
}

void ControlServer::Accept() {
  // At most a few per round, so that a flood of connections cannot keep the
  // clients already accepted from being served.
  for (int n = 0; n < 16; ++n) {
    UniqueFd fd(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
        // EMFILE and the like: the pending connection stays readable, so
        // pause rather than spin; counted as refused.
        metrics_->control_connections_refused_total.fetch_add(1, std::memory_order_relaxed);
        accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
      }
      return;
    }
    metrics_->control_connections_total.fetch_add(1, std::memory_order_relaxed);
    if (clients_.size() >= options_.connections_max) {
      metrics_->control_connections_refused_total.fetch_add(1, std::memory_order_relaxed);
      static constexpr char kBusy[] =
          "{\"ok\":false,\"error\":\"busy: too many control connections, try again\"}\n";
      [[maybe_unused]] ssize_t w = ::send(fd.get(), kBusy, sizeof kBusy - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      continue;
    }
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) continue;
    Client c;
    c.peer.pid = cred.pid;
    c.peer.uid = cred.uid;
    c.peer.gid = cred.gid;
    c.peer.may_change =
        cred.uid == 0 || cred.uid == ::geteuid() || InDaemonGroup(fd.get(), cred.gid);
    c.fd = std::move(fd);
    c.deadline = Clock::now() + std::chrono::milliseconds(options_.client_timeout_ms);
    clients_.push_back(std::move(c));
  }
}

bool ControlServer::OnReadable(Client* c) {
  char buf[1024];
  for (;;) {
    const ssize_t n = ::recv(c->fd.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    if (n == 0) {
      // The client closed its side: what it sent is the request.
      if (c->in.empty()) return false;
      HandleRequest(c, c->in);
      return OnWritable(c);
    }
    c->in.append(buf, static_cast<size_t>(n));
    if (const size_t nl = c->in.find('\n'); nl != std::string::npos) {
      HandleRequest(c, std::string_view(c->in).substr(0, nl));
      return OnWritable(c);
    }
    if (c->in.size() > kRequestBytesMax) {
      metrics_->control_requests_malformed_total.fetch_add(1, std::memory_order_relaxed);
      Reply(c, {{"ok", false},
                {"error", "request longer than " + std::to_string(kRequestBytesMax) + " bytes"}});
      return OnWritable(c);
    }
  }
}

bool ControlServer::OnWritable(Client* c) {
  while (c->out_sent < c->out.size()) {
    const ssize_t n = ::send(c->fd.get(), c->out.data() + c->out_sent, c->out.size() - c->out_sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    c->out_sent += static_cast<size_t>(n);
  }
  return false;  // all sent: close
}

void ControlServer::Reply(Client* c, const nlohmann::json& reply) {
  c->replying = true;
  c->out = reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (c->out.size() > kReplyBytesMax) {
    c->out = R"({"ok":false,"error":"reply too large"})";
  }
  c->out += '\n';
}

void ControlServer::HandleRequest(Client* c, std::string_view line) {
  metrics_->control_requests_total.fetch_add(1, std::memory_order_relaxed);
  nlohmann::json request = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded() || !request.is_object() || !request.contains("request") ||
      !request["request"].is_string()) {
    metrics_->control_requests_malformed_total.fetch_add(1, std::memory_order_relaxed);
    Reply(c, {{"ok", false},
              {"error", "a request is one JSON object with a string \"request\" on one line"}});
    return;
  }
  nlohmann::json reply;
  try {
    reply = handler_(request, c->peer);
  } catch (const std::exception& e) {
    // A request with fields of the wrong type (json type_error): the
    // client's mistake, answered, never a crash of the daemon.
    metrics_->control_requests_malformed_total.fetch_add(1, std::memory_order_relaxed);
    reply = {{"ok", false}, {"error", std::string("bad request: ") + e.what()}};
  }
  Reply(c, reply);
}

}  // namespace postspool::daemon
