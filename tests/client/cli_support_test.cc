// The command-line tool's parts on their own: the JSON reader, base64,
// SHA-512, v03 times, post fields from JSON.
#include <gtest/gtest.h>

#include <random>

#include "base64.h"
#include "json_reader.h"
#include "post_fields.h"
#include "sha512.h"
#include "test_util.h"
#include "v03_encoder.h"

namespace postspool::cli {
namespace {

JsonValue Parse(std::string_view text) {
  JsonValue v;
  JsonError e;
  EXPECT_TRUE(ParseJson(text, &v, &e)) << text << ": column " << e.column << ": " << e.message;
  return v;
}

JsonError ParseError(std::string_view text) {
  JsonValue v;
  JsonError e;
  EXPECT_FALSE(ParseJson(text, &v, &e)) << text;
  return e;
}

TEST(JsonReaderTest, ReadsTheShapeOfAPost) {
  const JsonValue v = Parse(
      R"( { "a": "x", "n": -42, "big": 9223372036854775807, "small": -9223372036854775808,)"
      R"( "t": true, "f": false, "z": null, "o": {"k": {}} } )");
  ASSERT_EQ(v.kind, JsonValue::Kind::kObject);
  ASSERT_EQ(v.members.size(), 8u);
  EXPECT_EQ(v.members[0].key, "a");  // input order
  EXPECT_EQ(v.Find("a")->string, "x");
  EXPECT_EQ(v.Find("n")->integer, -42);
  EXPECT_EQ(v.Find("big")->integer, INT64_MAX);
  EXPECT_EQ(v.Find("small")->integer, INT64_MIN);
  EXPECT_TRUE(v.Find("t")->boolean);
  EXPECT_EQ(v.Find("f")->kind, JsonValue::Kind::kBool);
  EXPECT_FALSE(v.Find("f")->boolean);
  EXPECT_EQ(v.Find("z")->kind, JsonValue::Kind::kNull);
  EXPECT_EQ(v.Find("o")->Find("k")->kind, JsonValue::Kind::kObject);
  EXPECT_EQ(v.Find("missing"), nullptr);
}

TEST(JsonReaderTest, DecodesEveryEscape) {
  const JsonValue v = Parse(R"("\"\\\/\b\f\n\r\t\u0041\u00e9\u20ac\ud83d\ude00\u0000")");
  EXPECT_EQ(v.string, std::string("\"\\/\b\f\n\r\tA\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\0", 19));
}

TEST(JsonReaderTest, KeepsValidUtf8AndRefusesInvalid) {
  EXPECT_EQ(Parse("\"caf\xc3\xa9 \xf0\x9f\x98\x80\"").string, "caf\xc3\xa9 \xf0\x9f\x98\x80");
  for (const char* bad : {"\"\xc3\"", "\"\xc0\xaf\"", "\"\xed\xa0\x80\"", "\"\xf4\x90\x80\x80\"",
                          "\"\xff\""}) {
    EXPECT_EQ(ParseError(bad).message, "invalid UTF-8 in a string") << bad;
  }
}

TEST(JsonReaderTest, ErrorsSayWhereAndWhatWasExpected) {
  struct Case {
    const char* text;
    size_t column;
    const char* message;
  };
  const Case cases[] = {
      {"", 1, "expected a value, found the end of the line"},
      {"{\"a\" 1}", 6, "expected ':' after an object key, found '1'"},
      {"{\"a\": 1,}", 9, "expected a string key, found '}'"},
      {"{\"a\": 1", 8, "expected ',' or '}', found the end of the line"},
      {"{a: 1}", 2, "expected a string key, found 'a'"},
      {"{\"a\": 1} x", 10, "expected the end of the line after the value"},
      {"{\"a\": 1, \"a\": 2}", 10, "duplicate key \"a\""},
      {"[1]", 1, "arrays are not supported in a post"},
      {"1.5", 2, "only integers are supported (no fraction or exponent)"},
      {"1e3", 2, "only integers are supported (no fraction or exponent)"},
      {"01", 1, "a number must not have leading zeros"},
      {"-", 2, "expected a digit, found the end of the line"},
      {"9223372036854775808", 1, "the number does not fit in 64 bits"},
      {"-9223372036854775809", 1, "the number does not fit in 64 bits"},
      {"tru", 1, "expected 'true', found 't'"},
      {"\"abc", 5, "unterminated string"},
      {"\"a\tb\"", 3, "a control character in a string must be escaped"},
      {"\"\\x\"", 2, "unknown escape '\\x' in a string"},
      {"\"\\u12g4\"", 6, "expected four hex digits after \\u, found 'g'"},
      {"\"\\ude00\"", 2, "a low surrogate \\u escape without a high surrogate before it"},
      {"\"\\ud83d\"", 2, "a high surrogate \\u escape must be followed by a low one"},
      {"\"\\ud83d\\u0041\"", 2, "a high surrogate \\u escape must be followed by a low one"},
      {"{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{\"a\":{}}}}}}}}}", 41,
       "objects nested too deeply"},
  };
  for (const Case& c : cases) {
    const JsonError e = ParseError(c.text);
    EXPECT_EQ(e.message, c.message) << c.text;
    EXPECT_EQ(e.column, c.column) << c.text;
  }
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
  std::string error;
  ASSERT_TRUE(PostFieldsFromJson(
      Parse(R"({"relPath":"a","retrievePath":null,"identity":{"method":"random","value":"1234"},)"
            R"("fileOp":{"hlink":"b","remove":false},"x":"y","mtime":null})"),
      &f, &error))
      << error;
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
      {R"("a")", "expected a JSON object, found a string"},
      {R"({"size":1})", "relPath is missing"},
      {R"({"relPath":1})", "relPath: expected a string, found an integer"},
      {R"({"relPath":"a\u0000b"})", "relPath: contains a NUL character"},
      {R"({"relPath":"a","size":"1"})", "size: expected an integer, found a string"},
      {R"({"relPath":"a","mode":420})", "mode: expected an octal string"},
      {R"({"relPath":"a","mtime":"yesterday"})", "mtime: expected a v03 time string"},
      {R"({"relPath":"a","fileOp":{"copy":""}})", "fileOp: unknown key \"copy\""},
      {R"({"relPath":"a","fileOp":{"remove":1}})", "fileOp.remove: expected \"\" or a boolean"},
      {R"({"relPath":"a","identity":{"method":"crc"}})", "identity.method: expected one of"},
      {R"({"relPath":"a","identity":{"method":"md5","value":"!"}})",
       "identity.value: expected base64"},
      {R"({"relPath":"a","extra":true})", "extra: an extra field must be a string"},
  };
  for (const auto& [text, message] : cases) {
    PostFields f;
    std::string error;
    EXPECT_FALSE(PostFieldsFromJson(Parse(text), &f, &error)) << text;
    EXPECT_NE(error.find(message), std::string::npos) << text << " -> " << error;
  }
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
