// What each phase of the harness found: the figures of a fleet of client
// processes, what reached the queue, and the results of the four phases,
// gathered in BenchResults for the table and the JSON (bench_report.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench_flags.h"
#include "broker/broker_fixture.h"
#include "confirmed_publisher.h"
#include "latency_summary.h"
#include "machine_info.h"
#include "process_fleet.h"
#include "progress_poller.h"

namespace postspool::bench {

// What a fleet of client processes did, from their post calls' outcomes.
struct FleetFigures {
  int processes = 0;
  int posts_per_process = 0;
  uint64_t posts = 0;
  uint64_t ok = 0;
  uint64_t failed = 0;
  uint64_t not_run = 0;
  int failed_processes = 0;
  uint64_t via_socket = 0;
  uint64_t via_spool = 0;
  // Spooled posts whose call took less than kQuickSpoolFraction of the
  // budget: the socket was not waited for (the client skips it for a
  // back-off after a failed connect or send, or it was refused at once).
  // The others waited for the socket's share of the budget first.
  static constexpr double kQuickSpoolFraction = 0.3;
  uint64_t via_spool_quick = 0;
  std::map<int, uint64_t> errors;  // error code -> count
  // From the first call's start to the last call's end.
  double seconds = 0;
  double posts_per_s = 0;
  double children_cpu_s = 0;
  LatencySummary latency_all;
  LatencySummary latency_socket;
  LatencySummary latency_spool;
  // The slowest calls, slowest first (kSlowestCalls at most).
  struct Call {
    int process = 0;
    int index = 0;           // the call's number in its process
    double start_ms = 0;     // since the first call of the fleet
    double latency_ms = 0;
    int rc = 0;
    int transport = 0;
    double cpu_ms = 0;       // see PostOutcome
    int voluntary_switches = 0;
    int involuntary_switches = 0;
    std::string detail;      // why a call failed
  };
  static constexpr size_t kSlowestCalls = 5;
  std::vector<Call> slowest;
  // The first failures' details (kSlowestCalls at most).
  std::vector<Call> first_failures;
  // Calls longer than the budget (for libpostspool's calls; 0 if no budget).
  double budget_ms = 0;
  uint64_t over_budget = 0;
  // Of those, the ones that never blocked (no voluntary context switch):
  // their time went to the CPU and to waiting for one.
  uint64_t over_budget_not_blocked = 0;
};

// `budget_ms`: the calls' budget, to count the calls over it (0: none).
FleetFigures Figures(const ProcessFleet& fleet, double budget_ms);

// What reached the queue, compared with what the clients were told was
// taken.
struct DeliveryFigures {
  uint64_t expected = 0;  // posts whose call returned success
  uint64_t arrived = 0;   // of those, how many reached the queue
  uint64_t missing = 0;
  uint64_t duplicates = 0;  // extra copies of arrived posts
  // Posts that arrived more than once, by the transport that took them.
  uint64_t duplicated_socket_posts = 0;
  uint64_t duplicated_spool_posts = 0;
  uint64_t unexpected = 0;  // messages with an id no client was given
  // Messages of posts whose call returned an error (a post the daemon
  // journaled although the client stopped waiting for its ack).
  uint64_t of_failed_calls = 0;
  uint64_t messages = 0;    // messages drained from the queue
  double body_bytes_mean = 0;
  std::string sample_routing_key;
  std::string drain_error;
};

// Drains `queue` and compares the message ids with the ids the fleet's
// calls were given. Call it once the broker has confirmed everything.
DeliveryFigures CheckDelivery(const ProcessFleet& fleet, const std::string& queue,
                              testing::AmqpTestClient* consumer);

struct CeilingResult {
  bool ran = false;
  std::string error;
  uint64_t messages = 0;
  uint32_t window = 0;
  PublishCounters counters;
  uint32_t queue_depth = 0;
  double seconds = 0;
  double messages_per_s = 0;
  double body_bytes_mean = 0;
  std::string routing_key;
  // When the n-th message was confirmed (seconds from the first publish):
  // every tenth of the messages, and the number of posts of the end-to-end
  // phase, for a like-for-like rate (the broker slows down as the queue,
  // which has no consumer, grows).
  std::vector<std::pair<uint64_t, double>> progress;
  double warmup_messages_per_s = 0;
  uint64_t like_for_like_messages = 0;
  double like_for_like_seconds = 0;
  double like_for_like_messages_per_s = 0;
};

struct EndToEndResult {
  bool ran = false;
  std::string error;
  double daemon_start_ms = 0;
  FleetFigures fleet;
  bool complete = false;  // the broker confirmed everything in time
  double confirmed_seconds = 0;  // first post -> daemon's confirmed_total
  double confirmed_posts_per_s = 0;
  double queue_seconds = 0;  // first post -> the queue holds them all
  double queue_posts_per_s = 0;
  // How far behind the broker was when the last client finished.
  uint64_t queued_at_last_post = 0;
  double daemon_cpu_s = -1;
  DeliveryFigures delivery;
  std::map<std::string, uint64_t> metrics;
  int daemon_exit = 0;
  std::vector<ProgressSample> series;  // relative to the first post
  int64_t series_origin_ns = 0;
};

struct SpoolResult {
  bool ran = false;
  std::string error;
  FleetFigures fleet;
  uint64_t spool_files = 0;
  uint64_t spool_bytes = 0;
  double daemon_start_ms = 0;
  bool complete = false;
  double adopted_seconds = 0;  // daemon start -> spool_posts_journaled_total
  double adopted_posts_per_s = 0;
  double confirmed_seconds = 0;  // daemon start -> confirmed_total
  double confirmed_posts_per_s = 0;
  double queue_seconds = 0;  // daemon start -> the queue holds them all
  double queue_posts_per_s = 0;
  double daemon_cpu_s = -1;
  uint64_t spool_files_left = 0;
  DeliveryFigures delivery;
  std::map<std::string, uint64_t> metrics;
  int daemon_exit = 0;
};

struct BaselineResult {
  bool ran = false;
  std::string error;
  FleetFigures fleet;
  uint32_t queue_depth = 0;
};

struct BenchResults {
  BenchFlags flags;
  MachineInfo machine;
  int poll_interval_ms = 0;
  int metrics_resolution_ms = 0;
  CeilingResult ceiling;
  EndToEndResult e2e;
  SpoolResult spool;
  BaselineResult baseline;
  double total_seconds = 0;
};

}  // namespace postspool::bench
