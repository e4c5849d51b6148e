// The v03 encoding, checked against hand-written Sarracenia messages: every
// expected string here is a literal, not the output of the code under test.
#include "v03_encoder.h"
#include "v03_fields.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "post.h"

namespace postspool::v03 {
namespace {

// The FIPS 180-2 SHA-512 test vector: the digest of "abc".
constexpr char kSha512OfAbcHex[] =
    "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a"
    "2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f";
// Its base64 (python3 -c 'import base64,hashlib;
// print(base64.b64encode(hashlib.sha512(b"abc").digest()).decode())').
constexpr char kSha512OfAbcBase64[] =
    "3a81oZNherrMQXNJriBBMRLm+k6JqX6iCp7u5ktV05ohkpkqJ0/BqDa6PCOj/uu9RU1EI2Q86A4qmslPpUyknw==";

std::string FromHex(std::string_view hex) {
  std::string bytes;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    bytes.push_back(static_cast<char>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return bytes;
}

// 2023-11-14T22:13:20.1234Z
constexpr int64_t kPubTimeNs = 1'700'000'000'123'400'000;

PostData MinimalPost() {
  PostData p;
  p.id = PostId{1, 2};
  p.pub_time_ns = kPubTimeNs;
  p.base_url = "file:/";
  p.rel_path = "data/x.txt";
  return p;
}

// The body of MinimalPost() up to the closing brace.
constexpr char kMinimalBodyOpen[] =
    R"({"pubTime": "20231114T221320.1234", "baseUrl": "file:/", "relPath": "data/x.txt")";

std::string MinimalBodyWith(std::string_view members) {
  return std::string(kMinimalBodyOpen) + std::string(members) + "}";
}

std::span<const std::byte> Payload(const flatbuffers::FlatBufferBuilder& builder) {
  return {reinterpret_cast<const std::byte*>(builder.GetBufferPointer()), builder.GetSize()};
}

EncodeOptions WithPrefix(std::string_view topic_prefix) {
  EncodeOptions options;
  options.topic_prefix = topic_prefix;
  return options;
}

EncodeOptions WithSource(std::string_view source) {
  EncodeOptions options;
  options.source = source;
  return options;
}

Status EncodeData(const PostData& data, const EncodeOptions& options, Encoded* out) {
  flatbuffers::FlatBufferBuilder builder;
  BuildPost(data, &builder);
  const std::span<const std::byte> payload = Payload(builder);
  EXPECT_TRUE(VerifyPostPayload(payload));
  return Encode(PostFromPayload(payload), options, out);
}

Encoded MustEncode(const PostData& data, const EncodeOptions& options = {}) {
  Encoded out;
  const Status s = EncodeData(data, options, &out);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return out;
}

std::string Body(const PostData& data, const EncodeOptions& options = {}) {
  return MustEncode(data, options).body;
}

std::string RoutingKey(std::string_view rel_path, const EncodeOptions& options = {}) {
  PostData p = MinimalPost();
  p.rel_path = std::string(rel_path);
  return MustEncode(p, options).routing_key;
}

std::string Time(int64_t unix_ns) {
  std::string out;
  AppendV03Time(unix_ns, &out);
  return out;
}

PostData FullPost() {
  PostData p = MinimalPost();
  p.base_url = "sftp://host/";
  p.rel_path = "data/obs/x.txt";
  p.retrieve_path = "/cache/x.txt";
  p.link = "t1";
  p.hlink = "data/h";
  p.rename = "data/old.txt";
  p.remove = true;
  p.directory = true;
  p.identity_method = fb::IdentityMethod::Sha512;
  p.identity_value = FromHex(kSha512OfAbcHex);
  p.size = 1234;
  p.mode = 0100644;
  p.mtime_ns = 1'700'000'000'000'000'000;
  p.atime_ns = 1'700'000'000'500'000'000;
  p.extras = {{"flow", "f1"}, {"x-note", "n"}};
  p.origin_uid = 1000;
  p.origin_gid = 100;
  p.origin_pid = 4242;
  p.origin_host = "node1";
  return p;
}

// ---------------------------------------------------------------------------
// Body

TEST(V03Encoder, FullPostWritesEveryFieldInSarraceniaOrder) {
  EncodeOptions options;
  options.source = "alice";
  const Encoded e = MustEncode(FullPost(), options);
  EXPECT_EQ(e.body,
            R"({"pubTime": "20231114T221320.1234", "baseUrl": "sftp://host/", )"
            R"("relPath": "data/obs/x.txt", "retrievePath": "/cache/x.txt", )"
            R"("fileOp": {"link": "t1", "hlink": "data/h", "rename": "data/old.txt", )"
            R"("remove": "", "directory": ""}, )"
            R"("identity": {"method": "sha512", "value": ")"
            "3a81oZNherrMQXNJriBBMRLm+k6JqX6iCp7u5ktV05ohkpkqJ0/BqDa6PCOj/uu9"
            "RU1EI2Q86A4qmslPpUyknw=="
            R"("}, "size": 1234, "mode": "644", "mtime": "20231114T221320", )"
            R"("atime": "20231114T221320.5", "source": "alice", "flow": "f1", "x-note": "n"})");
  EXPECT_EQ(e.routing_key, "v03.data.obs");
}

