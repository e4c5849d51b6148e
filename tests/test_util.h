// Helpers shared by the format tests: temporary directories and posts.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "flatbuffers/flatbuffers.h"
#include "post.h"
#include "segment_format.h"
#include "segment_reader.h"
#include "unique_fd.h"

namespace postspool::testing {

// The seed of a randomised test: $POSTSPOOL_TEST_SEED when set, else random.
// Tests print it (SCOPED_TRACE) so that a failure can be re-run.
inline uint64_t TestSeed() {
  if (const char* s = std::getenv("POSTSPOOL_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

// The whole content of a file ("" if it cannot be read).
inline std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// What a program run by RunTool did.
struct ToolRun {
  int exit_code = -1;  // 128 + the signal that ended it
  std::string out;
  std::string err;
};

// Runs args[0] with `args` and `input` on its stdin, in directory `cwd`
// when given. Its stdin, stdout and stderr are files in `dir` (removed
// afterwards), so that no pipe can fill up.
inline ToolRun RunTool(const std::string& dir, std::vector<std::string> args,
                       const std::string& input = "", const std::string& cwd = "") {
  const std::string in_path = dir + "/tool.stdin", out_path = dir + "/tool.stdout",
                    err_path = dir + "/tool.stderr";
  std::ofstream(in_path, std::ios::binary) << input;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int in = ::open(in_path.c_str(), O_RDONLY);
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || out < 0 || err < 0) ::_exit(126);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(125);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  ToolRun r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadWhole(out_path);
  r.err = ReadWhole(err_path);
  for (const std::string& p : {in_path, out_path, err_path}) ::unlink(p.c_str());
  return r;
}

// The names in a directory, without . and .. (in no particular order).
inline std::vector<std::string> ListNames(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  return names;
}

// A fresh directory under $TMPDIR (or /tmp), removed with its files at the end.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/postspool-test-XXXXXX";
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : std::string();
    fd_.reset(::open(path_.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC));
  }
  // Removes subdirectories too (the journal's damaged/).
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  int fd() const { return fd_.get(); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  std::vector<std::string> List() const { return ListNames(path_); }

 private:
  std::string path_;
  UniqueFd fd_;
};

// A post whose id and path encode (writer, seq), padded to about `bytes`.
inline PostData NumberedPost(uint64_t writer, uint64_t seq, size_t bytes = 200) {
  PostData p;
  p.id = PostId{writer, seq};
  p.pub_time_ns = 1700000000000000000 + static_cast<int64_t>(seq);
  p.base_url = "file:/";
  p.rel_path = "data/w" + std::to_string(writer) + "/f" + std::to_string(seq);
  p.size = static_cast<int64_t>(seq);
  if (bytes > 150) p.extras.emplace_back("pad", std::string(bytes - 150, 'x'));
  return p;
}

inline std::vector<std::byte> PostPayload(const PostData& post) {
  flatbuffers::FlatBufferBuilder b;
  BuildPost(post, &b);
  auto span = b.GetBufferSpan();
  std::vector<std::byte> out(span.size());
  std::memcpy(out.data(), span.data(), span.size());
  return out;
}

// A whole segment in memory: header, then one record per post. Offsets of
// the records are appended to *offsets when given.
inline std::vector<std::byte> SegmentBytes(const std::vector<PostData>& posts,
                                           std::vector<uint64_t>* offsets = nullptr,
                                           uint64_t segment_id = 42) {
  std::vector<std::byte> out(segment::kHeaderBytes);
  segment::Header h = segment::NewHeader(segment_id);
  segment::EncodeHeader(h, std::span<std::byte, segment::kHeaderBytes>(out.data(),
                                                                       segment::kHeaderBytes));
  for (const PostData& p : posts) {
    if (offsets) offsets->push_back(out.size());
    if (!segment::AppendRecord(PostPayload(p), &out).ok()) std::abort();
  }
  return out;
}

struct ReadResult {
  std::vector<PostData> posts;
  std::vector<uint64_t> offsets;
  struct Skip {
    uint64_t offset;
    uint64_t bytes;
    segment::SkipReason reason;
  };
  std::vector<Skip> skips;
  uint64_t torn_tail_bytes = 0;
  Status open_status;
  bool io_error = false;
};

// A FileSource whose reads fail with EIO while *failures_left is not zero
// (each failure counts it down; a negative count fails for ever): a disk
// with a bad sector, or one that recovers after a few errors.
class FailingSource final : public segment::Source {
 public:
  FailingSource(std::unique_ptr<segment::FileSource> file, std::atomic<int>* failures_left)
      : file_(std::move(file)), failures_left_(failures_left) {}
  uint64_t size() const override { return file_->size(); }
  Status ReadAt(uint64_t offset, std::span<std::byte> out, size_t* got) override {
    int left = failures_left_->load();
    while (left != 0 && !failures_left_->compare_exchange_weak(left, left > 0 ? left - 1 : left)) {
    }
    if (left != 0) {
      *got = 0;
      return Status::FromErrno(EIO, "read segment");
    }
    return file_->ReadAt(offset, out, got);
  }

 private:
  std::unique_ptr<segment::FileSource> file_;
  std::atomic<int>* failures_left_;
};

// A small tmpfs of its own, to fill up (disk-full tests). Root may mount
// one; elsewhere mounted() is false and the test skips with why_not().
class SmallFilesystem {
 public:
  explicit SmallFilesystem(size_t bytes) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/postspool-fs-XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) {
      why_not_ = std::string("mkdtemp: ") + std::strerror(errno);
      return;
    }
    path_ = tmpl;
    const std::string options = "size=" + std::to_string(bytes) + ",mode=0700";
    if (::mount("tmpfs", path_.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
      why_not_ = std::string("cannot mount a tmpfs (needs root or CAP_SYS_ADMIN): ") +
                 std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~SmallFilesystem() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
    if (!path_.empty()) ::rmdir(path_.c_str());
  }
  bool mounted() const { return mounted_; }
  const std::string& why_not() const { return why_not_; }
  const std::string& path() const { return path_; }
  uint64_t free_bytes() const {
    struct statvfs v;
    return ::statvfs(path_.c_str(), &v) == 0 ? uint64_t{v.f_bavail} * v.f_frsize : 0;
  }
  // Writes a filler file until the filesystem is full.
  void Fill() {
    UniqueFd fd(::open((path_ + "/filler").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600));
    std::vector<char> block(4096, 'f');
    while (::write(fd.get(), block.data(), block.size()) > 0) {
    }
    while (::write(fd.get(), block.data(), 1) > 0) {
    }
  }

 private:
  std::string path_;
  std::string why_not_;
  bool mounted_ = false;
};

inline ReadResult ReadAll(segment::Source* source, segment::ReaderOptions options = {}) {
  ReadResult r;
  options.verify_payload = VerifyPostPayload;
  options.on_skip = [&r](uint64_t off, uint64_t n, segment::SkipReason why) {
    r.skips.push_back({off, n, why});
  };
  std::unique_ptr<segment::SegmentReader> reader;
  r.open_status = segment::SegmentReader::Open(source, options, &reader);
  if (!r.open_status.ok()) return r;
  segment::Record rec;
  for (;;) {
    const auto res = reader->Next(&rec);
    if (res == segment::SegmentReader::Result::kEnd) break;
    if (res == segment::SegmentReader::Result::kIoError) {
      r.io_error = true;
      break;
    }
    r.posts.push_back(ReadPost(PostFromPayload(rec.payload)));
    r.offsets.push_back(rec.position.offset);
  }
  r.torn_tail_bytes = reader->torn_tail_bytes();
  return r;
}

inline ReadResult ReadAll(std::span<const std::byte> bytes, segment::ReaderOptions options = {}) {
  segment::MemorySource source(bytes);
  return ReadAll(&source, std::move(options));
}

inline ReadResult ReadFile(const std::string& path, segment::ReaderOptions options = {}) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::unique_ptr<segment::FileSource> source;
  if (!fd.valid() || !segment::FileSource::Open(fd.get(), &source).ok()) {
    ReadResult r;
    r.open_status = Status(StatusCode::kIoError, "cannot open " + path);
    return r;
  }
  return ReadAll(source.get(), std::move(options));
}

// A post id as the AMQP message_id carries it (a UUID in text).
inline std::string Uuid(const uint8_t id[16]) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += hex[id[i] >> 4];
    s += hex[id[i] & 15];
  }
  return s;
}

inline std::string Uuid(const PostId& id) {
  uint8_t raw[16];
  for (int k = 0; k < 8; ++k) {
    raw[k] = static_cast<uint8_t>(id.hi >> (56 - 8 * k));
    raw[8 + k] = static_cast<uint8_t>(id.lo >> (56 - 8 * k));
  }
  return Uuid(raw);
}

// The p-quantile (0..1) of `v`, nearest rank; 0 for none.
inline double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace postspool::testing
