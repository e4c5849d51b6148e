// The command-line tool's parts on their own: the JSON reader, base64,
// SHA-512, v03 times, post fields from JSON.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "base64.h"
#include "post_fields.h"
#include "sha512.h"
#include "test_util.h"
#include "v03_encoder.h"

namespace postspool::cli {
namespace {

nlohmann::json Parse(std::string_view text) {
  nlohmann::json v;
  std::string error;
  EXPECT_TRUE(ParseJsonLine(text, &v, &error)) << text << ": " << error;
  return v;
}

std::string ParseError(std::string_view text) {
  nlohmann::json v;
  std::string error;
  EXPECT_FALSE(ParseJsonLine(text, &v, &error)) << text;
  return error;
}

// The post fields of one JSON line, or the error.
std::string FieldsError(std::string_view text) {
  PostFields f;
  JsonNotes notes;
  std::string error;
  EXPECT_FALSE(PostFieldsFromJsonLine(text, &f, &notes, &error)) << text;
  return error;
}

TEST(JsonLineTest, ReadsTheShapeOfAPost) {
  const nlohmann::json v = Parse(
      R"( { "a": "x", "n": -42, "big": 9223372036854775807, "small": -9223372036854775808,)"
      R"( "t": true, "f": false, "z": null, "o": {"k": {}} } )");
  ASSERT_TRUE(v.is_object());
  EXPECT_EQ(v.size(), 8u);
  EXPECT_EQ(v["a"], "x");
  EXPECT_EQ(v["n"].get<int64_t>(), -42);
  EXPECT_EQ(v["big"].get<int64_t>(), INT64_MAX);
  EXPECT_EQ(v["small"].get<int64_t>(), INT64_MIN);
  EXPECT_TRUE(v["o"]["k"].is_object());
}

TEST(JsonLineTest, DecodesEveryEscapeAndKeepsValidUtf8) {
  const nlohmann::json v = Parse(R"("\"\\\/\b\f\n\r\t\u0041\u00e9\u20ac\ud83d\ude00")");
  EXPECT_EQ(v.get<std::string>(), "\"\\/\b\f\n\r\tA\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
  EXPECT_EQ(Parse("\"caf\xc3\xa9 \xf0\x9f\x98\x80\"").get<std::string>(),
            "caf\xc3\xa9 \xf0\x9f\x98\x80");
  for (const char* bad : {"\"\xc3\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"",
                          "\"\xff\""}) {
    EXPECT_NE(ParseError(bad).find("UTF-8"), std::string::npos) << bad;
  }
}

TEST(JsonLineTest, RefusesRepeatedKeysDeepNestingNulAndBadSyntaxSayingWhere) {
  EXPECT_EQ(ParseError(R"({"a": 1, "a": 2})"), "the key \"a\" is given twice");
  EXPECT_EQ(ParseError(R"({"o": {"a": 1, "a": 2}})"), "the key \"a\" is given twice");
  EXPECT_NE(ParseError(R"({"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{"a":{}}}}}}}}}})")
                .find("nested deeper than 8"),
            std::string::npos);
  EXPECT_NE(ParseError(R"({"a": "x\u0000y"})").find("column 9: a string holds a NUL"),
            std::string::npos);
  const std::string syntax = ParseError(R"({"relPath": "bad" "size": 1})");
  EXPECT_EQ(syntax.rfind("column 24: syntax error", 0), 0u) << syntax;
  EXPECT_NE(ParseError("{\"a\": 1} x").find("column"), std::string::npos);
  EXPECT_NE(ParseError("").find("column"), std::string::npos);
  // A lone high surrogate, and a low one outside the escaped-byte range.
  EXPECT_NE(ParseError(R"("\ud83d")").find("surrogate"), std::string::npos);
  EXPECT_NE(ParseError(R"("\udc41")").find("surrogate"), std::string::npos);
}

