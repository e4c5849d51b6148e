// Three RabbitMQ nodes on loopback, clustered, for the tests of one test
// binary (tests/cluster): the broker a site runs when it outgrows one.
//
// Each node is a BrokerProcess (tests/broker/broker_fixture.h) with its own
// data directory and free ports; they share one Erlang cookie (a HOME of
// their own) and one epmd on a free port that this fixture runs (a node's
// private epmd would go down with it and the others could not find a
// restarted node). The cluster forms at the first boot through classic
// peer discovery (rabbitmq.conf lists the three nodes): node 0 starts first,
// then nodes 1 and 2 join it. A node stopped or killed later restarts from
// its own data and rejoins by itself.
//
// Cleanup: every node's supervisor stops its node when the test binary
// exits in any way (broker_fixture.h); epmd is killed by the kernel when the
// thread that started it (the test's main thread) exits, and by Stop().
//
// Timing (2-core VM, loaded): Start() 20-60 s; a node's restart 5-20 s.
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "broker_fixture.h"
#include "status.h"

namespace postspool::testing {

class BrokerCluster {
 public:
  static constexpr int kNodes = 3;

  BrokerCluster();
  ~BrokerCluster();  // stops everything
  BrokerCluster(const BrokerCluster&) = delete;
  BrokerCluster& operator=(const BrokerCluster&) = delete;

  // Starts epmd and the three nodes, and waits until the cluster reports
  // all three running (at most `timeout_s` in all).
  Status Start(int timeout_s = 240);
  void Stop();

  BrokerProcess& node(int i) { return *nodes_[static_cast<size_t>(i)]; }
  // The AMQP URLs of the nodes, in node order.
  std::vector<std::string> urls() const;
  // The node whose AMQP URL (without password, as the forwarder shows it)
  // names its port; -1 if none.
  int NodeOf(const std::string& display_url) const;
  // Starts every node that is not running (in parallel) and waits until the
  // cluster reports all of them running.
  Status StartStopped(int timeout_s = 180);
  // The number of nodes `from` (a running node) sees running.
  int RunningNodes(int from);
  // The log tails of all nodes.
  std::string LogTails() const;

 private:
  std::string home_;
  int epmd_port_ = 0;
  pid_t epmd_pid_ = -1;
  std::vector<std::unique_ptr<BrokerProcess>> nodes_;
};

}  // namespace postspool::testing
