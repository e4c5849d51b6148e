// libpostspool through its C ABI, against a fake daemon and a real spool
// directory: which transport takes a post, what reaches it, and the error
// codes when none does.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <set>
#include <thread>

#include "client_test_util.h"
#include "fake_daemon.h"

namespace postspool::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Slack over a post's budget in the timing bounds below: a bound on
// scheduling noise (and sanitizer slowness), not a performance threshold.
constexpr milliseconds kSlack{200};

class ClientTest : public ::testing::Test {
 protected:
  std::string SocketPath() const { return dir_.File("d.sock"); }
  std::string SpoolDir() const { return spool_.path(); }

  TempDir dir_;    // the socket
  TempDir spool_;  // the spool directory
};

TEST_F(ClientTest, PostReachesTheDaemonWithEveryField) {
  FakeDaemon daemon(SocketPath());
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir());
  ASSERT_EQ(client.open_rc(), POSTSPOOL_OK);

  FullPost full;
  postspool_post_result result;
  const int64_t before = NowNs();
  ASSERT_EQ(postspool_post(client.get(), &full.post, &result), POSTSPOOL_OK)
      << postspool_last_error();
  const int64_t after = NowNs();
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SOCKET);

  const auto received = daemon.received();
  ASSERT_EQ(received.size(), 1u);
  PostData got = received[0].post;
  EXPECT_GE(got.pub_time_ns, before);
  EXPECT_LE(got.pub_time_ns, after);
  EXPECT_EQ(got.id, IdOf(result));
  full.expected.id = got.id;
  full.expected.pub_time_ns = got.pub_time_ns;
  EXPECT_EQ(got, full.expected);
  EXPECT_EQ(received[0].peer_pid, ::getpid());
  EXPECT_TRUE(ReadSpool(SpoolDir()).empty());
}

TEST_F(ClientTest, PostIdIsARandomVersion4Uuid) {
  FakeDaemon daemon(SocketPath());
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir());
  struct postspool_post post = SimplePost("a");
  postspool_post_result r1, r2;
  ASSERT_EQ(postspool_post(client.get(), &post, &r1), POSTSPOOL_OK);
  ASSERT_EQ(postspool_post(client.get(), &post, &r2), POSTSPOOL_OK);
  EXPECT_EQ(r1.id[6] >> 4, 4);        // version 4
  EXPECT_EQ(r1.id[8] & 0xc0, 0x80);   // RFC 4122 variant
  EXPECT_NE(IdOf(r1), IdOf(r2));
}

TEST_F(ClientTest, ConnectionIsKeptForLaterPosts) {
  FakeDaemon daemon(SocketPath());
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir());
  struct postspool_post post = SimplePost("a");
  for (int i = 0; i < 10; ++i) ASSERT_EQ(postspool_post(client.get(), &post, nullptr), 0);
  EXPECT_EQ(daemon.received().size(), 10u);
  EXPECT_EQ(daemon.connections_accepted(), 1u);
}

TEST_F(ClientTest, PostGoesToTheSpoolWhenNoDaemonListens) {
  ScopedClient client(SocketPath(), SpoolDir());  // nothing at SocketPath()
  FullPost full;
  postspool_post_result result;
  const int64_t before = NowNs();
  ASSERT_EQ(postspool_post(client.get(), &full.post, &result), POSTSPOOL_OK)
      << postspool_last_error();
  const int64_t after = NowNs();
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SPOOL);

  const std::string name = segment::SpoolCurrentName(::geteuid());
  EXPECT_EQ(spool_.List(), std::vector<std::string>{name});
  struct stat st;
  ASSERT_EQ(::stat(spool_.File(name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, segment::SegmentAppender::Options{}.file_mode);
  EXPECT_EQ(st.st_uid, ::geteuid());

  const std::vector<PostData> spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), 1u);
  const PostData& got = spooled[0];
  EXPECT_EQ(got.id, IdOf(result));
  EXPECT_GE(got.pub_time_ns, before);
  EXPECT_LE(got.pub_time_ns, after);
  full.expected.id = got.id;
  full.expected.pub_time_ns = got.pub_time_ns;
  EXPECT_EQ(got, full.expected);
}