TEST(V03Encoder, MinimalPostHasOnlyPubTimeBaseUrlRelPath) {
  const Encoded e = MustEncode(MinimalPost());
  EXPECT_EQ(e.body,
            R"({"pubTime": "20231114T221320.1234", "baseUrl": "file:/", "relPath": "data/x.txt"})");
  EXPECT_EQ(e.routing_key, "v03.data");
}

TEST(V03Encoder, BaseUrlDefaultFillsInOnlyAMissingBaseUrl) {
  EncodeOptions options;
  options.base_url_default = "sftp://node1/";
  PostData without = MinimalPost();
  without.base_url.clear();
  EXPECT_EQ(Body(without, options),
            R"({"pubTime": "20231114T221320.1234", "baseUrl": "sftp://node1/", )"
            R"("relPath": "data/x.txt"})");
  EXPECT_EQ(Body(MinimalPost(), options), MinimalBodyWith(""));
}

TEST(V03Encoder, OriginIsNotPartOfTheBody) {
  PostData p = MinimalPost();
  p.origin_uid = 1000;
  p.origin_host = "node1";
  EXPECT_EQ(Body(p), MinimalBodyWith(""));
}

TEST(V03Encoder, LeadingSlashesOfRelPathAreStripped) {
  PostData p = MinimalPost();
  p.rel_path = "///data//x.txt";
  const Encoded e = MustEncode(p);
  EXPECT_EQ(e.body,
            R"({"pubTime": "20231114T221320.1234", "baseUrl": "file:/", )"
            R"("relPath": "data//x.txt"})");
  EXPECT_EQ(e.routing_key, "v03.data");
}

TEST(V03Encoder, RetrievePathIsWrittenAsStored) {
  PostData p = MinimalPost();
  p.retrieve_path = "/spool/a b/x.txt";
  EXPECT_EQ(Body(p), MinimalBodyWith(R"(, "retrievePath": "/spool/a b/x.txt")"));
}

TEST(V03Encoder, SourceOptionIsWrittenWhenNotEmpty) {
  EncodeOptions options;
  options.source = "feeder";
  EXPECT_EQ(Body(MinimalPost(), options), MinimalBodyWith(R"(, "source": "feeder")"));
  options.source = "";
  EXPECT_EQ(Body(MinimalPost(), options), MinimalBodyWith(""));
}

TEST(V03Encoder, ExtrasFollowInTheirStoredOrderAfterSource) {
  PostData p = MinimalPost();
  p.extras = {{"zeta", "1"}, {"alpha", "2"}, {"mid", ""}};
  p.size = 5;
  EncodeOptions options;
  options.source = "s";
  EXPECT_EQ(Body(p, options),
            MinimalBodyWith(R"(, "size": 5, "source": "s", "zeta": "1", "alpha": "2", "mid": "")"));
}

TEST(V03Encoder, ExtraKeysAndValuesAreJsonEscaped) {
  PostData p = MinimalPost();
  p.extras = {{"k\"ey", "v\\al\xc3\xa9"}};
  EXPECT_EQ(Body(p), MinimalBodyWith(R"(, "k\"ey": "v\\al\u00e9")"));
}

TEST(V03Encoder, ExtraWithAStandardFieldNameIsRejected) {
  for (const char* key : {"pubTime", "baseUrl", "relPath", "retrievePath", "fileOp", "identity",
                          "size", "mode", "mtime", "atime", "source", "integrity", "topic",
                          "subtopic", "retPath", "parts", "blocks", "content", "contentType",
                          "from_cluster", "to_clusters", "rename", "report", "post_baseUrl",
                          "new_dir", "_format", "_deleteOnPost"}) {
    PostData p = MinimalPost();
    p.extras = {{"fine", "1"}, {key, "x"}};
    Encoded out;
    const Status s = EncodeData(p, {}, &out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << key;
    EXPECT_NE(s.message().find(key), std::string::npos) << s.message();
  }
}

TEST(V03Encoder, RefusesEveryNameOfTheSharedReservedList) {
  for (const std::string_view key : kReservedFieldNames) {
    PostData p = MinimalPost();
    p.extras = {{std::string(key), "x"}};
    Encoded out;
    EXPECT_EQ(EncodeData(p, {}, &out).code(), StatusCode::kInvalidArgument) << key;
  }
}

// sr3 maps an absolute rename/hlink value onto its tree (baseDir, strip);
// without its '/' the value would be taken relative to the new file.
TEST(V03Encoder, HlinkAndRenameKeepTheirLeadingSlash) {
  PostData p = MinimalPost();
  p.hlink = "/data/other.txt";
  p.rename = "/data/old.txt";
  EXPECT_EQ(Body(p),
            MinimalBodyWith(R"(, "fileOp": {"hlink": "/data/other.txt", "rename": "/data/old.txt"})"));
}

TEST(V03Encoder, ExtraKeysAreCaseSensitiveWhenCheckedAgainstStandardNames) {
  PostData p = MinimalPost();
  p.extras = {{"relpath", "x"}, {"Size", "y"}};
  EXPECT_EQ(Body(p), MinimalBodyWith(R"(, "relpath": "x", "Size": "y")"));
}

// ---------------------------------------------------------------------------
// fileOp

std::string FileOpMembers(const PostData& p) {
  const std::string body = Body(p);
  const std::string open = kMinimalBodyOpen;
  EXPECT_EQ(body.compare(0, open.size(), open), 0) << body;
  return body.substr(open.size());
}

TEST(V03FileOp, LinkCarriesTheTarget) {
  PostData p = MinimalPost();
  p.link = "../other/t.txt";
  EXPECT_EQ(FileOpMembers(p), R"(, "fileOp": {"link": "../other/t.txt"}})");
}

TEST(V03FileOp, HlinkCarriesTheOtherName) {
  PostData p = MinimalPost();
  p.hlink = "data/y.txt";
  EXPECT_EQ(FileOpMembers(p), R"(, "fileOp": {"hlink": "data/y.txt"}})");
}

TEST(V03FileOp, RenameCarriesTheOldName) {
  PostData p = MinimalPost();
  p.rename = "data/x.txt.tmp";
  EXPECT_EQ(FileOpMembers(p), R"(, "fileOp": {"rename": "data/x.txt.tmp"}})");
}

TEST(V03FileOp, RemoveIsAnEmptyString) {
  PostData p = MinimalPost();
  p.remove = true;
  EXPECT_EQ(FileOpMembers(p), R"(, "fileOp": {"remove": ""}})");
}

TEST(V03FileOp, DirectoryAloneIsMkdir) {
  PostData p = MinimalPost();
  p.directory = true;
  EXPECT_EQ(FileOpMembers(p), R"(, "fileOp": {"directory": ""}})");
}

TEST(V03FileOp, RmdirIsRemovePlusDirectory) {
  PostData p = MinimalPost();
  p.remove = true;
  p.directory = true;
  EXPECT_EQ(FileOpMembers(p), R"(, "fileOp": {"remove": "", "directory": ""}})");
}

TEST(V03FileOp, SymlinkReplacingAnOldNameIsLinkPlusRename) {
  PostData p = MinimalPost();
  p.link = "t";
  p.rename = "data/old";
  EXPECT_EQ(FileOpMembers(p), R"(, "fileOp": {"link": "t", "rename": "data/old"}})");
}

TEST(V03FileOp, FileOpTableWithNothingSetIsOmitted) {
  flatbuffers::FlatBufferBuilder b;
  const auto base_url = b.CreateString("file:/");
  const auto rel_path = b.CreateString("data/x.txt");
  const auto file_op = fb::CreateFileOp(b);
  const fb::PostId id(1, 2);
  b.Finish(fb::CreatePost(b, &id, kPubTimeNs, base_url, rel_path, 0, file_op),
           fb::PostIdentifier());
  const std::span<const std::byte> payload = Payload(b);
  ASSERT_TRUE(VerifyPostPayload(payload));
  ASSERT_NE(PostFromPayload(payload).file_op(), nullptr);
  Encoded out;
  ASSERT_TRUE(Encode(PostFromPayload(payload), {}, &out).ok());
  EXPECT_EQ(out.body, MinimalBodyWith(""));
}

// ---------------------------------------------------------------------------
// identity

std::string IdentityMembers(fb::IdentityMethod method, std::string value) {
  PostData p = MinimalPost();
  p.identity_method = method;
  p.identity_value = std::move(value);
  return FileOpMembers(p);
}

TEST(V03Identity, Sha512IsBase64OfTheRawDigest) {
  EXPECT_EQ(IdentityMembers(fb::IdentityMethod::Sha512, FromHex(kSha512OfAbcHex)),
            std::string(R"(, "identity": {"method": "sha512", "value": ")") + kSha512OfAbcBase64 +
                R"("}})");
}

TEST(V03Identity, Md5IsBase64OfTheRawDigest) {
  // md5("abc") = 900150983cd24fb0d6963f7d28e17f72 (RFC 1321 test suite).
  EXPECT_EQ(IdentityMembers(fb::IdentityMethod::Md5, FromHex("900150983cd24fb0d6963f7d28e17f72")),
            R"(, "identity": {"method": "md5", "value": "kAFQmDzST7DWlj99KOF/cg=="}})");
}

TEST(V03Identity, Base64PadsLikeRfc4648) {
  // RFC 4648 section 10 test vectors.
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},        {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"},
  };
  for (const auto& [raw, base64] : vectors) {
    EXPECT_EQ(IdentityMembers(fb::IdentityMethod::Md5, raw),
              std::string(R"(, "identity": {"method": "md5", "value": ")") + base64 + R"("}})");
  }
}

TEST(V03Identity, Base64UsesPlusAndSlash) {
  EXPECT_EQ(IdentityMembers(fb::IdentityMethod::Md5, "\xfb\xff\xbf"),
            R"(, "identity": {"method": "md5", "value": "+/+/"}})");
}

TEST(V03Identity, CodValueIsTheAlgorithmNameAsText) {
  EXPECT_EQ(IdentityMembers(fb::IdentityMethod::Cod, "sha512"),
            R"(, "identity": {"method": "cod", "value": "sha512"}})");
}

TEST(V03Identity, RandomValueIsText) {
  EXPECT_EQ(IdentityMembers(fb::IdentityMethod::Random, "0427"),
            R"(, "identity": {"method": "random", "value": "0427"}})");
}

TEST(V03Identity, ArbitraryValueIsJsonEscapedText) {
  EXPECT_EQ(IdentityMembers(fb::IdentityMethod::Arbitrary, "id \"7\" \xc3\xa9"),
            R"(, "identity": {"method": "arbitrary", "value": "id \"7\" \u00e9"}})");
}

