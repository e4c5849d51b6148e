#include "v03_encoder.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include <nettle/base64.h>

#include "v03_fields.h"

namespace postspool::v03 {
namespace {

constexpr char kHexLower[] = "0123456789abcdef";
constexpr char kHexUpper[] = "0123456789ABCDEF";

std::string_view View(const flatbuffers::String* s) {
  if (s == nullptr) return {};
  return std::string_view(s->c_str(), s->size());
}

// ---------------------------------------------------------------------------
// UTF-8

// The length of the well-formed UTF-8 character at the start of `p` (`n`
// bytes available), 0 if it is not one: a stray continuation byte, an
// overlong form (C0, C1, E0 80..9F, F0 80..8F), a UTF-16 surrogate (ED A0..BF),
// a code point above U+10FFFF (F4 90.., F5..FF) or a sequence cut short.
// `*code_point` is set when the length is not 0.
size_t DecodeUtf8(const unsigned char* p, size_t n, uint32_t* code_point) {
  const unsigned char lead = p[0];
  const auto continuation = [&](size_t i, unsigned char lo, unsigned char hi) {
    return i < n && p[i] >= lo && p[i] <= hi;
  };
  if (lead < 0x80) {
    *code_point = lead;
    return 1;
  }
  if (lead < 0xC2) return 0;
  if (lead < 0xE0) {
    if (!continuation(1, 0x80, 0xBF)) return 0;
    *code_point = (uint32_t{lead} & 0x1F) << 6 | (p[1] & 0x3F);
    return 2;
  }
  if (lead < 0xF0) {
    const unsigned char lo = lead == 0xE0 ? 0xA0 : 0x80;
    const unsigned char hi = lead == 0xED ? 0x9F : 0xBF;
    if (!continuation(1, lo, hi) || !continuation(2, 0x80, 0xBF)) return 0;
    *code_point = (uint32_t{lead} & 0x0F) << 12 | (uint32_t{p[1]} & 0x3F) << 6 | (p[2] & 0x3F);
    return 3;
  }
  if (lead < 0xF5) {
    const unsigned char lo = lead == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = lead == 0xF4 ? 0x8F : 0xBF;
    if (!continuation(1, lo, hi) || !continuation(2, 0x80, 0xBF) ||
        !continuation(3, 0x80, 0xBF)) {
      return 0;
    }
    *code_point = (uint32_t{lead} & 0x07) << 18 | (uint32_t{p[1]} & 0x3F) << 12 |
                  (uint32_t{p[2]} & 0x3F) << 6 | (p[3] & 0x3F);
    return 4;
  }
  return 0;
}

// The largest cut <= `max_bytes` of `s` that does not split a UTF-8
// character (for well-formed text; at most three bytes are given back).
size_t Utf8CutAtOrBefore(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s.size();
  size_t cut = max_bytes;
  for (int i = 0; i < 3 && cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80; ++i) {
    --cut;
  }
  return cut;
}

// ---------------------------------------------------------------------------
// JSON, as Python's json.dumps writes it with ensure_ascii=True.

// For each ASCII byte: 0 if it is written as is, 'u' if it is written as
// \u00XX, otherwise the letter that follows the backslash.
constexpr std::array<char, 128> MakeJsonEscapes() {
  std::array<char, 128> t{};
  for (int c = 0; c < 0x20; ++c) t[c] = 'u';
  t['\b'] = 'b';
  t['\f'] = 'f';
  t['\n'] = 'n';
  t['\r'] = 'r';
  t['\t'] = 't';
  t['"'] = '"';
  t['\\'] = '\\';
  t[0x7F] = 'u';  // Python escapes DEL too: only ' '..'~' pass unescaped
  return t;
}
constexpr std::array<char, 128> kJsonEscapes = MakeJsonEscapes();

void AppendUtf16Escape(uint32_t unit, std::string* out) {
  const char escape[6] = {'\\', 'u', kHexLower[(unit >> 12) & 0xF], kHexLower[(unit >> 8) & 0xF],
                          kHexLower[(unit >> 4) & 0xF], kHexLower[unit & 0xF]};
  out->append(escape, sizeof escape);
}

// Appends `s` as a quoted, pure-ASCII JSON string. A byte that is not part
// of well-formed UTF-8 becomes \udcXX (Python's surrogateescape), so that
// os.fsencode on the decoded string gives back the original bytes.
void AppendJsonString(std::string_view s, std::string* out) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  out->push_back('"');
  size_t run_begin = 0;  // bytes [run_begin, i) are copied as they are
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80 && kJsonEscapes[c] == 0) {
      ++i;
      continue;
    }
    out->append(s.data() + run_begin, i - run_begin);
    if (c < 0x80) {
      const char escape = kJsonEscapes[c];
      if (escape == 'u') {
        AppendUtf16Escape(c, out);
      } else {
        const char two[2] = {'\\', escape};
        out->append(two, 2);
      }
      ++i;
    } else {
      uint32_t code_point = 0;
      const size_t length = DecodeUtf8(p + i, n - i, &code_point);
      if (length == 0) {
        AppendUtf16Escape(0xDC00 | c, out);
        ++i;
      } else {
        if (code_point >= 0x10000) {
          const uint32_t v = code_point - 0x10000;
          AppendUtf16Escape(0xD800 | (v >> 10), out);
          AppendUtf16Escape(0xDC00 | (v & 0x3FF), out);
        } else {
          AppendUtf16Escape(code_point, out);
        }
        i += length;
      }
    }
    run_begin = i;
  }
  out->append(s.data() + run_begin, n - run_begin);
  out->push_back('"');
}

