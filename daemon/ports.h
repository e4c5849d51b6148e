// The ingest logic's view of the world outside it: a clock, the journal and
// the spool directory. The ingest logic (ingest.h) and spool adoption
// (spool_adopter.h) make no system call themselves; they call these ports,
// which the daemon implements with real files (journal_port.cc,
// spool_dir.cc) and the simulation (tests/sim) with a simulated file system
// that injects faults.
//
// Single-threaded: every port is called from the ingest loop's thread only.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "journal.h"
#include "ring_format.h"
#include "segment_reader.h"
#include "status.h"

namespace postspool::daemon {

using Clock = std::chrono::steady_clock;

class ClockPort {
 public:
  virtual ~ClockPort() = default;
  virtual Clock::time_point Now() = 0;
  // Wall-clock seconds since the Unix epoch (names in the quarantine).
  virtual int64_t WallSeconds() = 0;
};

// The journal as the ingest loop writes it (JournalWriter's Reserve /
// Committed / Abandon protocol, see journal.h). The write itself and its
// fdatasync are submitted through the IoLoop on Slot::fd.
class JournalPort {
 public:
  virtual ~JournalPort() = default;
  struct Slot {
    int fd = -1;               // valid until the next Reserve()
    JournalPosition position;  // where the first byte goes
  };
  // True when a batch of `bytes` needs a new segment first (none yet, the
  // last one was abandoned, or this one is full). The Ingest then has
  // NewSegmentTask() run off its thread (IoLoop::SubmitTask) and hands its
  // completion to SegmentDone(): creating a segment (a file, its header, and
  // at `synced` two fsyncs) never stalls the loop.
  virtual bool NeedsSegment(uint64_t bytes) const = 0;
  // The job that creates the next segment. It touches only the file system
  // and what it captured; it returns 0 or -1 (the status comes with
  // SegmentDone). One at a time.
  virtual std::function<int64_t()> NewSegmentTask() = 0;
  // The task finished: installs its segment. A failure (kNoSpace, kIoError)
  // leaves no new segment, and the next batch tries again.
  virtual Status SegmentDone() = 0;
  // Called only when !NeedsSegment(bytes).
  virtual Status Reserve(uint64_t bytes, Slot* slot) = 0;
  virtual JournalPosition Committed() = 0;
  virtual void Abandon() = 0;
  virtual JournalPosition end() const = 0;
  // Bytes the journal holds on disk (for the disk quota).
  virtual uint64_t bytes() const = 0;
  // The forwarder's acked watermark: every record before it is confirmed
  // (and the segments wholly before it are deleted or about to be).
  virtual JournalPosition watermark() const = 0;
  // Makes the committed end known to the forwarder.
  virtual void Publish(JournalPosition committed) = 0;
};

// What a spool directory entry is, from lstat (or fstat of an open file).
struct SpoolEntry {
  std::string name;
  bool regular = false;
  uid_t owner = 0;
  gid_t group = 0;
  uint64_t links = 0;
  uint64_t size = 0;             // apparent
  uint64_t allocated_bytes = 0;  // st_blocks * 512: what the file costs the disk
  bool has_hole = false;         // a hole before its end (SEEK_HOLE < size)
  int64_t mtime_s = 0;
};

// A spool segment opened for adoption. The descriptor behind it was opened
// O_NOFOLLOW | O_NONBLOCK, so that a FIFO or a symlink planted under the
// name cannot hang or redirect the daemon.
class SpoolFile {
 public:
  virtual ~SpoolFile() = default;
  // What the open file is (fstat): the checks are made on the file that is
  // read, not on the name.
  virtual const SpoolEntry& entry() const = 0;
  // Sets the sealed flag if no writer holds the segment's lock; never waits:
  // kTimedOut when a writer holds it (try again later).
  virtual Status TrySeal(bool sync) = 0;
  // The bytes, for a SegmentReader; valid while this object lives.
  virtual segment::Source* source() = 0;
};

class SpoolDir {
 public:
  virtual ~SpoolDir() = default;
  // Lists up to `max` entries of the directory, continuing where the last
  // call stopped; *pass_done when the pass reached the end (the next call
  // starts a new pass). Entries are not in any particular order.
  virtual Status List(size_t max, std::vector<SpoolEntry>* out, bool* pass_done) = 0;
  // Renames within the directory; kAlreadyExists if `to` exists (never
  // replaces), kNotFound if `from` is gone.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  virtual Status Open(const std::string& name, std::unique_ptr<SpoolFile>* out) = 0;
  virtual Status Unlink(const std::string& name) = 0;
  // Moves `name` into the quarantine directory as `target`; kAlreadyExists
  // if `target` exists there (never replaces).
  virtual Status Quarantine(const std::string& name, const std::string& target) = 0;
  // Bytes held by the quarantine directory (allocated), for the quota.
  virtual uint64_t quarantine_bytes() const = 0;
  // True if change notifications (inotify) arrived since the last call.
  virtual bool TakeChanges() = 0;
};

// The per-uid shared-memory rings (ring_format.h): the files and the
// doorbell. The ingest logic reads and advances the lanes itself through
// ring::Ring views; this port creates and opens the rings, answers whether
// a lane's owner still runs, and puts the doorbell watcher to sleep.
class RingPort {
 public:
  virtual ~RingPort() = default;
  struct Entry {
    uid_t uid = 0;
    ring::Ring ring;
  };
  // The uid's ring, created if it has none: the System V shared memory id
  // to hand to a process of that uid. kUnsupported when rings are off or
  // ring_uids_max rings exist; a new ring joins entries() at the end
  // (existing indexes never move).
  virtual Status ForUid(uid_t uid, int* shm_id) = 0;
  virtual const std::vector<Entry>& entries() const = 0;
  // True while the process `identity` names (pid and start time) runs.
  virtual bool OwnerAlive(uint64_t identity) = 0;
  // The rings go to sleep: every ring's doorbell is set and every lane was
  // found empty after. The watcher waits on the doorbells and makes the
  // loop's wake-up descriptor readable when one is rung. They stay asleep
  // across the loop's rounds (which serve the socket meanwhile) until Awake.
  virtual void Sleep() = 0;
  // The loop walks the lanes again (a doorbell rang, or another reason:
  // Ingest::DrainRings).
  virtual void Awake() = 0;
  // True once a doorbell rang since the last Sleep(), before Awake().
  virtual bool Rang() const = 0;
};

}  // namespace postspool::daemon
