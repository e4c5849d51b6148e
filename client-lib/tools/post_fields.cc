#include "post_fields.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <set>
#include <span>

#include <nlohmann/json.hpp>

#include "base64.h"
#include "sha512.h"

namespace postspool::cli {
namespace {

constexpr int64_t kNsPerSecond = 1000000000;

// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
// days_from_civil).
int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const auto yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

unsigned DaysInMonth(int64_t y, unsigned m) {
  static constexpr unsigned kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  return m == 2 && leap ? 29 : kDays[m - 1];
}

// Reads exactly `n` digits at *pos.
bool Digits(std::string_view s, size_t* pos, size_t n, unsigned* out) {
  if (*pos + n > s.size()) return false;
  unsigned v = 0;
  for (size_t i = 0; i < n; ++i) {
    const char c = s[*pos + i];
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<unsigned>(c - '0');
  }
  *pos += n;
  *out = v;
  return true;
}

bool Literal(std::string_view s, size_t* pos, char c) {
  if (*pos >= s.size() || s[*pos] != c) return false;
  ++*pos;
  return true;
}

int64_t TimespecNs(const timespec& ts) {
  return static_cast<int64_t>(ts.tv_sec) * kNsPerSecond + ts.tv_nsec;
}

using nlohmann::json;

const char* KindName(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number with a fraction or exponent";
    default: return "something else";
  }
}

// The sentinel that stands for a \udcXX escape while nlohmann's parser reads
// the line (it refuses lone surrogates): NUL then U+00XX, which the parser
// turns into "\0" and the two UTF-8 bytes of U+00XX. No string of a valid
// line holds a NUL otherwise (a \u0000 escape is refused before parsing).
constexpr char kSurrogateSentinel = '\0';

// A string as the post carries it: sentinels back to the raw bytes.
std::string Bytes(const std::string& parsed) {
  std::string out;
  out.reserve(parsed.size());
  for (size_t i = 0; i < parsed.size(); ++i) {
    if (parsed[i] == kSurrogateSentinel && i + 2 < parsed.size() &&
        (static_cast<unsigned char>(parsed[i + 1]) & 0xfe) == 0xc2) {
      const auto b1 = static_cast<unsigned char>(parsed[i + 1]);
      const auto b2 = static_cast<unsigned char>(parsed[i + 2]);
      out.push_back(static_cast<char>(((b1 & 0x1f) << 6) | (b2 & 0x3f)));
      i += 2;
    } else {
      out.push_back(parsed[i]);
    }
  }
  return out;
}

bool StringMember(const json& v, std::string_view key, std::optional<std::string>* out,
                  std::string* error) {
  if (v.is_null()) return true;
  if (!v.is_string()) {
    *error = std::string(key) + ": expected a string, found " + KindName(v);
    return false;
  }
  *out = Bytes(v.get_ref<const std::string&>());
  return true;
}

// fileOp's remove and directory: v03 writes "" for set; true is taken too.
bool FlagMember(const json& v, std::string_view key, uint32_t flag, uint32_t* flags,
                std::string* error) {
  if (v.is_null()) return true;
  if (v.is_string() || v.is_boolean()) {
    if (v.is_string() || v.get<bool>()) *flags |= flag;
    return true;
  }
  *error = "fileOp." + std::string(key) + ": expected \"\" or a boolean, found " + KindName(v);
  return false;
}

bool IntegerOf(const json& v, int64_t* out) {
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    *out = v.get<int64_t>();
    return true;
  }
  if (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) {
    *out = static_cast<int64_t>(v.get<uint64_t>());
    return true;
  }
  return false;
}

bool TimeMember(const json& v, std::string_view key, std::optional<int64_t>* out,
                std::string* error) {
  if (v.is_null()) return true;
  int64_t ns = 0;
  if (IntegerOf(v, &ns) || (v.is_string() && ParseV03Time(v.get_ref<const std::string&>(), &ns))) {
    *out = ns;
    return true;
  }
  *error = std::string(key) +
           ": expected a v03 time string (YYYYMMDDTHHMMSS.fraction) or integer nanoseconds";
  return false;
}

