#include "metrics.h"

namespace postspool::daemon {

std::string Metrics::RenderPrometheus() const {
  std::string out;
  auto put = [&out](const char* name, const char* type, uint64_t v) {
    out += "# TYPE postspool_";
    out += name;
    out += ' ';
    out += type;
    out += "\npostspool_";
    out += name;
    out += ' ';
    out += std::to_string(v);
    out += '\n';
  };
#define PS_COUNTER(f) put(#f, "counter", f.load(std::memory_order_relaxed))
#define PS_GAUGE(f) put(#f, "gauge", f.load(std::memory_order_relaxed))
  PS_COUNTER(connections_accepted_total);
  PS_COUNTER(connections_refused_total);
  PS_COUNTER(accept_errors_total);
  PS_COUNTER(requests_total);
  PS_COUNTER(requests_malformed_total);
  PS_COUNTER(requests_invalid_total);
  PS_COUNTER(requests_refused_full_total);
  PS_COUNTER(requests_refused_busy_total);
  PS_COUNTER(requests_unavailable_total);
  PS_COUNTER(socket_posts_journaled_total);
  PS_COUNTER(posts_fields_dropped_total);
  PS_COUNTER(ring_requests_total);
  PS_COUNTER(ring_requests_refused_total);
  PS_COUNTER(ring_posts_journaled_total);
  PS_COUNTER(ring_posts_deduplicated_total);
  PS_COUNTER(ring_posts_invalid_total);
  PS_COUNTER(ring_lanes_damaged_total);
  PS_COUNTER(ring_lanes_reclaimed_total);
  PS_COUNTER(ring_wakeups_total);
  PS_GAUGE(rings);
  PS_COUNTER(spool_segments_adopted_total);
  PS_COUNTER(spool_posts_journaled_total);
  PS_COUNTER(spool_posts_deduplicated_total);
  PS_COUNTER(spool_posts_invalid_total);
  PS_COUNTER(spool_bytes_damaged_total);
  PS_COUNTER(spool_bytes_torn_total);
  PS_COUNTER(spool_files_quarantined_total);
  PS_COUNTER(spool_seal_busy_total);
  PS_GAUGE(spool_bytes);
  PS_GAUGE(quarantine_bytes);
  PS_GAUGE(disk_bytes);
  PS_COUNTER(journal_writes_total);
  PS_COUNTER(journal_segments_created_total);
  PS_COUNTER(journal_write_errors_total);
  PS_COUNTER(journal_bytes_skipped_total);
  PS_COUNTER(journal_segments_damaged_total);
  PS_GAUGE(journal_bytes);
  PS_COUNTER(published_total);
  PS_COUNTER(confirmed_total);
  PS_COUNTER(nacked_total);
  PS_COUNTER(republished_total);
  PS_COUNTER(unroutable_total);
  PS_COUNTER(unroutable_dropped_total);
  PS_COUNTER(encode_errors_total);
  PS_COUNTER(broker_connects_total);
  PS_COUNTER(broker_connect_failures_total);
  PS_COUNTER(broker_connection_lost_total);
  PS_COUNTER(broker_blocked_total);
  PS_COUNTER(broker_path_changes_total);
  PS_GAUGE(broker_connected);
  PS_GAUGE(publish_in_flight);
  PS_GAUGE(backlog_posts);
  PS_GAUGE(backlog_oldest_age_seconds);
  PS_GAUGE(spool_segments_waiting);
  PS_COUNTER(control_connections_total);
  PS_COUNTER(control_connections_refused_total);
  PS_COUNTER(control_requests_total);
  PS_COUNTER(control_requests_malformed_total);
  PS_COUNTER(control_requests_denied_total);
#undef PS_COUNTER
#undef PS_GAUGE
  return out;
}

}  // namespace postspool::daemon
