// Helpers for the client library's tests: clients with test options, the
// spool read back, posts with every field, child processes.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "postspool.h"
#include "post.h"
#include "segment_writer.h"
#include "test_util.h"

namespace postspool::testing {

// A client opened with explicit paths (never the environment's).
class ScopedClient {
 public:
  ScopedClient(const std::string& socket_path, const std::string& spool_dir,
               uint32_t budget_ms = 2000, uint32_t socket_share_pct = 60) {
    postspool_options o;
    postspool_options_init(&o);
    o.socket_path = socket_path.c_str();
    o.spool_dir = spool_dir.c_str();
    o.budget_ms = budget_ms;
    o.socket_share_pct = socket_share_pct;
    open_rc_ = postspool_open(&o, &client_);
  }
  ~ScopedClient() { postspool_close(client_); }
  ScopedClient(const ScopedClient&) = delete;
  ScopedClient& operator=(const ScopedClient&) = delete;

  int open_rc() const { return open_rc_; }
  postspool_client* get() const { return client_; }

 private:
  postspool_client* client_ = nullptr;
  int open_rc_ = 0;
};

// The posts in every spool segment of `dir` (current and sealed), in file
// order per segment.
inline std::vector<PostData> ReadSpool(const std::string& dir) {
  std::vector<PostData> posts;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      if (!segment::ParseSpoolName(e->d_name)) continue;
      ReadResult r = ReadFile(dir + "/" + e->d_name);
      for (PostData& p : r.posts) posts.push_back(std::move(p));
    }
    ::closedir(d);
  }
  return posts;
}

inline PostId IdOf(const postspool_post_result& r) {
  PostId id;
  for (int i = 0; i < 8; ++i) {
    id.hi = (id.hi << 8) | r.id[i];
    id.lo = (id.lo << 8) | r.id[8 + i];
  }
  return id;
}

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A post with every field set, and the PostData the daemon should decode
// from it (id and pub_time left for the caller to fill in). The strings live
// in *this.
struct FullPost {
  FullPost() {
    postspool_post_init(&post);
    post.base_url = "sftp://example.org/";
    post.rel_path = "data/dir one/f#1.txt";
    post.retrieve_path = "retrieve/f1";
    post.link = "../target";
    post.hlink = "data/other";
    post.rename = "data/old name";
    post.op_flags = POSTSPOOL_OP_REMOVE | POSTSPOOL_OP_DIRECTORY;
    for (int i = 0; i < 64; ++i) digest[i] = static_cast<unsigned char>(i * 7 + 1);
    post.identity_method = POSTSPOOL_IDENTITY_SHA512;
    post.identity_value = digest;
    post.identity_size = sizeof digest;
    post.has_size = 1;
    post.size = 1234567890123;
    post.has_mode = 1;
    post.mode = 0100644;  // st_mode: the type bits are dropped
    post.has_mtime = 1;
    post.mtime_ns = 1700000000123456789;
    post.has_atime = 1;
    post.atime_ns = -5;
    extras[0] = {"flavour", "vanilla"};
    extras[1] = {"note", "caf\xc3\xa9 \"quoted\""};
    post.extras = extras;
    post.extras_count = 2;

    expected.base_url = post.base_url;
    expected.rel_path = post.rel_path;
    expected.retrieve_path = post.retrieve_path;
    expected.link = post.link;
    expected.hlink = post.hlink;
    expected.rename = post.rename;
    expected.remove = true;
    expected.directory = true;
    expected.identity_method = fb::IdentityMethod::Sha512;
    expected.identity_value.assign(reinterpret_cast<const char*>(digest), sizeof digest);
    expected.size = post.size;
    expected.mode = 0644;
    expected.mtime_ns = post.mtime_ns;
    expected.atime_ns = post.atime_ns;
    expected.extras = {{"flavour", "vanilla"}, {"note", "caf\xc3\xa9 \"quoted\""}};
  }
  FullPost(const FullPost&) = delete;
  FullPost& operator=(const FullPost&) = delete;

  struct postspool_post post;
  unsigned char digest[64];
  postspool_extra extras[2];
  PostData expected;
};

// A post with only a path.
inline struct postspool_post SimplePost(const char* rel_path) {
  struct postspool_post p;
  postspool_post_init(&p);
  p.rel_path = rel_path;
  return p;
}

// Runs `body` in a child process and returns its exit status (or 128 +
// signal). The child leaves with _exit, skipping the parent's atexit work.
inline int RunInChild(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

}  // namespace postspool::testing