// Starts the next member of the JSON object whose '{' is at out[open_at]:
// the ", " separator unless it is the first, then the key and ": ".
void AppendMemberKey(std::string_view key, size_t open_at, std::string* out) {
  if (out->size() > open_at + 1) out->append(", ");
  AppendJsonString(key, out);
  out->append(": ");
}

void AppendStringMember(std::string_view key, std::string_view value, size_t open_at,
                        std::string* out) {
  AppendMemberKey(key, open_at, out);
  AppendJsonString(value, out);
}

void AppendTimeMember(std::string_view key, int64_t unix_ns, size_t open_at, std::string* out) {
  AppendMemberKey(key, open_at, out);
  out->push_back('"');
  AppendV03Time(unix_ns, out);
  out->push_back('"');
}

// RFC 4648 base64, standard alphabet, '=' padding (nettle's).
void AppendBase64(const uint8_t* data, size_t n, std::string* out) {
  const size_t at = out->size();
  out->resize(at + BASE64_ENCODE_RAW_LENGTH(n));
  base64_encode_raw(out->data() + at, n, data);
}

// Sarracenia strips the leading '/' of relPath. (The fileOp values keep
// theirs: see AppendFileOp.)
std::string_view WithoutLeadingSlashes(std::string_view path) {
  path.remove_prefix(std::min(path.find_first_not_of('/'), path.size()));
  return path;
}

// The fileOp values go out exactly as posted. An sr3 subscriber maps only
// two forms of rename and hlink onto its own tree: an absolute path (its
// baseDir, or the path of baseUrl, replaced by its directory; or `strip N`
// counting the leading '/') and a bare name without '/'; anything else it
// takes relative to the new file's directory. So the posters (the tool's
// --file, the shim) post the absolute path of the old name, as `sr3 watch`
// does, and a '/' stripped here would turn that into a path sr3 cannot
// place (FORMAT.md, "fileOp values"). A link value is a symbolic link's
// target and must stay as the link holds it.
void AppendFileOp(const fb::FileOp* op, std::string* out) {
  if (op == nullptr) return;
  if (op->link() == nullptr && op->hlink() == nullptr && op->rename() == nullptr &&
      !op->remove() && !op->directory()) {
    return;
  }
  AppendMemberKey("fileOp", 0, out);
  const size_t open_at = out->size();
  out->push_back('{');
  if (op->link() != nullptr) AppendStringMember("link", View(op->link()), open_at, out);
  if (op->hlink() != nullptr) AppendStringMember("hlink", View(op->hlink()), open_at, out);
  if (op->rename() != nullptr) AppendStringMember("rename", View(op->rename()), open_at, out);
  if (op->remove()) AppendStringMember("remove", "", open_at, out);
  if (op->directory()) AppendStringMember("directory", "", open_at, out);
  out->push_back('}');
}