bool FileOpFromJson(const json& v, PostFields* f, std::string* error) {
  if (v.is_null()) return true;
  if (!v.is_object()) {
    *error = std::string("fileOp: expected an object, found ") + KindName(v);
    return false;
  }
  for (const auto& [key, value] : v.items()) {
    bool ok;
    if (key == "link") ok = StringMember(value, "fileOp.link", &f->link, error);
    else if (key == "hlink") ok = StringMember(value, "fileOp.hlink", &f->hlink, error);
    else if (key == "rename") ok = StringMember(value, "fileOp.rename", &f->rename, error);
    else if (key == "remove") ok = FlagMember(value, key, POSTSPOOL_OP_REMOVE, &f->op_flags, error);
    else if (key == "directory") {
      ok = FlagMember(value, key, POSTSPOOL_OP_DIRECTORY, &f->op_flags, error);
    } else {
      *error = "fileOp: unknown key \"" + Bytes(key) +
               "\" (expected link, hlink, rename, remove or directory)";
      return false;
    }
    if (!ok) return false;
  }
  return true;
}

bool IdentityFromJson(const json& v, PostFields* f, std::string* error) {
  if (v.is_null()) return true;
  if (!v.is_object()) {
    *error = std::string("identity: expected an object, found ") + KindName(v);
    return false;
  }
  for (const auto& [key, value] : v.items()) {
    if (key != "method" && key != "value") {
      *error = "identity: unknown key \"" + Bytes(key) + "\" (expected method and value)";
      return false;
    }
  }
  const auto method = v.find("method");
  const auto value = v.find("value");
  int method_id = 0;
  if (method == v.end() || !method->is_string() ||
      !ParseIdentityMethod(method->get_ref<const std::string&>(), &method_id)) {
    *error = "identity.method: expected one of sha512, md5, cod, random, arbitrary";
    return false;
  }
  if (value == v.end() || !value->is_string()) {
    *error = "identity.value: expected a string";
    return false;
  }
  std::string why;
  if (!ParseIdentity(method->get_ref<const std::string&>() + ":" +
                         Bytes(value->get_ref<const std::string&>()),
                     &f->identity_method, &f->identity_value, &why)) {
    *error = "identity: " + why;
    return false;
  }
  return true;
}

// Rewrites the \udcXX escapes (U+DC80..U+DCFF not after a high surrogate:
// the v03 encoder's surrogateescape for a byte of a name that is not UTF-8)
// of a JSON text into the sentinel; refuses a \u0000 escape, which no post
// field may hold.
bool EscapeLoneSurrogates(std::string_view line, std::string* out, std::string* error) {
  out->clear();
  out->reserve(line.size());
  bool in_string = false;
  bool after_high_surrogate = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (!in_string) {
      if (c == '"') in_string = true;
      out->push_back(c);
      continue;
    }
    if (c == '"') {
      in_string = false;
      after_high_surrogate = false;
      out->push_back(c);
      continue;
    }
    if (c != '\\' || i + 1 >= line.size()) {
      after_high_surrogate = false;
      out->push_back(c);
      continue;
    }
    if (line[i + 1] != 'u' || i + 6 > line.size()) {
      // A two-character escape: copied as it is (the parser checks it).
      after_high_surrogate = false;
      out->append(line.substr(i, 2));
      ++i;
      continue;
    }
    unsigned v = 0;
    bool hex = true;
    for (size_t k = i + 2; k < i + 6; ++k) {
      const char h = line[k];
      v <<= 4;
      if (h >= '0' && h <= '9') v |= static_cast<unsigned>(h - '0');
      else if (h >= 'a' && h <= 'f') v |= static_cast<unsigned>(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') v |= static_cast<unsigned>(h - 'A' + 10);
      else hex = false;
    }
    if (hex && v == 0) {
      *error = "column " + std::to_string(i + 1) +
               ": a string holds a NUL character (\\u0000), which no post field may hold";
      return false;
    }
    if (hex && v >= 0xdc80 && v <= 0xdcff && !after_high_surrogate) {
      char escaped[16];
      std::snprintf(escaped, sizeof escaped, "\\u0000\\u00%02x", v & 0xff);
      out->append(escaped);
      after_high_surrogate = false;
    } else {
      out->append(line.substr(i, 6));
      after_high_surrogate = hex && v >= 0xd800 && v <= 0xdbff;
    }
    i += 5;
  }
  return true;
}
}  // namespace