TEST_F(ClientTest, SpoolKeepsThePostsOfOneProcessInOrder) {
  ScopedClient client(SocketPath(), SpoolDir());
  std::vector<std::string> paths;
  for (int i = 0; i < 50; ++i) {
    std::string path = "f";  // not "f" + ...: GCC 12's false -Wrestrict at -O3 (bug 105329)
    path += std::to_string(i);
    paths.push_back(path);
  }
  for (const std::string& p : paths) {
    struct postspool_post post = SimplePost(p.c_str());
    ASSERT_EQ(postspool_post(client.get(), &post, nullptr), POSTSPOOL_OK);
  }
  const std::vector<PostData> spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), paths.size());
  for (size_t i = 0; i < paths.size(); ++i) EXPECT_EQ(spooled[i].rel_path, paths[i]);
}

TEST_F(ClientTest, DaemonThatNeverAnswersFallsBackToTheSpoolWithinTheBudget) {
  FakeDaemon daemon(SocketPath(), FakeDaemon::Mode::kNeverAnswer);
  ASSERT_TRUE(daemon.ok());
  constexpr uint32_t kBudgetMs = 100;
  ScopedClient client(SocketPath(), SpoolDir(), kBudgetMs);
  struct postspool_post post = SimplePost("slow/daemon");
  postspool_post_result result;
  const auto start = Clock::now();
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK) << postspool_last_error();
  const auto took = Clock::now() - start;
  EXPECT_LE(took, milliseconds(kBudgetMs) + kSlack);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SPOOL);
  EXPECT_TRUE(daemon.WaitForRequests(1, milliseconds(5000)));  // it was asked first
  const auto spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), 1u);
  EXPECT_EQ(spooled[0].id, IdOf(result));

  // The next post skips the unresponsive daemon (back-off) and stays fast.
  const auto start2 = Clock::now();
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  EXPECT_LE(Clock::now() - start2, milliseconds(kBudgetMs) + kSlack);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SPOOL);
  EXPECT_EQ(ReadSpool(SpoolDir()).size(), 2u);
}

TEST_F(ClientTest, LateAckOfATimedOutRequestIsNotTakenForALaterOne) {
  FakeDaemon daemon(SocketPath(), FakeDaemon::Mode::kSlowAck);
  ASSERT_TRUE(daemon.ok());
  daemon.set_slow_ack_delay(milliseconds(300));
  ScopedClient client(SocketPath(), SpoolDir(), 50);
  struct postspool_post first = SimplePost("first");
  postspool_post_result r1;
  ASSERT_EQ(postspool_post(client.get(), &first, &r1), POSTSPOOL_OK);
  EXPECT_EQ(r1.transport, POSTSPOOL_TRANSPORT_SPOOL);  // its ack came too late

  // Past the back-off, a post on a new connection gets its own ack.
  daemon.set_mode(FakeDaemon::Mode::kAccept);
  std::this_thread::sleep_for(milliseconds(1200));
  struct postspool_post second = SimplePost("second");
  postspool_post_result r2;
  ASSERT_EQ(postspool_post(client.get(), &second, &r2), POSTSPOOL_OK);
  EXPECT_EQ(r2.transport, POSTSPOOL_TRANSPORT_SOCKET);
  const auto received = daemon.received();
  ASSERT_EQ(received.size(), 2u);  // the late one was journaled too: a duplicate
  EXPECT_EQ(received[0].post.id, IdOf(r1));
  EXPECT_EQ(received[1].post.id, IdOf(r2));
  EXPECT_NE(received[0].connection, received[1].connection);
  EXPECT_EQ(ReadSpool(SpoolDir()).size(), 1u);
}

TEST_F(ClientTest, AckForAnotherRequestIsRefusedAndThePostSpooled) {
  FakeDaemon daemon(SocketPath(), FakeDaemon::Mode::kWrongRequestId);
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir());
  struct postspool_post post = SimplePost("a");
  postspool_post_result result;
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SPOOL);
  EXPECT_NE(std::string(postspool_last_error()).find("while waiting for request"),
            std::string::npos)
      << postspool_last_error();
  EXPECT_EQ(ReadSpool(SpoolDir()).size(), 1u);
}

TEST_F(ClientTest, DaemonFullFailsThePostWithEnospaceAndSpoolsNothing) {
  FakeDaemon daemon(SocketPath(), FakeDaemon::Mode::kFull);
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir());
  struct postspool_post post = SimplePost("full/daemon");
  postspool_post_result result;
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_ENOSPACE);
  EXPECT_NE(std::string(postspool_last_error()).find("disk_bytes_max"), std::string::npos)
      << postspool_last_error();
  EXPECT_EQ(daemon.requests_seen(), 1u);
  EXPECT_TRUE(daemon.received().empty());
  EXPECT_TRUE(ReadSpool(SpoolDir()).empty());

  // Full is not a reason to stop asking: once there is room, the socket.
  daemon.set_mode(FakeDaemon::Mode::kAccept);
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SOCKET);
}

