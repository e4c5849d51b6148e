// Micro-benchmarks of format/: the costs a post pays on its way through a
// spool segment (BuildPost, AppendToSegment), and the daemon's costs to take
// it out again (SegmentReader with VerifyPostPayload, v03::Encode).
//
//   build/bench/format_bench [--benchmark_filter=Append]
//
// Every benchmark reports items/s (posts or records) and bytes/s. The
// segment files live in a fresh directory under $TMPDIR (default /tmp); the
// label of the file benchmarks names that directory's filesystem, since a
// tmpfs /tmp makes the write and read numbers page-cache-only.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "post.h"
#include "post_stamp.h"
#include "segment_format.h"
#include "segment_reader.h"
#include "segment_writer.h"
#include "status.h"
#include "unique_fd.h"
#include "v03_encoder.h"

namespace postspool {
namespace {

using Bytes = std::vector<std::byte>;

constexpr int64_t kTimeNs = 1'700'000'000'123'456'789;
// Segment images read per iteration of the read benchmarks.
constexpr size_t kReadSegmentBytes = 1 << 20;
// The append benchmarks cut their segment back to the header this often, so
// that a long run does not fill the disk.
constexpr int64_t kAppendsPerTruncate = 16384;

// The post the LD_PRELOAD shim makes for a closed file: about 60 bytes of
// relPath under four directories, a sha512 identity, size, mode and times.
PostData TypicalPost() {
  PostData p;
  p.id = PostId{0x0123'4567'89ab'4cde, 0x8f01'2345'6789'abcd};
  p.pub_time_ns = kTimeNs;
  p.base_url = "sftp://dd.example.org/";
  p.rel_path = "data/model/run_20240102/output/air_temperature_2m_0001.grib2";
  p.identity_method = fb::IdentityMethod::Sha512;
  for (int i = 0; i < 64; ++i) p.identity_value.push_back(static_cast<char>(i * 37 + 11));
  p.size = 1'048'576;
  p.mode = 0644;
  p.mtime_ns = kTimeNs - 5'000'000'000;
  p.atime_ns = kTimeNs - 4'000'000'000;
  return p;
}

Bytes Build(const PostData& post) {
  flatbuffers::FlatBufferBuilder builder;
  BuildPost(post, &builder);
  const auto span = std::as_bytes(builder.GetBufferSpan());
  return Bytes(span.begin(), span.end());
}

// A real Post whose payload is about `payload_bytes`: small ones are a plain
// file post without identity and a longer relPath; larger ones are
// TypicalPost with an extra field as padding.
Bytes PostPayloadOfAbout(size_t payload_bytes) {
  PostData p;
  if (payload_bytes < Build(TypicalPost()).size()) {
    p.id = PostId{0x0123'4567'89ab'4cde, 0x8f01'2345'6789'abcd};
    p.pub_time_ns = kTimeNs;
    p.base_url = "file:/";
    p.rel_path = "data/run_20240102/out/t2m_0001.grib2";
    p.size = 1'048'576;
    p.mode = 0644;
    p.mtime_ns = kTimeNs;
    for (int i = 0; i < 4; ++i) {
      const size_t have = Build(p).size();
      if (have >= payload_bytes) break;
      p.rel_path.insert(std::string_view("data/").size(), payload_bytes - have, 'd');
    }
  } else {
    p = TypicalPost();
    p.extras = {{"pad", ""}};
    for (int i = 0; i < 4; ++i) {
      const size_t have = Build(p).size();
      if (have >= payload_bytes) break;
      p.extras[0].second.append(payload_bytes - have, 'x');
    }
  }
  return Build(p);
}

Bytes Framed(std::span<const std::byte> payload) {
  Bytes record;
  if (!segment::AppendRecord(payload, &record).ok()) std::abort();
  return record;
}

Bytes HeaderBytes() {
  std::array<std::byte, segment::kHeaderBytes> raw;
  segment::EncodeHeader(segment::NewHeader(0x00be'0c40'0000'0001), raw);
  return Bytes(raw.begin(), raw.end());
}

// A segment image of about kReadSegmentBytes of records of one payload.
Bytes SegmentImage(std::span<const std::byte> payload, size_t* records) {
  Bytes image = HeaderBytes();
  *records = kReadSegmentBytes / segment::RecordBytes(payload.size());
  for (size_t i = 0; i < *records; ++i) {
    if (!segment::AppendRecord(payload, &image).ok()) std::abort();
  }
  return image;
}

std::string FilesystemName(const std::string& dir) {
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) != 0) return "unknown fs";
  switch (static_cast<unsigned long>(fs.f_type)) {
    case TMPFS_MAGIC: return "tmpfs";
    case EXT4_SUPER_MAGIC: return "ext4";  // also ext2/ext3: same magic
    case XFS_SUPER_MAGIC: return "xfs";
    case BTRFS_SUPER_MAGIC: return "btrfs";
    case OVERLAYFS_SUPER_MAGIC: return "overlayfs";
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "fs 0x%lx", static_cast<unsigned long>(fs.f_type));
  return buf;
}

// A fresh directory under $TMPDIR (default /tmp), removed with its contents.
class TempDir {
 public:
  TempDir() {
    const char* root = std::getenv("TMPDIR");
    std::string tmpl = std::string(root != nullptr && *root != '\0' ? root : "/tmp") +
                       "/postspool-bench.XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    path_ = tmpl;
    fd_.reset(::open(path_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd_.valid()) std::abort();
    label_ = "in " + path_ + " on " + FilesystemName(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  const std::string& label() const { return label_; }

 private:
  std::string path_;
  UniqueFd fd_;
  std::string label_;
};

void ReportSizes(benchmark::State& state, size_t payload_bytes, size_t bytes_per_item,
                 int64_t items_per_iteration) {
  state.SetItemsProcessed(state.iterations() * items_per_iteration);
  state.SetBytesProcessed(state.iterations() * items_per_iteration *
                          static_cast<int64_t>(bytes_per_item));
  state.counters["payload_bytes"] = static_cast<double>(payload_bytes);
}

// One framed record per AppendToSegment: O_APPEND write under a shared
// flock after reading the sealed flag; fdatasync if `sync`.
void AppendRecords(benchmark::State& state, bool sync) {
  const Bytes payload = PostPayloadOfAbout(static_cast<size_t>(state.range(0)));
  const Bytes record = Framed(payload);
  TempDir dir;
  UniqueFd fd;
  if (Status s = segment::CreateSegment(dir.fd(), "bench.seg",
                                        segment::NewHeader(segment::NewSegmentId()), 0600,
                                        /*sync=*/false, &fd);
      !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  const segment::Deadline deadline = segment::Clock::now() + std::chrono::hours(1);
  int64_t since_truncate = 0;
  for (auto _ : state) {
    if (Status s = segment::AppendToSegment(fd.get(), record, deadline, sync); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    if (++since_truncate == kAppendsPerTruncate) {
      state.PauseTiming();
      if (::ftruncate(fd.get(), segment::kHeaderBytes) != 0) std::abort();
      since_truncate = 0;
      state.ResumeTiming();
    }
  }
  ReportSizes(state, payload.size(), record.size(), 1);
  state.SetLabel((sync ? "fdatasync every append, " : "no sync, ") + dir.label());
}

void BM_AppendToSegment(benchmark::State& state) { AppendRecords(state, /*sync=*/false); }
BENCHMARK(BM_AppendToSegment)->ArgName("payload")->Arg(200)->Arg(2048)->UseRealTime();

void BM_AppendToSegmentSync(benchmark::State& state) { AppendRecords(state, /*sync=*/true); }
BENCHMARK(BM_AppendToSegmentSync)->ArgName("payload")->Arg(200)->Iterations(300)->UseRealTime();

// Reads every record of a ~1 MiB segment through SegmentReader with
// VerifyPostPayload. `from_file`: a FileSource over a real file (in the
// page cache after the first iteration); otherwise a MemorySource.
void ReadRecords(benchmark::State& state, bool from_file) {
  const Bytes payload = PostPayloadOfAbout(static_cast<size_t>(state.range(0)));
  size_t records = 0;
  const Bytes image = SegmentImage(payload, &records);

  TempDir dir;
  UniqueFd fd;
  if (from_file) {
    fd.reset(::openat(dir.fd(), "read.seg", O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd.valid() || ::write(fd.get(), image.data(), image.size()) !=
                           static_cast<ssize_t>(image.size())) {
      state.SkipWithError("cannot write the segment file");
      return;
    }
  }
  segment::ReaderOptions options;
  options.verify_payload = VerifyPostPayload;
  uint64_t skipped = 0;
  options.on_skip = [&skipped](uint64_t, uint64_t bytes, segment::SkipReason) {
    skipped += bytes;
  };
  segment::MemorySource memory(image);
  for (auto _ : state) {
    std::unique_ptr<segment::FileSource> file;
    segment::Source* source = &memory;
    if (from_file) {
      if (Status s = segment::FileSource::Open(fd.get(), &file); !s.ok()) {
        state.SkipWithError(s.ToString().c_str());
        break;
      }
      source = file.get();
    }
    std::unique_ptr<segment::SegmentReader> reader;
    if (Status s = segment::SegmentReader::Open(source, options, &reader); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    segment::Record record;
    size_t got = 0;
    while (reader->Next(&record) == segment::SegmentReader::Result::kRecord) {
      benchmark::DoNotOptimize(record.payload.data());
      ++got;
    }
    if (got != records || skipped != 0) {
      state.SkipWithError("the reader did not return every record");
      break;
    }
  }
  ReportSizes(state, payload.size(), segment::RecordBytes(payload.size()),
              static_cast<int64_t>(records));
  state.counters["records_per_segment"] = static_cast<double>(records);
  state.SetLabel(from_file ? "FileSource, " + dir.label() : "MemorySource");
}

void BM_ReadVerifyMemory(benchmark::State& state) { ReadRecords(state, /*from_file=*/false); }
BENCHMARK(BM_ReadVerifyMemory)->ArgName("payload")->Arg(200)->Arg(2048);

void BM_ReadVerifyFile(benchmark::State& state) { ReadRecords(state, /*from_file=*/true); }
BENCHMARK(BM_ReadVerifyFile)->ArgName("payload")->Arg(200)->Arg(2048)->UseRealTime();

// The typical post's payload, 8-byte aligned in `storage` (as the daemon
// receives it).
std::span<const std::byte> AlignedTypicalPayload(std::vector<uint64_t>* storage) {
  const Bytes built = Build(TypicalPost());
  storage->assign((built.size() + 7) / 8, 0);
  std::memcpy(storage->data(), built.data(), built.size());
  return {reinterpret_cast<const std::byte*>(storage->data()), built.size()};
}

// The FlatBuffers verifier alone, for the share it takes of a read.
void BM_VerifyPostPayload(benchmark::State& state) {
  std::vector<uint64_t> aligned;
  const std::span<const std::byte> payload = AlignedTypicalPayload(&aligned);
  for (auto _ : state) {
    bool ok = VerifyPostPayload(payload);
    benchmark::DoNotOptimize(ok);
    if (!ok) {
      state.SkipWithError("the typical post does not verify");
      break;
    }
  }
  ReportSizes(state, payload.size(), payload.size(), 1);
}
BENCHMARK(BM_VerifyPostPayload);

void BM_V03Encode(benchmark::State& state) {
  std::vector<uint64_t> aligned;
  const std::span<const std::byte> payload = AlignedTypicalPayload(&aligned);
  if (!VerifyPostPayload(payload)) {
    state.SkipWithError("the typical post does not verify");
    return;
  }
  const fb::Post& post = PostFromPayload(payload);
  const v03::EncodeOptions options;
  v03::Encoded out;  // reused, as the forwarder does
  size_t body_bytes = 0;
  for (auto _ : state) {
    if (Status s = v03::Encode(post, options, &out); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(out.body.data());
    body_bytes = out.body.size();
  }
  // bytes/s counts the JSON body produced.
  ReportSizes(state, payload.size(), body_bytes, 1);
  state.counters["body_bytes"] = static_cast<double>(body_bytes);
  state.counters["routing_key_bytes"] = static_cast<double>(out.routing_key.size());
}
BENCHMARK(BM_V03Encode);

void BM_BuildPost(benchmark::State& state) {
  const PostData post = TypicalPost();
  flatbuffers::FlatBufferBuilder builder;  // reused, as the client library does
  size_t payload_bytes = 0;
  for (auto _ : state) {
    BuildPost(post, &builder);
    benchmark::DoNotOptimize(builder.GetBufferPointer());
    payload_bytes = builder.GetSize();
  }
  ReportSizes(state, payload_bytes, payload_bytes, 1);
}
BENCHMARK(BM_BuildPost);

// The daemon's per-post work between a verified request and the journal
// batch: stamping the trusted origin into the client's bytes (no rebuild),
// then framing the stamped post as a record with its checksum, each alone.
void BM_StampPostInPlace(benchmark::State& state) {
  std::vector<uint64_t> aligned;
  const std::span<const std::byte> payload = AlignedTypicalPayload(&aligned);
  const StampedOrigin origin{1000, 1000, 4242, "node0042.cluster.example"};
  std::vector<std::byte> out;  // reused, as the ingest does
  for (auto _ : state) {
    if (!StampPostInPlace(payload, origin, "", &out)) {
      state.SkipWithError("the typical post has no origin slot");
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  ReportSizes(state, payload.size(), out.size(), 1);
}
BENCHMARK(BM_StampPostInPlace);

void BM_AppendRecord(benchmark::State& state) {
  const Bytes payload = PostPayloadOfAbout(static_cast<size_t>(state.range(0)));
  std::vector<std::byte> batch;  // a group commit's batch, reused
  batch.reserve(64 * segment::RecordBytes(payload.size()));
  for (auto _ : state) {
    if (batch.size() + segment::RecordBytes(payload.size()) > batch.capacity()) batch.clear();
    if (Status s = segment::AppendRecord(payload, &batch); !s.ok()) {
      state.SkipWithError(s.ToString().c_str());
      break;
    }
    benchmark::DoNotOptimize(batch.data());
  }
  ReportSizes(state, payload.size(), payload.size(), 1);
}
BENCHMARK(BM_AppendRecord)->ArgName("payload")->Arg(200)->Arg(2048);

}  // namespace
}  // namespace postspool

BENCHMARK_MAIN();