void AppendIdentity(const fb::Identity* identity, std::string* out) {
  if (identity == nullptr) return;
  std::string_view method;
  bool binary = false;  // a raw digest, sent as base64
  switch (identity->method()) {
    case fb::IdentityMethod::Sha512:
      method = "sha512";
      binary = true;
      break;
    case fb::IdentityMethod::Md5:
      method = "md5";
      binary = true;
      break;
    case fb::IdentityMethod::Cod:
      method = "cod";
      break;
    case fb::IdentityMethod::Random:
      method = "random";
      break;
    case fb::IdentityMethod::Arbitrary:
      method = "arbitrary";
      break;
    default:  // None, or a method from a newer schema: no identity
      return;
  }
  const flatbuffers::Vector<uint8_t>* value = identity->value();
  const uint8_t* data = value != nullptr ? value->data() : nullptr;
  const size_t size = value != nullptr ? value->size() : 0;
  AppendMemberKey("identity", 0, out);
  const size_t open_at = out->size();
  out->push_back('{');
  AppendStringMember("method", method, open_at, out);
  AppendMemberKey("value", open_at, out);
  if (binary) {
    out->push_back('"');
    AppendBase64(data, size, out);
    out->push_back('"');
  } else {
    AppendJsonString(std::string_view(reinterpret_cast<const char*>(data), size), out);
  }
  out->push_back('}');
}

// ---------------------------------------------------------------------------
// Routing key

// Appends `unit` (a character or an escape, never split) if the key stays
// within kRoutingKeyBytesMax.
bool AppendKeyUnit(const char* unit, size_t n, std::string* key) {
  if (key->size() + n > kRoutingKeyBytesMax) return false;
  key->append(unit, n);
  return true;
}

enum class KeyFit { kComplete, kFullAtWordEnd, kFullMidWord };

// Appends one directory name as routing key words: '#' and '*' as
// Sarracenia's Python poster escapes them (a space is kept, as it keeps it:
// FORMAT.md, "Routing key"), bytes that are not well-formed UTF-8 as %XX,
// dots kept (they split the name into several words, as in Sarracenia).
KeyFit AppendKeyComponent(std::string_view component, std::string* key) {
  const auto* p = reinterpret_cast<const unsigned char*>(component.data());
  const size_t n = component.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    size_t consumed = 1;
    bool fits;
    if (c == '#') {
      fits = AppendKeyUnit("%23", 3, key);
    } else if (c == '*') {
      fits = AppendKeyUnit("%22", 3, key);  // sic: Sarracenia's choice
    } else if (c < 0x80) {
      fits = AppendKeyUnit(component.data() + i, 1, key);
    } else {
      uint32_t code_point = 0;
      const size_t length = DecodeUtf8(p + i, n - i, &code_point);
      if (length == 0) {
        const char escape[3] = {'%', kHexUpper[c >> 4], kHexUpper[c & 0xF]};
        fits = AppendKeyUnit(escape, 3, key);
      } else {
        fits = AppendKeyUnit(component.data() + i, length, key);
        consumed = length;
      }
    }
    if (!fits) return c == '.' ? KeyFit::kFullAtWordEnd : KeyFit::kFullMidWord;
    i += consumed;
  }
  return KeyFit::kComplete;
}

// Sarracenia's routing key: the topic prefix, then the directories of
// `rel_path` (its last component, the file name, dropped; empty components
// dropped). Cut to kRoutingKeyBytesMax at the end of a word so that it stays
// a valid prefix for bindings; only when no word after the prefix fits whole
// is the first word cut, at a character boundary.
void BuildRoutingKey(std::string_view prefix, std::string_view rel_path, std::string* key) {
  key->clear();
  if (prefix.size() > kRoutingKeyBytesMax) {
    key->append(prefix.substr(0, Utf8CutAtOrBefore(prefix, kRoutingKeyBytesMax)));
    return;
  }
  key->append(prefix);
  // A dot after this index ends a word after the first one.
  const size_t first_word_begin = prefix.size();
  const size_t last_slash = rel_path.rfind('/');
  if (last_slash == std::string_view::npos) return;
  const std::string_view directories = rel_path.substr(0, last_slash);
  size_t begin = 0;
  while (begin < directories.size()) {
    size_t end = directories.find('/', begin);
    if (end == std::string_view::npos) end = directories.size();
    const std::string_view component = directories.substr(begin, end - begin);
    begin = end + 1;
    if (component.empty()) continue;
    if (!key->empty() && !AppendKeyUnit(".", 1, key)) return;  // full at a word end
    switch (AppendKeyComponent(component, key)) {
      case KeyFit::kComplete:
        continue;
      case KeyFit::kFullAtWordEnd:
        return;
      case KeyFit::kFullMidWord: {
        const size_t dot = key->rfind('.');
        if (dot != std::string::npos && dot > first_word_begin) key->resize(dot);
        return;
      }
    }
  }
}

