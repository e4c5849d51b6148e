#include "broker_fixture.h"

#include <amqp_tcp_socket.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "amqp_session.h"

extern char** environ;

namespace postspool::testing {
namespace {

constexpr char kEpmd[] = "/usr/bin/epmd";

bool IsExecutable(const char* path) { return ::access(path, X_OK) == 0; }

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
  return static_cast<bool>(f);
}

void RemoveTree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    if (DIR* d = ::opendir(path.c_str())) {
      while (dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") RemoveTree(path + "/" + name);
      }
      ::closedir(d);
    }
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

bool PortFree(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

// The lowest port the kernel hands out to outgoing connections
// (net.ipv4.ip_local_port_range; 32768 when it cannot be read).
int EphemeralLow() {
  int low = 32768, high = 0;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 32768;
    std::fclose(f);
  }
  return low;
}

// A free port below the ephemeral range, so that while a broker is stopped
// and started again (the bench and the cluster tests do) no outgoing
// connection of another program on the machine can be given its port; seen
// as eaddrinuse at restart on a busy machine. At least 10000 and below 40000,
// low enough that RabbitMQ's CLI tools, which use the distribution port +
// 10000..10010, stay below 65536.
int PickPort(std::mt19937* rng, int avoid1 = 0, int avoid2 = 0) {
  const int high = std::clamp(EphemeralLow(), 12000, 40000);
  std::uniform_int_distribution<int> pick(10000, high - 1);
  for (int i = 0; i < 1000; ++i) {
    const int p = pick(*rng);
    if (p != avoid1 && p != avoid2 && PortFree(p) && PortFree(p + 10000)) return p;
  }
  return 0;
}

// --- What the supervisor process does (after fork: async-signal-safe calls
// only, everything prepared before the fork).

void SleepMs(long ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

bool PortAccepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

[[noreturn]] void ExecChild(char* const* argv, char* const* envp) {
  ::close_range(3, ~0U, 0);
  ::execve(argv[0], argv, envp);
  ::_exit(127);
}

bool Exited(pid_t pid) {
  int status;
  return ::waitpid(pid, &status, WNOHANG) == pid;
}

// The supervisor: a fork of the test binary, in a session of its own. It
// starts a private epmd and then the broker in a process group of its own
// (so that pausing the broker never pauses the supervisor), and obeys
// one-byte commands on `control_fd`: 'p' pause (SIGSTOP the broker's group),
// 'r' resume, 'k' kill (SIGKILL the group). End of file (Stop(), or the
// test binary died) stops the broker gracefully. It exits, after a last
// SIGKILL of the broker's group and of epmd, when the broker is gone.
[[noreturn]] void Supervise(int control_fd, int log_fd, int null_fd, int epmd_port,
                            char* const* epmd_argv, char* const* server_argv,
                            char* const* envp) {
  ::setsid();
  ::dup2(null_fd, 0);
  ::dup2(log_fd, 1);
  ::dup2(log_fd, 2);
  // Keep only the own control pipe: a supervisor forked while other brokers
  // of the test binary run (a cluster's nodes) would otherwise hold their
  // pipes open, and they would never see the end of file that stops them.
  if (control_fd != 3) {
    ::dup2(control_fd, 3);
    control_fd = 3;
  }
  ::close_range(4, ~0U, 0);
  // Should the supervisor itself be killed (kill -9 of the whole test
  // binary's process tree), its children learn it from the kernel: epmd
  // dies, the broker's script stops the broker.
  const pid_t self = ::getpid();
  // Private epmd, listening before the node starts (none when the caller
  // runs one for several nodes: epmd_argv is null).
  const pid_t epmd = epmd_argv == nullptr ? -1 : ::fork();
  if (epmd == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != self) ::_exit(1);
    ExecChild(epmd_argv, envp);
  }
  for (int i = 0; i < 250 && !PortAccepts(epmd_port); ++i) SleepMs(20);
  const pid_t server = ::fork();
  if (server == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != self) ::_exit(1);
    ExecChild(server_argv, envp);
  }
  if (server > 0) ::setpgid(server, server);  // either side may run first
  bool server_gone = server < 0;
  bool kill_now = false;
  while (!server_gone && !kill_now) {
    pollfd p{control_fd, POLLIN, 0};
    if (::poll(&p, 1, 200) > 0) {
      char c = 0;
      const ssize_t n = ::read(control_fd, &c, 1);
      if (n <= 0 && !(n < 0 && errno == EINTR)) break;  // end of file: stop
      if (c == 'p') ::kill(-server, SIGSTOP);
      if (c == 'r') ::kill(-server, SIGCONT);
      if (c == 'k') kill_now = true;
    }
    server_gone = Exited(server);
  }
  if (kill_now) {
    ::kill(-server, SIGKILL);
  } else if (!server_gone) {
    // The rabbitmq-server script stops the VM on SIGTERM and waits for it.
    ::kill(-server, SIGCONT);
    ::kill(server, SIGTERM);
    for (int i = 0; i < 3000 && !Exited(server); ++i) SleepMs(10);
  }
  // Whatever is left of the broker, and epmd.
  if (server > 0) ::kill(-server, SIGKILL);
  if (epmd > 0) ::kill(epmd, SIGKILL);
  while (::waitpid(-1, nullptr, 0) > 0 || errno == EINTR) {
  }
  ::_exit(0);
}

