// Fork safety: a child never uses its parent's connection or spool
// descriptor, and the parent's keep working.
#include <gtest/gtest.h>

#include <thread>

#include "client_test_util.h"
#include "fake_daemon.h"

namespace postspool::testing {
namespace {

using std::chrono::milliseconds;

class ClientForkTest : public ::testing::Test {
 protected:
  std::string SocketPath() const { return dir_.File("d.sock"); }
  std::string SpoolDir() const { return spool_.path(); }

  TempDir dir_;
  TempDir spool_;
};

TEST_F(ClientForkTest, ChildPostsOnItsOwnConnectionAndTheParentsKeepsWorking) {
  FakeDaemon daemon(SocketPath());
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir());
  struct postspool_post before = SimplePost("parent/before");
  postspool_post_result result;
  ASSERT_EQ(postspool_post(client.get(), &before, &result), POSTSPOOL_OK);
  ASSERT_EQ(result.transport, POSTSPOOL_TRANSPORT_SOCKET);

  const int status = RunInChild([&] {
    struct postspool_post post = SimplePost("child");
    postspool_post_result r;
    if (postspool_post(client.get(), &post, &r) != POSTSPOOL_OK) return 1;
    return r.transport == POSTSPOOL_TRANSPORT_SOCKET ? 0 : 2;
  });
  EXPECT_EQ(status, 0);

  struct postspool_post after = SimplePost("parent/after");
  ASSERT_EQ(postspool_post(client.get(), &after, &result), POSTSPOOL_OK);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SOCKET);

  const auto received = daemon.received();
  ASSERT_EQ(received.size(), 3u);
  EXPECT_EQ(received[0].post.rel_path, "parent/before");
  EXPECT_EQ(received[1].post.rel_path, "child");
  EXPECT_EQ(received[2].post.rel_path, "parent/after");
  EXPECT_EQ(received[0].peer_pid, ::getpid());
  EXPECT_NE(received[1].peer_pid, ::getpid());
  EXPECT_EQ(received[2].peer_pid, ::getpid());
  EXPECT_NE(received[1].connection, received[0].connection);
  EXPECT_EQ(received[2].connection, received[0].connection);  // the parent's kept connection
  EXPECT_EQ(daemon.connections_accepted(), 2u);
}

TEST_F(ClientForkTest, ChildClosingTheClientLeavesTheParentsConnectionAlone) {
  FakeDaemon daemon(SocketPath());
  ASSERT_TRUE(daemon.ok());
  ScopedClient client(SocketPath(), SpoolDir());
  struct postspool_post post = SimplePost("a");
  ASSERT_EQ(postspool_post(client.get(), &post, nullptr), POSTSPOOL_OK);
  EXPECT_EQ(RunInChild([&] {
              postspool_close(client.get());
              return 0;
            }),
            0);
  postspool_post_result result;
  ASSERT_EQ(postspool_post(client.get(), &post, &result), POSTSPOOL_OK);
  EXPECT_EQ(result.transport, POSTSPOOL_TRANSPORT_SOCKET);
  EXPECT_EQ(daemon.connections_accepted(), 1u);
}

TEST_F(ClientForkTest, ChildSpoolsOnItsOwnDescriptor) {
  ScopedClient client(SocketPath(), SpoolDir());  // no daemon
  struct postspool_post post = SimplePost("parent");
  ASSERT_EQ(postspool_post(client.get(), &post, nullptr), POSTSPOOL_OK);
  EXPECT_EQ(RunInChild([&] {
              struct postspool_post p = SimplePost("child");
              postspool_post_result r;
              if (postspool_post(client.get(), &p, &r) != POSTSPOOL_OK) return 1;
              return r.transport == POSTSPOOL_TRANSPORT_SPOOL ? 0 : 2;
            }),
            0);
  ASSERT_EQ(postspool_post(client.get(), &post, nullptr), POSTSPOOL_OK);
  const auto spooled = ReadSpool(SpoolDir());
  ASSERT_EQ(spooled.size(), 3u);
  EXPECT_EQ(spooled[1].rel_path, "child");
}

TEST_F(ClientForkTest, ChildForkedWhileAnotherThreadWasMidPostDoesNotDeadlock) {
  FakeDaemon daemon(SocketPath(), FakeDaemon::Mode::kNeverAnswer);
  ASSERT_TRUE(daemon.ok());
  constexpr uint32_t kBudgetMs = 3000;
  ScopedClient client(SocketPath(), SpoolDir(), kBudgetMs);
  // This thread holds the client's mutex while it waits for an ack that
  // never comes.
  std::thread busy([&] {
    struct postspool_post post = SimplePost("busy");
    EXPECT_EQ(postspool_post(client.get(), &post, nullptr), POSTSPOOL_OK);
  });
  ASSERT_TRUE(daemon.WaitForRequests(1, milliseconds(10000)));
  daemon.set_mode(FakeDaemon::Mode::kAccept);

  const int status = RunInChild([&] {
    const auto start = std::chrono::steady_clock::now();
    struct postspool_post post = SimplePost("child");
    postspool_post_result r;
    if (postspool_post(client.get(), &post, &r) != POSTSPOOL_OK) return 1;
    if (std::chrono::steady_clock::now() - start > milliseconds(kBudgetMs)) return 3;
    return r.transport == POSTSPOOL_TRANSPORT_SOCKET ? 0 : 2;
  });
  busy.join();
  EXPECT_EQ(status, 0);
  const auto received = daemon.received();
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].post.rel_path, "child");
  EXPECT_NE(received[0].peer_pid, ::getpid());
}

}  // namespace
}  // namespace postspool::testing