TEST_F(ClientTest, DaemonBusySendsThePostToTheSpool) {
  FakeDaemon daemon(SocketPath(), FakeDaemon::Mode::kBusy);
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir());
  struct postspool_post post = SimplePost("busy/daemon");
  postspool_post_result result;
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SPOOL);
  const auto spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), 1u);
  EXPECT_EQ(spooled[0].rel_path, "busy/daemon");
  daemon.set_mode(FakeDaemon::Mode::kAccept);
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SOCKET);
}

TEST_F(ClientTest, DaemonShuttingDownSendsThePostToTheSpool) {
  FakeDaemon daemon(SocketPath(), FakeDaemon::Mode::kShuttingDown);
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir());
  struct postspool_post post = SimplePost("a");
  postspool_post_result result;
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SPOOL);
  EXPECT_EQ(ReadSpool(SpoolDir()).size(), 1u);
}

TEST_F(ClientTest, DaemonClosingTheConnectionRaisesNoSigpipeAndThePostIsSpooled) {
  // SIGPIPE at its default action would kill this process.
  struct sigaction old_action;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ASSERT_EQ(::sigaction(SIGPIPE, &dfl, &old_action), 0);

  FakeDaemon daemon(SocketPath());
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir());
  struct postspool_post post = SimplePost("a");
  postspool_post_result result;
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SOCKET);

  // The daemon drops the kept connection, then closes each new one on
  // receipt: the client writes to a dead socket first.
  daemon.CloseAllConnections();
  daemon.set_mode(FakeDaemon::Mode::kClose);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK)
        << postspool_last_error();
    EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SPOOL);
  }
  EXPECT_EQ(ReadSpool(SpoolDir()).size(), 3u);
  ::sigaction(SIGPIPE, &old_action, nullptr);
}

TEST_F(ClientTest, DaemonRestartCostsOneReconnectNotASpoolDetour) {
  FakeDaemon daemon(SocketPath());
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir());
  struct postspool_post post = SimplePost("a");
  postspool_post_result result;
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  daemon.CloseAllConnections();
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SOCKET);
  EXPECT_EQ(daemon.connections_accepted(), 2u);
  EXPECT_TRUE(ReadSpool(SpoolDir()).empty());
}

TEST_F(ClientTest, MalformedAckSendsThePostToTheSpoolAndIsReported) {
  FakeDaemon daemon(SocketPath(), FakeDaemon::Mode::kGarbageAck);
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir());
  struct postspool_post post = SimplePost("a");
  postspool_post_result result;
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SPOOL);
  const std::string detail = postspool_last_error();
  EXPECT_NE(detail.find("malformed acknowledgement"), std::string::npos) << detail;
  EXPECT_NE(detail.find("went to the spool"), std::string::npos) << detail;
  EXPECT_EQ(ReadSpool(SpoolDir()).size(), 1u);
}

TEST_F(ClientTest, ClientReachesTheDaemonOnceItStarts) {
  ScopedClient client(SocketPath(), SpoolDir());
  struct postspool_post post = SimplePost("a");
  postspool_post_result result;
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SPOOL);

  FakeDaemon daemon(SocketPath());
  ASSERT_TRUE(daemon.ok());
  // After the connect back-off (about a second) the socket is tried again.
  const auto give_up = Clock::now() + milliseconds(10000);
  int spooled = 1;
  while (Clock::now() < give_up) {
    ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
    if (result.transport == POSTSPOOL_TRANSPORT_SOCKET) break;
    ++spooled;
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SOCKET);
  EXPECT_EQ(daemon.received().size(), 1u);
  EXPECT_EQ(ReadSpool(SpoolDir()).size(), static_cast<size_t>(spooled));
}