struct CStrings {
  explicit CStrings(const std::vector<std::string>& v) {
    for (const std::string& s : v) ptrs.push_back(const_cast<char*>(s.c_str()));
    ptrs.push_back(nullptr);
  }
  char* const* get() const { return ptrs.data(); }
  std::vector<char*> ptrs;
};


std::string ToString(amqp_bytes_t b) {
  return b.bytes == nullptr ? std::string() : std::string(static_cast<const char*>(b.bytes), b.len);
}

// Logs in once to check that the broker serves AMQP.
bool AmqpLoginWorks(int port, std::string* why) {
  amqp_connection_state_t conn = amqp_new_connection();
  amqp_socket_t* socket = amqp_tcp_socket_new(conn);
  timeval tv{2, 0};
  bool ok = false;
  if (int rc = amqp_socket_open_noblock(socket, "127.0.0.1", port, &tv); rc != AMQP_STATUS_OK) {
    *why = std::string("connect: ") + amqp_error_string2(rc);
  } else {
    amqp_set_rpc_timeout(conn, &tv);
    amqp_set_handshake_timeout(conn, &tv);
    const amqp_rpc_reply_t r =
        amqp_login(conn, "/", 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest");
    ok = r.reply_type == AMQP_RESPONSE_NORMAL;
    if (!ok) {
      *why = daemon::AmqpReplyStatus(r, "login").message();
    } else {
      amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
    }
  }
  amqp_destroy_connection(conn);
  return ok;
}

std::string Tail(const std::string& path, size_t lines) {
  std::ifstream f(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(f, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) {
    out += all[i];
    out += '\n';
  }
  return out;
}

// Runs a shell command (for openssl); true if it exited 0.
bool RunShell(const std::string& command, const std::string& log_path) {
  const std::string full = command + " >>'" + log_path + "' 2>&1";
  const std::vector<std::string> args = {"/bin/sh", "-c", full};
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid;
  if (::posix_spawn(&pid, "/bin/sh", nullptr, nullptr, argv.data(), environ) != 0) return false;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

int UnusedPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);  // bound, never listened on: connections to it are refused
  return port;
}

// ---------------------------------------------------------------------------
// BrokerProcess

bool BrokerProcess::Installed(std::string* why) {
  if (!IsExecutable(kRabbitmqServer)) {
    *why = std::string("RabbitMQ is not installed (") + kRabbitmqServer +
           " not found; Debian: apt-get install rabbitmq-server)";
    return false;
  }
  if (!IsExecutable(kEpmd)) {
    *why = std::string("Erlang's epmd is not installed (") + kEpmd + " not found)";
    return false;
  }
  return true;
}

BrokerProcess::BrokerProcess(const Options& options) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/postspool-rabbitmq-XXXXXX";
  if (::mkdtemp(tmpl.data()) != nullptr) dir_ = tmpl;
  home_ = options.home.empty() ? dir_ : options.home;
  own_epmd_ = options.epmd_port == 0;
  std::mt19937 rng(std::random_device{}());
  amqp_port_ = PickPort(&rng);
  dist_port_ = PickPort(&rng, amqp_port_);
  epmd_port_ = own_epmd_ ? PickPort(&rng, amqp_port_, dist_port_) : options.epmd_port;
  std::string tls_config;
  if (options.tls && MakeCertificates()) {
    do {
      amqps_port_ = PickPort(&rng, amqp_port_, dist_port_);
    } while (amqps_port_ != 0 && amqps_port_ == epmd_port_);
    tls_config = "listeners.ssl.1 = 127.0.0.1:" + std::to_string(amqps_port_) +
                 "\n"
                 "ssl_options.cacertfile = " + dir_ + "/ca.pem\n"
                 "ssl_options.certfile = " + dir_ + "/server.pem\n"
                 "ssl_options.keyfile = " + dir_ + "/server.key\n"
                 "ssl_options.verify = verify_none\n"
                 "ssl_options.fail_if_no_peer_cert = false\n";
  }
  node_name_ = options.node_name.empty()
                   ? "postspool-test-" + std::to_string(::getpid()) + "@localhost"
                   : options.node_name;
  ::mkdir((dir_ + "/mnesia").c_str(), 0700);
  ::mkdir((dir_ + "/log").c_str(), 0700);
  WriteFile(dir_ + "/enabled_plugins", "[].\n");
  WriteFile(dir_ + "/rabbitmq.conf",
            "# guest may log in from loopback only (RabbitMQ's default, stated here).\n"
            "loopback_users.guest = true\n"
            "# A test machine's disk may be nearly full; do not block publishers for it.\n"
            "disk_free_limit.absolute = 1MB\n"
            "log.file.level = info\n" +
                tls_config + options.extra_config);
}