Status CheckExtras(const fb::Post& post) {
  if (post.extras() == nullptr) return Status::Ok();
  for (const fb::Extra* extra : *post.extras()) {
    if (extra == nullptr) continue;
    const std::string_view key = View(extra->key());
    // The same list ValidatePost uses: a journal written before a name was
    // reserved still never sends it as a standard field.
    if (IsReservedFieldName(key)) {
      return Status(StatusCode::kInvalidArgument,
                    "extra field \"" + std::string(key) + "\" is a standard v03 field name");
    }
  }
  return Status::Ok();
}

// Two decimal digits of `v` (< 100) at `dst`.
void PutTwoDigits(unsigned v, char* dst) {
  dst[0] = static_cast<char>('0' + v / 10);
  dst[1] = static_cast<char>('0' + v % 10);
}

struct CivilDate {
  int64_t year;
  unsigned month;  // 1..12
  unsigned day;    // 1..31
};

// Days since 1970-01-01 to a date of the proleptic Gregorian calendar, by
// arithmetic alone. Years are counted from 1 March, so that the leap day is
// the last day of its year, and grouped into 400-year eras of exactly 146097
// days: inside an era, centuries of 36524 days (the last one 36525), then
// four-year groups of 1461 days (the last one of a century 1460 unless it is
// the era's last century), then years of 365 days (the last of a group 366).
CivilDate CivilFromDays(int64_t days_since_epoch) {
  constexpr int64_t kDaysPerEra = 146097;
  constexpr int64_t kEpochFromEraStart = 719468;  // 0000-03-01 to 1970-01-01
  const int64_t days = days_since_epoch + kEpochFromEraStart;
  const int64_t era = (days >= 0 ? days : days - (kDaysPerEra - 1)) / kDaysPerEra;
  const auto day_of_era = static_cast<unsigned>(days - era * kDaysPerEra);  // [0, 146096]
  unsigned century = day_of_era / 36524;
  if (century > 3) century = 3;  // the era's very last day, a 29 February
  const unsigned day_of_century = day_of_era - century * 36524;
  const unsigned group = day_of_century / 1461;
  const unsigned day_of_group = day_of_century - group * 1461;
  unsigned year_of_group = day_of_group / 365;
  if (year_of_group > 3) year_of_group = 3;  // the group's leap day
  const unsigned day_of_year = day_of_group - year_of_group * 365;  // [0, 365] from 1 March
  // From March on, months come in two runs of five (31 30 31 30 31 days:
  // 153 days) and then January and February.
  const unsigned month_from_march = (5 * day_of_year + 2) / 153;  // [0, 11]
  const unsigned day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
  const unsigned month = month_from_march < 10 ? month_from_march + 3 : month_from_march - 9;
  const int64_t year =
      era * 400 + century * 100 + group * 4 + year_of_group + (month <= 2 ? 1 : 0);
  return CivilDate{year, month, day};
}

}  // namespace