TEST_F(ClientTest, NoDaemonAndNoSpoolDirIsEnodaemonNamingBoth) {
  const std::string missing = spool_.File("missing");
  ScopedClient client(SocketPath(), missing);
  struct postspool_post post = SimplePost("a");
  postspool_post_result result;
  EXPECT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_ENODAEMON);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_NONE);
  const std::string detail = postspool_last_error();
  EXPECT_NE(detail.find("daemon: connect " + SocketPath() + ": No such file or directory"),
            std::string::npos)
      << detail;
  EXPECT_NE(detail.find("spool: open " + missing + ": No such file or directory"),
            std::string::npos)
      << detail;

  // The next post skips connecting for a while, and says so.
  EXPECT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_ENODAEMON);
  const std::string second = postspool_last_error();
  EXPECT_NE(second.find("daemon: not tried for another"), std::string::npos) << second;
  EXPECT_NE(second.find("connect " + SocketPath()), std::string::npos) << second;
}

TEST_F(ClientTest, SpoolDirThatIsAFileIsEnodaemon) {
  const std::string file = spool_.File("plain");
  UniqueFd fd(::open(file.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
  ASSERT_TRUE(fd.valid());
  ScopedClient client(SocketPath(), file);
  struct postspool_post post = SimplePost("a");
  EXPECT_EQ(postspool_post(client.get(), &post, nullptr), POSTSPOOL_ENODAEMON);
  const std::string detail = postspool_last_error();
  EXPECT_NE(detail.find("spool: " + file + " is not a directory"), std::string::npos) << detail;
}

TEST_F(ClientTest, SpoolDirRemovedAndRecreatedIsFollowed) {
  const std::string dir = spool_.File("incoming");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ScopedClient client(SocketPath(), dir);
  struct postspool_post post = SimplePost("a");
  ASSERT_EQ(postspool_post(client.get(), &post, nullptr), POSTSPOOL_OK);
  const std::string current = dir + "/" + segment::SpoolCurrentName(::geteuid());
  const std::string moved = spool_.File("old");
  ASSERT_EQ(::rename(dir.c_str(), moved.c_str()), 0);
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(postspool_post(client.get(), &post, nullptr), POSTSPOOL_OK);
  EXPECT_EQ(ReadSpool(dir).size(), 1u);   // the new directory, not the old one
  EXPECT_EQ(ReadSpool(moved).size(), 1u);
  for (const std::string& d : {dir, moved}) {
    ::unlink((d + "/" + segment::SpoolCurrentName(::geteuid())).c_str());
    ::rmdir(d.c_str());
  }
}

TEST_F(ClientTest, SpoolWriteFailureIsEio) {
  // A file size limit of exactly one segment header: the segment is
  // created, the append fails with EFBIG.
  const int status = RunInChild([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit;
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = segment::kHeaderBytes;
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 100;
    ScopedClient client(SocketPath(), SpoolDir());
    struct postspool_post post = SimplePost("a");
    const int rc = postspool_post(client.get(), &post, nullptr);
    if (std::string(postspool_last_error()).find("File too large") == std::string::npos) {
      return 101;
    }
    return -rc;
  });
  EXPECT_EQ(status, -POSTSPOOL_EIO);
}

TEST_F(ClientTest, ShortSpoolWriteIsEnospace) {
  // Room for the header and part of a record: a short write, as on a full
  // disk.
  const int status = RunInChild([&] {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit limit;
    ::getrlimit(RLIMIT_FSIZE, &limit);
    limit.rlim_cur = segment::kHeaderBytes + 40;
    if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 100;
    ScopedClient client(SocketPath(), SpoolDir());
    struct postspool_post post = SimplePost("a");
    return -postspool_post(client.get(), &post, nullptr);
  });
  EXPECT_EQ(status, -POSTSPOOL_ENOSPACE);
}

// Runs `body` as user nobody (65534) in a child process; needs root.
int RunAsNobody(const std::function<int()>& body) {
  return RunInChild([&] {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) return 99;
    return body();
  });
}

TEST_F(ClientTest, SpoolDirNotWritableIsEperm) {
  if (::geteuid() == 0) {
    // The spool's parent directory (mode 0700, root's) is closed to nobody.
    const int status = RunAsNobody([&] {
      ScopedClient client(SocketPath(), SpoolDir());
      struct postspool_post post = SimplePost("a");
      return -postspool_post(client.get(), &post, nullptr);
    });
    EXPECT_EQ(status, -POSTSPOOL_EPERM);
  } else {
    ASSERT_EQ(::chmod(SpoolDir().c_str(), 0500), 0);
    ScopedClient client(SocketPath(), SpoolDir());
    struct postspool_post post = SimplePost("a");
    EXPECT_EQ(postspool_post(client.get(), &post, nullptr), POSTSPOOL_EPERM);
    EXPECT_NE(std::string(postspool_last_error()).find("Permission denied"), std::string::npos);
    ::chmod(SpoolDir().c_str(), 0700);
  }
}

TEST_F(ClientTest, UsersCanSpoolIntoADirectoryTheyCannotList) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to post as another user";
  // The packaged spool: mode 1733, users may create files but not list.
  const std::string dir = spool_.File("incoming");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 01733), 0);
  ASSERT_EQ(::chmod(SpoolDir().c_str(), 0711), 0);
  const int status = RunAsNobody([&] {
    if (::opendir(dir.c_str()) != nullptr) return 98;  // it must not be listable
    ScopedClient client(SocketPath(), dir);
    struct postspool_post post = SimplePost("from/nobody");
    postspool_post_result result;
    const int rc = postspool_post(client.get(), &post, &result);
    if (rc != POSTSPOOL_OK) return -rc;
    return result.transport == POSTSPOOL_TRANSPORT_SPOOL ? 0 : 97;
  });
  EXPECT_EQ(status, 0);
  const std::string file = dir + "/" + segment::SpoolCurrentName(65534);
  struct stat st;
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u);
  const auto spooled = ReadSpool(dir);
  ASSERT_EQ(spooled.size(), 1u);
  EXPECT_EQ(spooled[0].rel_path, "from/nobody");
  ::unlink(file.c_str());
  ::rmdir(dir.c_str());
}

