// The daemon's counters and gauges, shared by its threads (relaxed atomics)
// and rendered in the Prometheus text format. One name for one thing: the
// field names are the metric names without the "postspool_" prefix.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace postspool::daemon {

struct Metrics {
  using Counter = std::atomic<uint64_t>;
  // Ingest: socket. A "request" is one packet of posts; refused requests
  // are counted once, under their reason.
  Counter connections_accepted_total{0};
  Counter connections_refused_total{0};  // above connections_max or connections_per_uid_max
  Counter accept_errors_total{0};        // accept() failed (EMFILE...): accepting paused
  Counter requests_total{0};
  Counter requests_malformed_total{0};   // garbage on the socket: framing, checksum, verifier
  Counter requests_invalid_total{0};     // a post fails validation (what a post may say)
  Counter requests_refused_full_total{0};  // disk_bytes_max or the uid's share reached
  Counter requests_refused_busy_total{0};  // the group-commit batch is full
  Counter requests_unavailable_total{0};   // the journal write failed
  Counter socket_posts_journaled_total{0};
  Counter socket_acks_undelivered_total{0};  // journaled, but the client was gone or gave up
  Counter socket_posts_deduplicated_total{0};  // already journaled (its spooled copy came first)
  // Posts without an origin slot that carried fields of a newer schema:
  // rebuilt to stamp them, which dropped those fields (post_stamp.h).
  Counter posts_fields_dropped_total{0};
  // Ingest: the shared-memory rings.
  Counter ring_requests_total{0};           // processes that asked for their uid's ring
  Counter ring_requests_refused_total{0};   // rings off, ring_uids_max reached, or the file failed
  Counter ring_posts_journaled_total{0};
  Counter ring_posts_deduplicated_total{0};  // already journaled (the daemon died before the head moved)
  Counter ring_posts_invalid_total{0};       // fail validation: dropped, the lane goes on
  Counter ring_lanes_damaged_total{0};       // a lane's bytes are not records: the lane is reset
  Counter ring_lanes_reclaimed_total{0};     // lanes of dead or closed owners, drained and freed
  Counter ring_wakeups_total{0};             // doorbell wake-ups of the sleeping ingest loop
  // Posts that processes could not make (the shim over its budget, a failed
  // post), as their clients added them to their uid's ring: a claim of the
  // uid's processes, clamped per take (ring::kDroppedPerTakeMax), saturating.
  Counter shim_posts_dropped_total{0};
  std::atomic<uint64_t> rings{0};            // gauge: rings attached
  // Ingest: spool. A "file" is anything in the spool directory; a
  // "segment" is a spool segment file (FORMAT.md).
  Counter spool_segments_adopted_total{0};
  Counter spool_posts_journaled_total{0};
  Counter spool_posts_deduplicated_total{0};  // spooled copies of journaled posts, dropped
  Counter spool_posts_invalid_total{0};       // fail validation: the segment is quarantined
  Counter spool_bytes_damaged_total{0};  // skipped inside segments (resynchronised past)
  Counter spool_records_lost_total{0};   // records those bytes held (segment::CountLostRecords), and those of unreadable segments
  Counter spool_bytes_torn_total{0};     // unfinished last records (a writer died mid-write)
  Counter spool_files_quarantined_total{0};
  Counter spool_seal_busy_total{0};      // a segment's lock was held: sealing retried later
  std::atomic<uint64_t> spool_bytes{0};       // gauge: allocated bytes of spool segments
  std::atomic<uint64_t> quarantine_bytes{0};  // gauge
  std::atomic<uint64_t> disk_bytes{0};        // gauge: journal + spool + quarantine
  // Journal.
  Counter journal_writes_total{0};
  Counter journal_segments_created_total{0};
  Counter journal_write_errors_total{0};
  Counter journal_bytes_skipped_total{0};
  Counter journal_segments_damaged_total{0};  // unreadable segments skipped, kept in damaged/
  Counter journal_records_lost_total{0};  // records in skipped bytes and unreadable segments (segment::CountLostRecords)
  std::atomic<uint64_t> journal_bytes{0};  // gauge
  // Forwarder.
  Counter published_total{0};
  Counter confirmed_total{0};
  Counter nacked_total{0};
  Counter republished_total{0};
  Counter unroutable_total{0};
  Counter unroutable_dropped_total{0};
  Counter encode_errors_total{0};        // posts that cannot be encoded as v03
  Counter broker_connects_total{0};
  Counter broker_connect_failures_total{0};
  Counter broker_connection_lost_total{0};
  Counter broker_blocked_total{0};
  Counter broker_path_changes_total{0};  // reconnects for a broken path (broker_path.h)
  Counter broker_standby_takeovers_total{0};  // moves to the standby connection
  std::atomic<uint64_t> broker_connected{0};  // gauge, 0/1
  std::atomic<uint64_t> broker_standby_connected{0};  // gauge: 0 none, 1 open, 2 warm
  std::atomic<uint64_t> publish_in_flight{0}; // gauge
  // Backlog (gauges, from the forwarder's count): journaled posts not yet
  // confirmed, and the age of the oldest of them.
  std::atomic<uint64_t> backlog_posts{0};
  std::atomic<uint64_t> backlog_oldest_age_seconds{0};
  std::atomic<uint64_t> spool_segments_waiting{0};  // gauge: not adopted yet
  // Control socket.
  Counter control_connections_total{0};
  Counter control_connections_refused_total{0};  // above control_connections_max
  Counter control_requests_total{0};
  Counter control_requests_malformed_total{0};   // not JSON, too long, unknown request
  Counter control_requests_denied_total{0};      // a state change by a user who may not

  std::string RenderPrometheus() const;
};

}  // namespace postspool::daemon
