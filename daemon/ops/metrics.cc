#include "metrics.h"

namespace postspool::daemon {

std::string Metrics::RenderPrometheus() const {
  std::string out;
  // Each metric with its # HELP and # TYPE lines, as Prometheus' text
  // format has them (docs/configuration.md says the same at more length).
  auto put = [&out](const char* name, const char* type, uint64_t v, const char* help) {
    out += "# HELP postspool_";
    out += name;
    out += ' ';
    out += help;
    out += "\n# TYPE postspool_";
    out += name;
    out += ' ';
    out += type;
    out += "\npostspool_";
    out += name;
    out += ' ';
    out += std::to_string(v);
    out += '\n';
  };
#define PS_COUNTER(f, help) put(#f, "counter", f.load(std::memory_order_relaxed), help)
#define PS_GAUGE(f, help) put(#f, "gauge", f.load(std::memory_order_relaxed), help)
  PS_COUNTER(connections_accepted_total, "Socket connections taken.");
  PS_COUNTER(connections_refused_total, "Socket connections closed at once (above connections_max or connections_per_uid_max, or stopping).");
  PS_COUNTER(accept_errors_total, "accept() failures on the post socket (EMFILE...); accepting pauses after each.");
  PS_COUNTER(requests_total, "Requests (socket packets of posts) received.");
  PS_COUNTER(requests_malformed_total, "Requests refused: framing, checksum or FlatBuffers verifier failed.");
  PS_COUNTER(requests_invalid_total, "Requests refused: a post fails validation.");
  PS_COUNTER(requests_refused_full_total, "Requests refused as full: disk_bytes_max or the uid's disk_bytes_per_uid_max reached.");
  PS_COUNTER(requests_refused_busy_total, "Requests refused as busy: the group-commit batch is full (the client spools).");
  PS_COUNTER(requests_unavailable_total, "Requests refused: the journal write failed (the client spools).");
  PS_COUNTER(socket_posts_journaled_total, "Posts received over the socket and journaled.");
  PS_COUNTER(socket_posts_deduplicated_total,
             "Socket posts already journaled (the client spooled them when the budget ran out, and adoption came first), acknowledged and dropped.");
  PS_COUNTER(socket_acks_undelivered_total,
             "Acknowledgements of journaled requests that did not reach their client (gone, or it gave up and spooled the posts).");
  PS_COUNTER(posts_fields_dropped_total, "Posts journaled with fields dropped.");
  PS_COUNTER(ring_requests_total, "Processes that asked for their uid's ring.");
  PS_COUNTER(ring_requests_refused_total, "Ring requests refused (rings off, ring_uids_max reached, the segment could not be made).");
  PS_COUNTER(ring_posts_journaled_total, "Posts received through the shared-memory ring and journaled.");
  PS_COUNTER(ring_posts_deduplicated_total, "Ring posts already journaled, dropped.");
  PS_COUNTER(ring_posts_invalid_total, "Ring posts that fail validation, dropped.");
  PS_COUNTER(ring_lanes_damaged_total, "Ring lanes whose bytes are not records, reset.");
  PS_COUNTER(ring_lanes_reclaimed_total, "Ring lanes of exited or closed processes, drained and freed.");
  PS_COUNTER(ring_wakeups_total, "Times a producer's doorbell woke the sleeping ingest loop.");
  PS_COUNTER(shim_posts_dropped_total, "Posts that processes (the LD_PRELOAD shim) could not make, as their clients reported them through their uid's ring.");
  PS_GAUGE(rings, "Rings attached (including rings their users removed, read until the daemon stops).");
  PS_COUNTER(spool_segments_adopted_total, "Spool segments read to their end and journaled.");
  PS_COUNTER(spool_posts_journaled_total, "Posts adopted from the spool directory and journaled.");
  PS_COUNTER(spool_posts_deduplicated_total, "Spooled copies of posts already journaled, dropped.");
  PS_COUNTER(spool_posts_invalid_total, "Spooled posts that fail validation (their segment is quarantined).");
  PS_COUNTER(spool_bytes_damaged_total, "Bytes skipped inside spool segments (damage).");
  PS_COUNTER(spool_records_lost_total, "Records lost in damaged spool segments: in the bytes skipped, or in a segment whose header is unreadable (quarantined).");
  PS_COUNTER(spool_bytes_torn_total, "Bytes of unfinished last records of spool segments.");
  PS_COUNTER(spool_files_quarantined_total, "Files moved to the quarantine directory.");
  PS_COUNTER(spool_seal_busy_total, "Sealing attempts that found a writer holding the lock (retried later).");
  PS_GAUGE(spool_bytes, "Allocated bytes of the spool segments not yet adopted.");
  PS_GAUGE(quarantine_bytes, "Allocated bytes of the quarantine directory.");
  PS_GAUGE(disk_bytes, "Journal plus spool plus quarantine, allocated bytes (compared with disk_bytes_max).");
  PS_COUNTER(journal_writes_total, "Group-commit journal writes.");
  PS_COUNTER(journal_segments_created_total, "Journal segments started.");
  PS_COUNTER(journal_write_errors_total, "Journal writes or syncs that failed.");
  PS_COUNTER(journal_bytes_skipped_total, "Journal bytes skipped as damaged by the forwarder.");
  PS_COUNTER(journal_segments_damaged_total, "Journal segments that could not be read, set aside in damaged/.");
  PS_COUNTER(journal_records_lost_total, "Records lost in the journal: in the bytes skipped, or after the point where a damaged segment became unreadable.");
  PS_GAUGE(journal_bytes, "Allocated bytes of the journal segment files.");
  PS_COUNTER(published_total, "basic.publish calls, republications included.");
  PS_COUNTER(confirmed_total, "Posts confirmed by the broker (basic.ack).");
  PS_COUNTER(nacked_total, "Posts refused by the broker (basic.nack), published again.");
  PS_COUNTER(republished_total, "Posts published again (after a nack or a lost connection).");
  PS_COUNTER(unroutable_total, "Unroutable posts: returned by the broker (basic.return, no queue bound).");
  PS_COUNTER(unroutable_dropped_total, "Unroutable posts dropped after their retries.");
  PS_COUNTER(encode_errors_total, "Journaled posts that cannot be encoded as v03, skipped.");
  PS_COUNTER(broker_connects_total, "Broker connections opened.");
  PS_COUNTER(broker_connect_failures_total, "Broker connection attempts that failed.");
  PS_COUNTER(broker_connection_lost_total, "Broker connections lost.");
  PS_COUNTER(broker_blocked_total, "Times the broker blocked publishing (connection.blocked).");
  PS_COUNTER(broker_path_changes_total, "Connections dropped for a broken broker path (refused or silent) or by postspool reconnect.");
  PS_COUNTER(broker_standby_takeovers_total, "Times the forwarder moved to its standby connection after its connection broke.");
  PS_GAUGE(broker_connected, "1 while connected to a broker, else 0.");
  PS_GAUGE(broker_standby_connected, "The standby connection (broker_standby): 0 none, 1 open, 2 open and warm (its channel has published).");
  PS_GAUGE(publish_in_flight, "Posts published and not yet confirmed.");
  PS_GAUGE(backlog_posts, "Journaled posts not yet confirmed by the broker nor dropped.");
  PS_GAUGE(backlog_oldest_age_seconds, "Age of the oldest unconfirmed post, 0 when there is none.");
  PS_GAUGE(spool_segments_waiting, "Spool segments found and not yet adopted.");
  PS_COUNTER(control_connections_total, "Control socket connections.");
  PS_COUNTER(control_connections_refused_total, "Control socket connections refused (above control_connections_max, or accept failed).");
  PS_COUNTER(control_requests_total, "Control requests.");
  PS_COUNTER(control_requests_malformed_total, "Control requests that were not one JSON object with a known request.");
  PS_COUNTER(control_requests_denied_total, "Control state changes refused to a user who may not make them.");
#undef PS_COUNTER
#undef PS_GAUGE
  return out;
}

}  // namespace postspool::daemon
