#include "segment_commands.h"

#include <dirent.h>
#include <fcntl.h>
#include <getopt.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exit_codes.h"
#include "little_endian.h"
#include "lost_records.h"
#include "post.h"
#include "segment_format.h"
#include "segment_reader.h"
#include "segment_writer.h"
#include "unique_fd.h"
#include "v03_encoder.h"

namespace postspool::cli {
namespace {

using ordered_json = nlohmann::ordered_json;
using segment::SkipReason;

// Damaged ranges listed per segment by verify (all are counted).
constexpr size_t kDamageListedMax = 100;
// Bytes of clean records gathered before one write of a repaired copy.
constexpr size_t kRepairWriteBytes = 1 << 20;
// Quarantine names tried: NAME, NAME.1, ... NAME.<this>.
constexpr int kQuarantineNamesMax = 1000;

// A compact JSON line; bytes that are not UTF-8 (a host name, say) are
// replaced rather than thrown on.
std::string Dump(const ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string FormatId(const fb::PostId& id) {
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016" PRIx64 "%016" PRIx64, id.hi(), id.lo());
  const std::string h = hex;
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) +
         "-" + h.substr(20);
}

std::string FormatTime(int64_t unix_ns) {
  std::string out;
  v03::AppendV03Time(unix_ns, &out);
  return out;
}

struct Damage {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  std::string reason;
  uint64_t lost_records = 0;  // CountLostRecords
};

// How many records the `bytes` at `offset` of the file held
// (segment::CountLostRecords, which the daemon uses too); 0 if the file
// cannot be read.
uint64_t CountLostRecords(int fd, uint64_t offset, uint64_t bytes) {
  std::unique_ptr<segment::FileSource> source;
  if (!segment::FileSource::Open(fd, &source).ok()) return 0;
  return segment::CountLostRecords(source.get(), offset, bytes);
}

// What reading one segment found.
struct Scan {
  bool opened = false;     // the file could be opened and its size had
  std::string open_error;  // when not
  uint64_t file_bytes = 0;
  bool header_ok = false;
  std::string header_error;  // the whole file is unreadable
  segment::Header header;
  uint64_t records = 0;
  uint64_t record_bytes = 0;
  uint64_t damaged_ranges = 0;
  uint64_t damaged_bytes = 0;
  uint64_t torn_tail_bytes = 0;
  // Records lost in the damaged ranges and, in a sealed segment, in the
  // torn tail (CountLostRecords).
  uint64_t lost_records = 0;
  uint64_t torn_tail_lost_records = 0;
  std::string io_error;  // reading stopped early
  // A torn tail is the end of data in a segment that may still grow; a
  // sealed segment was complete, so in it a torn tail is lost records.
  bool torn_tail_lost() const { return header_ok && header.sealed() && torn_tail_bytes != 0; }
  bool damaged() const {
    return !header_ok || damaged_ranges != 0 || !io_error.empty() || torn_tail_lost();
  }
};

using RecordFn = std::function<void(const segment::Record&)>;
using DamageFn = std::function<void(const Damage&)>;

// Reads the segment open on `fd` as the daemon does, handing out every valid
// record and every damaged range in file order.
void ScanSegment(int fd, Scan* scan, const RecordFn& on_record, const DamageFn& on_damage) {
  struct stat st;
  std::unique_ptr<segment::FileSource> source;
  if (::fstat(fd, &st) != 0) {
    scan->open_error = std::string("fstat: ") + std::strerror(errno);
    return;
  }
  if (Status s = segment::FileSource::Open(fd, &source); !s.ok()) {
    scan->open_error = s.message();
    return;
  }
  scan->opened = true;
  scan->file_bytes = source->size();
  segment::ReaderOptions options;
  options.verify_payload = VerifyPostPayload;
  options.on_skip = [&](uint64_t offset, uint64_t bytes, SkipReason reason) {
    ++scan->damaged_ranges;
    scan->damaged_bytes += bytes;
    const uint64_t lost = CountLostRecords(fd, offset, bytes);
    scan->lost_records += lost;
    if (on_damage) on_damage(Damage{offset, bytes, segment::SkipReasonName(reason), lost});
  };
  std::unique_ptr<segment::SegmentReader> reader;
  if (Status s = segment::SegmentReader::Open(source.get(), options, &reader); !s.ok()) {
    scan->header_error = s.message().empty() ? StatusCodeName(s.code()) : s.message();
    scan->damaged_bytes = scan->file_bytes;
    scan->lost_records = CountLostRecords(fd, 0, scan->file_bytes);
    if (on_damage) {
      on_damage(Damage{0, scan->file_bytes, "unreadable header: " + scan->header_error,
                       scan->lost_records});
    }
    return;
  }
  scan->header_ok = true;
  scan->header = reader->header();
  for (;;) {
    segment::Record record;
    const auto result = reader->Next(&record);
    if (result == segment::SegmentReader::Result::kRecord) {
      ++scan->records;
      scan->record_bytes += record.next_offset - record.position.offset;
      if (on_record) on_record(record);
    } else if (result == segment::SegmentReader::Result::kYield) {
      continue;
    } else if (result == segment::SegmentReader::Result::kIoError) {
      scan->io_error = reader->io_status().ToString();
      return;
    } else {
      break;
    }
  }
  scan->torn_tail_bytes = reader->torn_tail_bytes();
  if (scan->torn_tail_lost()) {
    // A torn tail starts where a record starts: at least that one.
    scan->torn_tail_lost_records = std::max<uint64_t>(
        1, CountLostRecords(fd, scan->file_bytes - scan->torn_tail_bytes, scan->torn_tail_bytes));
    scan->lost_records += scan->torn_tail_lost_records;
  }
}

ordered_json HeaderJson(const std::string& path, const Scan& scan) {
  ordered_json j;
  j["kind"] = "segment";
  j["file"] = path;
  j["bytes"] = scan.file_bytes;
  if (!scan.header_ok) {
    j["headerError"] = scan.header_error;
    return j;
  }
  char id[17];
  std::snprintf(id, sizeof id, "%016" PRIx64, scan.header.segment_id);
  j["segmentId"] = id;
  j["formatVersion"] = scan.header.format_version;
  j["sealed"] = scan.header.sealed();
  j["created"] = FormatTime(scan.header.created_unix_ns);
  j["creator"] = {{"uid", scan.header.creator_uid},
                  {"gid", scan.header.creator_gid},
                  {"pid", scan.header.creator_pid},
                  {"host", scan.header.host}};
  return j;
}

// One record as `inspect` shows it: position, id, origin, routing key, and
// the v03 body under "post", as the daemon's forwarder would publish it
// (without source, which the daemon sets from its broker user).
std::string RecordLine(const segment::Record& record, std::string* table_row) {
  const fb::Post& post = PostFromPayload(record.payload);
  ordered_json j;
  j["kind"] = "record";
  j["offset"] = record.position.offset;
  j["bytes"] = record.next_offset - record.position.offset;
  j["id"] = FormatId(*post.id());
  if (const fb::Origin* origin = post.origin(); origin != nullptr) {
    ordered_json o = ordered_json::object();
    if (origin->uid()) o["uid"] = *origin->uid();
    if (origin->gid()) o["gid"] = *origin->gid();
    if (origin->pid()) o["pid"] = *origin->pid();
    if (origin->host() != nullptr) o["host"] = origin->host()->str();
    j["origin"] = o;
  }
  v03::Encoded encoded;
  const Status s = v03::Encode(post, v03::EncodeOptions{}, &encoded);
  const std::string rel_path = post.rel_path() != nullptr ? post.rel_path()->str() : "";
  char row[96];
  std::snprintf(row, sizeof row, "%-10" PRIu64 " %-7" PRIu64 " record  %s ",
                record.position.offset, record.next_offset - record.position.offset,
                FormatId(*post.id()).c_str());
  *table_row = row;
  if (!s.ok()) {
    j["error"] = "not encodable as v03: " + s.message();
    *table_row += rel_path + "  (not encodable as v03: " + s.message() + ")";
    return Dump(j);
  }
  j["routingKey"] = encoded.routing_key;
  *table_row += rel_path;
  if (const fb::FileOp* op = post.file_op(); op != nullptr) {
    std::string ops;
    if (op->link() != nullptr) ops += " link";
    if (op->hlink() != nullptr) ops += " hlink";
    if (op->rename() != nullptr) ops += " rename";
    if (op->remove()) ops += " remove";
    if (op->directory()) ops += " directory";
    if (!ops.empty()) *table_row += "  [" + ops.substr(1) + "]";
  }
  std::string line = Dump(j);
  line.pop_back();  // the closing brace: the body follows as it is encoded
  return line + ",\"post\":" + encoded.body + "}";
}

std::string DamageLine(const Damage& d) {
  ordered_json j;
  j["kind"] = "damaged";
  j["offset"] = d.offset;
  j["bytes"] = d.bytes;
  j["reason"] = d.reason;
  j["lostRecords"] = d.lost_records;
  return Dump(j);
}

std::string Records(uint64_t n) { return std::to_string(n) + (n == 1 ? " record" : " records"); }

void PrintDamageRow(const Damage& d) {
  std::printf("%-10" PRIu64 " %-7" PRIu64 " DAMAGED %s (%s lost)\n", d.offset, d.bytes,
              d.reason.c_str(), Records(d.lost_records).c_str());
}

std::string GetoptMessage(int result, char** argv) {
  const char* arg = argv[optind - 1] != nullptr ? argv[optind - 1] : "";
  if (result == ':') return std::string(arg) + " needs a value";
  return std::string("unknown option ") + arg;
}

int CommandUsage(std::string_view name, const std::string& message) {
  std::fprintf(stderr, "postspool %.*s: %s\n(usage: postspool %.*s --help)\n",
               static_cast<int>(name.size()), name.data(), message.c_str(),
               static_cast<int>(name.size()), name.data());
  return kExitUsage;
}

constexpr char kInspectUsage[] =
    "usage: postspool inspect [--table] FILE\n"
    "\n"
    "Shows a spool or journal segment as the daemon reads it: one JSON line for the\n"
    "header (kind \"segment\"), then, in file order, one per valid record (kind\n"
    "\"record\": offset, bytes, id, origin, routingKey, and the v03 body under \"post\",\n"
    "which `postspool post --json` takes back: jq -c .post) and one per damaged range\n"
    "(kind \"damaged\": offset, bytes, reason), and a torn tail at the end (kind\n"
    "\"tornTail\": the end of data, not damage). --table prints the same as a table.\n"
    "\n"
    "Exit status: 0 the file was read (damage is shown, not an error: see verify),\n"
    "1 it could not be read, 2 usage error.\n";

}  // namespace

int RunInspect(std::string_view name, int argc, char** argv) {
  static constexpr option kOptions[] = {{"table", no_argument, nullptr, 't'},
                                        {"help", no_argument, nullptr, 'h'},
                                        {nullptr, 0, nullptr, 0}};
  bool table = false;
  opterr = 0;
  optind = 0;
  for (int o; (o = ::getopt_long(argc, argv, ":h", kOptions, nullptr)) != -1;) {
    if (o == 'h') {
      std::fputs(kInspectUsage, stdout);
      return kExitOk;
    }
    if (o == 't') {
      table = true;
      continue;
    }
    return CommandUsage(name, GetoptMessage(o, argv));
  }
  if (argc - optind != 1) return CommandUsage(name, "expected one FILE, a spool or journal segment");
  const std::string path = argv[optind];
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd.valid()) {
    std::fprintf(stderr, "postspool inspect: %s: %s\n", path.c_str(), std::strerror(errno));
    return errno == ENOENT ? kExitUsage : kExitFailed;
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    std::fprintf(stderr, "postspool inspect: %s is not a regular file\n", path.c_str());
    return kExitUsage;
  }
  Scan scan;
  std::string row;
  if (table) std::printf("%-10s %-7s WHAT\n", "OFFSET", "BYTES");
  bool header_printed = false;
  const auto print_header = [&] {
    if (header_printed) return;
    header_printed = true;
    if (!table) {
      std::printf("%s\n", Dump(HeaderJson(path, scan)).c_str());
    } else if (scan.header_ok) {
      std::printf("%-10d %-7zu header  segment %016" PRIx64 ", %s, created %s by uid %u pid %u on %s\n",
                  0, segment::kHeaderBytes, scan.header.segment_id,
                  scan.header.sealed() ? "sealed" : "not sealed",
                  FormatTime(scan.header.created_unix_ns).c_str(), scan.header.creator_uid,
                  scan.header.creator_pid, scan.header.host.c_str());
    }
  };
  ScanSegment(
      fd.get(), &scan,
      [&](const segment::Record& record) {
        print_header();
        const std::string line = RecordLine(record, &row);
        std::printf("%s\n", table ? row.c_str() : line.c_str());
      },
      [&](const Damage& d) {
        print_header();
        if (table) PrintDamageRow(d);
        else std::printf("%s\n", DamageLine(d).c_str());
      });
  if (!scan.opened) {
    std::fprintf(stderr, "postspool inspect: %s: %s\n", path.c_str(), scan.open_error.c_str());
    return kExitFailed;
  }
  print_header();
  if (scan.torn_tail_bytes != 0) {
    const uint64_t offset = scan.file_bytes - scan.torn_tail_bytes;
    if (table && scan.torn_tail_lost()) {
      std::printf("%-10" PRIu64 " %-7" PRIu64 " DAMAGED torn tail of a sealed segment (%s lost)\n",
                  offset, scan.torn_tail_bytes, Records(scan.torn_tail_lost_records).c_str());
    } else if (table) {
      std::printf("%-10" PRIu64 " %-7" PRIu64 " torn tail (end of data)\n", offset,
                  scan.torn_tail_bytes);
    } else {
      ordered_json j;
      j["kind"] = "tornTail";
      j["offset"] = offset;
      j["bytes"] = scan.torn_tail_bytes;
      j["lostRecords"] = scan.torn_tail_lost_records;
      std::printf("%s\n", Dump(j).c_str());
    }
  }
  std::fflush(stdout);
  if (!scan.io_error.empty()) {
    std::fprintf(stderr, "postspool inspect: %s: reading stopped: %s\n", path.c_str(),
                 scan.io_error.c_str());
    return kExitFailed;
  }
  return kExitOk;
}

