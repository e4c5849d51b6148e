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
  // Ingest: socket.
  Counter connections_accepted_total{0};
  Counter connections_refused_total{0};  // above connections_max
  Counter requests_total{0};
  Counter requests_malformed_total{0};   // garbage on the socket
  Counter requests_refused_full_total{0};
  Counter posts_accepted_total{0};       // journaled from the socket
  // Ingest: spool.
  Counter spool_segments_adopted_total{0};
  Counter spool_posts_adopted_total{0};
  Counter spool_posts_deduplicated_total{0};  // spooled copies of socket posts, dropped
  Counter spool_bytes_skipped_total{0};  // damage inside spool segments
  Counter spool_files_quarantined_total{0};
  // Journal.
  Counter journal_writes_total{0};
  Counter journal_write_errors_total{0};
  Counter journal_bytes_skipped_total{0};
  Counter journal_segments_damaged_total{0};  // unreadable segments skipped, kept in damaged/
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
  std::atomic<uint64_t> broker_connected{0};  // gauge, 0/1
  std::atomic<uint64_t> publish_in_flight{0}; // gauge

  std::string RenderPrometheus() const;
};

}  // namespace postspool::daemon
