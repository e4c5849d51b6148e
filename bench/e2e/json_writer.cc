#include "json_writer.h"

#include <cassert>
#include <cmath>
#include <cstdio>

namespace postspool::bench {

void JsonWriter::Newline() {
  out_ += '\n';
  out_.append(2 * stack_.size(), ' ');
}

void JsonWriter::BeforeValue() {
  if (stack_.empty()) {
    assert(out_.empty() && "one top-level value only");
    return;
  }
  Level& level = stack_.back();
  if (level.object) {
    assert(level.key_pending && "a value inside an object needs a key first");
    level.key_pending = false;
    return;  // Key() wrote the separator
  }
  if (!level.empty) out_ += level.compact ? ", " : ",";
  level.empty = false;
  if (!level.compact) Newline();
}

JsonWriter& JsonWriter::Key(std::string_view key) {
  assert(!stack_.empty() && stack_.back().object && !stack_.back().key_pending);
  Level& level = stack_.back();
  if (!level.empty) out_ += level.compact ? ", " : ",";
  level.empty = false;
  if (!level.compact) Newline();
  WriteString(key);
  out_ += ": ";
  level.key_pending = true;
  return *this;
}

void JsonWriter::Open(char c, bool object, bool compact) {
  // Inside a compact array everything is compact.
  compact = compact || (!stack_.empty() && stack_.back().compact);
  BeforeValue();
  out_ += c;
  stack_.push_back(Level{object, true, false, compact});
}

void JsonWriter::Close(char c, bool object) {
  assert(!stack_.empty() && stack_.back().object == object && !stack_.back().key_pending);
  const bool empty = stack_.back().empty;
  const bool compact = stack_.back().compact;
  stack_.pop_back();
  if (!empty && !compact) Newline();
  out_ += c;
  if (stack_.empty()) out_ += '\n';
}

JsonWriter& JsonWriter::BeginObject() {
  Open('{', true, false);
  return *this;
}
JsonWriter& JsonWriter::EndObject() {
  Close('}', true);
  return *this;
}
JsonWriter& JsonWriter::BeginArray(bool compact) {
  Open('[', false, compact);
  return *this;
}
JsonWriter& JsonWriter::EndArray() {
  Close(']', false);
  return *this;
}

JsonWriter& JsonWriter::Value(std::string_view s) {
  BeforeValue();
  WriteString(s);
  return *this;
}

void JsonWriter::WriteString(std::string_view s) {
  out_ += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out_ += "\\\""; break;
      case '\\': out_ += "\\\\"; break;
      case '\n': out_ += "\\n"; break;
      case '\r': out_ += "\\r"; break;
      case '\t': out_ += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out_ += buf;
        } else {
          out_ += static_cast<char>(c);
        }
    }
  }
  out_ += '"';
}

JsonWriter& JsonWriter::Value(double d) {
  if (!std::isfinite(d)) return Null();
  BeforeValue();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", d);
  out_ += buf;
  return *this;
}

JsonWriter& JsonWriter::Value(bool b) {
  BeforeValue();
  out_ += b ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::Integer(int64_t v) {
  BeforeValue();
  out_ += std::to_string(v);
  return *this;
}

JsonWriter& JsonWriter::Unsigned(uint64_t v) {
  BeforeValue();
  out_ += std::to_string(v);
  return *this;
}

JsonWriter& JsonWriter::Null() {
  BeforeValue();
  out_ += "null";
  return *this;
}

}  // namespace postspool::bench