bool BrokerProcess::MakeCertificates() {
  if (!IsExecutable("/usr/bin/openssl")) return false;
  // EC keys: generated in milliseconds. The server certificate names
  // localhost and 127.0.0.1 (hostname verification), signed by ca.pem.
  const std::string d = "'" + dir_ + "'";
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string log = dir_ + "/openssl.log";
  const bool ok =
      WriteFile(dir_ + "/server.ext",
                "subjectAltName = DNS:localhost, IP:127.0.0.1\n"
                "basicConstraints = CA:FALSE\n"
                "keyUsage = digitalSignature, keyEncipherment\n"
                "extendedKeyUsage = serverAuth\n") &&
      RunShell("openssl req -x509 " + key + " -keyout " + d + "/ca.key -out " + d +
                   "/ca.pem -days 2 -subj '/CN=postspool test CA'",
               log) &&
      RunShell("openssl req -x509 " + key + " -keyout " + d + "/other-ca.key -out " + d +
                   "/other-ca.pem -days 2 -subj '/CN=unrelated test CA'",
               log) &&
      RunShell("openssl req " + key + " -keyout " + d + "/server.key -out " + d +
                   "/server.csr -subj '/CN=localhost'",
               log) &&
      RunShell("openssl x509 -req -in " + d + "/server.csr -CA " + d + "/ca.pem -CAkey " + d +
                   "/ca.key -CAcreateserial -out " + d + "/server.pem -days 2 -extfile " + d +
                   "/server.ext",
               log);
  if (!ok) return false;
  tls_ca_file_ = dir_ + "/ca.pem";
  other_ca_file_ = dir_ + "/other-ca.pem";
  return true;
}

BrokerProcess::~BrokerProcess() {
  Stop().IgnoreError();
  if (!dir_.empty() && std::getenv("POSTSPOOL_KEEP_BROKER_DIR") == nullptr) RemoveTree(dir_);
}

std::string BrokerProcess::url() const {
  return "amqp://guest:guest@127.0.0.1:" + std::to_string(amqp_port_) + "/";
}

std::string BrokerProcess::tls_url() const {
  return "amqps://guest:guest@localhost:" + std::to_string(amqps_port_) + "/";
}

