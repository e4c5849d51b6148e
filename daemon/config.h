// postspoold's configuration: every limit and default in one struct.
// docs/configuration.md is the reference; keep the two in step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "status.h"

namespace postspool::daemon {

enum class Durability { kAccepted, kSynced };
enum class IoBackend { kAuto, kIoUring, kEpoll };
enum class UnroutablePolicy { kDrop, kRetry };

struct Config {
  // Paths.
  std::string socket_path = "/run/postspool/postspoold.sock";
  uint32_t socket_mode = 0666;
  std::string spool_dir = "/var/spool/postspool/incoming";
  std::string quarantine_dir = "/var/spool/postspool/quarantine";
  std::string journal_dir = "/var/lib/postspool/journal";
  // The records of the per-uid shared-memory rings (the daemon's own
  // directory, mode 0700): one System V segment of ring_lanes lanes of
  // ring_lane_bytes each per uid that asked for one, at most ring_uids_max
  // of them. Empty: no rings.
  std::string ring_dir = "/run/postspool/rings";

  // Ingest.
  Durability durability = Durability::kAccepted;
  IoBackend io_backend = IoBackend::kAuto;
  uint32_t connections_max = 4096;
  // One uid's share of connections_max: one user's idle connections must
  // not push every other user to the spool.
  uint32_t connections_per_uid_max = 256;
  uint32_t batch_records_max = 4096;      // records in one group-commit write
  uint64_t batch_bytes_max = 4ull << 20;  // bytes in one group-commit write
  uint32_t spool_rescan_interval_ms = 1000;
  uint32_t ring_lanes = 128;
  uint32_t ring_lane_bytes = 32u << 10;  // a power of two, 4 KiB to 16 MiB
  uint32_t ring_uids_max = 64;           // at most kRingUidsLimit
  // Records one lane gives to one ingest round (fairness between lanes).
  uint32_t ring_lane_records_per_round = 256;
  // After the last ring record, the ingest loop polls the rings this long
  // before it sleeps (and producers must ring the doorbell).
  uint32_t ring_poll_us = 200;
  // Bounds on the spool work of one ingest round, so that a directory of
  // 50,000 files or a huge segment never stalls socket posts or the
  // watchdog: directory entries examined, and bytes examined by the
  // segment reader.
  uint32_t spool_scan_entries_max = 256;
  uint64_t spool_read_bytes_max = 1ull << 20;
  // The quarantine directory's size (allocated bytes, counted in
  // disk_bytes_max too); when it is reached, files that would go there stay
  // where they are, are skipped and logged.
  uint64_t quarantine_bytes_max = 256ull << 20;
  // Ids of recently journaled posts remembered, so that spool adoption drops
  // a spooled copy of a post already journaled (recent_ids.h); 0: off.
  uint32_t dedupe_window_posts = 131072;
  uint64_t journal_segment_bytes_max = 64ull << 20;
  // Journal plus spool plus quarantine on disk (allocated bytes); above it,
  // socket posts fail with `full` (POSTSPOOL_ENOSPACE).
  uint64_t disk_bytes_max = 4ull << 30;
  // One uid's share of disk_bytes_max: its unconfirmed posts in the journal
  // plus its spool segments. Above it that uid's posts fail with `full`,
  // its ring lanes and spool segments wait until its share frees; other
  // users go on. 0 (the default): a quarter of disk_bytes_max
  // (DiskBytesPerUidMax), so that a share always leaves room for others
  // whatever the total is.
  uint64_t disk_bytes_per_uid_max = 0;
  uint64_t DiskBytesPerUidMax() const {
    return disk_bytes_per_uid_max != 0 ? disk_bytes_per_uid_max : disk_bytes_max / 4;
  }

  // Broker (names as Sarracenia's where it has them).
  std::vector<std::string> post_broker = {"amqp://guest:guest@localhost/"};
  std::string post_exchange;  // empty: xs_<broker user>
  std::string post_topicPrefix = "v03";
  std::string post_baseUrl = "file:/";  // for posts that carry no base URL
  bool exchange_declare = true;         // declare (durable topic) or only check
  uint32_t publish_window_max = 1000;   // unconfirmed messages in flight
  bool publish_mandatory = true;
  UnroutablePolicy unroutable_policy = UnroutablePolicy::kDrop;
  uint32_t heartbeat_s = 30;
  uint32_t connect_timeout_ms = 5000;
  uint32_t reconnect_delay_initial_ms = 100;
  // Small enough that a broker back from an outage is used within about
  // 1.5 s (full jitter: the wait is uniform in [0, cap]); a broker that stays
  // down costs one refused TCP connect per 0.75 s on average per node.
  uint32_t reconnect_delay_max_ms = 1500;
  // The per-post delay before a post the broker nacked (or returned, under
  // unroutable_policy = retry) is published again; exponential, full jitter.
  uint32_t republish_delay_initial_ms = 100;
  uint32_t republish_delay_max_ms = 30000;
  // A connection that refuses every post (nacks, no ack) for path_refused_ms,
  // or confirms nothing for path_silent_ms while posts wait, is a broken
  // path: the forwarder reconnects, then moves to the next broker, the waits
  // between steps doubling up to path_wait_max_ms (broker_path.h).
  uint32_t path_refused_ms = 1000;
  uint32_t path_silent_ms = 5000;
  uint32_t path_wait_max_ms = 30000;
  // With two or more brokers: keep a second connection open to another one,
  // warmed by publishing on it once, and move to it at once when the
  // connection breaks (standby_session.h).
  bool broker_standby = true;
  uint32_t checkpoint_interval_ms = 200;
  std::string tls_ca_file;  // empty: the system's CA store
  std::string tls_cert_file;
  std::string tls_key_file;
  bool tls_verify_peer = true;
  bool tls_verify_hostname = true;