void AppendV03Time(int64_t unix_ns, std::string* out) {
  constexpr int64_t kNsPerSecond = 1'000'000'000;
  constexpr int64_t kSecondsPerDay = 86'400;
  // Floor division: before 1970 the fraction still counts forward.
  int64_t seconds = unix_ns / kNsPerSecond;
  int64_t fraction_ns = unix_ns % kNsPerSecond;
  if (fraction_ns < 0) {
    fraction_ns += kNsPerSecond;
    --seconds;
  }
  int64_t days = seconds / kSecondsPerDay;
  int64_t second_of_day = seconds % kSecondsPerDay;
  if (second_of_day < 0) {
    second_of_day += kSecondsPerDay;
    --days;
  }
  const CivilDate date = CivilFromDays(days);
  // An int64 of nanoseconds spans the years 1677 to 2262: always 4 digits.
  const auto year = static_cast<unsigned>(date.year);
  const auto sod = static_cast<unsigned>(second_of_day);
  char text[25];  // YYYYMMDDTHHMMSS.nnnnnnnnn
  PutTwoDigits(year / 100 % 100, text);
  PutTwoDigits(year % 100, text + 2);
  PutTwoDigits(date.month, text + 4);
  PutTwoDigits(date.day, text + 6);
  text[8] = 'T';
  PutTwoDigits(sod / 3600, text + 9);
  PutTwoDigits(sod / 60 % 60, text + 11);
  PutTwoDigits(sod % 60, text + 13);
  size_t length = 15;
  if (fraction_ns != 0) {
    text[15] = '.';
    auto f = static_cast<unsigned>(fraction_ns);
    for (size_t i = 24; i > 15; --i) {
      text[i] = static_cast<char>('0' + f % 10);
      f /= 10;
    }
    length = 25;
    while (text[length - 1] == '0') --length;
  }
  out->append(text, length);
}

Status Encode(const fb::Post& post, const EncodeOptions& options, Encoded* out) {
  // Checked first: a rejected post leaves `out` as it was.
  if (Status s = CheckExtras(post); !s.ok()) return s;

  // Sarracenia strips leading slashes from relPath.
  const std::string_view rel_path = WithoutLeadingSlashes(View(post.rel_path()));

  BuildRoutingKey(options.topic_prefix, rel_path, &out->routing_key);

  std::string* body = &out->body;
  body->clear();
  // Enough for a post without escapes, so that the usual post grows the
  // buffer at most once.
  std::string_view base_url = View(post.base_url());
  if (base_url.empty() && !options.base_url_default.empty()) base_url = options.base_url_default;
  size_t estimate = 512 + options.source.size() + base_url.size() + rel_path.size() +
                    View(post.retrieve_path()).size();
  if (post.extras() != nullptr) estimate += post.extras()->size() * 64;
  if (body->capacity() < estimate) body->reserve(estimate);

  body->push_back('{');
  AppendTimeMember("pubTime", post.pub_time_ns(), 0, body);
  if (post.base_url() != nullptr || !base_url.empty()) AppendStringMember("baseUrl", base_url, 0, body);
  if (post.rel_path() != nullptr) AppendStringMember("relPath", rel_path, 0, body);
  if (post.retrieve_path() != nullptr) {
    AppendStringMember("retrievePath", View(post.retrieve_path()), 0, body);
  }
  AppendFileOp(post.file_op(), body);
  AppendIdentity(post.identity(), body);
  char number[24];
  if (const flatbuffers::Optional<int64_t> size = post.size(); size.has_value()) {
    AppendMemberKey("size", 0, body);
    const auto end = std::to_chars(number, number + sizeof number, *size).ptr;
    body->append(number, static_cast<size_t>(end - number));
  }
  if (const flatbuffers::Optional<uint32_t> mode = post.mode(); mode.has_value()) {
    AppendMemberKey("mode", 0, body);
    const auto end = std::to_chars(number, number + sizeof number, *mode & 07777u, 8).ptr;
    body->push_back('"');
    body->append(number, static_cast<size_t>(end - number));
    body->push_back('"');
  }
  if (const flatbuffers::Optional<int64_t> mtime = post.mtime_ns(); mtime.has_value()) {
    AppendTimeMember("mtime", *mtime, 0, body);
  }
  if (const flatbuffers::Optional<int64_t> atime = post.atime_ns(); atime.has_value()) {
    AppendTimeMember("atime", *atime, 0, body);
  }
  if (!options.source.empty()) AppendStringMember("source", options.source, 0, body);
  if (post.extras() != nullptr) {
    for (const fb::Extra* extra : *post.extras()) {
      if (extra == nullptr || extra->key() == nullptr) continue;
      AppendStringMember(View(extra->key()), View(extra->value()), 0, body);
    }
  }
  body->push_back('}');
  return Status::Ok();
}

}  // namespace postspool::v03