std::vector<std::string> BrokerProcess::Environment() const {
  const char* path = std::getenv("PATH");
  return {
      "PATH=" + std::string(path ? path : "/usr/local/bin:/usr/bin:/bin"),
      "HOME=" + home_,  // the Erlang cookie lives here
      "LANG=C.UTF-8",
      "LC_ALL=C.UTF-8",
      "RABBITMQ_NODENAME=" + node_name_,
      "RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
      "RABBITMQ_NODE_PORT=" + std::to_string(amqp_port_),
      "RABBITMQ_DIST_PORT=" + std::to_string(dist_port_),
      "ERL_EPMD_PORT=" + std::to_string(epmd_port_),
      "ERL_EPMD_ADDRESS=127.0.0.1",
      "RABBITMQ_MNESIA_BASE=" + dir_ + "/mnesia",
      "RABBITMQ_LOG_BASE=" + dir_ + "/log",
      "RABBITMQ_LOGS=" + dir_ + "/log/rabbit.log",
      "RABBITMQ_PID_FILE=" + dir_ + "/rabbitmq.pid",
      "RABBITMQ_ENABLED_PLUGINS_FILE=" + dir_ + "/enabled_plugins",
      "RABBITMQ_CONFIG_FILE=" + dir_ + "/rabbitmq.conf",
      "RABBITMQ_ADVANCED_CONFIG_FILE=" + dir_ + "/advanced.config",
      "RABBITMQ_CONF_ENV_FILE=" + dir_ + "/rabbitmq-env.conf",
      "ERL_CRASH_DUMP=" + dir_ + "/erl_crash.dump",
  };
}

