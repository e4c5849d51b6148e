// Writes the seed corpus of the fuzz targets, with format/'s own writer
// code, into <dir>/<target>/ (dir is normally tests/fuzz/corpus):
//   make_corpus tests/fuzz/corpus
// The generated files are kept in the repository; the test
// fuzz_corpus_current (make_corpus --check tests/fuzz/corpus) fails when
// they differ from what make_corpus writes. The output is deterministic (fixed ids, times and header),
// so running it again after a format change shows up as a reviewable diff.
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "post.h"
#include "ring_format.h"
#include "segment_format.h"

namespace {

using postspool::PostData;
using postspool::PostId;
namespace fb = postspool::fb;
namespace segment = postspool::segment;
namespace ring = postspool::ring;
using Bytes = std::vector<std::byte>;

constexpr int64_t kTimeNs = 1'700'000'000'123'456'789;

PostData MinimalPost() {
  PostData p;
  p.id = PostId{0x0123'4567'89ab'4cde, 0x8f01'2345'6789'abcd};
  p.pub_time_ns = kTimeNs;
  p.base_url = "file:/";
  p.rel_path = "data/a.txt";
  return p;
}

// A typical post from the LD_PRELOAD shim: about 60 bytes of relPath under
// four directories, a sha512 identity, size, mode and times.
PostData TypicalPost(int n) {
  PostData p = MinimalPost();
  p.id.lo += static_cast<uint64_t>(n);
  p.base_url = "sftp://dd.example.org/";
  p.rel_path = "data/model/run_" + std::to_string(20240101 + n) + "/output/field_t2m_000" +
               std::to_string(n % 10) + ".grib2";
  p.identity_method = fb::IdentityMethod::Sha512;
  for (int i = 0; i < 64; ++i) p.identity_value.push_back(static_cast<char>(i * 37 + 11 + n));
  p.size = 1'048'576 + n;
  p.mode = 0644;
  p.mtime_ns = kTimeNs - 5'000'000'000;
  p.atime_ns = kTimeNs - 4'000'000'000;
  return p;
}

PostData FullPost() {
  PostData p = TypicalPost(7);
  p.retrieve_path = "/incoming/run_7/field_t2m_0007.grib2";
  p.link = "../current/field.grib2";
  p.rename = "data/model/run_20240108/output/.field_t2m_0007.grib2.tmp";
  p.extras = {{"topic", "model.output"}, {"flow", "nwp"}};
  p.origin_uid = 1000;
  p.origin_gid = 100;
  p.origin_pid = 31337;
  p.origin_host = "node042";
  return p;
}

PostData RmdirPost() {
  PostData p = MinimalPost();
  p.rel_path = "data/old/run_20230101";
  p.remove = true;
  p.directory = true;
  return p;
}

PostData HardLinkPost() {
  PostData p = TypicalPost(3);
  p.hlink = "data/model/run_20240104/output/field_t2m_0003.grib2";
  p.identity_method = fb::IdentityMethod::Md5;
  p.identity_value.resize(16);
  return p;
}

// UTF-8, JSON specials and control characters: the encoder must escape them.
PostData AwkwardTextPost() {
  PostData p = MinimalPost();
  p.rel_path = "donn\xc3\xa9\x65s/\xc3\xa9t\xc3\xa9 #1/*/a\"b\\c\n\x01\x7f/\xff\xfe.txt";
  p.identity_method = fb::IdentityMethod::Arbitrary;
  p.identity_value = "label \"x\"\t\xe2\x82\xac";
  p.extras = {{"note", "tab\there, quote\" and \xe2\x9c\x93"}};
  return p;
}

// More directories than a 255-byte routing key holds.
PostData DeepPathPost() {
  PostData p = MinimalPost();
  p.rel_path.clear();
  for (int i = 0; i < 40; ++i) p.rel_path += "directory" + std::to_string(i) + "/";
  p.rel_path += "leaf.txt";
  p.identity_method = fb::IdentityMethod::Cod;
  p.identity_value = "sha512";
  return p;
}

// An extra field named like a standard v03 field: Encode refuses it.
PostData ReservedExtraPost() {
  PostData p = MinimalPost();
  p.identity_method = fb::IdentityMethod::Random;
  p.identity_value = "4711";
  p.extras = {{"relPath", "elsewhere/b.txt"}};
  return p;
}

Bytes Build(const PostData& post) {
  flatbuffers::FlatBufferBuilder builder;
  postspool::BuildPost(post, &builder);
  const auto span = std::as_bytes(builder.GetBufferSpan());
  return Bytes(span.begin(), span.end());
}

// TypicalPost padded with an extra field to about `payload_bytes`.
PostData PaddedPost(int n, size_t payload_bytes) {
  PostData p = TypicalPost(n);
  p.extras = {{"pad", ""}};
  for (int i = 0; i < 4; ++i) {
    const size_t have = Build(p).size();
    if (have >= payload_bytes) break;
    p.extras[0].second.append(payload_bytes - have, 'x');
  }
  return p;
}

segment::Header FixedHeader(uint32_t flags = 0) {
  segment::Header h;
  h.segment_id = 0x00c0'ffee'0000'0001;
  h.created_unix_ns = kTimeNs;
  h.creator_uid = 1000;
  h.creator_gid = 1000;
  h.creator_pid = 4242;
  h.host = "node042";
  h.flags = flags;
  return h;
}

Bytes EncodedHeader(const segment::Header& header) {
  std::array<std::byte, segment::kHeaderBytes> raw;
  segment::EncodeHeader(header, raw);
  return Bytes(raw.begin(), raw.end());
}

void Append(const Bytes& payload, Bytes* out) {
  if (!segment::AppendRecord(payload, out).ok()) {
    std::fprintf(stderr, "AppendRecord failed\n");
    std::exit(1);
  }
}

// Header plus one record per post.
Bytes Segment(const std::vector<PostData>& posts, uint32_t flags = 0) {
  Bytes out = EncodedHeader(FixedHeader(flags));
  for (const PostData& p : posts) Append(Build(p), &out);
  return out;
}

Bytes Concat(const Bytes& a, const Bytes& b) {
  Bytes out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

class CorpusWriter {
 public:
  // check: compare with the files under `root` instead of writing them.
  CorpusWriter(std::filesystem::path root, bool check) : root_(std::move(root)), check_(check) {}

  void Write(const std::string& target, const std::string& name, const Bytes& bytes) {
    const auto dir = root_ / target;
    if (check_) {
      std::ifstream in(dir / name, std::ios::binary);
      const std::string have((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (!std::filesystem::is_regular_file(dir / name)) {
        std::printf("missing: %s\n", (dir / name).c_str());
        ++differ_;
      } else if (have.size() != bytes.size() ||
                 std::memcmp(have.data(), bytes.data(), bytes.size()) != 0) {
        std::printf("differs: %s (%zu bytes committed, %zu written by make_corpus)\n",
                    (dir / name).c_str(), have.size(), bytes.size());
        ++differ_;
      }
      total_bytes_ += bytes.size();
      ++files_;
      return;
    }
    std::filesystem::create_directories(dir);
    std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
      std::exit(1);
    }
    total_bytes_ += bytes.size();
    ++files_;
  }

  // A segment for fuzz_segment_reader, and for fuzz_segment_records the
  // same bytes without the header (that target supplies its own).
  void WriteSegment(const std::string& name, const Bytes& file) {
    Write("fuzz_segment_reader", name, file);
    if (file.size() > segment::kHeaderBytes) {
      Write("fuzz_segment_records", name,
            Bytes(file.begin() + segment::kHeaderBytes, file.end()));
    }
  }

  size_t files() const { return files_; }
  size_t total_bytes() const { return total_bytes_; }
  size_t differ() const { return differ_; }

 private:
  std::filesystem::path root_;
  bool check_ = false;
  size_t differ_ = 0;
  size_t files_ = 0;
  size_t total_bytes_ = 0;
};


// A post whose framed record is exactly `record_bytes` long.
PostData PostOfRecordBytes(size_t record_bytes) {
  for (size_t k = record_bytes > 96 ? record_bytes - 96 : 0; k <= record_bytes; ++k) {
    PostData p = PaddedPost(9, k);
    if (segment::RecordBytes(Build(p).size()) == record_bytes) return p;
  }
  std::fprintf(stderr, "no post makes a record of %zu bytes\n", record_bytes);
  std::exit(1);
}

// A ring written by format/'s own producer code (ring::Append), dumped as a
// fuzz_ring_lane input: four control bytes (see fuzz_ring_lane.cc), then the
// ring from its first lane header on, or the whole ring when raw.
class RingImage {
 public:
  RingImage(uint32_t lanes, uint32_t lane_bytes)
      : lanes_(lanes), lane_bytes_(lane_bytes), words_(ring::RingBytes(lanes, lane_bytes) / 8),
        tails_(lanes, 0) {
    ring::Ring::Format(mem(), lanes, lane_bytes, 1000, ring::kDurabilityAccepted);
    std::string why;
    if (!ring::Ring::Open(mem(), &ring_, &why)) {
      std::fprintf(stderr, "ring: %s\n", why.c_str());
      std::exit(1);
    }
    for (uint32_t l = 0; l < lanes; ++l) ring_.owner(l).store(ring::MakeIdentity(4000 + l, 99));
  }
  std::span<std::byte> mem() {
    return {reinterpret_cast<std::byte*>(words_.data()), words_.size() * 8};
  }
  const ring::Ring& r() const { return ring_; }
  // The lane's owner posts `p`; false when the lane is full.
  bool Post(uint32_t lane, const PostData& p) {
    Bytes rec;
    Append(Build(p), &rec);
    return ring::Append(ring_, lane, &tails_[lane], rec) == ring::AppendResult::kAppended;
  }
  // The daemon journaled everything published in the lane.
  void Journal(uint32_t lane) { ring_.head(lane).store(ring_.tail(lane).load()); }
  uint64_t tail(uint32_t lane) const { return tails_[lane]; }
  // Posts (journaled at once) until the lane's tail is at `at` in its lap;
  // the last of those posts is left unjournaled.
  void MoveTo(uint32_t lane, uint64_t at) {
    uint64_t last = tails_[lane];
    while (tails_[lane] % lane_bytes_ != at) {
      const uint64_t pos = tails_[lane] % lane_bytes_;
      const uint64_t left = (at + lane_bytes_ - pos) % lane_bytes_;
      // Too close for one post: once more round the lap.
      const uint64_t bytes = left > 1536 || left < 512 ? 1024 : left;
      last = tails_[lane];
      if (!Post(lane, PostOfRecordBytes(bytes))) std::exit(1);
      Journal(lane);
    }
    ring_.head(lane).store(last);
  }
  Bytes Input(uint8_t flags) {
    const size_t from = (flags & 1) != 0 ? 0 : ring::kHeaderBytes;
    Bytes out(4 + mem().size() - from);
    out[0] = std::byte(flags);
    out[1] = std::byte(lanes_ - 1);
    out[2] = std::byte(lane_bytes_ == 8192 ? 1 : 0);
    std::memcpy(out.data() + 4, mem().data() + from, mem().size() - from);
    return out;
  }

 private:
  uint32_t lanes_;
  uint32_t lane_bytes_;
  std::vector<uint64_t> words_;
  ring::Ring ring_;
  std::vector<uint64_t> tails_;
};

void WriteRingSeeds(CorpusWriter& w) {
  const std::string t = "fuzz_ring_lane";
  constexpr uint8_t kAppendAfter = 2;
  {
    RingImage img(1, 4096);
    for (int i = 1; i <= 3; ++i) img.Post(0, TypicalPost(i));
    w.Write(t, "records.ring", img.Input(kAppendAfter));
    w.Write(t, "records_raw.ring", img.Input(kAppendAfter | 1));
  }
  {
    RingImage img(2, 4096);
    for (int i = 1; i <= 3; ++i) img.Post(0, TypicalPost(i));
    img.r().head(0).store(segment::RecordBytes(Build(TypicalPost(1)).size()));
    img.Post(1, MinimalPost());
    img.Post(1, FullPost());
    img.Journal(1);
    img.Post(1, RmdirPost());
    w.Write(t, "partly_journaled.ring", img.Input(kAppendAfter));
  }
  {
    // 24 bytes left in the lap: a wrap marker, then the record at the start.
    RingImage img(1, 4096);
    img.MoveTo(0, 4096 - 24);
    img.Post(0, TypicalPost(5));
    img.Post(0, TypicalPost(6));
    w.Write(t, "wrap_marker.ring", img.Input(kAppendAfter));
  }
  {
    // 8 bytes left: skipped without a marker.
    RingImage img(1, 4096);
    img.MoveTo(0, 4096 - 8);
    img.Post(0, TypicalPost(5));
    w.Write(t, "implicit_wrap.ring", img.Input(kAppendAfter));
  }
  {
    RingImage img(1, 8192);
    for (int i = 0; i < 300; ++i) {
      img.Post(0, i % 7 == 0 ? FullPost() : TypicalPost(i));
      if (i < 295) img.Journal(0);
    }
    w.Write(t, "many_laps.ring", img.Input(kAppendAfter));
  }
  {
    // The owner died copying its fourth record: bytes past the tail.
    RingImage img(1, 4096);
    for (int i = 1; i <= 3; ++i) img.Post(0, TypicalPost(i));
    const uint64_t tail = img.tail(0);
    img.Post(0, FullPost());
    img.r().tail(0).store(tail);
    w.Write(t, "torn_record.ring", img.Input(kAppendAfter));
    // ... or a tail stored into the middle of a record.
    img.r().tail(0).store(tail + 40);
    w.Write(t, "tail_in_record.ring", img.Input(0));
  }
  {
    RingImage img(1, 4096);
    for (int i = 1; i <= 3; ++i) img.Post(0, TypicalPost(i));
    const size_t second = segment::RecordBytes(Build(TypicalPost(1)).size());
    img.r().data(0)[second + segment::kRecordHeaderBytes + 30] ^= std::byte{0x04};
    w.Write(t, "flipped_bit.ring", img.Input(0));
    img.r().data(0)[second + segment::kRecordHeaderBytes + 30] ^= std::byte{0x04};
    img.r().data(0)[second + 8] ^= std::byte{0x01};  // its marker
    w.Write(t, "bad_marker.ring", img.Input(0));
    img.r().data(0)[second + 8] ^= std::byte{0x01};
    img.r().tail(0).store(img.tail(0) + 8192);
    w.Write(t, "tail_past_lane.ring", img.Input(0));
  }
  {
    RingImage img(1, 4096);
    for (int i = 0; img.Post(0, TypicalPost(i)); ++i) {
    }
    w.Write(t, "full_lane.ring", img.Input(kAppendAfter));
  }
  {
    // Lanes in every state a producer's claim must look at.
    RingImage img(4, 4096);
    img.Post(0, TypicalPost(1));
    img.Journal(0);
    img.r().owner(0).store(0);  // free and drained
    img.Post(1, TypicalPost(2));
    img.r().owner(1).store(0);  // free but not drained
    img.r().state(2).store(ring::kLaneBroken);
    img.r().owner(2).store(0);
    img.r().owner(3).store(ring::MakeIdentity(4003, 99) | ring::kReleasedBit);
    w.Write(t, "lane_states.ring", img.Input(kAppendAfter));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool check = argc == 3 && std::strcmp(argv[1], "--check") == 0;
  if (argc != 2 && !check) {
    std::fprintf(stderr, "usage: %s [--check] <corpus dir, e.g. tests/fuzz/corpus>\n", argv[0]);
    return 2;
  }
  const char* root = argv[argc - 1];
  CorpusWriter w(root, check);

  // Payloads alone.
  const std::string post = "fuzz_post_verifier";
  w.Write(post, "minimal.post", Build(MinimalPost()));
  w.Write(post, "typical.post", Build(TypicalPost(1)));
  w.Write(post, "full.post", Build(FullPost()));
  w.Write(post, "rmdir.post", Build(RmdirPost()));
  w.Write(post, "hardlink_md5.post", Build(HardLinkPost()));
  w.Write(post, "awkward_text.post", Build(AwkwardTextPost()));
  w.Write(post, "deep_path_cod.post", Build(DeepPathPost()));
  w.Write(post, "reserved_extra.post", Build(ReservedExtraPost()));
  w.Write(post, "padded_2k.post", Build(PaddedPost(2, 2048)));
  Bytes wrong_identifier = Build(MinimalPost());
  std::memcpy(wrong_identifier.data() + 4, "XXXX", 4);  // the file identifier
  w.Write(post, "wrong_identifier.post", wrong_identifier);
  Bytes truncated_post = Build(TypicalPost(4));
  truncated_post.resize(truncated_post.size() / 2);
  w.Write(post, "truncated.post", truncated_post);

  // Segments.
  const std::vector<PostData> three = {TypicalPost(1), TypicalPost(2), TypicalPost(3)};
  const Bytes three_records = Segment(three);
  w.WriteSegment("header_only.seg", EncodedHeader(FixedHeader()));
  w.WriteSegment("three_records.seg", three_records);
  w.WriteSegment("mixed_records.seg",
                 Segment({MinimalPost(), FullPost(), RmdirPost(), AwkwardTextPost(),
                          PaddedPost(5, 2048), ReservedExtraPost()}));
  w.WriteSegment("sealed.seg", Segment(three, segment::kFlagSealed));

  // The writer died in the middle of its last record.
  Bytes torn = three_records;
  torn.resize(torn.size() - segment::RecordBytes(Build(TypicalPost(3)).size()) / 2);
  w.WriteSegment("torn_tail.seg", torn);

  // One bit of the middle record's payload flipped: a checksum mismatch,
  // then resynchronisation to the third record.
  Bytes flipped = three_records;
  const size_t second = segment::kHeaderBytes + segment::RecordBytes(Build(TypicalPost(1)).size());
  flipped[second + segment::kRecordHeaderBytes + 40] ^= std::byte{0x10};
  w.WriteSegment("flipped_bit.seg", flipped);

  // 24 bytes of garbage on the 8-byte grid between two records.
  Bytes garbage = Segment({TypicalPost(1)});
  for (int i = 0; i < 24; ++i) garbage.push_back(std::byte(0xa5 ^ i));
  Append(Build(TypicalPost(2)), &garbage);
  w.WriteSegment("garbage_between.seg", garbage);

  // A short write left 13 bytes of a record; the records appended after it
  // by other writers are off the 8-byte grid.
  Bytes off_grid = Segment({TypicalPost(1)});
  Bytes partial;
  Append(Build(TypicalPost(9)), &partial);
  off_grid.insert(off_grid.end(), partial.begin(), partial.begin() + 13);
  Append(Build(TypicalPost(2)), &off_grid);
  Append(Build(TypicalPost(3)), &off_grid);
  w.WriteSegment("short_write_off_grid.seg", off_grid);

  // Intact framing around a payload that is not a Post.
  Bytes invalid_payload = Segment({TypicalPost(1)});
  Bytes not_a_post(96);
  for (size_t i = 0; i < not_a_post.size(); ++i) not_a_post[i] = std::byte(i * 7);
  Append(not_a_post, &invalid_payload);
  Append(Build(TypicalPost(2)), &invalid_payload);
  w.WriteSegment("invalid_payload.seg", invalid_payload);

  // A record header claiming more than the payload maximum.
  Bytes bad_length = Segment({TypicalPost(1)});
  const size_t at = bad_length.size();
  Append(Build(MinimalPost()), &bad_length);
  const uint32_t huge = segment::kRecordPayloadMax + 8;
  for (int i = 0; i < 4; ++i) bad_length[at + 12 + i] = std::byte(huge >> (8 * i));
  Append(Build(TypicalPost(2)), &bad_length);
  w.WriteSegment("bad_length.seg", bad_length);

  // Headers that must be refused (fuzz_segment_reader only: the records
  // target has its own valid header).
  const std::string reader = "fuzz_segment_reader";
  Bytes bad_checksum = three_records;
  bad_checksum[20] ^= std::byte{0x01};  // inside segment_id
  w.Write(reader, "bad_header_checksum.seg", bad_checksum);
  segment::Header newer = FixedHeader();
  newer.format_version = segment::kFormatVersion + 1;
  const Bytes records_only(three_records.begin() + segment::kHeaderBytes, three_records.end());
  w.Write(reader, "newer_version.seg", Concat(EncodedHeader(newer), records_only));
  w.Write(reader, "truncated_header.seg",
          Bytes(three_records.begin(), three_records.begin() + 100));

  WriteRingSeeds(w);

  if (check) {
    // Files of the corpus that make_corpus does not write (regression
    // seeds, regression-*) are not looked at.
    std::printf("%zu of %zu seeds under %s differ from what make_corpus writes%s\n", w.differ(),
                w.files(), root, w.differ() != 0 ? ": run make_corpus on it and commit" : "");
    return w.differ() != 0 ? 1 : 0;
  }
  std::printf("wrote %zu files, %zu bytes, under %s\n", w.files(), w.total_bytes(), root);
  return 0;
}
