#include "test_users.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <thread>

extern char** environ;

namespace postspool::testing {
namespace {

constexpr char kUseradd[] = "/usr/sbin/useradd";
constexpr char kUserdel[] = "/usr/sbin/userdel";

// Runs a command, returns its exit status; *output gets stdout and stderr.
int Run(const std::vector<std::string>& args, std::string* output) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return -1;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, out[1], 2);
  pid_t pid;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  if (rc != 0) {
    ::close(out[0]);
    *output = "cannot run " + args[0];
    return -1;
  }
  char buf[1024];
  for (;;) {
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output->append(buf, static_cast<size_t>(n));
  }
  ::close(out[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::mutex g_mu;
std::set<std::string>* g_users = nullptr;  // created and not yet deleted

void DeleteLeftUsers() {
  std::lock_guard lock(g_mu);
  if (g_users == nullptr) return;
  for (const std::string& name : *g_users) {
    std::string out;
    if (Run({kUserdel, name}, &out) != 0) Run({kUserdel, "-f", name}, &out);
  }
  g_users->clear();
}

}  // namespace

bool CanCreateUsers(std::string* why) {
  if (::geteuid() != 0) {
    *why = "the hostile tests create local users and must run as root";
    return false;
  }
  if (::access(kUseradd, X_OK) != 0 || ::access(kUserdel, X_OK) != 0) {
    *why = std::string(kUseradd) + " or " + kUserdel + " is not installed (Debian: passwd)";
    return false;
  }
  return true;
}

bool CreateUser(const std::string& prefix, TestUser* out, std::string* why) {
  static int counter = 0;
  {
    std::lock_guard lock(g_mu);
    if (g_users == nullptr) {
      g_users = new std::set<std::string>;
      std::atexit(DeleteLeftUsers);
    }
  }
  for (int attempt = 0; attempt < 5; ++attempt) {
    const std::string name = prefix + std::to_string(::getpid() % 100000) + "n" +
                             std::to_string(++counter);
    std::string output;
    const int rc = Run({kUseradd, "-M", "-N", "-s", "/usr/sbin/nologin", name}, &output);
    if (rc == 9) continue;  // the name is taken (another run): try the next
    if (rc != 0) {
      *why = "useradd " + name + " exited " + std::to_string(rc) + ": " + output;
      return false;
    }
    {
      std::lock_guard lock(g_mu);
      g_users->insert(name);
    }
    const passwd* pw = ::getpwnam(name.c_str());
    if (pw == nullptr) {
      *why = "useradd " + name + " succeeded but getpwnam does not find it";
      return false;
    }
    out->name = name;
    out->uid = pw->pw_uid;
    out->gid = pw->pw_gid;
    return true;
  }
  *why = "useradd: every name tried was taken";
  return false;
}

bool DeleteUser(const TestUser& user) {
  if (user.name.empty()) return true;
  std::string output;
  int rc = Run({kUserdel, user.name}, &output);
  if (rc != 0) rc = Run({kUserdel, "-f", user.name}, &output);
  if (rc != 0) {
    std::fprintf(stderr, "userdel %s failed (%d): %s\n", user.name.c_str(), rc, output.c_str());
    return false;
  }
  std::lock_guard lock(g_mu);
  if (g_users != nullptr) g_users->erase(user.name);
  return true;
}

ChildAs::ChildAs(const TestUser& user, std::vector<int> keep, std::function<int()> body,
                 std::function<void()> before_drop) {
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ != 0) return;
  // The child. Renumber the descriptors it keeps to 3, 4, ...: first out of
  // the way (above every target number), then into place.
  const int above = 3 + static_cast<int>(keep.size());
  std::vector<int> high;
  for (size_t i = 0; i < keep.size(); ++i) {
    high.push_back(::fcntl(keep[i], F_DUPFD, above));
  }
  for (size_t i = 0; i < high.size(); ++i) ::dup2(high[i], 3 + static_cast<int>(i));
  ::close_range(3 + static_cast<unsigned>(high.size()), ~0U, 0);
  if (before_drop) before_drop();
  if (::setgroups(0, nullptr) != 0 || ::setgid(user.gid) != 0 || ::setuid(user.uid) != 0 ||
      ::geteuid() != user.uid || ::getegid() != user.gid || ::setuid(0) == 0) {
    std::fprintf(stderr, "child: cannot become %s\n", user.name.c_str());
    ::_exit(121);
  }
  // Cleared by the credential change, so set afterwards: the child dies with
  // the test binary and never keeps its user from being deleted.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(122);
  ::_exit(body());
}

ChildAs::~ChildAs() { Kill(); }

int ChildAs::Wait(int timeout_ms) {
  if (pid_ <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (std::chrono::steady_clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

bool ChildAs::WaitStopped(int timeout_ms) {
  if (pid_ <= 0) return false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG | WUNTRACED);
    if (r == pid_) {
      if (WIFSTOPPED(status)) return true;
      pid_ = -1;  // it exited
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

void ChildAs::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

}  // namespace postspool::testing