void PostFields::ToPost(struct postspool_post* post, std::vector<postspool_extra>* out) const {
  postspool_post_init(post);
  const auto c_str = [](const std::optional<std::string>& s) {
    return s ? s->c_str() : nullptr;
  };
  post->base_url = c_str(base_url);
  post->rel_path = c_str(rel_path);
  post->retrieve_path = c_str(retrieve_path);
  post->link = c_str(link);
  post->hlink = c_str(hlink);
  post->rename = c_str(rename);
  post->op_flags = op_flags;
  post->identity_method = identity_method;
  if (identity_method != POSTSPOOL_IDENTITY_NONE) {
    post->identity_value = identity_value.data();
    post->identity_size = identity_value.size();
  }
  if (size) {
    post->has_size = 1;
    post->size = *size;
  }
  if (mode) {
    post->has_mode = 1;
    post->mode = *mode;
  }
  if (mtime_ns) {
    post->has_mtime = 1;
    post->mtime_ns = *mtime_ns;
  }
  if (atime_ns) {
    post->has_atime = 1;
    post->atime_ns = *atime_ns;
  }
  out->clear();
  for (const auto& [key, value] : extras) out->push_back(postspool_extra{key.c_str(), value.c_str()});
  post->extras = out->empty() ? nullptr : out->data();
  post->extras_count = out->size();
}

bool ParseIdentityMethod(std::string_view name, int* method) {
  if (name == "sha512") *method = POSTSPOOL_IDENTITY_SHA512;
  else if (name == "md5") *method = POSTSPOOL_IDENTITY_MD5;
  else if (name == "cod") *method = POSTSPOOL_IDENTITY_COD;
  else if (name == "random") *method = POSTSPOOL_IDENTITY_RANDOM;
  else if (name == "arbitrary") *method = POSTSPOOL_IDENTITY_ARBITRARY;
  else return false;
  return true;
}

bool ParseIdentity(std::string_view text, int* method, std::string* value, std::string* error) {
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos) {
    *error = "expected METHOD:VALUE, e.g. sha512:<base64> or cod:sha512";
    return false;
  }
  const std::string_view name = text.substr(0, colon);
  const std::string_view rest = text.substr(colon + 1);
  if (!ParseIdentityMethod(name, method)) {
    *error = "unknown identity method \"" + std::string(name) +
             "\" (expected sha512, md5, cod, random or arbitrary)";
    return false;
  }
  if (*method == POSTSPOOL_IDENTITY_SHA512 || *method == POSTSPOOL_IDENTITY_MD5) {
    const size_t digest_bytes = *method == POSTSPOOL_IDENTITY_SHA512 ? 64 : 16;
    const std::string form = "the " + std::string(name) + " value is the " +
                             std::to_string(digest_bytes) + "-byte digest in base64 (" +
                             std::to_string((digest_bytes + 2) / 3 * 4) + " characters)";
    if (!Base64Decode(rest, value)) {
      *error = form + "; \"" + std::string(rest) + "\" is not base64";
      return false;
    }
    if (value->size() != digest_bytes) {
      *error = form + "; \"" + std::string(rest) + "\" decodes to " +
               std::to_string(value->size()) + " bytes";
      return false;
    }
    return true;
  }
  if (rest.empty()) {
    *error = "the " + std::string(name) + " value is empty";
    return false;
  }
  *value = std::string(rest);
  return true;
}

bool ParseOctalMode(std::string_view text, uint32_t* mode) {
  if (text.empty() || text.size() > 5) return false;
  uint32_t v = 0;
  for (const char c : text) {
    if (c < '0' || c > '7') return false;
    v = v * 8 + static_cast<uint32_t>(c - '0');
  }
  if (v > 07777) return false;
  *mode = v;
  return true;
}

bool ParseInt64(std::string_view text, int64_t* value) {
  if (text.empty() || text.front() == '+') return false;
  const auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return ec == std::errc() && p == text.data() + text.size();
}

