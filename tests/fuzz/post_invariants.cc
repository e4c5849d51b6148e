#include "post_invariants.h"

#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "post.h"
#include "status.h"
#include "v03_encoder.h"
#include "v03_fields.h"

namespace postspool::fuzz {
namespace {

constexpr int kJsonDepthMax = 32;

// A strict recursive-descent JSON checker: enough to tell whether the
// encoder escaped everything it had to, nothing more.
class JsonChecker {
 public:
  explicit JsonChecker(std::string_view text) : text_(text) {}

  bool Document() {
    SkipSpace();
    if (Peek() != '{' || !Value(0)) return false;
    SkipSpace();
    return pos_ == text_.size();
  }

 private:
  int Peek() const { return pos_ < text_.size() ? static_cast<unsigned char>(text_[pos_]) : -1; }
  bool Eat(char c) {
    if (Peek() != static_cast<unsigned char>(c)) return false;
    ++pos_;
    return true;
  }
  void SkipSpace() {
    while (Peek() == ' ' || Peek() == '\t' || Peek() == '\n' || Peek() == '\r') ++pos_;
  }
  static bool IsDigit(int c) { return c >= '0' && c <= '9'; }
  static bool IsHex(int c) {
    return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  }

  bool Literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  bool String() {
    if (!Eat('"')) return false;
    for (;;) {
      const int c = Peek();
      if (c < 0x20) return false;  // end of text, or an unescaped control character
      ++pos_;
      if (c == '"') return true;
      if (c != '\\') continue;
      const int e = Peek();
      ++pos_;
      switch (e) {
        case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
          break;
        case 'u':
          for (int i = 0; i < 4; ++i) {
            if (!IsHex(Peek())) return false;
            ++pos_;
          }
          break;
        default:
          return false;
      }
    }
  }

  bool Number() {
    Eat('-');
    if (Eat('0')) {
      // no leading zeros
    } else if (IsDigit(Peek())) {
      while (IsDigit(Peek())) ++pos_;
    } else {
      return false;
    }
    if (Eat('.')) {
      if (!IsDigit(Peek())) return false;
      while (IsDigit(Peek())) ++pos_;
    }
    if (Eat('e') || Eat('E')) {
      if (!Eat('+')) Eat('-');
      if (!IsDigit(Peek())) return false;
      while (IsDigit(Peek())) ++pos_;
    }
    return true;
  }

  bool Value(int depth) {
    if (depth > kJsonDepthMax) return false;
    SkipSpace();
    switch (Peek()) {
      case '{': {
        ++pos_;
        SkipSpace();
        if (Eat('}')) return true;
        for (;;) {
          SkipSpace();
          if (!String()) return false;
          SkipSpace();
          if (!Eat(':') || !Value(depth + 1)) return false;
          SkipSpace();
          if (Eat('}')) return true;
          if (!Eat(',')) return false;
        }
      }
      case '[': {
        ++pos_;
        SkipSpace();
        if (Eat(']')) return true;
        for (;;) {
          if (!Value(depth + 1)) return false;
          SkipSpace();
          if (Eat(']')) return true;
          if (!Eat(',')) return false;
        }
      }
      case '"': return String();
      case 't': return Literal("true");
      case 'f': return Literal("false");
      case 'n': return Literal("null");
      default: return Number();
    }
  }

  std::string_view text_;
  size_t pos_ = 0;
};

// An independent statement of the relPath form ValidatePost promises: after
// at most one leading '/', '/'-separated components that are neither empty
// nor "." nor "..".
bool IsNormalisedRelPath(std::string_view path) {
  if (path.starts_with('/')) path.remove_prefix(1);
  if (path.empty()) return false;
  for (;;) {
    const size_t slash = path.find('/');
    const std::string_view component = path.substr(0, slash);
    if (component.empty() || component == "." || component == "..") return false;
    if (slash == std::string_view::npos) return true;
    path.remove_prefix(slash + 1);
  }
}

void CheckEncoded(const v03::Encoded& out, std::string_view topic_prefix) {
  FUZZ_CHECK(out.routing_key.size() <= v03::kRoutingKeyBytesMax);
  FUZZ_CHECK(out.routing_key.starts_with(topic_prefix));
  for (char c : out.body) FUZZ_CHECK(static_cast<unsigned char>(c) < 0x80);
  FUZZ_CHECK(IsJsonObject(out.body));
}

}  // namespace

bool IsJsonObject(std::string_view text) { return JsonChecker(text).Document(); }

void CheckVerifiedPost(std::span<const std::byte> payload) {
  const fb::Post& post = PostFromPayload(payload);
  // Every accessor that ReadPost uses must be safe on a verified buffer
  // (AddressSanitizer watches the reads).
  const PostData data = ReadPost(post);
  FUZZ_CHECK(data.base_url.size() < payload.size());
  FUZZ_CHECK(data.rel_path.size() < payload.size());

  const v03::EncodeOptions options;
  v03::Encoded fresh;
  const Status s = v03::Encode(post, options, &fresh);
  FUZZ_CHECK(s.ok() || s.code() == StatusCode::kInvalidArgument);

  // What a post may say is decided once: a post that ValidatePost accepts
  // (as the daemon journals it) is never refused by the encoder, and keeps
  // the promises the validator makes to consumers.
  if (ValidatePost(data).ok()) {
    FUZZ_CHECK(s.ok());
    FUZZ_CHECK(IsNormalisedRelPath(data.rel_path));
    if (data.hlink) FUZZ_CHECK(IsNormalisedRelPath(*data.hlink));
    if (data.rename) FUZZ_CHECK(IsNormalisedRelPath(*data.rename));
    if (data.size) FUZZ_CHECK(*data.size >= 0);
    for (size_t i = 0; i < data.extras.size(); ++i) {
      FUZZ_CHECK(!v03::IsReservedFieldName(data.extras[i].first));
      for (size_t j = 0; j < i; ++j) FUZZ_CHECK(data.extras[j].first != data.extras[i].first);
    }
  }

  // The encoder reuses its output strings: the previous input's leftovers
  // (up to the capacity) must not leak into this one.
  static v03::Encoded reused;
  const Status again = v03::Encode(post, options, &reused);
  FUZZ_CHECK(again.code() == s.code());
  if (!s.ok()) return;
  CheckEncoded(fresh, options.topic_prefix);
  FUZZ_CHECK(reused.routing_key == fresh.routing_key);
  FUZZ_CHECK(reused.body == fresh.body);

  // A non-default prefix and a source field go through the same checks.
  v03::EncodeOptions custom;
  custom.topic_prefix = "v03.post";
  custom.source = "feeder";
  const Status with_source = v03::Encode(post, custom, &reused);
  FUZZ_CHECK(with_source.ok() || with_source.code() == StatusCode::kInvalidArgument);
  if (with_source.ok()) CheckEncoded(reused, custom.topic_prefix);
}

}  // namespace postspool::fuzz
