#include "json_reader.h"

#include <limits>
#include <set>

namespace postspool::cli {
namespace {

class Parser {
 public:
  Parser(std::string_view text, JsonError* error) : text_(text), error_(error) {}

  bool ParseDocument(JsonValue* value) {
    SkipWhitespace();
    if (!ParseValue(value, 0)) return false;
    SkipWhitespace();
    if (pos_ != text_.size()) return Fail("expected the end of the line after the value");
    return true;
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return text_[pos_]; }

  // "found 'x'" / "found the end of the line" / "found byte 0x..".
  std::string Found() const {
    if (AtEnd()) return "found the end of the line";
    const auto c = static_cast<unsigned char>(Peek());
    if (c >= 0x20 && c < 0x7f) return std::string("found '") + static_cast<char>(c) + "'";
    static constexpr char kHex[] = "0123456789abcdef";
    return std::string("found byte 0x") + kHex[c >> 4] + kHex[c & 15];
  }

  bool Fail(std::string message) {
    error_->column = pos_ + 1;
    error_->message = std::move(message);
    return false;
  }
  bool Expected(std::string_view what) { return Fail("expected " + std::string(what) + ", " + Found()); }

  void SkipWhitespace() {
    while (!AtEnd() && (Peek() == ' ' || Peek() == '\t' || Peek() == '\n' || Peek() == '\r')) {
      ++pos_;
    }
  }

  bool ParseValue(JsonValue* value, int depth) {
    if (AtEnd()) return Expected("a value");
    switch (Peek()) {
      case '{':
        return ParseObject(value, depth);
      case '"':
        value->kind = JsonValue::Kind::kString;
        return ParseString(&value->string);
      case 't':
        value->kind = JsonValue::Kind::kBool;
        value->boolean = true;
        return ParseLiteral("true");
      case 'f':
        value->kind = JsonValue::Kind::kBool;
        value->boolean = false;
        return ParseLiteral("false");
      case 'n':
        value->kind = JsonValue::Kind::kNull;
        return ParseLiteral("null");
      case '[':
        return Fail("arrays are not supported in a post");
      default:
        if (Peek() == '-' || (Peek() >= '0' && Peek() <= '9')) return ParseInteger(value);
        return Expected("a value (object, string, integer, true, false or null)");
    }
  }

  bool ParseLiteral(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) {
      // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict
      // overlap for "'" + std::string(...) (GCC bug 105329).
      std::string quoted = "'";
      quoted.append(word);
      quoted += '\'';
      return Expected(quoted);
    }
    pos_ += word.size();
    return true;
  }

  bool ParseInteger(JsonValue* value) {
    const size_t start = pos_;
    const bool negative = Peek() == '-';
    if (negative) ++pos_;
    if (AtEnd() || Peek() < '0' || Peek() > '9') return Expected("a digit");
    if (Peek() == '0' && pos_ + 1 < text_.size() && text_[pos_ + 1] >= '0' &&
        text_[pos_ + 1] <= '9') {
      return Fail("a number must not have leading zeros");
    }
    // Accumulated as a negative number, whose range includes INT64_MIN.
    int64_t v = 0;
    constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      const int digit = Peek() - '0';
      if (v < (kMin + digit) / 10) {
        pos_ = start;
        return Fail("the number does not fit in 64 bits");
      }
      v = v * 10 - digit;
      ++pos_;
    }
    if (!AtEnd() && (Peek() == '.' || Peek() == 'e' || Peek() == 'E')) {
      return Fail("only integers are supported (no fraction or exponent)");
    }
    if (!negative) {
      if (v == kMin) {
        pos_ = start;
        return Fail("the number does not fit in 64 bits");
      }
      v = -v;
    }
    value->kind = JsonValue::Kind::kInteger;
    value->integer = v;
    return true;
  }