bool ParseV03Time(std::string_view s, int64_t* unix_ns) {
  size_t pos = 0;
  unsigned year, month, day, hour, minute, second;
  const bool iso = s.size() > 4 && s[4] == '-';
  if (!Digits(s, &pos, 4, &year)) return false;
  if (iso && !Literal(s, &pos, '-')) return false;
  if (!Digits(s, &pos, 2, &month)) return false;
  if (iso && !Literal(s, &pos, '-')) return false;
  if (!Digits(s, &pos, 2, &day)) return false;
  if (!Literal(s, &pos, 'T')) return false;
  if (!Digits(s, &pos, 2, &hour)) return false;
  if (iso && !Literal(s, &pos, ':')) return false;
  if (!Digits(s, &pos, 2, &minute)) return false;
  if (iso && !Literal(s, &pos, ':')) return false;
  if (!Digits(s, &pos, 2, &second)) return false;
  int64_t fraction_ns = 0;
  if (pos < s.size() && s[pos] == '.') {
    ++pos;
    int64_t scale = kNsPerSecond / 10;
    const size_t first = pos;
    for (; pos < s.size() && s[pos] >= '0' && s[pos] <= '9'; ++pos) {
      fraction_ns += (s[pos] - '0') * scale;
      scale /= 10;
    }
    if (pos == first) return false;
  }
  if (iso && pos < s.size() && s[pos] == 'Z') ++pos;
  if (pos != s.size()) return false;
  if (month < 1 || month > 12 || day < 1 || day > DaysInMonth(year, month) || hour > 23 ||
      minute > 59 || second > 60) {
    return false;
  }
  const int64_t days = DaysFromCivil(year, month, day);
  *unix_ns = ((days * 24 + hour) * 60 + minute) * 60 * kNsPerSecond +
             static_cast<int64_t>(second) * kNsPerSecond + fraction_ns;
  return true;
}

bool FillFromFile(const std::string& path, PostFields* f, std::string* error) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    *error = "lstat " + path + ": " + std::strerror(errno);
    return false;
  }
  f->mtime_ns = TimespecNs(st.st_mtim);
  f->atime_ns = TimespecNs(st.st_atim);
  if (S_ISLNK(st.st_mode)) {
    std::string target(static_cast<size_t>(st.st_size > 0 ? st.st_size : 4096) + 1, '\0');
    const ssize_t n = ::readlink(path.c_str(), target.data(), target.size());
    if (n < 0 || static_cast<size_t>(n) >= target.size()) {
      *error = "readlink " + path + ": " + (n < 0 ? std::strerror(errno) : "target changed");
      return false;
    }
    target.resize(static_cast<size_t>(n));
    f->link = std::move(target);
    return true;
  }
  f->mode = st.st_mode & 07777;
  if (S_ISDIR(st.st_mode)) {
    f->op_flags |= POSTSPOOL_OP_DIRECTORY;
    return true;
  }
  if (!S_ISREG(st.st_mode)) {
    *error = path + " is not a regular file, a directory or a symbolic link";
    return false;
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    *error = "open " + path + ": " + std::strerror(errno);
    return false;
  }
  Sha512 hash;
  uint64_t bytes = 0;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *error = "read " + path + ": " + std::strerror(errno);
      ::close(fd);
      return false;
    }
    if (n == 0) break;
    hash.Update(buf, static_cast<size_t>(n));
    bytes += static_cast<uint64_t>(n);
  }
  ::close(fd);
  // The size of what was hashed, so that size and checksum agree even if the
  // file changed since lstat.
  f->size = static_cast<int64_t>(bytes);
  const Sha512::Digest digest = hash.Finish();
  f->identity_method = POSTSPOOL_IDENTITY_SHA512;
  f->identity_value.assign(reinterpret_cast<const char*>(digest.data()), digest.size());
  return true;
}

namespace {

// `path` made absolute against `cwd` and normalised lexically, as components.
std::vector<std::string_view> NormalisedComponents(std::string_view path, std::string_view cwd) {
  std::vector<std::string_view> components;
  const auto add = [&](std::string_view p) {
    while (!p.empty()) {
      const size_t slash = std::min(p.find('/'), p.size());
      const std::string_view c = p.substr(0, slash);
      p.remove_prefix(std::min(slash + 1, p.size()));
      if (c.empty() || c == ".") continue;
      if (c == "..") {
        if (!components.empty()) components.pop_back();
        continue;
      }
      components.push_back(c);
    }
  };
  if (!path.starts_with('/')) add(cwd);
  add(path);
  return components;
}

std::string Join(std::span<const std::string_view> components) {
  std::string out;
  for (const std::string_view c : components) {
    if (!out.empty()) out += '/';
    out += c;
  }
  return out;
}

}  // namespace

std::string RelPathOfFile(std::string_view path, std::string_view cwd) {
  return Join(NormalisedComponents(path, cwd));
}

bool RelPathUnderBase(std::string_view path, std::string_view base, std::string_view cwd,
                      std::string* rel_path) {
  const std::vector<std::string_view> p = NormalisedComponents(path, cwd);
  const std::vector<std::string_view> b = NormalisedComponents(base, cwd);
  if (p.size() <= b.size() || !std::equal(b.begin(), b.end(), p.begin())) return false;
  *rel_path = Join(std::span(p).subspan(b.size()));
  return true;
}

