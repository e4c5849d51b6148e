// What the forwarder's files (forwarder.cc, forwarder_connection.cc,
// forwarder_status.cc) share: how they format times, positions and ids for
// the log, and how they add to a counter.
#pragma once

#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <string>

#include "amqp_properties.h"
#include "journal.h"
#include "metrics.h"

namespace postspool::daemon::forwarder_internal {

using std::chrono::milliseconds;

inline int64_t UnixMsNow() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch()).count();
}

inline std::string FormatSeconds(milliseconds d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", static_cast<double>(d.count()) / 1000.0);
  return buf;
}

inline std::string FormatPosition(JournalPosition p) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%016" PRIx64 ":%" PRIu64, p.segment_seq, p.offset);
  return buf;
}

inline std::string IdString(PostId id) {
  const MessageId m = FormatMessageId(id);
  return std::string(m.data(), m.size());
}

inline void Add(Metrics::Counter& counter, uint64_t n) {
  if (n != 0) counter.fetch_add(n, std::memory_order_relaxed);
}

}  // namespace postspool::daemon::forwarder_internal
