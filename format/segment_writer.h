// Writing segments: creating one atomically, appending records from many
// processes at once, sealing, and the spool's "current segment" protocol.
// FORMAT.md ("Writing", "Sealing", "Spool file names") is the specification.
#pragma once

#include <sys/stat.h>
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
// the umask). With `sync`, the header and the new name are durable when it
// returns: the file is fsync'ed after the link (which commits the link on
// journaling filesystems, ext4 and xfs), and the directory is fsync'ed too
// where `dirfd` allows it (NewNameSyncFor). Never syncfs. If a sync after
// the link fails, the name exists but may not survive a power loss: *out is
// the file all the same, with the error.
Status CreateSegment(int dirfd, const std::string& name, const Header& header, mode_t mode,
                     bool sync, UniqueFd* out);
// CreateSegment's file steps for any `contents` (the journal's Storage
// makes its files with it).
Status CreateFileComplete(int dirfd, const std::string& name, std::span<const std::byte> contents,
                          mode_t mode, bool sync, UniqueFd* out);

// How CreateSegment makes a new name durable through `dirfd`:
//  - kFileAndDirectory: fsync of the file, then of the directory;
//  - kFile: fsync of the file only, for an O_PATH descriptor (the client
//    library's: users may not open the spool directory for reading, and an
//    O_PATH descriptor cannot be fsync'ed). It relies on the filesystem
//    committing the link with the file's metadata, as journaling
//    filesystems do (FORMAT.md, "Durability of a new segment's name").
enum class NewNameSync { kFileAndDirectory, kFile };
NewNameSync NewNameSyncFor(int dirfd);

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

// The spool's file names. Every uid has one shared current segment that its
// processes append to; a writer that finds the shared name taken by
// something it must not use (another user's file, a symbolic link, a FIFO, a
// directory, a hard link) appends to a private current segment of its own
// instead; a sealed segment waiting for the daemon carries its segment id in
// its name.
//   <uid>.current
//   <uid>.<segment id, 16 lower-case hex digits>.current   (private)
//   <uid>.<segment id, 16 lower-case hex digits>.sealed
std::string SpoolCurrentName(uid_t uid);
std::string SpoolPrivateCurrentName(uid_t uid, uint64_t segment_id);
std::string SpoolSealedName(uid_t uid, uint64_t segment_id);
struct SpoolName {
  uid_t uid = 0;
  bool current = false;     // the shared or a private current segment
  uint64_t segment_id = 0;  // for sealed and private current names; 0 for <uid>.current
};
// Parses a spool file name; nullopt for anything else (temporaries, junk).
std::optional<SpoolName> ParseSpoolName(std::string_view name);

// A random 64-bit segment id (getrandom).
uint64_t NewSegmentId();

// Appends records to the uid's current spool segment, following the writer
// side of the protocol: open or create <uid>.current, and use it only if it
// is a regular file owned by `uid` with one link; else (whatever a squatter
// put there) create a private <uid>.<random>.current with O_EXCL semantics.
// A squatter never makes an append fail. When the open segment is no longer
// the one under its name, is sealed, or gained a link or another owner,
// open again (the daemon renames a segment away before sealing it); when it
// would exceed segment_bytes_max, rename it to its sealed name, seal it, and
// start a new one. Not thread-safe: callers serialise. Fork-safe: a child
// process never reuses its parent's descriptor.
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
  // The name of the open segment: <uid>.current or a private name.
  const std::string& current_name() const { return current_name_; }

 private:
  // Opens (or creates) <uid>.current, or falls back to OpenPrivate.
  Status OpenCurrent();
  // Creates and opens a new private current segment.
  Status OpenPrivate();
  void MoveAsideUnsynced(const UniqueFd& fd, const std::string& name, uint64_t segment_id);
  // A regular file owned by uid_ with exactly one name.
  bool Usable(const struct stat& st) const;
  // Renames the current segment (if it is still the one open) to its sealed
  // name, then seals it.
  Status RollOver(Deadline deadline);

  int dirfd_;
  uid_t uid_;
  Options options_;
  std::string shared_name_;   // <uid>.current
  std::string current_name_;  // the open segment's name
  UniqueFd fd_;
  pid_t opened_by_ = -1;
  uint64_t segment_id_ = 0;
  uint64_t open_segment_id_ = 0;
};

}  // namespace postspool::segment
