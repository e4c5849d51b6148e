// Writing segments: creating one atomically, appending records from many
// processes at once, sealing, and the spool's "current segment" protocol.
// FORMAT.md ("Writing", "Sealing", "Spool file names") is the specification.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "segment_format.h"
#include "status.h"
#include "unique_fd.h"

namespace postspool::segment {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Creates segment `name` in directory `dirfd` holding only `header`, so that
// the name never shows a partial header (an unnamed temporary file is linked
// into place). kAlreadyExists if the name is taken. On success *out is the
// new file, open O_RDWR | O_APPEND. `mode` is applied exactly (not masked by
// the umask).
Status CreateSegment(int dirfd, const std::string& name, const Header& header, mode_t mode,
                     bool sync, UniqueFd* out);

// Reads and checks the header of the segment open on `fd`.
Status ReadHeader(int fd, Header* header);

// Appends `records` (whole framed records, see AppendRecord) to the segment
// open on `fd` (which must be O_APPEND) with a single write(), holding a
// shared flock, after checking that the segment is not sealed.
//  - kSealed: the segment is sealed; nothing was written.
//  - kTimedOut: the lock was not had before `deadline`; nothing was written.
//  - kNoSpace / kIoError: the write failed or was short; a short write can
//    leave a partial record, which readers skip as damage.
// With `sync`, the data is fdatasync'ed before the call returns.
// `still_current`, when given, is asked under the lock too: false means the
// segment was taken away (renamed) and is treated as sealed.
Status AppendToSegment(int fd, std::span<const std::byte> records, Deadline deadline, bool sync,
                       const std::function<bool()>& still_current = {});

// Sets the sealed flag under an exclusive flock (so it waits for appends in
// progress) and, with `sync`, fdatasyncs it (needed only to keep the flag
// across a power loss, when no writer survives anyway). Once it returned ok,
// AppendToSegment writes nothing more to this file. `fd` must be open O_RDWR
// without O_APPEND (pwrite on an O_APPEND descriptor appends on Linux).
// Sealing a sealed segment is ok.
Status SealSegment(int fd, Deadline deadline, bool sync = true);

// The spool's file names. Every uid has one current segment that its
// processes append to; a sealed segment waiting for the daemon carries its
// segment id in its name.
//   <uid>.current
//   <uid>.<segment id, 16 lower-case hex digits>.sealed
std::string SpoolCurrentName(uid_t uid);
std::string SpoolSealedName(uid_t uid, uint64_t segment_id);
struct SpoolName {
  uid_t uid = 0;
  bool current = false;
  uint64_t segment_id = 0;  // for sealed names
};
// Parses a spool file name; nullopt for anything else (temporaries, junk).
std::optional<SpoolName> ParseSpoolName(std::string_view name);

// A random 64-bit segment id (getrandom).
uint64_t NewSegmentId();

// Appends records to the uid's current spool segment, following the writer
// side of the protocol: open or create <uid>.current; when the open segment
// is no longer the one under that name, or is sealed, reopen the name (the
// daemon renames a segment away before sealing it); when it would exceed
// segment_bytes_max, rename it to its sealed name, seal it, and start a new
// one. Not thread-safe: callers serialise. Fork-safe: a child process never
// reuses its parent's descriptor.
class SegmentAppender {
 public:
  struct Options {
    // Group-writable: the daemon (the spool directory's group) sets the
    // sealed flag.
    mode_t file_mode = 0660;
    uint64_t segment_bytes_max = 64ull << 20;
    bool sync = false;  // fdatasync every append
  };
  // `dirfd` is borrowed and must remain open while the appender is used.
  SegmentAppender(int dirfd, uid_t uid, Options options);

  // Appends whole framed records with one write. Waits (for segment locks)
  // at most until the deadline: kTimedOut then, and nothing is written.
  // Steps that do not wait are made even past the deadline.
  Status Append(std::span<const std::byte> records, Deadline deadline);

  // The segment the last successful Append wrote to (0 before any).
  uint64_t segment_id() const { return segment_id_; }
  // The open descriptor (-1 if none), for diagnostics and tests.
  int descriptor() const { return fd_.get(); }

 private:
  Status OpenCurrent();
  // Renames the current segment (if it is still the one open) to its sealed
  // name, then seals it.
  Status RollOver(Deadline deadline);

  int dirfd_;
  uid_t uid_;
  Options options_;
  std::string current_name_;
  UniqueFd fd_;
  pid_t opened_by_ = -1;
  uint64_t segment_id_ = 0;
  uint64_t open_segment_id_ = 0;
};

}  // namespace postspool::segment
