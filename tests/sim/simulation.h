// One seeded run of the daemon's ingest logic (the real Ingest and
// SpoolAdopter) on a simulated node: SimFs, SimIoLoop, SimStorage under the real journal,
// SimSpoolDir, simulated clients (socket first, then the spool, as
// client-lib does) and a simulated forwarder (the real PublishWindow,
// SegmentReader and v03 encoder) publishing to a FakeBroker. One seed drives
// everything; a run replays exactly from its seed.
//
// A run: a fault phase (clients post; faults of every kind; the daemon
// crashes at random I/O points, sometimes with a power loss at durability
// `synced`, sometimes stops cleanly; restarts as daemon.cc's Start does),
// then a drain phase (no new posts, no faults) that must end, within
// kDrainMsMax of virtual time, with everything delivered.
//
// Invariants (the names are what a failure reports):
//  - acknowledged_is_recoverable: after every crash, each acknowledged post
//    not yet confirmed is in the journal at or after the stored checkpoint,
//    or in a spool segment the daemon will adopt;
//  - acknowledged_is_confirmed: at the end, each acknowledged post was
//    confirmed by the broker (a post the broker returned as unroutable
//    under unroutable_policy = drop is exempt, and counted);
//  - nothing_invented: every post published was made by a client, with the
//    path it made and the origin uid of the process that made it;
//  - published_only_what_was_handed_over: every post published (of a benign
//    client) was handed to the daemon: its socket request was sent whole and
//    not refused by the daemon's answer, or its spool record was written
//    whole (a torn write, or a writer killed mid-append, counts only the
//    records that landed whole), or its ring record's tail was stored. A
//    post refused with `full` and not spooled must never appear. Checked by
//    breaking it: a daemon that journals a request it answers `full` fails
//    it in 15 of 1,000 seeds;
//  - duplicates_per_crash_at_most_publish_window: after each crash (or
//    restart), at most publish_window_max of the posts the broker had
//    enqueued before it are enqueued again;
//  - drains: once faults stop, everything is delivered and the spool is
//    adopted within kDrainMsMax;
//  - damaged_segment_kept: a journal segment that cannot be read (a
//    zero-length file, a damaged header) while it holds a post the broker
//    has not confirmed is set aside in damaged/ by the forwarder, never
//    deleted (checked after every crash and at the end; a name a power
//    loss took is exempt);
//  - bounded_work_per_round: the work one ingest round asks of the spool
//    directory and the loop stays within the configured limits;
//  - ring_no_lost_wakeup: while the ingest sleeps, a producer that
//    publishes finds the doorbell set (or another producer rang), and a
//    round that only the loop's timeout woke finds no lane holding
//    published records (unless their producer died before its doorbell);
//  - ring_journaled_once, ring_order_per_producer: a ring post (tail
//    stored) is published from one journal record, and a producer
//    process's ring posts in the order it made them; ring posts must also
//    be confirmed (acknowledged_is_confirmed) and recoverable after a crash
//    (the rings survive it);
//  - ring_dead_lanes_reclaimed: at the end no lane is owned by a process
//    that is gone or released it, and every free lane is claimable (one a
//    claim hands back, after a scribble, the daemon must repair: the drain
//    phase probes such lanes with a claim until it does);
// Ring lanes whose uid the disk quota holds back (Ingest::RingAdmits wants
// room for the largest record) are not drained; their posts are counted
// (exempt.ring_posts_held_by_full_disk), not failed.
// Ring posts in a lane that was scribbled over are exempt (counted), and so
// are ring posts not yet journaled when a power loss took tmpfs.
// Posts of hostile clients (squatters, garbage writers) are exempt from the
// first two: they sabotage their own files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "sim_stats.h"

namespace postspool::sim {

struct SimOptions {
  uint64_t seed = 1;
  // Store the checkpoint at every move of the watermark (the forwarder
  // change under way), to measure the duplicate bound it would give.
  bool checkpoint_every_move = false;
  // No full-disk periods (a full disk stops the checkpoint today: it needs
  // a new file), to measure what else makes duplicates.
  bool no_disk_full = false;
  // Print the run's events to stderr.
  bool verbose = false;
};

struct SimFailure {
  std::string invariant;
  std::string detail;
};

struct SimResult {
  uint64_t seed = 0;
  std::string config;  // what the seed chose
  std::vector<SimFailure> failures;
  SimStats stats;
  bool ok() const { return failures.empty(); }
  // Failures of invariants other than the duplicate bound.
  bool ok_except_duplicates() const;
};

SimResult RunSimulation(const SimOptions& options);

// The report of many runs: seeds, crashes, faults of each kind, duplicates
// per crash (max and mean), failed invariants.
std::string Summarize(const std::vector<SimResult>& results);
// A failed run: the seed, the command that replays it, what failed.
std::string DescribeFailure(const SimResult& result, const SimOptions& options);

// "tests/sim/sim_run --seed N" (and the option that changes the run).
std::string ReplayCommand(const SimOptions& options);

inline constexpr const char* kDuplicatesInvariant = "duplicates_per_crash_at_most_publish_window";

}  // namespace postspool::sim
