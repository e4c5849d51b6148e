// Adopting the spool: the posts clients wrote to the spool directory while
// the daemon was down, busy or full.
//
// Scan: every <uid>.current is renamed to its sealed name (writers move on
// to a new current segment) and sealed; every sealed segment is then read
// record by record, and the daemon journals the records (Next); once they
// are committed (Finish) the file is deleted, or moved to the quarantine
// directory if part of it was damaged. Anything in the directory that is not
// a spool segment, not a regular file, not owned by the uid in its name, or
// unreadable is moved to the quarantine directory, counted and logged; no
// file is deleted without its records being journaled, and links are never
// followed.
//
// Not thread-safe: the ingest loop's own.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <memory>
#include <string>

#include "config.h"
#include "metrics.h"
#include "post.h"
#include "segment_reader.h"
#include "status.h"
#include "unique_fd.h"

namespace postspool::daemon {

class SpoolAdopter {
 public:
  SpoolAdopter(const Config& config, Metrics* metrics);

  // Opens the spool and quarantine directories and the inotify watch.
  Status Open();
  // Readable when the spool directory changed; call OnInotify then.
  int inotify_fd() const { return inotify_fd_.get(); }
  void OnInotify();

  // Scans when something changed (debounced) or the rescan interval passed.
  void MaybeScan(std::chrono::steady_clock::time_point now);

  // The next record of the segment being adopted, with the trusted origin
  // (the file owner). False when there is nothing to adopt right now.
  struct Adopted {
    std::span<const std::byte> payload;  // valid until the next call
    uid_t uid;
    gid_t gid;
  };
  bool Next(Adopted* out);
  // True when the segment being adopted has been read to its end: once the
  // records handed out so far are committed, call Finish().
  bool AtEnd() const { return current_ != nullptr && current_->at_end; }
  bool Adopting() const { return current_ != nullptr; }
  // The records handed out are in the journal: delete (or quarantine) the file.
  void Finish();
  // The records handed out were not journaled: read the file again from the
  // start (its records may then be journaled twice: duplicates, not loss).
  void Restart();

  // Bytes of spool segments seen in the last scan (for the disk quota).
  uint64_t spool_bytes() const { return spool_bytes_; }

 private:
  struct Current {
    std::string name;
    UniqueFd fd;
    std::unique_ptr<segment::FileSource> source;
    std::unique_ptr<segment::SegmentReader> reader;
    uid_t uid = 0;
    gid_t gid = 0;
    uint64_t skipped_bytes = 0;
    bool at_end = false;
  };

  void Scan();
  void Quarantine(const std::string& name, const std::string& why);
  // Opens, checks and seals the next queued sealed segment.
  bool OpenNext();
  Status OpenCurrent(const std::string& name, uid_t uid);

  const Config& config_;
  Metrics* metrics_;
  UniqueFd dirfd_;
  UniqueFd quarantine_fd_;
  UniqueFd inotify_fd_;
  bool changed_ = true;
  std::chrono::steady_clock::time_point last_scan_{};
  std::deque<std::string> queue_;  // sealed segments to adopt, oldest first
  std::chrono::steady_clock::time_point settle_until_{};  // see kSettle
  std::unique_ptr<Current> current_;
  uint64_t spool_bytes_ = 0;
};

}  // namespace postspool::daemon