TEST(JsonLineTest, LoneSurrogateEscapesAreTheRawBytesOfANameThatIsNotUtf8) {
  PostFields f;
  JsonNotes notes;
  std::string error;
  // What the v03 encoder writes for the bytes 0xff and 0xe9 of a name; a
  // pair (\ud83d\udc80) stays a character, and an escaped backslash before
  // "udcff" is text.
  ASSERT_TRUE(PostFieldsFromJsonLine(
      R"({"relPath": "d/\udcff\udce9.txt", "k\udc80": "\ud83d\udc80 \\udcff"})", &f, &notes,
      &error))
      << error;
  EXPECT_EQ(f.rel_path, "d/\xff\xe9.txt");
  ASSERT_EQ(f.extras.size(), 1u);
  EXPECT_EQ(f.extras[0].first, "k\x80");
  EXPECT_EQ(f.extras[0].second, "\xf0\x9f\x92\x80 \\udcff");
}

TEST(Base64Test, RoundTripsTheRfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},         {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"},
  };
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(Base64Encode(plain), encoded);
    std::string decoded;
    ASSERT_TRUE(Base64Decode(encoded, &decoded)) << encoded;
    EXPECT_EQ(decoded, plain);
  }
  const std::string all = [] {
    std::string s;
    for (int i = 0; i < 256; ++i) s += static_cast<char>(i);
    return s;
  }();
  std::string back;
  ASSERT_TRUE(Base64Decode(Base64Encode(all), &back));
  EXPECT_EQ(back, all);
}

TEST(Base64Test, RefusesAnythingButTheCanonicalForm) {
  std::string out;
  for (const char* bad : {"Zg", "Zg=", "Z===", "Zh==", "Zm9=", "Zm9v\n", "Zm 9v", "Zg==Zg==",
                          "Zm-v", "Zm_v", "=Zg="}) {
    EXPECT_FALSE(Base64Decode(bad, &out)) << bad;
  }
}

std::string Hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (const unsigned char c : bytes) {
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
  return s;
}

TEST(Sha512Test, MatchesTheFipsExamples) {
  EXPECT_EQ(Hex(Sha512Of("")),
            "cf83e1357eefb8bdf1542850d66d8007d620e4050b5715dc83f4a921d36ce9ce"
            "47d0d13c5d85f2b0ff8318d2877eec2f63b931bd47417a81a538327af927da3e");
  EXPECT_EQ(Hex(Sha512Of("abc")),
            "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a"
            "2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f");
  EXPECT_EQ(Hex(Sha512Of("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                         "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu")),
            "8e959b75dae313da8cf4f72814fc143f8f7779c6eb9f7fa17299aeadb6889018"
            "501d289e4900f7e4331b99dec4b5433ac7d329eeb6dd26545e96e55b874be909");
}

TEST(Sha512Test, PiecewiseUpdatesMatchOneUpdate) {
  // A million 'a's, fed in uneven pieces across block boundaries.
  Sha512 h;
  const std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    const size_t n = std::min(left, chunk.size());
    h.Update(chunk.data(), n);
    left -= n;
  }
  const Sha512::Digest d = h.Finish();
  EXPECT_EQ(Hex(std::string(reinterpret_cast<const char*>(d.data()), d.size())),
            "e718483d0ce769644e2e42c7bc15b4638e1f98b13b2044285632a803afa973eb"
            "de0ff244877ea60a4cb0432ce577c31beb009c5c2c49aa2e4eadb217ad8cc09b");
}

TEST(V03TimeTest, ParsesSarraceniaAndIsoForms) {
  int64_t ns = 0;
  ASSERT_TRUE(ParseV03Time("19700101T000000", &ns));
  EXPECT_EQ(ns, 0);
  ASSERT_TRUE(ParseV03Time("20240102T030405.5", &ns));
  EXPECT_EQ(ns, 1704164645500000000);
  ASSERT_TRUE(ParseV03Time("2024-01-02T03:04:05.5Z", &ns));
  EXPECT_EQ(ns, 1704164645500000000);
  ASSERT_TRUE(ParseV03Time("20240229T235959.1234567891234", &ns));  // cut to ns
  EXPECT_EQ(ns, 1709251199123456789);
  ASSERT_TRUE(ParseV03Time("19691231T235959.9", &ns));
  EXPECT_EQ(ns, -100000000);
  for (const char* bad : {"", "2024", "20240102T0304", "20240102 030405", "20231301T000000",
                          "20230229T000000", "20240102T240000", "20240102T030405.",
                          "20240102T030405Z", "2024-01-02T03:04:05.5ZZ", "20240102T030405.5x"}) {
    EXPECT_FALSE(ParseV03Time(bad, &ns)) << bad;
  }
}

TEST(V03TimeTest, ReadsBackWhatTheV03EncoderWrites) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (POSTSPOOL_TEST_SEED)");
  std::mt19937_64 rng(seed);
  // From 1900 to 2200.
  std::uniform_int_distribution<int64_t> dist(-2208988800LL * 1000000000, 7258118400LL * 1000000000);
  for (int i = 0; i < 10000; ++i) {
    const int64_t t = dist(rng);
    std::string text;
    v03::AppendV03Time(t, &text);
    int64_t back = 0;
    ASSERT_TRUE(ParseV03Time(text, &back)) << text;
    ASSERT_EQ(back, t) << text;
  }
}

