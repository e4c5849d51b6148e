// A small streaming JSON writer for the harness's report: objects, arrays,
// strings, numbers, booleans, pretty-printed with two-space indentation.
// Misuse (a value where a key is due, unbalanced ends) is a bug and asserts.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace postspool::bench {

class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  // A compact array is written on one line (for short rows of numbers).
  JsonWriter& BeginArray(bool compact = false);
  JsonWriter& EndArray();
  // Inside an object: the key of the next value.
  JsonWriter& Key(std::string_view key);

  JsonWriter& Value(std::string_view s);
  JsonWriter& Value(const char* s) { return Value(std::string_view(s)); }
  JsonWriter& Value(const std::string& s) { return Value(std::string_view(s)); }
  // Not finite: null.
  JsonWriter& Value(double d);
  JsonWriter& Value(bool b);
  template <typename T>
    requires(std::is_integral_v<T> && !std::is_same_v<T, bool>)
  JsonWriter& Value(T v) {
    if constexpr (std::is_signed_v<T>) {
      return Integer(static_cast<int64_t>(v));
    } else {
      return Unsigned(static_cast<uint64_t>(v));
    }
  }
  JsonWriter& Null();

  template <typename T>
  JsonWriter& Field(std::string_view key, const T& value) {
    Key(key);
    return Value(value);
  }

  // The document; complete once every object and array is ended.
  const std::string& text() const { return out_; }
  bool complete() const { return stack_.empty() && !out_.empty(); }

 private:
  JsonWriter& Integer(int64_t v);
  JsonWriter& Unsigned(uint64_t v);
  // Writes the separator and indentation before a value or key.
  void BeforeValue();
  void WriteString(std::string_view s);
  void Open(char c, bool object, bool compact);
  void Close(char c, bool object);
  void Newline();

  struct Level {
    bool object = false;
    bool empty = true;
    bool key_pending = false;
    bool compact = false;
  };
  std::vector<Level> stack_;
  std::string out_;
};

}  // namespace postspool::bench