  bool ParseHex4(uint32_t* out) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      if (AtEnd()) return Expected("four hex digits after \\u");
      const char c = Peek();
      uint32_t d;
      if (c >= '0' && c <= '9') d = static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') d = static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') d = static_cast<uint32_t>(c - 'A' + 10);
      else return Expected("four hex digits after \\u");
      v = v << 4 | d;
      ++pos_;
    }
    *out = v;
    return true;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      *out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      *out += static_cast<char>(0xC0 | (cp >> 6));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += static_cast<char>(0xE0 | (cp >> 12));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      *out += static_cast<char>(0xF0 | (cp >> 18));
      *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      *out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  // The length of the well-formed UTF-8 sequence at pos_ (RFC 3629: no
  // overlong forms, no surrogates, nothing above U+10FFFF), or 0.
  size_t Utf8SequenceLength() const {
    const auto* p = reinterpret_cast<const unsigned char*>(text_.data() + pos_);
    const size_t n = text_.size() - pos_;
    const auto cont = [&](size_t i, unsigned char lo, unsigned char hi) {
      return i < n && p[i] >= lo && p[i] <= hi;
    };
    const unsigned char lead = p[0];
    if (lead >= 0xC2 && lead <= 0xDF) return cont(1, 0x80, 0xBF) ? 2 : 0;
    if (lead >= 0xE0 && lead <= 0xEF) {
      const unsigned char lo = lead == 0xE0 ? 0xA0 : 0x80;
      const unsigned char hi = lead == 0xED ? 0x9F : 0xBF;
      return cont(1, lo, hi) && cont(2, 0x80, 0xBF) ? 3 : 0;
    }
    if (lead >= 0xF0 && lead <= 0xF4) {
      const unsigned char lo = lead == 0xF0 ? 0x90 : 0x80;
      const unsigned char hi = lead == 0xF4 ? 0x8F : 0xBF;
      return cont(1, lo, hi) && cont(2, 0x80, 0xBF) && cont(3, 0x80, 0xBF) ? 4 : 0;
    }
    return 0;
  }

  bool ParseString(std::string* out) {
    if (AtEnd() || Peek() != '"') return Expected("'\"'");
    ++pos_;
    out->clear();
    for (;;) {
      if (AtEnd()) return Fail("unterminated string");
      const auto c = static_cast<unsigned char>(Peek());
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return Fail("a control character in a string must be escaped");
      if (c >= 0x80) {
        const size_t n = Utf8SequenceLength();
        if (n == 0) return Fail("invalid UTF-8 in a string");
        out->append(text_.substr(pos_, n));
        pos_ += n;
        continue;
      }
      if (c != '\\') {
        *out += static_cast<char>(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (AtEnd()) return Fail("unterminated escape in a string");
      const char e = Peek();
      ++pos_;
      switch (e) {
        case '"': *out += '"'; break;
        case '\\': *out += '\\'; break;
        case '/': *out += '/'; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'n': *out += '\n'; break;
        case 'r': *out += '\r'; break;
        case 't': *out += '\t'; break;
        case 'u': {
          const size_t escape_start = pos_ - 2;
          uint32_t cp = 0;
          if (!ParseHex4(&cp)) return false;
          if (cp >= 0xDC00 && cp <= 0xDFFF) {
            pos_ = escape_start;
            return Fail("a low surrogate \\u escape without a high surrogate before it");
          }
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.substr(pos_, 2) != "\\u") {
              pos_ = escape_start;
              return Fail("a high surrogate \\u escape must be followed by a low one");
            }
            pos_ += 2;
            uint32_t low = 0;
            if (!ParseHex4(&low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) {
              pos_ = escape_start;
              return Fail("a high surrogate \\u escape must be followed by a low one");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          pos_ -= 2;  // at the backslash
          return Fail(std::string("unknown escape '\\") + e + "' in a string");
      }
    }
  }

  bool ParseObject(JsonValue* value, int depth) {
    if (depth >= kJsonDepthMax) return Fail("objects nested too deeply");
    ++pos_;  // '{'
    value->kind = JsonValue::Kind::kObject;
    value->members.clear();
    SkipWhitespace();
    if (!AtEnd() && Peek() == '}') {
      ++pos_;
      return true;
    }
    std::set<std::string> keys;
    for (;;) {
      SkipWhitespace();
      if (AtEnd() || Peek() != '"') return Expected("a string key");
      const size_t key_pos = pos_;
      JsonMember member;
      if (!ParseString(&member.key)) return false;
      if (!keys.insert(member.key).second) {
        pos_ = key_pos;
        return Fail("duplicate key \"" + member.key + "\"");
      }
      SkipWhitespace();
      if (AtEnd() || Peek() != ':') return Expected("':' after an object key");
      ++pos_;
      SkipWhitespace();
      if (!ParseValue(&member.value, depth + 1)) return false;
      value->members.push_back(std::move(member));
      SkipWhitespace();
      if (AtEnd()) return Expected("',' or '}'");
      if (Peek() == ',') {
        ++pos_;
        continue;
      }
      if (Peek() == '}') {
        ++pos_;
        return true;
      }
      return Expected("',' or '}'");
    }
  }

  std::string_view text_;
  JsonError* error_;
  size_t pos_ = 0;
};

}  // namespace

const JsonValue* JsonValue::Find(std::string_view key) const {
  for (const JsonMember& m : members) {
    if (m.key == key) return &m.value;
  }
  return nullptr;
}

const char* JsonKindName(JsonValue::Kind kind) {
  switch (kind) {
    case JsonValue::Kind::kNull: return "null";
    case JsonValue::Kind::kBool: return "a boolean";
    case JsonValue::Kind::kInteger: return "an integer";
    case JsonValue::Kind::kString: return "a string";
    case JsonValue::Kind::kObject: return "an object";
  }
  return "a value";
}

bool ParseJson(std::string_view text, JsonValue* value, JsonError* error) {
  *value = JsonValue();
  return Parser(text, error).ParseDocument(value);
}

}  // namespace postspool::cli