TEST(PostFieldsTest, ParsesModesAndIdentities) {
  uint32_t mode = 0;
  EXPECT_TRUE(ParseOctalMode("644", &mode));
  EXPECT_EQ(mode, 0644u);
  EXPECT_TRUE(ParseOctalMode("07777", &mode));
  EXPECT_EQ(mode, 07777u);
  for (const char* bad : {"", "8", "17777", "-1", "0x1ff", "644 "}) {
    EXPECT_FALSE(ParseOctalMode(bad, &mode)) << bad;
  }
  int method = 0;
  std::string value, error;
  EXPECT_TRUE(ParseIdentity("md5:1B2M2Y8AsgTpgAmY7PhCfg==", &method, &value, &error));
  EXPECT_EQ(method, POSTSPOOL_IDENTITY_MD5);
  EXPECT_EQ(value.size(), 16u);
  EXPECT_TRUE(ParseIdentity("arbitrary:any:thing", &method, &value, &error));
  EXPECT_EQ(method, POSTSPOOL_IDENTITY_ARBITRARY);
  EXPECT_EQ(value, "any:thing");
  EXPECT_FALSE(ParseIdentity("sha512", &method, &value, &error));
  EXPECT_FALSE(ParseIdentity("crc32:1", &method, &value, &error));
}

TEST(PostFieldsTest, JsonMembersMapToPostFields) {
  PostFields f;
  JsonNotes notes;
  std::string error;
  ASSERT_TRUE(PostFieldsFromJson(
      Parse(R"({"relPath":"a","retrievePath":null,"identity":{"method":"random","value":"1234"},)"
            R"("fileOp":{"hlink":"b","remove":false},"x":"y","mtime":null})"),
      &f, &notes, &error))
      << error;
  EXPECT_FALSE(notes.pub_time_replaced);
  EXPECT_FALSE(notes.source_replaced);
  EXPECT_EQ(f.rel_path, "a");
  EXPECT_FALSE(f.retrieve_path.has_value());
  EXPECT_EQ(f.identity_method, POSTSPOOL_IDENTITY_RANDOM);
  EXPECT_EQ(f.identity_value, "1234");
  EXPECT_EQ(f.hlink, "b");
  EXPECT_EQ(f.op_flags, 0u);
  EXPECT_FALSE(f.mtime_ns.has_value());
  ASSERT_EQ(f.extras.size(), 1u);

  struct postspool_post post;
  std::vector<postspool_extra> extras;
  f.ToPost(&post, &extras);
  EXPECT_STREQ(post.rel_path, "a");
  EXPECT_STREQ(post.hlink, "b");
  EXPECT_EQ(post.identity_size, 4u);
  EXPECT_EQ(post.extras_count, 1u);
  EXPECT_STREQ(post.extras[0].key, "x");
}

