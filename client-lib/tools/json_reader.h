// A small, strict JSON reader for one post per line (`postspool post
// --json`): objects, strings (all escapes, \uXXXX with surrogate pairs, valid
// UTF-8 only), integers, true, false and null. No arrays and no fractions or
// exponents, which no post field needs; they are errors, as are duplicate
// keys, trailing garbage and nesting deeper than kJsonDepthMax.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace postspool::cli {

inline constexpr int kJsonDepthMax = 8;

struct JsonMember;

struct JsonValue {
  enum class Kind { kNull, kBool, kInteger, kString, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  int64_t integer = 0;
  std::string string;               // UTF-8; may contain NUL (from \u0000)
  std::vector<JsonMember> members;  // in input order; keys are unique

  // The member named `key`, or nullptr.
  const JsonValue* Find(std::string_view key) const;
};

struct JsonMember {
  std::string key;
  JsonValue value;
};

const char* JsonKindName(JsonValue::Kind kind);

struct JsonError {
  size_t column = 0;  // 1-based byte offset in the text
  std::string message;  // e.g. "expected ':' after an object key, found '}'"
};

// Parses `text`, which must hold exactly one JSON value (surrounded by
// optional whitespace). On failure returns false and fills *error.
bool ParseJson(std::string_view text, JsonValue* value, JsonError* error);

}  // namespace postspool::cli