TEST(V03Identity, NoneIsOmitted) {
  EXPECT_EQ(IdentityMembers(fb::IdentityMethod::None, ""), "}");
}

TEST(V03Identity, UnknownMethodFromANewerSchemaIsOmitted) {
  EXPECT_EQ(IdentityMembers(static_cast<fb::IdentityMethod>(200), "xyz"), "}");
}

TEST(V03Identity, MissingValueVectorIsAnEmptyValue) {
  flatbuffers::FlatBufferBuilder b;
  const auto base_url = b.CreateString("file:/");
  const auto rel_path = b.CreateString("data/x.txt");
  const auto identity = fb::CreateIdentity(b, fb::IdentityMethod::Sha512);
  const fb::PostId id(1, 2);
  b.Finish(fb::CreatePost(b, &id, kPubTimeNs, base_url, rel_path, 0, 0, identity),
           fb::PostIdentifier());
  const std::span<const std::byte> payload = Payload(b);
  ASSERT_TRUE(VerifyPostPayload(payload));
  Encoded out;
  ASSERT_TRUE(Encode(PostFromPayload(payload), {}, &out).ok());
  EXPECT_EQ(out.body, MinimalBodyWith(R"(, "identity": {"method": "sha512", "value": ""})"));
}

// ---------------------------------------------------------------------------
// size, mode