bool ParseJsonLine(std::string_view line, json* value, std::string* error) {
  std::string text;
  if (!EscapeLoneSurrogates(line, &text, error)) return false;
  // Duplicate keys and deep nesting are refused: nlohmann keeps the last of
  // a repeated key, which would hide a mistake.
  std::vector<std::set<std::string>> keys;
  std::string structure_error;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event,
                                            json& parsed) {
    if (event == json::parse_event_t::object_start) {
      if (depth >= kJsonDepthMax && structure_error.empty()) {
        structure_error = "objects nested deeper than " + std::to_string(kJsonDepthMax);
      }
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end && !keys.empty()) {
      keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(key).second && structure_error.empty()) {
        structure_error = "the key \"" + Bytes(key) + "\" is given twice";
      }
    }
    return true;
  };
  try {
    *value = json::parse(text, check);
  } catch (const json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 19:
    // syntax error while parsing ..." -> "column 19: syntax error ..."
    std::string message = e.what();
    const size_t column = message.find("column ");
    *error = column == std::string::npos ? message : message.substr(column);
    return false;
  }
  if (!structure_error.empty()) {
    *error = structure_error;
    return false;
  }
  return true;
}

bool PostFieldsFromJson(const json& object, PostFields* f, JsonNotes* notes, std::string* error) {
  if (!object.is_object()) {
    *error = std::string("expected a JSON object (one post per line), found ") + KindName(object);
    return false;
  }
  for (const auto& [parsed_key, v] : object.items()) {
    const std::string key = Bytes(parsed_key);
    bool ok = true;
    if (key == "relPath") ok = StringMember(v, key, &f->rel_path, error);
    else if (key == "baseUrl") ok = StringMember(v, key, &f->base_url, error);
    else if (key == "retrievePath") ok = StringMember(v, key, &f->retrieve_path, error);
    else if (key == "fileOp") ok = FileOpFromJson(v, f, error);
    else if (key == "identity") ok = IdentityFromJson(v, f, error);
    else if (key == "size") {
      int64_t size = 0;
      if (IntegerOf(v, &size)) f->size = size;
      else if (!v.is_null()) {
        *error = std::string("size: expected an integer, found ") + KindName(v);
        ok = false;
      }
    } else if (key == "mode") {
      uint32_t mode = 0;
      if (v.is_string() && ParseOctalMode(v.get_ref<const std::string&>(), &mode)) f->mode = mode;
      else if (!v.is_null()) {
        *error = "mode: expected an octal string such as \"644\"";
        ok = false;
      }
    } else if (key == "mtime") ok = TimeMember(v, key, &f->mtime_ns, error);
    else if (key == "atime") ok = TimeMember(v, key, &f->atime_ns, error);
    else if (key == "pubTime") {
      // Checked, then replaced: the library stamps the time of this post.
      std::optional<int64_t> ignored;
      ok = TimeMember(v, key, &ignored, error);
      if (ok && ignored) notes->pub_time_replaced = true;
    } else if (key == "source") {
      // Set by the daemon (the broker user) when it publishes.
      std::optional<std::string> ignored;
      ok = StringMember(v, key, &ignored, error);
      if (ok && ignored) notes->source_replaced = true;
    } else if (v.is_null()) {
      continue;
    } else if (v.is_string()) {
      f->extras.emplace_back(key, Bytes(v.get_ref<const std::string&>()));
    } else {
      *error = "\"" + key + "\" is not a v03 field postspool reads, so it would be an extra " +
               "field, and an extra field's value is a string; found " + KindName(v) +
               " (put structured data in a string)";
      return false;
    }
    if (!ok) return false;
  }
  if (!f->rel_path) {
    *error = "relPath is missing";
    return false;
  }
  return true;
}

bool PostFieldsFromJsonLine(std::string_view line, PostFields* fields, JsonNotes* notes,
                            std::string* error) {
  json value;
  return ParseJsonLine(line, &value, error) && PostFieldsFromJson(value, fields, notes, error);
}

std::string FormatUuid(const uint8_t id[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  s.reserve(36);
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += kHex[id[i] >> 4];
    s += kHex[id[i] & 15];
  }
  return s;
}

}  // namespace postspool::cli