Status BrokerProcess::Start(int timeout_s) {
  if (running()) return Status::Ok();
  if (dir_.empty()) return Status(StatusCode::kIoError, "no temporary directory for the broker");
  if (amqp_port_ == 0 || dist_port_ == 0 || epmd_port_ == 0) {
    return Status(StatusCode::kIoError, "no free ports for the broker");
  }
  const std::vector<std::string> env = Environment();
  const std::vector<std::string> epmd_args = {kEpmd, "-port", std::to_string(epmd_port_)};
  const std::vector<std::string> server_args = {kRabbitmqServer};
  const CStrings envp(env), epmd_argv(epmd_args), server_argv(server_args);
  const int log_fd = ::open((dir_ + "/console.log").c_str(),
                            O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int control[2];
  if (log_fd < 0 || null_fd < 0 || ::pipe2(control, O_CLOEXEC) != 0) {
    return Status::FromErrno(errno, "set up the broker's supervisor");
  }
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(control[1]);
    Supervise(control[0], log_fd, null_fd, epmd_port_, own_epmd_ ? epmd_argv.get() : nullptr,
              server_argv.get(), envp.get());
  }
  ::close(control[0]);
  ::close(log_fd);
  ::close(null_fd);
  if (pid < 0) {
    ::close(control[1]);
    return Status::FromErrno(errno, "fork the broker's supervisor");
  }
  supervisor_pid_ = pid;
  control_fd_ = control[1];

  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::seconds(timeout_s);
  std::string why = "not tried";
  for (;;) {
    if (AmqpLoginWorks(amqp_port_, &why)) return Status::Ok();
    int status;
    if (::waitpid(supervisor_pid_, &status, WNOHANG) == supervisor_pid_) {
      supervisor_pid_ = -1;
      ::close(control_fd_);
      control_fd_ = -1;
      return Status(StatusCode::kIoError,
                    "rabbitmq-server exited during startup; log tail:\n" + LogTail());
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      const std::string tail = LogTail();
      Stop().IgnoreError();
      return Status(StatusCode::kTimedOut,
                    "rabbitmq-server did not accept an AMQP login on 127.0.0.1:" +
                        std::to_string(amqp_port_) + " within " + std::to_string(timeout_s) +
                        " s (last error: " + why + "); log tail:\n" + tail);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

Status BrokerProcess::Stop() { return Finish(false); }

Status BrokerProcess::Kill() { return Finish(true); }

void BrokerProcess::Pause() { Command('p'); }

void BrokerProcess::Resume() { Command('r'); }

void BrokerProcess::Command(char c) {
  if (!running()) return;
  [[maybe_unused]] ssize_t n = ::write(control_fd_, &c, 1);
}

Status BrokerProcess::Finish(bool kill) {
  if (!running()) return Status::Ok();
  if (kill) Command('k');
  ::close(control_fd_);  // end of file: the supervisor stops the broker
  control_fd_ = -1;
  int status;
  while (::waitpid(supervisor_pid_, &status, 0) < 0 && errno == EINTR) {
  }
  supervisor_pid_ = -1;
  // The port is closed when the VM exits; wait for it so that a restart
  // finds it free.
  for (int i = 0; i < 100 && PortAccepts(amqp_port_); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return Status::Ok();
}

int BrokerProcess::Ctl(const std::vector<std::string>& args, std::string* output) const {
  std::vector<std::string> argv = {kRabbitmqCtl, "-n", node_name_};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::vector<std::string> env = Environment();
  const CStrings c_argv(argv), c_env(env);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, out[1], 2);
  pid_t pid;
  const int rc = ::posix_spawn(&pid, kRabbitmqCtl, &actions, nullptr, c_argv.get(), c_env.get());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    if (output) *output = std::string("posix_spawn rabbitmqctl: ") + std::strerror(rc);
    return -1;
  }
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (output) *output = std::move(text);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string BrokerProcess::LogTail(size_t lines) const {
  return "--- " + dir_ + "/log/rabbit.log:\n" + Tail(dir_ + "/log/rabbit.log", lines) + "--- " +
         dir_ + "/console.log:\n" + Tail(dir_ + "/console.log", lines);
}

// ---------------------------------------------------------------------------
// AmqpTestClient

AmqpTestClient::~AmqpTestClient() { Disconnect(); }

void AmqpTestClient::Disconnect() {
  if (conn_ == nullptr) return;
  amqp_connection_close(conn_, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn_);
  conn_ = nullptr;
}

Status AmqpTestClient::Reply(const char* what) {
  const amqp_rpc_reply_t r = amqp_get_rpc_reply(conn_);
  if (r.reply_type == AMQP_RESPONSE_NORMAL) return Status::Ok();
  return daemon::AmqpReplyStatus(r, what);
}

Status AmqpTestClient::Connect(const std::string& url) {
  Disconnect();
  std::vector<char> copy(url.begin(), url.end());
  copy.push_back('\0');
  amqp_connection_info info;
  if (amqp_parse_url(copy.data(), &info) != AMQP_STATUS_OK) {
    return Status(StatusCode::kInvalidArgument, "bad URL " + url);
  }
  conn_ = amqp_new_connection();
  amqp_socket_t* socket = amqp_tcp_socket_new(conn_);
  timeval tv{10, 0};
  amqp_set_rpc_timeout(conn_, &tv);
  if (int rc = amqp_socket_open_noblock(socket, info.host, info.port, &tv); rc != AMQP_STATUS_OK) {
    return Status(StatusCode::kIoError, std::string("connect: ") + amqp_error_string2(rc));
  }
  const char* vhost = *info.vhost ? info.vhost : "/";
  const amqp_rpc_reply_t r =
      amqp_login(conn_, vhost, 0, 131072, 0, AMQP_SASL_METHOD_PLAIN, info.user, info.password);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    return daemon::AmqpReplyStatus(r, "login");
  }
  amqp_channel_open(conn_, 1);
  return Reply("channel.open");
}

Status AmqpTestClient::DeclareExchange(const std::string& name) {
  amqp_exchange_declare(conn_, 1, amqp_cstring_bytes(name.c_str()), amqp_cstring_bytes("topic"),
                        0, 1, 0, 0, amqp_empty_table);
  return Reply("exchange.declare");
}

Status AmqpTestClient::DeleteExchange(const std::string& name) {
  amqp_exchange_delete(conn_, 1, amqp_cstring_bytes(name.c_str()), 0);
  return Reply("exchange.delete");
}

Status AmqpTestClient::DeclareBoundQueue(const std::string& queue, const std::string& exchange,
                                         const std::string& binding_key) {
  return DeclareBoundQueue(queue, exchange, QueueOptions{}, binding_key);
}

Status AmqpTestClient::DeclareBoundQueue(const std::string& queue, const std::string& exchange,
                                         const QueueOptions& options,
                                         const std::string& binding_key) {
  amqp_table_entry_t entries[3];
  int n = 0;
  if (!options.queue_type.empty()) {
    entries[n].key = amqp_cstring_bytes("x-queue-type");
    entries[n].value.kind = AMQP_FIELD_KIND_UTF8;
    entries[n].value.value.bytes = amqp_cstring_bytes(options.queue_type.c_str());
    ++n;
  }
  if (options.max_length >= 0) {
    entries[n].key = amqp_cstring_bytes("x-max-length");
    entries[n].value.kind = AMQP_FIELD_KIND_I64;
    entries[n].value.value.i64 = options.max_length;
    ++n;
  }
  if (!options.overflow.empty()) {
    entries[n].key = amqp_cstring_bytes("x-overflow");
    entries[n].value.kind = AMQP_FIELD_KIND_UTF8;
    entries[n].value.value.bytes = amqp_cstring_bytes(options.overflow.c_str());
    ++n;
  }
  const amqp_table_t args{n, entries};
  amqp_queue_declare(conn_, 1, amqp_cstring_bytes(queue.c_str()), 0, 1, 0, 0, args);
  if (Status s = Reply("queue.declare"); !s.ok()) return s;
  amqp_queue_bind(conn_, 1, amqp_cstring_bytes(queue.c_str()), amqp_cstring_bytes(exchange.c_str()),
                  amqp_cstring_bytes(binding_key.c_str()), amqp_empty_table);
  return Reply("queue.bind");
}

Status AmqpTestClient::DeleteQueue(const std::string& queue) {
  amqp_queue_delete(conn_, 1, amqp_cstring_bytes(queue.c_str()), 0, 0);
  return Reply("queue.delete");
}

Status AmqpTestClient::GetAll(const std::string& queue, std::vector<ReceivedMessage>* out) {
  for (;;) {
    const amqp_rpc_reply_t r = amqp_basic_get(conn_, 1, amqp_cstring_bytes(queue.c_str()), 1);
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      return daemon::AmqpReplyStatus(r, "basic.get");
    }
    if (r.reply.id == AMQP_BASIC_GET_EMPTY_METHOD) break;
    const auto* ok = static_cast<const amqp_basic_get_ok_t*>(r.reply.decoded);
    ReceivedMessage m;
    m.exchange = ToString(ok->exchange);
    m.routing_key = ToString(ok->routing_key);
    amqp_message_t message;
    const amqp_rpc_reply_t rr = amqp_read_message(conn_, 1, &message, 0);
    if (rr.reply_type != AMQP_RESPONSE_NORMAL) {
      return daemon::AmqpReplyStatus(rr, "read message");
    }
    m.body = ToString(message.body);
    const amqp_basic_properties_t& p = message.properties;
    if (p._flags & AMQP_BASIC_CONTENT_TYPE_FLAG) m.content_type = ToString(p.content_type);
    if (p._flags & AMQP_BASIC_CONTENT_ENCODING_FLAG) {
      m.content_encoding = ToString(p.content_encoding);
    }
    if (p._flags & AMQP_BASIC_MESSAGE_ID_FLAG) m.message_id = ToString(p.message_id);
    if (p._flags & AMQP_BASIC_DELIVERY_MODE_FLAG) m.delivery_mode = p.delivery_mode;
    amqp_destroy_message(&message);
    amqp_maybe_release_buffers(conn_);
    out->push_back(std::move(m));
  }
  return Status::Ok();
}

Status AmqpTestClient::Consume(const std::string& queue, size_t count,
                               std::chrono::milliseconds idle, std::vector<ReceivedMessage>* out) {
  constexpr amqp_channel_t kChannel = 2;
  amqp_channel_open(conn_, kChannel);
  if (Status s = Reply("channel.open"); !s.ok()) return s;
  amqp_basic_qos(conn_, kChannel, 0, 2000, 0);
  if (Status s = Reply("basic.qos"); !s.ok()) return s;
  amqp_basic_consume(conn_, kChannel, amqp_cstring_bytes(queue.c_str()), amqp_empty_bytes, 0, 0, 0,
                     amqp_empty_table);
  if (Status s = Reply("basic.consume"); !s.ok()) return s;
  const auto* consume_ok = static_cast<amqp_basic_consume_ok_t*>(amqp_get_rpc_reply(conn_).reply.decoded);
  const std::string tag = consume_ok != nullptr ? ToString(consume_ok->consumer_tag) : "";
  Status result = Status::Ok();
  size_t got = 0;
  uint64_t unacked = 0, last_tag = 0;
  bool cancelled = false;
  for (;;) {
    if (got >= count && !cancelled) {
      // Deliveries already on their way come before cancel-ok (rabbitmq-c
      // keeps them): they are read below, until a short silence.
      amqp_basic_cancel(conn_, kChannel, amqp_cstring_bytes(tag.c_str()));
      cancelled = true;
      idle = std::chrono::milliseconds(100);
    }
    amqp_envelope_t envelope;
    timeval tv{static_cast<time_t>(idle.count() / 1000),
               static_cast<suseconds_t>((idle.count() % 1000) * 1000)};
    amqp_maybe_release_buffers(conn_);
    const amqp_rpc_reply_t r = amqp_consume_message(conn_, &envelope, &tv, 0);
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT) break;
    if (r.reply_type != AMQP_RESPONSE_NORMAL) {
      result = daemon::AmqpReplyStatus(r, "consume");
      break;
    }
    ReceivedMessage m;
    m.exchange = ToString(envelope.exchange);
    m.routing_key = ToString(envelope.routing_key);
    m.body = ToString(envelope.message.body);
    const amqp_basic_properties_t& p = envelope.message.properties;
    if (p._flags & AMQP_BASIC_CONTENT_TYPE_FLAG) m.content_type = ToString(p.content_type);
    if (p._flags & AMQP_BASIC_CONTENT_ENCODING_FLAG) m.content_encoding = ToString(p.content_encoding);
    if (p._flags & AMQP_BASIC_MESSAGE_ID_FLAG) m.message_id = ToString(p.message_id);
    if (p._flags & AMQP_BASIC_DELIVERY_MODE_FLAG) m.delivery_mode = p.delivery_mode;
    last_tag = envelope.delivery_tag;
    amqp_destroy_envelope(&envelope);
    out->push_back(std::move(m));
    ++got;
    if (++unacked >= 500) {
      amqp_basic_ack(conn_, kChannel, last_tag, 1);
      unacked = 0;
    }
  }
  if (unacked > 0) amqp_basic_ack(conn_, kChannel, last_tag, 1);
  // Closing the channel gives back whatever was delivered and not read.
  amqp_channel_close(conn_, kChannel, AMQP_REPLY_SUCCESS);
  if (Status s = Reply("channel.close"); !s.ok() && result.ok()) result = s;
  return result;
}

