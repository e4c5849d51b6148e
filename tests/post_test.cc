// The Post schema: every field round-trips, the verifier guards readers, and
// records written under a newer schema are read under this one.
#include "post.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <set>

#include "post_v2_generated.h"
#include "post_stamp.h"
#include "test_util.h"
#include "v03_fields.h"

namespace postspool {
namespace {

PostData FullPost() {
  PostData p;
  p.id = PostId{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  p.pub_time_ns = 1700000000123456789;
  p.base_url = "sftp://data.example.org/";
  p.rel_path = "obs/2023/11/14/radar.h5";
  p.retrieve_path = "incoming/radar.h5.tmp";
  p.link = "../target";
  p.hlink = "obs/other.h5";
  p.rename = "obs/old-name.h5";
  p.remove = true;
  p.directory = true;
  p.identity_method = fb::IdentityMethod::Sha512;
  p.identity_value = std::string(64, '\xab');
  p.size = 123456789012;
  p.mode = 0644;
  p.mtime_ns = 1699999999000000001;
  p.atime_ns = -5;  // before the epoch
  p.extras = {{"flavour", "ops"}, {"station", "ALL"}};
  p.origin_uid = 1001;
  p.origin_gid = 100;
  p.origin_pid = 4242;
  p.origin_host = "node17";
  return p;
}

PostData RoundTrip(const PostData& in) {
  const auto payload = testing::PostPayload(in);
  EXPECT_TRUE(VerifyPostPayload(payload));
  return ReadPost(PostFromPayload(payload));
}

TEST(Post, EveryFieldRoundTrips) {
  const PostData in = FullPost();
  EXPECT_EQ(RoundTrip(in), in);
}

TEST(Post, EachOptionalFieldRoundTripsAloneAndAbsentStaysAbsent) {
  const PostData full = FullPost();
  PostData base;
  base.id = full.id;
  base.base_url = "file:/";
  base.rel_path = "a";
  EXPECT_EQ(RoundTrip(base), base);
  std::vector<std::function<void(PostData&)>> setters = {
      [&](PostData& p) { p.retrieve_path = full.retrieve_path; },
      [&](PostData& p) { p.link = full.link; },
      [&](PostData& p) { p.hlink = full.hlink; },
      [&](PostData& p) { p.rename = full.rename; },
      [&](PostData& p) { p.remove = true; },
      [&](PostData& p) { p.directory = true; },
      [&](PostData& p) {
        p.identity_method = fb::IdentityMethod::Cod;
        p.identity_value = "sha512";
      },
      [&](PostData& p) { p.size = 0; },  // zero is present, not absent
      [&](PostData& p) { p.mode = 0; },
      [&](PostData& p) { p.mtime_ns = 0; },
      [&](PostData& p) { p.atime_ns = 0; },
      [&](PostData& p) { p.extras = full.extras; },
      [&](PostData& p) { p.origin_uid = 0; },
      [&](PostData& p) { p.origin_host = "h"; },
  };
  for (size_t i = 0; i < setters.size(); ++i) {
    PostData p = base;
    setters[i](p);
    EXPECT_EQ(RoundTrip(p), p) << "setter " << i;
  }
}

TEST(Post, VerifierRejectsDamagedOrForeignBuffers) {
  const auto good = testing::PostPayload(FullPost());
  EXPECT_TRUE(VerifyPostPayload(good));
  for (size_t cut = 0; cut < good.size(); cut += 7) {
    std::vector<std::byte> shorter(good.begin(), good.begin() + static_cast<long>(cut));
    EXPECT_FALSE(VerifyPostPayload(shorter)) << cut;
  }
  auto wrong_id = good;
  wrong_id[4] = std::byte{'X'};  // the file identifier
  EXPECT_FALSE(VerifyPostPayload(wrong_id));
  std::vector<std::byte> zeros(256);
  EXPECT_FALSE(VerifyPostPayload(zeros));
  // A buffer without a required field does not pass.
  flatbuffers::FlatBufferBuilder b;
  const fb::PostId id(1, 2);
  const auto start = b.StartTable();  // by hand: PostBuilder asserts required fields
  b.AddStruct(fb::Post::VT_ID, &id);
  b.Finish(flatbuffers::Offset<fb::Post>(b.EndTable(start)), fb::PostIdentifier());
  std::vector<std::byte> missing(b.GetSize());
  std::memcpy(missing.data(), b.GetBufferPointer(), b.GetSize());
  EXPECT_FALSE(VerifyPostPayload(missing));
}

TEST(Post, VerifierRejectsAMisalignedBufferInsteadOfReadingIt) {
  const auto good = testing::PostPayload(FullPost());
  // One byte of padding, then the payload: built by insert, since GCC 12 at
  // -O3 reports a false -Wstringop-overflow for std::copy to begin() + 1.
  std::vector<std::byte> shifted(1);
  shifted.insert(shifted.end(), good.begin(), good.end());
  shifted.resize(good.size() + 8);
  EXPECT_FALSE(VerifyPostPayload(std::span(shifted).subspan(1, good.size())));
}

TEST(PostSchemaEvolution, TodaysReaderReadsARecordWrittenByANewerSchema) {
  namespace v2 = fbtest::v2;
  flatbuffers::FlatBufferBuilder b;
  const auto base_url = b.CreateString("file:/");
  const auto rel_path = b.CreateString("dir/new.bin");
  const auto value = b.CreateVector(std::vector<uint8_t>{1, 2, 3});
  const auto identity = v2::CreateIdentity(b, v2::IdentityMethod::Sha3_512, value);
  const auto rename = b.CreateString("dir/old.bin");
  const auto op = v2::CreateFileOp(b, 0, 0, rename, false, false, /*truncate=*/true);
  const auto container = b.CreateString("pod-7");
  v2::OriginBuilder ob(b);
  ob.add_uid(7);
  ob.add_container(container);
  const auto origin = ob.Finish();
  const auto content_type = b.CreateString("application/x-hdf5");
  const auto blocks = v2::CreateBlocks(b, 4096, 3);
  const v2::PostId id(9, 10);
  v2::PostBuilder pb(b);
  pb.add_id(&id);
  pb.add_pub_time_ns(1);
  pb.add_base_url(base_url);
  pb.add_rel_path(rel_path);
  pb.add_file_op(op);
  pb.add_identity(identity);
  pb.add_size(77);
  pb.add_origin(origin);
  pb.add_content_type(content_type);
  pb.add_blocks(blocks);
  b.Finish(pb.Finish(), v2::PostIdentifier());
  std::vector<std::byte> payload(b.GetSize());
  std::memcpy(payload.data(), b.GetBufferPointer(), b.GetSize());

  ASSERT_TRUE(VerifyPostPayload(payload));
  const PostData p = ReadPost(PostFromPayload(payload));
  EXPECT_EQ(p.id, (PostId{9, 10}));
  EXPECT_EQ(p.rel_path, "dir/new.bin");
  EXPECT_EQ(p.rename, "dir/old.bin");
  EXPECT_EQ(p.size, 77);
  EXPECT_EQ(p.origin_uid, 7u);
  // An enum value this reader does not know arrives as its number.
  EXPECT_EQ(static_cast<int>(p.identity_method), 6);
}

TEST(PostSchemaEvolution, ANewerReaderReadsTodaysRecordWithDefaultsForNewFields) {
  const auto payload = testing::PostPayload(FullPost());
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(payload.data()),
                                 payload.size());
  ASSERT_TRUE(fbtest::v2::VerifyPostBuffer(verifier));
  const auto* post = fbtest::v2::GetPost(payload.data());
  EXPECT_EQ(post->rel_path()->str(), FullPost().rel_path);
  EXPECT_EQ(post->content_type(), nullptr);
  EXPECT_EQ(post->blocks(), nullptr);
  EXPECT_FALSE(post->file_op()->truncate());
  EXPECT_EQ(post->origin()->container(), nullptr);
}

TEST(ValidatePost, AcceptsAFullPostAndNamesTheFieldItRejects) {
  EXPECT_TRUE(ValidatePost(FullPost()).ok());
  auto expect_rejected = [](PostData p, const std::string& field) {
    const Status s = ValidatePost(p);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  };
  PostData p = FullPost();
  p.base_url.clear();
  EXPECT_TRUE(ValidatePost(p).ok()) << "the daemon fills in its post_baseUrl";
  p = FullPost();
  p.rel_path.clear();
  expect_rejected(p, "rel_path");
  p = FullPost();
  p.rel_path = std::string(kPathBytesMax + 1, 'a');
  expect_rejected(p, "rel_path");
  p = FullPost();
  p.rel_path = std::string("a\0b", 3);
  expect_rejected(p, "rel_path");
  p = FullPost();
  p.rename = std::string(kPathBytesMax + 1, 'a');
  expect_rejected(p, "rename");
  p = FullPost();
  p.extras.assign(kExtrasMax + 1, {"k", "v"});
  expect_rejected(p, "extra");
  p = FullPost();
  p.identity_value = std::string(kIdentityBytesMax + 1, 'v');
  expect_rejected(p, "identity");
}

// Each case: a FullPost changed one way, and the field the refusal must name.
void ExpectRefusedNaming(const PostData& p, const std::string& field) {
  const Status s = ValidatePost(p);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << field << ": " << s.ToString();
  EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
}

TEST(ValidatePost, RefusesPathsThatCouldLeadAConsumerOutsideItsDirectory) {
  for (const char* bad : {"a//b", "a/b/", "//a", "./a", "a/./b", "a/.", "../a", "a/../b",
                          "a/..", "..", ".", "/", "/..", "/a/../../etc/passwd"}) {
    for (const char* field : {"rel_path", "hlink", "rename"}) {
      PostData p = FullPost();
      if (std::string(field) == "rel_path") p.rel_path = bad;
      if (std::string(field) == "hlink") p.hlink = bad;
      if (std::string(field) == "rename") p.rename = bad;
      SCOPED_TRACE(std::string(field) + " = \"" + bad + "\"");
      ExpectRefusedNaming(p, field);
    }
  }
}

TEST(ValidatePost, AcceptsNormalisedPathsWithOneOptionalLeadingSlash) {
  for (const char* good : {"a", "/a", "a/b", "/data/x.txt", "a/..b/c..", ".hidden/.x", "a/.../b"}) {
    PostData p = FullPost();
    p.rel_path = good;
    p.hlink = good;
    p.rename = good;
    EXPECT_TRUE(ValidatePost(p).ok()) << good << ": " << ValidatePost(p).ToString();
  }
}

TEST(ValidatePost, ASymbolicLinkTargetMayPointAnywhere) {
  PostData p = FullPost();
  p.link = "../../shared//lib/./x/";
  EXPECT_TRUE(ValidatePost(p).ok()) << ValidatePost(p).ToString();
}

TEST(ValidatePost, RefusesEveryReservedV03NameAsAnExtraKey) {
  for (const std::string_view key : v03::kReservedFieldNames) {
    PostData p = FullPost();
    p.extras.emplace_back(std::string(key), "x");
    ExpectRefusedNaming(p, std::string(key));
  }
  for (const char* key : {"_format", "_deleteOnPost", "_anything"}) {
    PostData p = FullPost();
    p.extras.emplace_back(key, "x");
    ExpectRefusedNaming(p, key);
  }
  // Names are compared as JSON compares them: case-sensitively.
  PostData p = FullPost();
  p.extras = {{"relpath", "x"}, {"Size", "y"}, {"new_version", "z"}};
  EXPECT_TRUE(ValidatePost(p).ok()) << ValidatePost(p).ToString();
}

TEST(ValidatePost, RefusesAnExtraKeyGivenTwice) {
  PostData p = FullPost();
  p.extras = {{"flavour", "a"}, {"station", "b"}, {"flavour", "c"}};
  ExpectRefusedNaming(p, "flavour");
}

TEST(ValidatePost, RefusesANegativeSizeAndModeBitsOutsidePermissions) {
  PostData p = FullPost();
  p.size = -1;
  ExpectRefusedNaming(p, "size");
  p = FullPost();
  p.size = 0;
  EXPECT_TRUE(ValidatePost(p).ok());
  p = FullPost();
  p.mode = 0100644;  // an st_mode with its file type bits
  ExpectRefusedNaming(p, "mode");
}

TEST(ValidatePost, RefusesAnIdentityOfTheWrongLengthForItsDigest) {
  PostData p = FullPost();
  p.identity_value.resize(63);
  ExpectRefusedNaming(p, "identity");
  p = FullPost();
  p.identity_method = fb::IdentityMethod::Md5;
  ExpectRefusedNaming(p, "identity");
  p.identity_value.resize(16);
  EXPECT_TRUE(ValidatePost(p).ok());
  p = FullPost();
  p.identity_method = fb::IdentityMethod::Cod;
  p.identity_value.clear();
  ExpectRefusedNaming(p, "identity");
}

TEST(ValidatePost, RefusesANulByteInAnExtraField) {
  PostData p = FullPost();
  p.extras = {{"flavour", std::string("a\0b", 3)}};
  ExpectRefusedNaming(p, "extra field");
}

TEST(ValidatePost, TheLargestValidPostFitsInOneRecord) {
  PostData p = FullPost();
  p.base_url = std::string(kBaseUrlBytesMax, 'u');
  for (auto* f : {&p.rel_path}) *f = std::string(kPathBytesMax, 'p');
  for (auto* f : {&p.retrieve_path, &p.link, &p.hlink, &p.rename, &p.origin_host}) {
    *f = std::string(kPathBytesMax, 'p');
  }
  p.identity_method = fb::IdentityMethod::Arbitrary;  // a text identity can take all 256 bytes
  p.identity_value = std::string(kIdentityBytesMax, 'i');
  p.extras.clear();
  for (size_t i = 0; i < kExtrasMax; ++i) {
    // 24-byte keys, all different: k...k00 to k...k31.
    const std::string key = std::string(22, 'k') + static_cast<char>('0' + i / 10) +
                            static_cast<char>('0' + i % 10);
    p.extras.emplace_back(key, std::string(kExtraBytesMax - 24, 'v'));
  }
  ASSERT_TRUE(ValidatePost(p).ok());
  std::vector<std::byte> out;
  EXPECT_TRUE(segment::AppendRecord(testing::PostPayload(p), &out).ok());
}

TEST(NewPostId, IsAVersion4IdAndDoesNotRepeat) {
  std::set<PostId> ids;
  for (int i = 0; i < 10000; ++i) {
    const PostId id = NewPostId();
    EXPECT_EQ((id.hi >> 12) & 0xf, 4u);
    EXPECT_EQ(id.lo >> 62, 2u);
    EXPECT_TRUE(ids.insert(id).second);
  }
}

// Ids come from a per-thread buffer of random bytes: a child after fork
// must not take the same next id as its parent.
TEST(NewPostId, AChildAfterForkDoesNotRepeatItsParentsNextIds) {
  (void)NewPostId();  // the buffer holds bytes for more
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    const PostId child = NewPostId();
    ::_exit(::write(fds[1], &child, sizeof child) == sizeof child ? 0 : 1);
  }
  const PostId parent = NewPostId();
  PostId child;
  ASSERT_EQ(::read(fds[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_FALSE(child == parent);
}

}  // namespace
}  // namespace postspool

namespace postspool {
namespace {

// A post written with the newer schema (tests/post_v2.fbs), with an origin
// table the client does not fill and an empty base URL.
std::vector<std::byte> NewerSchemaPost(bool with_origin) {
  namespace v2 = fbtest::v2;
  flatbuffers::FlatBufferBuilder b;
  const auto base_url = b.CreateString("");
  const auto rel_path = b.CreateString("dir/new.bin");
  const auto content_type = b.CreateString("application/x-hdf5");
  const auto blocks = v2::CreateBlocks(b, 4096, 3);
  flatbuffers::Offset<v2::Origin> origin = 0;
  if (with_origin) {
    v2::OriginBuilder ob(b);
    ob.add_uid(12345);  // what a client claims: replaced
    origin = ob.Finish();
  }
  const v2::PostId id(9, 10);
  v2::PostBuilder pb(b);
  pb.add_id(&id);
  pb.add_base_url(base_url);
  pb.add_rel_path(rel_path);
  pb.add_origin(origin);
  pb.add_content_type(content_type);
  pb.add_blocks(blocks);
  b.Finish(pb.Finish(), v2::PostIdentifier());
  std::vector<std::byte> payload(b.GetSize());
  std::memcpy(payload.data(), b.GetBufferPointer(), b.GetSize());
  return payload;
}

TEST(StampPostInPlace, KeepsTheFieldsOfANewerSchemaAndReplacesTheOrigin) {
  const auto payload = NewerSchemaPost(true);
  ASSERT_TRUE(VerifyPostPayload(payload));
  EXPECT_TRUE(PostHasUnknownFields(payload));
  std::vector<std::byte> out;
  ASSERT_TRUE(StampPostInPlace(payload, StampedOrigin{1000, std::nullopt, 42, "node7"},
                               "sftp://node7/", &out));
  ASSERT_TRUE(VerifyPostPayload(out));
  const PostData p = ReadPost(PostFromPayload(out));
  EXPECT_EQ(p.origin_uid, 1000u);
  EXPECT_EQ(p.origin_gid, std::nullopt);
  EXPECT_EQ(p.origin_pid, 42);
  EXPECT_EQ(p.origin_host, "node7");
  EXPECT_EQ(p.base_url, "sftp://node7/");
  EXPECT_EQ(p.rel_path, "dir/new.bin");
  // What this build does not know is still there for a newer reader.
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(out.data()), out.size());
  ASSERT_TRUE(fbtest::v2::VerifyPostBuffer(verifier));
  const auto* v2post = fbtest::v2::GetPost(out.data());
  ASSERT_NE(v2post->content_type(), nullptr);
  EXPECT_EQ(v2post->content_type()->str(), "application/x-hdf5");
  ASSERT_NE(v2post->blocks(), nullptr);
  EXPECT_EQ(v2post->origin()->uid(), 1000u);
}

TEST(StampPostInPlace, NeedsAnOriginSlotAndTodaysPostsAlwaysHaveOne) {
  std::vector<std::byte> out;
  EXPECT_FALSE(StampPostInPlace(NewerSchemaPost(false), StampedOrigin{1, 1, 1, "h"}, "file:/", &out));
  PostData p;
  p.id = PostId{1, 2};
  p.base_url = "file:/";
  p.rel_path = "a/b";
  const auto today = testing::PostPayload(p);
  EXPECT_FALSE(PostHasUnknownFields(today));
  ASSERT_TRUE(StampPostInPlace(today, StampedOrigin{7, 8, 9, "h"}, "file:/", &out));
  ASSERT_TRUE(VerifyPostPayload(out));
  PostData want = p;
  want.origin_uid = 7;
  want.origin_gid = 8;
  want.origin_pid = 9;
  want.origin_host = "h";
  EXPECT_EQ(ReadPost(PostFromPayload(out)), want);
}

}  // namespace
}  // namespace postspool
