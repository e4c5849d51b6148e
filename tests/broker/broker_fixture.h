// A real RabbitMQ for the tests of one test binary, and a small blocking AMQP
// client to look at what reached it.
//
// BrokerProcess runs the Debian package's /usr/lib/rabbitmq/bin/rabbitmq-server
// directly (not the system service): on 127.0.0.1, on free ports (AMQP,
// Erlang distribution, and a private epmd, so that the shared epmd on 4369 is
// neither used nor left behind), with its own data, log and config in a
// temporary directory (HOME is that directory too, for the Erlang cookie), no
// plugins, and a configuration that lets guest log in from loopback. When
// the openssl command is installed it also listens for amqps on another port,
// with a server certificate for "localhost" and 127.0.0.1 signed by a CA made
// for the test run (tls_ca_file()); a second, unrelated CA
// (other_ca_file()) is there to test verification failures.
//
// Timing (2-core VM, RabbitMQ 3.10 on Erlang 25): Start() takes 5-10 s (up
// to 17 s seen on a loaded machine: the Erlang VM and RabbitMQ boot; it waits
// until an AMQP login works, at most 60 s); Stop() about 1-2 s; Start() again
// on the same port and data directory (a broker restart: durable queues and
// persistent messages are kept) 5-10 s. Hence one broker per test binary
// (BrokerEnvironment).
//
// Cleanup: the broker's processes run in a process group of their own under
// a supervisor process of the fixture (a fork of the test binary, in its own
// session, with a private epmd). The supervisor stops the broker (SIGTERM,
// then SIGKILL of the group after 30 s) and epmd when Stop() is called or
// when the test binary exits in any way, even a crash or a kill -9 while the
// broker is paused (it watches a pipe that the kernel closes when the test
// binary dies), so no broker process is left behind. (The broker's own port
// helpers, erl_child_setup and inet_gethost, run in sessions of their own
// and exit when the VM does.)
#pragma once

#include <sys/types.h>

#include <amqp.h>

#include <cstdint>
#include <map>
#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "status.h"

namespace postspool::testing {

// The rabbitmq-server script this fixture runs.
inline constexpr char kRabbitmqServer[] = "/usr/lib/rabbitmq/bin/rabbitmq-server";
inline constexpr char kRabbitmqCtl[] = "/usr/lib/rabbitmq/bin/rabbitmqctl";

class BrokerProcess {
 public:
  // True if rabbitmq-server (and epmd) are installed; else *why says what is
  // missing (the tests are then skipped with that reason).
  static bool Installed(std::string* why);

  // For nodes of a cluster (tests/cluster): the defaults are one broker on
  // its own.
  struct Options {
    std::string node_name;     // empty: postspool-test-<pid>@localhost
    int epmd_port = 0;         // 0: a private epmd started with the broker; else the
                               // caller's epmd on this port (shared by the nodes)
    std::string home;          // HOME, where the Erlang cookie is; empty: dir()
    std::string extra_config;  // appended to rabbitmq.conf
    bool tls = true;           // an amqps listener when openssl is installed
  };

  // Creates the temporary directory and chooses the ports; starts nothing.
  BrokerProcess() : BrokerProcess(Options{}) {}
  explicit BrokerProcess(const Options& options);
  // Stops the broker and removes the temporary directory.
  ~BrokerProcess();
  BrokerProcess(const BrokerProcess&) = delete;
  BrokerProcess& operator=(const BrokerProcess&) = delete;

  // Starts the broker and waits until an AMQP login works (at most
  // `timeout_s`). On failure the status carries the tail of the broker's log.
  Status Start(int timeout_s = 60);
  // Stops the broker (gracefully: durable data is kept) and waits for it.
  Status Stop();
  // Kills the broker (SIGKILL of all its processes: a crash or power loss of
  // the broker; what it confirmed is on disk) and waits for it.
  Status Kill();
  // Freezes (SIGSTOP) and thaws (SIGCONT) the broker's processes: the TCP
  // connections stay open but nothing answers (a hung broker, a network
  // black hole), so only heartbeats can tell.
  void Pause();
  void Resume();
  bool running() const { return supervisor_pid_ > 0; }

  int amqp_port() const { return amqp_port_; }
  // amqp://guest:guest@127.0.0.1:<port>/ (the default vhost "/").
  std::string url() const;
  // 0 when the broker has no TLS listener (no openssl command).
  int amqps_port() const { return amqps_port_; }
  // amqps://guest:guest@localhost:<amqps port>/
  std::string tls_url() const;
  const std::string& tls_ca_file() const { return tls_ca_file_; }
  const std::string& other_ca_file() const { return other_ca_file_; }
  const std::string& node_name() const { return node_name_; }
  const std::string& dir() const { return dir_; }

