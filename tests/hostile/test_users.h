// Real local users for the hostile-neighbour tests, and child processes that
// run as them.
//
// The test binary runs as root: it creates ordinary users with useradd (no
// home, no user group, no login shell) and deletes them with userdel when the
// test ends, also when it fails (the fixture's TearDown) and at exit (for a
// test that threw or asserted out of its body). A user that still has
// processes cannot be deleted, so the children run as those users are
// killed first (ChildAs::Kill, and PR_SET_PDEATHSIG should the test binary
// die).
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace postspool::testing {

struct TestUser {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
};

// True if useradd and userdel are installed and we are root; else *why says
// what is missing (the tests are then skipped with that reason).
bool CanCreateUsers(std::string* why);

// Creates a user with a unique name starting with `prefix` (a few lower-case
// letters). False with *why (useradd's output) if that failed. The user is
// remembered and deleted at exit if DeleteUser is not called first.
bool CreateUser(const std::string& prefix, TestUser* out, std::string* why);
// userdel; true if the user is gone.
bool DeleteUser(const TestUser& user);

// A forked child that dropped every privilege to become `user` (no
// supplementary groups, the user's gid and uid, real, effective and saved)
// and then runs `body`; its return value is the exit status. The child holds
// only the descriptors in `keep` (renumbered 3, 4, ... in that order) and
// stdin/stdout/stderr. `before_drop`, if given, runs as root just before the
// privileges are dropped (to raise a limit, say).
class ChildAs {
 public:
  ChildAs(const TestUser& user, std::vector<int> keep, std::function<int()> body,
          std::function<void()> before_drop = {});
  ~ChildAs();  // kills the child if it still runs
  ChildAs(const ChildAs&) = delete;
  ChildAs& operator=(const ChildAs&) = delete;

  pid_t pid() const { return pid_; }
  // Waits up to `timeout_ms` for the child to exit; its exit status, or -1
  // (timed out: the child still runs), or 128 + the signal that ended it.
  int Wait(int timeout_ms = 120000);
  // Waits until the child is stopped (SIGSTOP); false on timeout or exit.
  bool WaitStopped(int timeout_ms = 10000);
  void Kill();

 private:
  pid_t pid_ = -1;
};

}  // namespace postspool::testing