  // Shutdown: how long SIGTERM waits for the broker to confirm what is
  // journaled before exiting (what is left stays journaled for the next start).
  uint32_t shutdown_drain_ms = 5000;

  // Metrics in the Prometheus text format, rewritten every
  // metrics_interval_ms (for node_exporter's textfile collector); empty: off.
  std::string metrics_file = "/run/postspool/metrics.prom";
  uint32_t metrics_interval_ms = 5000;

  // The control socket (`postspool status|drain|metrics`; control.h): any
  // user may read status and metrics, root and the daemon's group may change
  // state. Empty: off. At most control_connections_max clients at once, each
  // served within control_timeout_ms.
  std::string control_socket_path = "/run/postspool/control.sock";
  uint32_t control_connections_max = 16;
  uint32_t control_timeout_ms = 2000;
  // `postspool status` calls the daemon unhealthy when posts are in flight
  // and the broker confirmed nothing for this long.
  uint32_t health_confirm_stall_ms = 30000;

  // Logging: error, warning, info, debug.
  std::string log_level = "info";
};

// futex_waitv waits on at most 128 words: the doorbell thread's own and
// one per ring.
inline constexpr uint32_t kRingUidsLimit = 127;

// Parses "key = value" lines ('#' starts a comment). Sizes take the
// suffixes KiB, MiB, GiB; booleans are true/false/yes/no/on/off.
// `post_broker` may be given several times (or as a comma-separated list):
// the brokers are tried in turn. An unknown key or a bad value is an error
// naming the file and line.
Status ParseConfig(const std::string& text, const std::string& origin, Config* config);
Status LoadConfig(const std::string& path, Config* config);

// Descriptors the daemon keeps for itself besides client connections
// (journal, spool, quarantine, listening socket, signalfd, inotify, eventfds,
// io_uring, the broker connection, metrics, stdio), with room to spare.
inline constexpr uint32_t kDaemonFdsReserve = 64;

// Every check of `config` that does not need the daemon running, i.e. every
// static check that start makes (or would otherwise fail on later), so that
// `postspoold --check-config` (systemd's ExecStartPre, exit 2, not
// restarted) catches what would make the daemon exit at start and be
// restarted in a loop. kInvalidArgument naming the key:
//  - socket_path absolute and short enough for a Unix socket address
//    (sizeof(sun_path) - 1 = 107 bytes); spool_dir, quarantine_dir,
//    journal_dir and a non-empty metrics_file absolute;
//  - every post_broker URL parses (ParseBrokerUrl); at least one;
//  - tls_ca_file, tls_cert_file, tls_key_file readable when set; a key
//    only with a certificate;
//  - connections_max + kDaemonFdsReserve within RLIMIT_NOFILE's hard limit
//    (start raises the soft limit to it: RaiseOpenFilesLimit);
//  - batch_bytes_max holds at least one record of the largest payload;
//    journal_segment_bytes_max at least batch_bytes_max;
//  - the ranges ParseConfig enforces, for a Config built in code.
// Reads the TLS files and getrlimit; changes nothing.
Status CheckConfig(const Config& config);

// What is valid but almost certainly not meant (one line each, naming the
// keys): a disk_bytes_per_uid_max that is not below disk_bytes_max, which
// lets one user fill the whole quota. --check-config prints them (and
// still exits 0); start logs them as warnings.
std::vector<std::string> ConfigWarnings(const Config& config);

// Raises RLIMIT_NOFILE's soft limit to its hard limit (systemd starts
// services with a soft limit of 1024, far below connections_max). An error
// only if setrlimit refuses.
Status RaiseOpenFilesLimit();

const char* DurabilityName(Durability d);
const char* IoBackendName(IoBackend b);

}  // namespace postspool::daemon