TEST_F(ClientTest, SyncSpoolWorksOnTheSpoolDirectoryDescriptor) {
  postspool_options o;
  postspool_options_init(&o);
  const std::string socket = SocketPath();
  const std::string spool = SpoolDir();
  o.socket_path = socket.c_str();
  o.spool_dir = spool.c_str();
  o.budget_ms = 5000;
  o.sync_spool = 1;
  postspool_client* client = nullptr;
  ASSERT_EQ(postspool_open(&o, &client), POSTSPOOL_OK);
  struct postspool_post post = SimplePost("synced");
  EXPECT_EQ(postspool_post(client, &post, nullptr), POSTSPOOL_OK) << postspool_last_error();
  postspool_close(client);
  EXPECT_EQ(ReadSpool(SpoolDir()).size(), 1u);
}

TEST_F(ClientTest, SocketShareZeroGoesStraightToTheSpool) {
  FakeDaemon daemon(SocketPath());
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir(), 1000, 0);
  struct postspool_post post = SimplePost("a");
  postspool_post_result result;
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SPOOL);
  EXPECT_EQ(daemon.requests_seen(), 0u);
}

TEST_F(ClientTest, LockedSpoolSegmentTimesOutWithinTheBudgetOnEveryThread) {
  // A sealing daemon holds the segment's exclusive lock for longer than the
  // budget: every post, including one waiting for the client's mutex,
  // returns ETIMEDOUT in time.
  ScopedClient client(SocketPath(), SpoolDir(), 300);
  struct postspool_post post = SimplePost("a");
  ASSERT_EQ(postspool_post(client.get(), &post, nullptr), POSTSPOOL_OK);
  UniqueFd segment(::open(spool_.File(segment::SpoolCurrentName(::geteuid())).c_str(),
                          O_RDWR | O_CLOEXEC));
  ASSERT_TRUE(segment.valid());
  ASSERT_EQ(::flock(segment.get(), LOCK_EX), 0);

  std::atomic<int> within_budget{0};
  std::atomic<int> timed_out{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&] {
      struct postspool_post p = SimplePost("b");
      const auto start = Clock::now();
      const int rc = postspool_post(client.get(), &p, nullptr);
      if (Clock::now() - start <= milliseconds(300) + kSlack) ++within_budget;
      if (rc == POSTSPOOL_ETIMEDOUT) ++timed_out;
    });
  }
  for (std::thread& t : threads) t.join();
  ::flock(segment.get(), LOCK_UN);
  EXPECT_EQ(within_budget.load(), 3);
  EXPECT_EQ(timed_out.load(), 3);
  EXPECT_EQ(ReadSpool(SpoolDir()).size(), 1u);
}