// ---------------------------------------------------------------------------
// BrokerEnvironment

namespace {
BrokerProcess* g_broker = nullptr;
std::string g_skip_reason;
Status g_start_status;
}  // namespace

void BrokerEnvironment::SetUp() {
  // A write to a connection the broker closed must be an error, not a
  // signal that kills the test binary.
  ::signal(SIGPIPE, SIG_IGN);
  if (!BrokerProcess::Installed(&g_skip_reason)) return;
  g_broker = new BrokerProcess();
  const auto start = std::chrono::steady_clock::now();
  g_start_status = g_broker->Start();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (g_start_status.ok()) {
    std::fprintf(stderr, "[ broker   ] RabbitMQ %s on %s started in %.1f s (data in %s)\n",
                 g_broker->node_name().c_str(), g_broker->url().c_str(), seconds,
                 g_broker->dir().c_str());
  }
}

void BrokerEnvironment::TearDown() {
  delete g_broker;
  g_broker = nullptr;
}

BrokerProcess* BrokerEnvironment::broker() {
  return g_start_status.ok() ? g_broker : nullptr;
}
const std::string& BrokerEnvironment::skip_reason() { return g_skip_reason; }
const Status& BrokerEnvironment::start_status() { return g_start_status; }

}  // namespace postspool::testing
