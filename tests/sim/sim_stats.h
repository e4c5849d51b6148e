// What one simulated run did: faults injected by kind, crashes, posts, and
// the duplicates each crash caused. Ordered maps only, so that printing is
// deterministic.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace postspool::sim {

struct SimStats {
  // Faults injected, by kind ("fs.write.eio", "broker.nack", ...).
  std::map<std::string, uint64_t> faults;
  // Where the daemon process died ("fs.write", "fs.rename", "round"...).
  std::map<std::string, uint64_t> crash_points;
  uint64_t crashes = 0;
  uint64_t power_losses = 0;
  uint64_t clean_restarts = 0;
  uint64_t start_failures = 0;
  uint64_t rounds = 0;
  uint64_t virtual_ms = 0;
  uint64_t posts_made = 0;
  uint64_t posts_acknowledged = 0;
  uint64_t posts_acknowledged_socket = 0;
  uint64_t posts_acknowledged_spool = 0;
  uint64_t posts_failed = 0;  // the client call returned an error
  uint64_t posts_confirmed = 0;
  uint64_t broker_enqueued = 0;
  // Per crash: broker enqueues, after the restart, of posts already enqueued
  // before the crash.
  std::vector<uint64_t> duplicates_per_crash;
  // Of those, the ones from a second journal record of the post.
  std::vector<uint64_t> journaled_twice_per_crash;
  uint64_t duplicates_total = 0;  // every enqueue beyond the first of an id
  // The rings: what the producers did ("posts_published", "doorbells_rung"),
  // how the loop slept ("rounds_slept", "timeout_rounds_while_asleep"), and
  // the daemons' ring counters summed over their processes
  // ("daemon.posts_deduplicated", "daemon.lanes_damaged", ...).
  std::map<std::string, uint64_t> ring;
  // The most work one ingest round asked for, by kind ("spool.entries",
  // "spool.bytes_read", ...).
  std::map<std::string, uint64_t> round_work_max;
  void NoteRoundWork(const std::string& kind, uint64_t n) {
    uint64_t& m = round_work_max[kind];
    if (n > m) m = n;
  }

  void Fault(const std::string& kind, uint64_t n = 1) { faults[kind] += n; }
  void Merge(const SimStats& o);
};

inline void SimStats::Merge(const SimStats& o) {
  for (const auto& [k, v] : o.faults) faults[k] += v;
  for (const auto& [k, v] : o.crash_points) crash_points[k] += v;
  for (const auto& [k, v] : o.round_work_max) NoteRoundWork(k, v);
  for (const auto& [k, v] : o.ring) ring[k] += v;
  crashes += o.crashes;
  power_losses += o.power_losses;
  clean_restarts += o.clean_restarts;
  start_failures += o.start_failures;
  rounds += o.rounds;
  virtual_ms += o.virtual_ms;
  posts_made += o.posts_made;
  posts_acknowledged += o.posts_acknowledged;
  posts_acknowledged_socket += o.posts_acknowledged_socket;
  posts_acknowledged_spool += o.posts_acknowledged_spool;
  posts_failed += o.posts_failed;
  posts_confirmed += o.posts_confirmed;
  broker_enqueued += o.broker_enqueued;
  duplicates_per_crash.insert(duplicates_per_crash.end(), o.duplicates_per_crash.begin(),
                              o.duplicates_per_crash.end());
  journaled_twice_per_crash.insert(journaled_twice_per_crash.end(),
                                   o.journaled_twice_per_crash.begin(),
                                   o.journaled_twice_per_crash.end());
  duplicates_total += o.duplicates_total;
}

}  // namespace postspool::sim