TEST(V03Encoder, SizeIsAJsonInteger) {
  PostData p = MinimalPost();
  p.size = 0;
  EXPECT_EQ(Body(p), MinimalBodyWith(R"(, "size": 0)"));
  p.size = 9'007'199'254'740'993;
  EXPECT_EQ(Body(p), MinimalBodyWith(R"(, "size": 9007199254740993)"));
}

TEST(V03Encoder, ModeIsOctalPermissionBitsWithoutLeadingZero) {
  const std::pair<uint32_t, const char*> cases[] = {
      {0644, "644"},      {0100644, "644"}, {04755, "4755"}, {0, "0"},
      {07, "7"},          {07777, "7777"},  {0170000, "0"},  {0xFFFFFFFF, "7777"},
  };
  for (const auto& [mode, text] : cases) {
    PostData p = MinimalPost();
    p.mode = mode;
    EXPECT_EQ(Body(p), MinimalBodyWith(std::string(R"(, "mode": ")") + text + "\"")) << mode;
  }
}

TEST(V03Encoder, MtimeAndAtimeUseTheV03TimeFormat) {
  PostData p = MinimalPost();
  p.mtime_ns = 0;
  p.atime_ns = -1;
  EXPECT_EQ(Body(p), MinimalBodyWith(R"(, "mtime": "19700101T000000", )"
                                     R"("atime": "19691231T235959.999999999")"));
}

// ---------------------------------------------------------------------------
// Time format

TEST(V03Time, ZeroFractionHasNoDot) {
  EXPECT_EQ(Time(0), "19700101T000000");
  EXPECT_EQ(Time(1'700'000'000'000'000'000), "20231114T221320");
}

TEST(V03Time, FractionDropsTrailingZeros) {
  EXPECT_EQ(Time(1'700'000'000'123'400'000), "20231114T221320.1234");
  EXPECT_EQ(Time(1'700'000'000'500'000'000), "20231114T221320.5");
  EXPECT_EQ(Time(1'700'000'000'000'000'001), "20231114T221320.000000001");
  EXPECT_EQ(Time(1'700'000'000'999'999'999), "20231114T221320.999999999");
  EXPECT_EQ(Time(1'700'000'000'010'000'000), "20231114T221320.01");
}