namespace {

constexpr char kVerifyUsage[] =
    "usage: postspool verify [--json] [--repair [--quarantine-dir DIR] [--force]] DIR|FILE\n"
    "\n"
    "Checks every segment in DIR (a journal or spool directory; files whose name is a\n"
    "segment name or that start with the segment magic; subdirectories are not\n"
    "entered), or the segment FILE: good records, damaged ranges with their reason,\n"
    "sealed or not, torn tail, and the records lost (those whose start is found in\n"
    "damaged bytes). A torn tail is the end of data of a segment being written; in a\n"
    "sealed segment, which was complete, it is damage: lost records. Read-only and\n"
    "safe while postspoold runs.\n"
    "\n"
    "  --json                 one JSON object per segment instead of text\n"
    "  --repair               move each damaged segment to the quarantine directory\n"
    "                         (never replacing a file there: NAME, NAME.1, ...) and put\n"
    "                         a clean copy of its valid records in its place, written\n"
    "                         under a temporary name, synced and renamed in, with the\n"
    "                         same header (sealed if it was), owner and mode\n"
    "  --quarantine-dir DIR   where damaged segments go (same filesystem); default for\n"
    "                         a journal: its damaged/ directory; required otherwise\n"
    "  --force                repair a journal whose lock a daemon holds, and spool\n"
    "                         segments still open for writing (*.current)\n"
    "\n"
    "--repair refuses a journal that a running daemon holds locked, never rewrites the\n"
    "journal segment the checkpoint points into (offsets would move under the\n"
    "watermark), and leaves *.current spool segments (clients append to them); in a\n"
    "spool directory, stop postspoold first or a segment may be adopted twice\n"
    "(duplicates, not loss).\n"
    "\n"
    "Exit status: 0 nothing damaged, 1 damage found (repaired or not; the report says),\n"
    "2 usage error.\n";

struct VerifyArgs {
  bool json = false;
  bool repair = false;
  bool force = false;
  std::optional<std::string> quarantine_dir;
};

bool IsJournalSegmentName(std::string_view name) {
  if (name.size() != 8 + 16 + 4 || !name.starts_with("journal-") || !name.ends_with(".seg")) {
    return false;
  }
  return std::all_of(name.begin() + 8, name.begin() + 24, [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
  });
}

uint64_t JournalSeqOfName(std::string_view name) {
  return std::strtoull(std::string(name.substr(8, 16)).c_str(), nullptr, 16);
}

bool StartsWithMagic(int dirfd, const std::string& name) {
  UniqueFd fd(::openat(dirfd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid()) return false;
  std::array<std::byte, segment::kMagic.size()> magic{};
  return ::pread(fd.get(), magic.data(), magic.size(), 0) == static_cast<ssize_t>(magic.size()) &&
         magic == segment::kMagic;
}

// The journal's watermark segment, read as FORMAT.md ("Checkpoint") says:
// the valid slot with the highest generation (version 2) or the version 1
// file. nullopt with *error when the file exists and holds nothing valid;
// 0 when there is no checkpoint (the beginning).
std::optional<uint64_t> WatermarkSegment(int dirfd, std::string* error) {
  UniqueFd fd(::openat(dirfd, "checkpoint", O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) {
    if (errno == ENOENT) return 0;
    *error = std::string("checkpoint: ") + std::strerror(errno);
    return std::nullopt;
  }
  std::array<std::byte, 8192> bytes{};
  const ssize_t n = ::pread(fd.get(), bytes.data(), bytes.size(), 0);
  const std::byte* b = bytes.data();
  const auto checksum_ok = [b](size_t at, size_t covered) {
    return segment::UnmaskChecksum(LoadLe64(b + at + covered)) == XXH3_64bits(b + at, covered);
  };
  constexpr uint32_t kCheckpointMagic = 0x4b435350;  // "PSCK"
  std::optional<uint64_t> best_seq;
  uint64_t best_generation = 0;
  if (n == 8192) {
    for (size_t at : {size_t{0}, size_t{4096}}) {
      if (LoadLe32(b + at) != kCheckpointMagic || LoadLe32(b + at + 4) != 2 ||
          !checksum_ok(at, 32)) {
        continue;
      }
      const uint64_t generation = LoadLe64(b + at + 8);
      if (!best_seq || generation > best_generation) {
        best_generation = generation;
        best_seq = LoadLe64(b + at + 16);
      }
    }
  } else if (n == 32 && LoadLe32(b) == kCheckpointMagic && LoadLe32(b + 4) == 1 &&
             checksum_ok(0, 24)) {
    best_seq = LoadLe64(b + 8);
  }
  if (!best_seq) *error = "checkpoint holds no valid watermark";
  return best_seq;
}

Status WriteAll(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno(errno, "write");
    bytes = bytes.subspan(static_cast<size_t>(n));
  }
  return Status::Ok();
}

// Moves `name` from `dirfd` into the quarantine directory under NAME, or
// NAME.1, NAME.2, ... if taken (never replacing a file there). The name used.
Status Quarantine(int dirfd, const std::string& name, int quarantine_fd, std::string* moved_as) {
  for (int n = 0; n <= kQuarantineNamesMax; ++n) {
    const std::string target = n == 0 ? name : name + "." + std::to_string(n);
    if (::renameat2(dirfd, name.c_str(), quarantine_fd, target.c_str(), RENAME_NOREPLACE) == 0) {
      *moved_as = target;
      return Status::Ok();
    }
    if (errno == EXDEV) {
      return Status(StatusCode::kIoError,
                    "the quarantine directory is on another filesystem (a rename cannot "
                    "move the file there)", EXDEV);
    }
    if (errno != EEXIST) return Status::FromErrno(errno, "rename " + name + " to quarantine");
  }
  return Status(StatusCode::kAlreadyExists, "every quarantine name for " + name + " is taken");
}

// Writes the valid records of segment `name` (open on `fd`) into a new
// segment with the same header under `tmp_name`; owner and mode as `st`.
// *records is how many were copied.
Status WriteCleanCopy(int dirfd, int fd, const struct stat& st, const segment::Header& header,
                      const std::string& tmp_name, uint64_t* records) {
  UniqueFd out;
  // Not synced here: the whole file is synced once complete, below.
  if (Status s = segment::CreateSegment(dirfd, tmp_name, header, st.st_mode & 07777, false, &out);
      !s.ok()) {
    return s;
  }
  if (::fchown(out.get(), st.st_uid, st.st_gid) != 0 && (st.st_uid != ::geteuid())) {
    const int err = errno;
    ::unlinkat(dirfd, tmp_name.c_str(), 0);
    return Status::FromErrno(err, "chown of the clean copy to the original's owner");
  }
  std::vector<std::byte> pending;
  Status write_status;
  Scan scan;
  ScanSegment(
      fd, &scan,
      [&](const segment::Record& record) {
        if (!write_status.ok()) return;
        if (Status s = segment::AppendRecord(record.payload, &pending); !s.ok()) {
          write_status = s;
          return;
        }
        ++*records;
        if (pending.size() >= kRepairWriteBytes) {
          write_status = WriteAll(out.get(), pending);
          pending.clear();
        }
      },
      {});
  if (write_status.ok()) write_status = WriteAll(out.get(), pending);
  if (write_status.ok() && !scan.io_error.empty()) {
    write_status = Status(StatusCode::kIoError, "reading the damaged segment: " + scan.io_error);
  }
  if (write_status.ok() && ::fsync(out.get()) != 0) write_status = Status::FromErrno(errno, "fsync");
  if (!write_status.ok()) ::unlinkat(dirfd, tmp_name.c_str(), 0);
  return write_status;
}

struct RepairContext {
  int dirfd = -1;
  int quarantine_fd = -1;
  std::string quarantine_dir;
  bool journal_dir = false;
  std::optional<uint64_t> watermark_seq;  // journal only
  bool force = false;
};

// Repairs one damaged segment. What was done, or why not, for the report.
bool RepairSegment(const RepairContext& ctx, const std::string& name, int fd, const Scan& scan,
                   std::string* report) {
  if (IsJournalSegmentName(name) && ctx.journal_dir && ctx.watermark_seq &&
      JournalSeqOfName(name) == *ctx.watermark_seq) {
    *report = "not repaired: the checkpoint points into this segment, and a clean copy "
              "would move records under the watermark; the daemon skips its damage";
    return false;
  }
  if (const auto spool = segment::ParseSpoolName(name); spool && spool->current && !ctx.force) {
    *report = "not repaired: clients may still append to it (a *.current segment; "
              "--force to repair anyway)";
    return false;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    *report = std::string("not repaired: fstat: ") + std::strerror(errno);
    return false;
  }
  const std::string tmp_name = "." + name + ".repair." + std::to_string(::getpid());
  uint64_t copied = 0;
  bool have_copy = false;
  if (scan.header_ok && scan.records != 0) {
    if (Status s = WriteCleanCopy(ctx.dirfd, fd, st, scan.header, tmp_name, &copied); !s.ok()) {
      *report = "not repaired: writing the clean copy failed: " + s.message();
      return false;
    }
    have_copy = true;
  }
  std::string moved_as;
  if (Status s = Quarantine(ctx.dirfd, name, ctx.quarantine_fd, &moved_as); !s.ok()) {
    if (have_copy) ::unlinkat(ctx.dirfd, tmp_name.c_str(), 0);
    *report = "not repaired: " + s.message();
    return false;
  }
  *report = "moved to " + ctx.quarantine_dir + "/" + moved_as;
  if (have_copy) {
    if (::renameat2(ctx.dirfd, tmp_name.c_str(), ctx.dirfd, name.c_str(), RENAME_NOREPLACE) != 0) {
      *report += std::string("; the clean copy stays as ") + tmp_name +
                 " (rename failed: " + std::strerror(errno) + ")";
      return false;
    }
    *report += "; clean copy of " + std::to_string(copied) + " records written in its place";
  } else {
    *report += scan.header_ok ? "; no valid record to copy" : "; header unreadable, nothing copied";
  }
  ::fsync(ctx.dirfd);
  ::fsync(ctx.quarantine_fd);
  return true;
}

}  // namespace

int RunVerify(std::string_view name, int argc, char** argv) {
  static constexpr option kOptions[] = {{"json", no_argument, nullptr, 'j'},
                                        {"repair", no_argument, nullptr, 'r'},
                                        {"force", no_argument, nullptr, 'f'},
                                        {"quarantine-dir", required_argument, nullptr, 'q'},
                                        {"help", no_argument, nullptr, 'h'},
                                        {nullptr, 0, nullptr, 0}};
  VerifyArgs args;
  opterr = 0;
  optind = 0;
  for (int o; (o = ::getopt_long(argc, argv, ":h", kOptions, nullptr)) != -1;) {
    switch (o) {
      case 'h': std::fputs(kVerifyUsage, stdout); return kExitOk;
      case 'j': args.json = true; break;
      case 'r': args.repair = true; break;
      case 'f': args.force = true; break;
      case 'q': args.quarantine_dir = optarg; break;
      default: return CommandUsage(name, GetoptMessage(o, argv));
    }
  }
  if (argc - optind != 1) return CommandUsage(name, "expected one DIR or FILE");
  if ((args.force || args.quarantine_dir) && !args.repair) {
    return CommandUsage(name, "--force and --quarantine-dir go with --repair");
  }
  const std::string target = argv[optind];
  struct stat target_st;
  if (::stat(target.c_str(), &target_st) != 0) {
    return CommandUsage(name, target + ": " + std::strerror(errno));
  }
  // The directory to work in and the files to check.
  std::string dir;
  std::vector<std::string> names;
  if (S_ISDIR(target_st.st_mode)) {
    dir = target;
  } else if (S_ISREG(target_st.st_mode)) {
    const size_t slash = target.rfind('/');
    dir = slash == std::string::npos ? "." : slash == 0 ? "/" : target.substr(0, slash);
    names.push_back(slash == std::string::npos ? target : target.substr(slash + 1));
  } else {
    return CommandUsage(name, target + " is neither a directory nor a regular file");
  }
  UniqueFd dirfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dirfd.valid()) {
    std::fprintf(stderr, "postspool verify: %s: %s\n", dir.c_str(), std::strerror(errno));
    return kExitFailed;
  }
  uint64_t other_files = 0;
  if (S_ISDIR(target_st.st_mode)) {
    DIR* d = ::fdopendir(::dup(dirfd.get()));
    if (d == nullptr) {
      std::fprintf(stderr, "postspool verify: %s: %s\n", dir.c_str(), std::strerror(errno));
      return kExitFailed;
    }
    while (const dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      struct stat st;
      if (::fstatat(dirfd.get(), n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
        continue;
      }
      if (IsJournalSegmentName(n) || segment::ParseSpoolName(n) || StartsWithMagic(dirfd.get(), n)) {
        names.push_back(n);
      } else {
        ++other_files;
      }
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());
  }
  const bool journal_dir =
      std::any_of(names.begin(), names.end(), [](const std::string& n) { return IsJournalSegmentName(n); });

  // Repair set-up: the quarantine directory, the journal's lock and watermark.
  RepairContext ctx;
  ctx.dirfd = dirfd.get();
  ctx.journal_dir = journal_dir;
  ctx.force = args.force;
  UniqueFd quarantine_fd;
  UniqueFd journal_lock;
  if (args.repair) {
    if (journal_dir) {
      journal_lock.reset(::openat(dirfd.get(), "lock", O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
      if (journal_lock.valid() && ::flock(journal_lock.get(), LOCK_EX | LOCK_NB) != 0 && !args.force) {
        std::fprintf(stderr,
                     "postspool verify: %s: a running postspoold holds this journal (its lock "
                     "file is locked): stop it before --repair (or --force)\n",
                     dir.c_str());
        return kExitFailed;
      }
      std::string error;
      ctx.watermark_seq = WatermarkSegment(dirfd.get(), &error);
      if (!ctx.watermark_seq) {
        std::fprintf(stderr,
                     "postspool verify: %s: %s: without the watermark no journal segment is "
                     "repaired\n",
                     dir.c_str(), error.c_str());
        return kExitFailed;
      }
    }
    if (!args.quarantine_dir && !journal_dir) {
      return CommandUsage(name, "--repair outside a journal needs --quarantine-dir DIR (for a "
                                "spool: the daemon's quarantine_dir, on the same filesystem)");
    }
    ctx.quarantine_dir = args.quarantine_dir.value_or(dir + "/damaged");
    if (!args.quarantine_dir && ::mkdirat(dirfd.get(), "damaged", 0700) != 0 && errno != EEXIST) {
      std::fprintf(stderr, "postspool verify: mkdir %s: %s\n", ctx.quarantine_dir.c_str(),
                   std::strerror(errno));
      return kExitFailed;
    }
    quarantine_fd.reset(::open(ctx.quarantine_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!quarantine_fd.valid()) {
      std::fprintf(stderr, "postspool verify: %s: %s\n", ctx.quarantine_dir.c_str(),
                   std::strerror(errno));
      return kExitFailed;
    }
    ctx.quarantine_fd = quarantine_fd.get();
  }

  uint64_t segments = 0, records = 0, damaged_segments = 0, repaired = 0, lost_records = 0;
  bool failed_to_read = false;
  for (const std::string& n : names) {
    UniqueFd fd(::openat(dirfd.get(), n.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    const std::string path = dir + "/" + n;
    if (!fd.valid()) {
      std::fprintf(stderr, "postspool verify: %s: %s\n", path.c_str(), std::strerror(errno));
      failed_to_read = true;
      continue;
    }
    Scan scan;
    std::vector<Damage> listed;
    ScanSegment(fd.get(), &scan, {}, [&](const Damage& d) {
      if (listed.size() < kDamageListedMax) listed.push_back(d);
    });
    if (!scan.opened) {
      std::fprintf(stderr, "postspool verify: %s: %s\n", path.c_str(), scan.open_error.c_str());
      failed_to_read = true;
      continue;
    }
    ++segments;
    records += scan.records;
    lost_records += scan.lost_records;
    std::string repair_report;
    bool repaired_this = false;
    if (scan.damaged()) {
      ++damaged_segments;
      if (args.repair) {
        repaired_this = RepairSegment(ctx, n, fd.get(), scan, &repair_report);
        repaired += repaired_this ? 1 : 0;
      }
    }
    if (args.json) {
      ordered_json j = HeaderJson(path, scan);
      j.erase("kind");
      j["records"] = scan.records;
      j["recordBytes"] = scan.record_bytes;
      j["damagedRanges"] = scan.damaged_ranges + (scan.header_ok ? 0 : 1);
      j["damagedBytes"] = scan.damaged_bytes;
      j["lostRecords"] = scan.lost_records;
      ordered_json list = ordered_json::array();
      for (const Damage& d : listed) {
        list.push_back({{"offset", d.offset}, {"bytes", d.bytes}, {"reason", d.reason},
                        {"lostRecords", d.lost_records}});
      }
      j["damaged"] = list;
      j["tornTailBytes"] = scan.torn_tail_bytes;
      if (!scan.io_error.empty()) j["ioError"] = scan.io_error;
      j["ok"] = !scan.damaged();
      if (!repair_report.empty()) j["repair"] = {{"done", repaired_this}, {"what", repair_report}};
      std::printf("%s\n", Dump(j).c_str());
      continue;
    }
    std::string line = path + ": ";
    if (!scan.header_ok) {
      line += "DAMAGED: unreadable header (" + scan.header_error + "), " +
              Records(scan.lost_records) + " lost";
    } else {
      line += scan.header.sealed() ? "sealed" : "not sealed";
      line += ", " + std::to_string(scan.records) + " records";
      if (scan.torn_tail_lost()) {
        line += ", DAMAGED: torn tail of " + std::to_string(scan.torn_tail_bytes) +
                " bytes in a sealed segment, " + Records(scan.torn_tail_lost_records) + " lost";
      } else if (scan.torn_tail_bytes != 0) {
        line += ", torn tail of " + std::to_string(scan.torn_tail_bytes) + " bytes (end of data)";
      }
      if (scan.damaged_ranges != 0) {
        line += ", DAMAGED: " + std::to_string(scan.damaged_ranges) +
                (scan.damaged_ranges == 1 ? " range, " : " ranges, ") +
                std::to_string(scan.damaged_bytes) + " bytes, " +
                Records(scan.lost_records - scan.torn_tail_lost_records) + " lost";
      }
      if (!scan.io_error.empty()) line += ", READ ERROR: " + scan.io_error;
      if (!scan.damaged()) line += ", ok";
    }
    std::printf("%s\n", line.c_str());
    if (scan.header_ok) {
      for (const Damage& d : listed) {
        std::printf("  offset %" PRIu64 ", %" PRIu64 " bytes: %s (%s lost)\n", d.offset, d.bytes,
                    d.reason.c_str(), Records(d.lost_records).c_str());
      }
      if (scan.damaged_ranges > listed.size()) {
        std::printf("  ... and %" PRIu64 " more damaged ranges\n",
                    scan.damaged_ranges - listed.size());
      }
    }
    if (!repair_report.empty()) std::printf("  repair: %s\n", repair_report.c_str());
  }
  if (!args.json) {
    std::printf("%" PRIu64 " segments, %" PRIu64 " records, %" PRIu64 " damaged, %" PRIu64
                " records lost",
                segments, records, damaged_segments, lost_records);
    if (args.repair) std::printf(", %" PRIu64 " repaired", repaired);
    if (other_files != 0) std::printf("; %" PRIu64 " other files not checked", other_files);
    std::printf("\n");
  }
  std::fflush(stdout);
  return damaged_segments != 0 || failed_to_read ? kExitFailed : kExitOk;
}

}  // namespace postspool::cli