TEST_F(ClientTest, ManyThreadsOnOneClientAreEachAckedOnce) {
  FakeDaemon daemon(SocketPath());
  ASSERT_TRUE(daemon.ok());
  // A generous budget: this pins down exactly-once delivery under
  // contention, not speed.
  ScopedClient client(SocketPath(), SpoolDir(), 10000);
  constexpr int kThreads = 8;
  constexpr int kPostsPerThread = 1000;
  std::vector<std::vector<PostId>> ids(kThreads);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPostsPerThread; ++i) {
        // Not "t" + std::to_string(t) + ...: a false -Wrestrict from GCC 12
        // at -O3 (GCC bug 105329).
        std::string path = "t";
        path += std::to_string(t);
        path += '/';
        path += std::to_string(i);
        struct postspool_post post = SimplePost(path.c_str());
        postspool_post_result result;
        if (postspool_post(client.get(), &post, &result) != POSTSPOOL_OK ||
            result.transport != POSTSPOOL_TRANSPORT_SOCKET) {
          ++failures;
        }
        ids[t].push_back(IdOf(result));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  std::set<PostId> sent;
  for (const auto& v : ids) sent.insert(v.begin(), v.end());
  EXPECT_EQ(sent.size(), static_cast<size_t>(kThreads * kPostsPerThread));
  const auto received = daemon.received();
  EXPECT_EQ(received.size(), static_cast<size_t>(kThreads * kPostsPerThread));
  std::set<PostId> got;
  for (const auto& r : received) got.insert(r.post.id);
  EXPECT_EQ(got, sent);
  // Per thread, the daemon saw the posts in the order they were made.
  std::vector<int> next(kThreads, 0);
  for (const auto& r : received) {
    const size_t slash = r.post.rel_path.find('/');
    const int t = std::stoi(r.post.rel_path.substr(1, slash - 1));
    EXPECT_EQ(std::stoi(r.post.rel_path.substr(slash + 1)), next[t]++);
  }
  EXPECT_TRUE(ReadSpool(SpoolDir()).empty());
}

TEST_F(ClientTest, LastErrorIsPerThread) {
  ScopedClient client(SocketPath(), spool_.File("missing"));
  struct postspool_post empty = SimplePost("");
  ASSERT_EQ(postspool_post(client.get(), &empty, nullptr), POSTSPOOL_EINVAL);
  std::string other;
  std::thread([&] {
    struct postspool_post post = SimplePost("a");
    EXPECT_EQ(postspool_post(client.get(), &post, nullptr), POSTSPOOL_ENODAEMON);
    other = postspool_last_error();
  }).join();
  EXPECT_STREQ(postspool_last_error(), "rel_path is empty");
  EXPECT_NE(other.find("spool: open"), std::string::npos) << other;
}

TEST_F(ClientTest, LogStderrPrintsOneLinePerFailedPost) {
  const std::string log = dir_.File("stderr.log");
  const std::string missing = spool_.File("missing");
  const int status = RunInChild([&] {
    const int fd = ::open(log.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ::dup2(fd, STDERR_FILENO) < 0) return 100;
    postspool_options o;
    postspool_options_init(&o);
    const std::string socket = SocketPath();
    o.socket_path = socket.c_str();
    o.spool_dir = missing.c_str();
    o.log_stderr = 1;
    postspool_client* client = nullptr;
    if (postspool_open(&o, &client) != POSTSPOOL_OK) return 101;
    struct postspool_post post = SimplePost("x/y");
    postspool_post(client, &post, nullptr);
    postspool_post(client, &post, nullptr);
    postspool_close(client);
    return 0;
  });
  ASSERT_EQ(status, 0);
  std::string text(4096, '\0');
  UniqueFd fd(::open(log.c_str(), O_RDONLY | O_CLOEXEC));
  text.resize(static_cast<size_t>(std::max<ssize_t>(0, ::read(fd.get(), text.data(), text.size()))));
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
  EXPECT_EQ(text.rfind("postspool: post x/y failed: ", 0), 0u) << text;
  ::unlink(log.c_str());
}

TEST_F(ClientTest, QuietByDefault) {
  const std::string log = dir_.File("stderr.log");
  const int status = RunInChild([&] {
    const int fd = ::open(log.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ::dup2(fd, STDERR_FILENO) < 0 || ::dup2(fd, STDOUT_FILENO) < 0) return 100;
    ScopedClient client(SocketPath(), spool_.File("missing"));
    struct postspool_post post = SimplePost("x/y");
    postspool_post(client.get(), &post, nullptr);
    struct postspool_post empty = SimplePost("");
    postspool_post(client.get(), &empty, nullptr);
    return 0;
  });
  ASSERT_EQ(status, 0);
  struct stat st;
  ASSERT_EQ(::stat(log.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
  ::unlink(log.c_str());
}

}  // namespace
}  // namespace postspool::testing