TEST(V03Time, BeforeTheEpochTheFractionCountsForward) {
  EXPECT_EQ(Time(-1), "19691231T235959.999999999");
  EXPECT_EQ(Time(-1'000'000'000), "19691231T235959");
  EXPECT_EQ(Time(-1'500'000'000), "19691231T235958.5");
  EXPECT_EQ(Time(-86'400'000'000'000), "19691231T000000");
  EXPECT_EQ(Time(-2'208'988'800'000'000'000), "19000101T000000");
}

TEST(V03Time, LeapDays) {
  EXPECT_EQ(Time(1'709'210'096'000'000'000), "20240229T123456");
  EXPECT_EQ(Time(951'786'123'000'000'000), "20000229T010203");  // 2000 is a leap year
  EXPECT_EQ(Time(1'735'689'599'000'000'000), "20241231T235959");
}

TEST(V03Time, Year2100IsNotALeapYear) {
  EXPECT_EQ(Time(4'107'542'399'000'000'000), "21000228T235959");
  EXPECT_EQ(Time(4'107'542'400'000'000'000), "21000301T000000");
}

TEST(V03Time, ExtremesOfInt64Nanoseconds) {
  EXPECT_EQ(Time(std::numeric_limits<int64_t>::min()), "16770921T001243.145224192");
  EXPECT_EQ(Time(std::numeric_limits<int64_t>::max()), "22620411T234716.854775807");
}

TEST(V03Time, AppendsWithoutClearing) {
  std::string out = "t=";
  AppendV03Time(0, &out);
  EXPECT_EQ(out, "t=19700101T000000");
}

// ---------------------------------------------------------------------------
// JSON string escaping

std::string RelPathMember(std::string rel_path) {
  PostData p = MinimalPost();
  p.rel_path = std::move(rel_path);
  const std::string body = Body(p);
  const std::string open =
      R"({"pubTime": "20231114T221320.1234", "baseUrl": "file:/", "relPath": )";
  EXPECT_EQ(body.compare(0, open.size(), open), 0) << body;
  EXPECT_EQ(body.back(), '}');
  return body.substr(open.size(), body.size() - open.size() - 1);
}

TEST(V03Json, QuoteAndBackslashAreEscaped) {
  EXPECT_EQ(RelPathMember("a\"b\\c"), R"("a\"b\\c")");
}

TEST(V03Json, SlashIsNotEscaped) { EXPECT_EQ(RelPathMember("a/b/c"), R"("a/b/c")"); }

TEST(V03Json, ControlCharactersUseShortEscapesOrLowerCaseUnicode) {
  EXPECT_EQ(RelPathMember("\n\r\t\b\f\x01\x1b\x1f x"), R"("\n\r\t\b\f\u0001\u001b\u001f x")");
}

TEST(V03Json, DelIsEscapedLikePython) { EXPECT_EQ(RelPathMember("a\x7f"), R"("a\u007f")"); }

TEST(V03Json, PrintableAsciiIsCopied) {
  EXPECT_EQ(RelPathMember(" !#$%&'()*+,-.:;<=>?@[]^_`{|}~"), R"(" !#$%&'()*+,-.:;<=>?@[]^_`{|}~")");
}

TEST(V03Json, NonAsciiIsWrittenAsLowerCaseUnicodeEscapes) {
  EXPECT_EQ(RelPathMember("caf\xc3\xa9"), R"("caf\u00e9")");
  EXPECT_EQ(RelPathMember("\xc2\x80\xdf\xbf"), R"("\u0080\u07ff")");
  EXPECT_EQ(RelPathMember("\xe2\x82\xac\xed\x9f\xbf\xef\xbf\xbf"), R"("\u20ac\ud7ff\uffff")");
}

TEST(V03Json, CharactersAboveBmpAreSurrogatePairs) {
  EXPECT_EQ(RelPathMember("\xf0\x9f\x98\x80"), R"("\ud83d\ude00")");      // U+1F600
  EXPECT_EQ(RelPathMember("\xf0\x90\x80\x80"), R"("\ud800\udc00")");      // U+10000
  EXPECT_EQ(RelPathMember("\xf4\x8f\xbf\xbf"), R"("\udbff\udfff")");      // U+10FFFF
}

TEST(V03Json, InvalidUtf8BytesBecomeSurrogateEscapes) {
  EXPECT_EQ(RelPathMember("x\xff"), R"("x\udcff")");
  EXPECT_EQ(RelPathMember("\x80\xbf"), R"("\udc80\udcbf")");  // stray continuation bytes
  EXPECT_EQ(RelPathMember("\xfe\xf5\xf8"), R"("\udcfe\udcf5\udcf8")");
}

TEST(V03Json, OverlongEncodingsAreInvalidByteByByte) {
  EXPECT_EQ(RelPathMember("\xc0\x80"), R"("\udcc0\udc80")");
  EXPECT_EQ(RelPathMember("\xc1\xbf"), R"("\udcc1\udcbf")");
  EXPECT_EQ(RelPathMember("\xe0\x80\xaf"), R"("\udce0\udc80\udcaf")");
  EXPECT_EQ(RelPathMember("\xf0\x80\x80\xaf"), R"("\udcf0\udc80\udc80\udcaf")");
}

TEST(V03Json, EncodedSurrogatesAreInvalid) {
  EXPECT_EQ(RelPathMember("\xed\xa0\x80"), R"("\udced\udca0\udc80")");
  EXPECT_EQ(RelPathMember("\xed\xbf\xbf"), R"("\udced\udcbf\udcbf")");
}

TEST(V03Json, CodePointsAbove10FFFFAreInvalid) {
  EXPECT_EQ(RelPathMember("\xf4\x90\x80\x80"), R"("\udcf4\udc90\udc80\udc80")");
}

TEST(V03Json, TruncatedSequencesAreInvalidAndDecodingResumes) {
  EXPECT_EQ(RelPathMember("\xe2\x82" "A"), R"("\udce2\udc82A")");
  EXPECT_EQ(RelPathMember("a\xe2\x82"), R"("a\udce2\udc82")");           // cut by the end
  EXPECT_EQ(RelPathMember("\xf0\x9f\x98"), R"("\udcf0\udc9f\udc98")");
  EXPECT_EQ(RelPathMember("\xc3\xc3\xa9"), R"("\udcc3\u00e9")");         // restarts at a lead byte
}

// ---------------------------------------------------------------------------
// Routing key

TEST(V03RoutingKey, NestedDirectoriesBecomeWordsAndTheFileNameIsDropped) {
  EXPECT_EQ(RoutingKey("a/b/c/file.txt"), "v03.a.b.c");
}

TEST(V03RoutingKey, FileAtTopLevelGivesThePrefixOnly) {
  EXPECT_EQ(RoutingKey("file.txt"), "v03");
  EXPECT_EQ(RoutingKey("/file.txt"), "v03");
}

TEST(V03RoutingKey, LeadingAndDoubledSlashesMakeNoEmptyWords) {
  EXPECT_EQ(RoutingKey("//a//b/file"), "v03.a.b");
}

TEST(V03RoutingKey, TrailingSlashDropsOnlyTheEmptyName) {
  EXPECT_EQ(RoutingKey("a/b/"), "v03.a.b");
}

TEST(V03RoutingKey, RoutingKeyDropsFileNameAndEscapesHashAndStarButNotSpace) {
  // As sr3 (Python) publishes it, so that a subscriber's subtopic binding
  // written with the directory's real name ("e f") matches.
  EXPECT_EQ(RoutingKey("a#b/c*d/e f/x #*.txt"), "v03.a%23b.c%22d.e f");
  EXPECT_EQ(RoutingKey(" lead/trail / x"), "v03. lead.trail ");
}

TEST(V03RoutingKey, InvalidUtf8BytesArePercentEscapedUpperCase) {
  EXPECT_EQ(RoutingKey("d\xff\xfe/x\xff"), "v03.d%FF%FE");
  EXPECT_EQ(RoutingKey("\xc0\x80/\xe2\x82/x"), "v03.%C0%80.%E2%82");
}

TEST(V03RoutingKey, ValidUtf8IsKeptAsIs) {
  EXPECT_EQ(RoutingKey("caf\xc3\xa9/\xf0\x9f\x98\x80/x"), "v03.caf\xc3\xa9.\xf0\x9f\x98\x80");
}

TEST(V03RoutingKey, DotsInDirectoryNamesMakeExtraWords) {
  EXPECT_EQ(RoutingKey("a.b/c/x.y.z"), "v03.a.b.c");
}

TEST(V03RoutingKey, CustomTopicPrefixIsNotEscaped) {
  EXPECT_EQ(RoutingKey("a/b/x", WithPrefix("v03.post")), "v03.post.a.b");
  EXPECT_EQ(RoutingKey("x", WithPrefix("v03.post")), "v03.post");
  EXPECT_EQ(RoutingKey("a/x", WithPrefix("my #*")), "my #*.a");
}

TEST(V03RoutingKey, EmptyPrefixStartsWithTheFirstDirectory) {
  EXPECT_EQ(RoutingKey("a/b/x", WithPrefix("")), "a.b");
}

TEST(V03RoutingKey, DeepPathIsCutAtAWordBoundaryExactlyAt255) {
  // "v03" and 42 words ".dNNNN" are exactly 255 bytes; the 43rd is dropped.
  std::string path;
  std::string unlimited = "v03";
  for (int i = 0; i < 100; ++i) {
    std::string word = std::to_string(10000 + i);  // "d0000" .. "d0099"
    word[0] = 'd';
    path += word;
    path += '/';
    unlimited += '.';
    unlimited += word;
  }
  path += "file";
  const std::string key = RoutingKey(path);
  EXPECT_EQ(key.size(), 255u);
  EXPECT_EQ(key, unlimited.substr(0, 255));
  EXPECT_EQ(unlimited[255], '.');
}

TEST(V03RoutingKey, DeepPathDropsThePartialLastWord) {
  // "v03" and 50 words ".abcd" are 253 bytes; ".a" of the 51st would fit but
  // the word does not.
  std::string path;
  std::string expected = "v03";
  for (int i = 0; i < 80; ++i) path += "abcd/";
  for (int i = 0; i < 50; ++i) expected += ".abcd";
  path += "file";
  const std::string key = RoutingKey(path);
  EXPECT_EQ(key, expected);
  EXPECT_LE(key.size(), kRoutingKeyBytesMax);
}

TEST(V03RoutingKey, DeepPathWithEscapesStaysAPrefixOfTheUnlimitedKey) {
  std::string path;
  std::string unlimited = "v03";
  for (int i = 0; i < 60; ++i) {
    path += "x y#z/";
    unlimited += ".x y%23z";
  }
  path += "file";
  const std::string key = RoutingKey(path);
  EXPECT_LE(key.size(), kRoutingKeyBytesMax);
  EXPECT_EQ(unlimited.compare(0, key.size(), key), 0);
  EXPECT_EQ(unlimited[key.size()], '.');  // ends at a word boundary
  EXPECT_EQ(key.size(), 3 + 31 * 8u);     // 31 whole words of 8 bytes
}

TEST(V03RoutingKey, DotInsideADirectoryNameIsAWordBoundaryForTheCut) {
  // One directory "aaa...a.bbb...b": the cut keeps "v03.aaa...a".
  const std::string a(200, 'a');
  const std::string b(100, 'b');
  EXPECT_EQ(RoutingKey(a + "." + b + "/file"), "v03." + a);
}

TEST(V03RoutingKey, HugeSingleDirectoryIsCutAtACharacterBoundary) {
  std::string e_acute;
  for (int i = 0; i < 200; ++i) e_acute += "\xc3\xa9";
  // "v03." + 125 two-byte characters = 254 bytes; the 126th would make 256.
  std::string expected = "v03.";
  for (int i = 0; i < 125; ++i) expected += "\xc3\xa9";
  EXPECT_EQ(RoutingKey(e_acute + "/file"), expected);

  std::string emoji;
  for (int i = 0; i < 100; ++i) emoji += "\xf0\x9f\x98\x80";
  // "v03." + 62 four-byte characters = 252 bytes.
  std::string expected_emoji = "v03.";
  for (int i = 0; i < 62; ++i) expected_emoji += "\xf0\x9f\x98\x80";
  EXPECT_EQ(RoutingKey(emoji + "/file"), expected_emoji);
}

TEST(V03RoutingKey, HugeSingleDirectoryNeverSplitsAnEscape) {
  // "v03." + 83 "%23" = 253 bytes; the 84th would make 256.
  std::string expected = "v03.";
  for (int i = 0; i < 83; ++i) expected += "%23";
  EXPECT_EQ(RoutingKey(std::string(100, '#') + "/file"), expected);

  std::string invalid_expected = "v03.";
  for (int i = 0; i < 83; ++i) invalid_expected += "%FF";
  EXPECT_EQ(RoutingKey(std::string(100, '\xff') + "/file"), invalid_expected);
}

TEST(V03RoutingKey, PrefixFillingTheLimitLeavesNoDirectories) {
  const std::string prefix(255, 'p');
  EXPECT_EQ(RoutingKey("a/b/x", WithPrefix(prefix)), prefix);
}

TEST(V03RoutingKey, PrefixAboveTheLimitIsCutAtACharacterBoundary) {
  const std::string ascii_prefix(300, 'p');
  EXPECT_EQ(RoutingKey("a/x", WithPrefix(ascii_prefix)), std::string(255, 'p'));
  std::string prefix;
  for (int i = 0; i < 200; ++i) prefix += "\xc3\xa9";
  EXPECT_EQ(RoutingKey("a/x", WithPrefix(prefix)), prefix.substr(0, 254));
}

// ---------------------------------------------------------------------------
// Output buffers

TEST(V03Encoder, OutputBuffersAreOverwrittenAndTheirCapacityReused) {
  PostData long_post = FullPost();
  long_post.rel_path = std::string(100, 'd') + "/" + std::string(100, 'e') + "/" +
                       std::string(500, 'f');
  Encoded out;
  ASSERT_TRUE(EncodeData(long_post, WithSource("alice"), &out).ok());
  const char* body_data = out.body.data();
  const char* key_data = out.routing_key.data();

  ASSERT_TRUE(EncodeData(MinimalPost(), {}, &out).ok());
  const Encoded fresh = MustEncode(MinimalPost());
  EXPECT_EQ(out.body, fresh.body);
  EXPECT_EQ(out.routing_key, fresh.routing_key);
  EXPECT_EQ(out.body.data(), body_data);  // no reallocation
  EXPECT_EQ(out.routing_key.data(), key_data);
}

TEST(V03Encoder, RejectedPostLeavesTheOutputUntouched) {
  Encoded out = MustEncode(MinimalPost());
  const Encoded before = out;
  PostData p = FullPost();
  p.extras = {{"size", "1"}};
  EXPECT_FALSE(EncodeData(p, {}, &out).ok());
  EXPECT_EQ(out.body, before.body);
  EXPECT_EQ(out.routing_key, before.routing_key);
}

// ---------------------------------------------------------------------------
// Python's view of the body

bool HavePython() { return std::system("command -v python3 >/dev/null 2>&1") == 0; }

// Runs `script` with python3 on a file holding `lines`, one per line; the
// script's standard output.
std::string RunPython(const std::vector<std::string>& lines, const char* script) {
  std::string path = ::testing::TempDir() + "v03_bodies_XXXXXX";
  const int fd = ::mkstemp(path.data());
  EXPECT_GE(fd, 0);
  if (fd < 0) return {};
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  EXPECT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  const std::string command =
      std::string("PYTHONUTF8=1 python3 -c '") + script + "' " + path + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  EXPECT_NE(pipe, nullptr);
  std::string output;
  if (pipe != nullptr) {
    char buffer[4096];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0) output.append(buffer, n);
    EXPECT_EQ(::pclose(pipe), 0) << output;
  }
  ::unlink(path.c_str());
  return output;
}

std::string Hex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (const char c : bytes) {
    hex += kHex[static_cast<unsigned char>(c) >> 4];
    hex += kHex[static_cast<unsigned char>(c) & 0xF];
  }
  return hex;
}

TEST(V03Python, BodiesAreWhatPythonJsonDumpsWritesAndGiveBackTheOriginalBytes) {
  if (!HavePython()) GTEST_SKIP() << "python3 not found";
  std::vector<std::string> rel_paths = {
      "data/obs/x.txt",
      "a\"b\\c/\n\r\t\b\f\x01\x1f\x7f/ ~",
      "caf\xc3\xa9/\xf0\x9f\x98\x80/\xe2\x82\xac\xef\xbf\xbf\xf4\x8f\xbf\xbf",
      "bad/x\xff\xc0\x80\xed\xa0\x80\xe2\x82" "A\xf4\x90\x80\x80\xf0\x9f\x98",
      "\x80\xbf\xfe\xc3\xc3\xa9",
  };
  std::vector<std::string> bodies;
  std::string expected;
  for (const std::string& rel_path : rel_paths) {
    PostData p = FullPost();
    p.rel_path = rel_path;
    p.extras = {{"k\xff\xc3\xa9", "v\x7f\xed\xa0\x80"}};
    bodies.push_back(Body(p, WithSource("alice")));
    expected += Hex(rel_path) + "\n";
  }
  // Each body parses, re-serialises byte for byte with json.dumps' defaults
  // (so it is exactly what Python sr3 would send), and its relPath turns
  // back into the original bytes with os.fsencode.
  const std::string output = RunPython(bodies,
                                       "import json, os, sys\n"
                                       "for line in open(sys.argv[1], encoding=\"ascii\"):\n"
                                       "    body = line.rstrip(\"\\n\")\n"
                                       "    msg = json.loads(body)\n"
                                       "    if json.dumps(msg) != body:\n"
                                       "        print(\"differs: \" + json.dumps(msg))\n"
                                       "    print(os.fsencode(msg[\"relPath\"]).hex())\n");
  EXPECT_EQ(output, expected);
}

// Random file names, biased towards UTF-8 fragments: well-formed characters
// of every length, truncated ones, stray continuation and invalid lead bytes.
std::string RandomRelPath(std::mt19937_64& rng) {
  auto pick = [&](uint32_t lo, uint32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng);
  };
  std::string path;
  const uint32_t pieces = pick(1, 40);
  for (uint32_t i = 0; i < pieces; ++i) {
    switch (pick(0, 6)) {
      case 0:
        path += '/';
        break;
      case 1:
        path += static_cast<char>(pick(0, 0x7F));
        break;
      case 2:
        path += static_cast<char>(pick(0x80, 0xFF));
        break;
      default: {  // a code point, whole or cut short
        uint32_t cp = 0;
        switch (pick(0, 3)) {
          case 0: cp = pick(0x80, 0x7FF); break;
          case 1: cp = pick(0x800, 0xFFFF); break;
          case 2: cp = pick(0x10000, 0x10FFFF); break;
          default: cp = pick(0xD800, 0xDFFF); break;  // encoded surrogate: invalid
        }
        std::string c;
        if (cp < 0x800) {
          c = {static_cast<char>(0xC0 | cp >> 6), static_cast<char>(0x80 | (cp & 0x3F))};
        } else if (cp < 0x10000) {
          c = {static_cast<char>(0xE0 | cp >> 12), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
               static_cast<char>(0x80 | (cp & 0x3F))};
        } else {
          c = {static_cast<char>(0xF0 | cp >> 18), static_cast<char>(0x80 | ((cp >> 12) & 0x3F)),
               static_cast<char>(0x80 | ((cp >> 6) & 0x3F)), static_cast<char>(0x80 | (cp & 0x3F))};
        }
        if (pick(0, 3) == 0) c.resize(pick(1, static_cast<uint32_t>(c.size())));
        path += c;
        break;
      }
    }
  }
  return path;
}

TEST(V03Python, RandomFileNamesEncodeAsPythonFsdecodeAndJsonDumpsDo) {
  if (!HavePython()) GTEST_SKIP() << "python3 not found";
  const char* seed_env = std::getenv("POSTSPOOL_TEST_SEED");
  const uint64_t seed = seed_env != nullptr ? std::strtoull(seed_env, nullptr, 10)
                                            : std::random_device{}();
  SCOPED_TRACE("POSTSPOOL_TEST_SEED=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::vector<std::string> lines;
  for (int i = 0; i < 500; ++i) {
    PostData p = MinimalPost();
    p.rel_path = RandomRelPath(rng);
    const Encoded e = MustEncode(p);
    EXPECT_LE(e.routing_key.size(), kRoutingKeyBytesMax);
    lines.push_back(Hex(p.rel_path) + " " + e.body);
  }
  // Python sr3 builds relPath with os.fsdecode and strips leading '/'; the
  // body must be what json.dumps makes of that.
  const std::string output = RunPython(
      lines,
      "import json, os, sys\n"
      "for line in open(sys.argv[1], encoding=\"ascii\"):\n"
      "    raw, body = line.rstrip(\"\\n\").split(\" \", 1)\n"
      "    msg = json.loads(body)\n"
      "    want = os.fsdecode(bytes.fromhex(raw)).lstrip(\"/\")\n"
      "    if msg[\"relPath\"] != want or json.dumps(msg) != body:\n"
      "        print(\"mismatch: \" + raw + \" \" + body)\n");
  EXPECT_EQ(output, "");
}

}  // namespace
}  // namespace postspool::v03