TEST(PostFieldsTest, JsonOfTheWrongShapeIsRefusedWithTheKeyNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {R"("a")", "expected a JSON object (one post per line), found a string"},
      {R"([{"relPath":"a"}])", "expected a JSON object (one post per line), found an array"},
      {R"({"size":1})", "relPath is missing"},
      {R"({"relPath":1})", "relPath: expected a string, found an integer"},
      {R"({"relPath":"a","size":"1"})", "size: expected an integer, found a string"},
      {R"({"relPath":"a","size":1.5})", "size: expected an integer, found a number with a"},
      {R"({"relPath":"a","size":18446744073709551615})", "size: expected an integer"},
      {R"({"relPath":"a","mode":420})", "mode: expected an octal string"},
      {R"({"relPath":"a","mtime":"yesterday"})", "mtime: expected a v03 time string"},
      {R"({"relPath":"a","pubTime":"yesterday"})", "pubTime: expected a v03 time string"},
      {R"({"relPath":"a","source":7})", "source: expected a string, found an integer"},
      {R"({"relPath":"a","fileOp":{"copy":""}})", "fileOp: unknown key \"copy\""},
      {R"({"relPath":"a","fileOp":{"remove":1}})", "fileOp.remove: expected \"\" or a boolean"},
      {R"({"relPath":"a","identity":{"method":"crc"}})", "identity.method: expected one of"},
      {R"({"relPath":"a","identity":{"method":"md5","value":"!"}})",
       "identity: the md5 value is the 16-byte digest in base64"},
      {R"({"relPath":"a","identity":{"method":"md5","value":"AAAA"}})",
       "\"AAAA\" decodes to 3 bytes"},
      {R"({"relPath":"a","extra":true})",
       "\"extra\" is not a v03 field postspool reads, so it would be an extra field, and an "
       "extra field's value is a string; found a boolean"},
      {R"({"relPath":"a","meta":{"k":"v"}})", "found an object (put structured data in a string)"},
  };
  for (const auto& [text, message] : cases) {
    const std::string error = FieldsError(text);
    EXPECT_NE(error.find(message), std::string::npos) << text << " -> " << error;
  }
}

TEST(PostFieldsTest, PubTimeAndSourceAreCheckedThenReplacedAndSaidSo) {
  PostFields f;
  JsonNotes notes;
  std::string error;
  ASSERT_TRUE(PostFieldsFromJsonLine(
      R"({"pubTime": "20240102T030405.5", "relPath": "a", "source": "alice"})", &f, &notes,
      &error))
      << error;
  EXPECT_TRUE(notes.pub_time_replaced);
  EXPECT_TRUE(notes.source_replaced);
  EXPECT_TRUE(f.extras.empty());  // neither became an extra field
}

TEST(PostFieldsTest, RelPathUnderBaseIsNormalisedAndStaysUnderTheBase) {
  std::string rel;
  ASSERT_TRUE(RelPathUnderBase("../../x/f.txt", "/home", "/home/u/work", &rel));
  EXPECT_EQ(rel, "x/f.txt");
  ASSERT_TRUE(RelPathUnderBase("./a//b/./c", "/w/", "/w", &rel));
  EXPECT_EQ(rel, "a/b/c");
  ASSERT_TRUE(RelPathUnderBase("/data//obs/../x.h5", "/data/.", "/ignored", &rel));
  EXPECT_EQ(rel, "x.h5");
  ASSERT_TRUE(RelPathUnderBase("sub/f", "..", "/b/c", &rel));
  EXPECT_EQ(rel, "c/sub/f");
  EXPECT_FALSE(RelPathUnderBase("../../x/f.txt", "/home/u", "/home/u/work", &rel));
  EXPECT_FALSE(RelPathUnderBase("/home/u", "/home/u", "/", &rel));      // the base itself
  EXPECT_FALSE(RelPathUnderBase("/home/user2/f", "/home/u", "/", &rel));  // not a prefix word
}

TEST(PostFieldsTest, RelPathOfFileIsTheLexicallyNormalisedAbsolutePath) {
  EXPECT_EQ(RelPathOfFile("../../x/f.txt", "/home/u/work"), "home/x/f.txt");
  EXPECT_EQ(RelPathOfFile("f.txt", "/home/u"), "home/u/f.txt");
  EXPECT_EQ(RelPathOfFile("./a//b/./c", "/w"), "w/a/b/c");
  EXPECT_EQ(RelPathOfFile("/data//obs/../x.h5", "/ignored"), "data/x.h5");
  EXPECT_EQ(RelPathOfFile("../../../../etc/passwd", "/a"), "etc/passwd");  // stays at /
  EXPECT_EQ(RelPathOfFile("dir/", "/w"), "w/dir");
  EXPECT_EQ(RelPathOfFile("/", "/w"), "");
  EXPECT_EQ(RelPathOfFile("..", "/"), "");
}

TEST(PostFieldsTest, FormatsIdsAsUuids) {
  const uint8_t id[16] = {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0x4d, 0xef,
                          0x80, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0xff};
  EXPECT_EQ(FormatUuid(id), "12345678-9abc-4def-8001-0203040506ff");
}

}  // namespace
}  // namespace postspool::cli