  // Runs rabbitmqctl against this broker (right node name, cookie and epmd
  // port): returns its exit status, *output gets stdout and stderr.
  int Ctl(const std::vector<std::string>& args, std::string* output) const;

  // The last `lines` lines of the broker's log and console output.
  std::string LogTail(size_t lines = 40) const;

 private:
  std::vector<std::string> Environment() const;
  // Makes the CAs and the server certificate; false if openssl is missing.
  bool MakeCertificates();
  // Ends the supervisor: gracefully (pipe closed) or with SIGKILL ('k').
  Status Finish(bool kill);
  // Sends a command byte to the supervisor ('p', 'r', 'k').
  void Command(char c);

  std::string dir_;
  std::string home_;
  bool own_epmd_ = true;
  std::string node_name_;
  std::string tls_ca_file_;
  std::string other_ca_file_;
  int amqp_port_ = 0;
  int amqps_port_ = 0;
  int dist_port_ = 0;
  int epmd_port_ = 0;
  pid_t supervisor_pid_ = -1;
  int control_fd_ = -1;  // write end of the supervisor's pipe
};

// A port on 127.0.0.1 that nothing listens on (at the time of the call).
int UnusedPort();

// One message as a consumer sees it.
struct ReceivedMessage {
  std::string exchange;
  std::string routing_key;
  std::string body;
  std::string content_type;
  std::string content_encoding;
  std::string message_id;
  int delivery_mode = 0;  // 0: not set
};

// A blocking AMQP client for tests (rabbitmq-c, channel 1). Every method
// returns a status naming what failed.
class AmqpTestClient {
 public:
  AmqpTestClient() = default;
  ~AmqpTestClient();
  AmqpTestClient(const AmqpTestClient&) = delete;
  AmqpTestClient& operator=(const AmqpTestClient&) = delete;

  Status Connect(const std::string& url);
  void Disconnect();

  // A durable topic exchange (as postspoold declares it).
  Status DeclareExchange(const std::string& name);
  Status DeleteExchange(const std::string& name);
  struct QueueOptions {
    int64_t max_length = -1;      // x-max-length, if >= 0
    std::string overflow;         // x-overflow, e.g. "reject-publish", if not empty
    std::string queue_type;       // x-queue-type, e.g. "quorum", if not empty
  };
  // Declares a durable queue and binds it to `exchange` with `binding_key`.
  Status DeclareBoundQueue(const std::string& queue, const std::string& exchange,
                           const std::string& binding_key = "#");
  Status DeclareBoundQueue(const std::string& queue, const std::string& exchange,
                           const QueueOptions& options, const std::string& binding_key = "#");
  Status DeleteQueue(const std::string& queue);
  // basic.get with no_ack until the queue is empty; appends to *out.
  Status GetAll(const std::string& queue, std::vector<ReceivedMessage>* out);
  // For large volumes (basic.get is one round trip a message): consumes
  // from `queue` on a channel of its own (prefetch 2,000, acknowledged in
  // batches) until `count` messages arrived or nothing came for `idle`;
  // appends them to *out, then closes that channel.
  Status Consume(const std::string& queue, size_t count, std::chrono::milliseconds idle,
                 std::vector<ReceivedMessage>* out);

 private:
  Status Reply(const char* what);
  amqp_connection_state_t conn_ = nullptr;
};

// The broker of the test binary, started once before the first test and
// stopped after the last (and, through the supervisor, at any exit).
// Register with ::testing::AddGlobalTestEnvironment (tests/broker does it in
// its main).
class BrokerEnvironment : public ::testing::Environment {
 public:
  void SetUp() override;
  void TearDown() override;

  // nullptr when the broker is not installed (see skip_reason()) or did not
  // start (see start_status()).
  static BrokerProcess* broker();
  static const std::string& skip_reason();
  static const Status& start_status();
};

// For test fixtures' SetUp: skips when RabbitMQ is not installed, fails when
// it did not start.
#define POSTSPOOL_REQUIRE_BROKER()                                                   \
  do {                                                                               \
    if (!::postspool::testing::BrokerEnvironment::skip_reason().empty()) {           \
      GTEST_SKIP() << ::postspool::testing::BrokerEnvironment::skip_reason();        \
    }                                                                                \
    ASSERT_TRUE(::postspool::testing::BrokerEnvironment::start_status().ok())        \
        << ::postspool::testing::BrokerEnvironment::start_status().ToString();       \
  } while (0)

}  // namespace postspool::testing
