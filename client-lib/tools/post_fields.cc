#include "post_fields.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

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

bool HasNul(const std::string& s) { return s.find('\0') != std::string::npos; }

bool StringMember(const JsonValue& v, std::string_view key, std::optional<std::string>* out,
                  std::string* error) {
  if (v.kind == JsonValue::Kind::kNull) return true;
  if (v.kind != JsonValue::Kind::kString) {
    *error = std::string(key) + ": expected a string, found " + JsonKindName(v.kind);
    return false;
  }
  if (HasNul(v.string)) {
    *error = std::string(key) + ": contains a NUL character (\\u0000)";
    return false;
  }
  *out = v.string;
  return true;
}

// fileOp's remove and directory: v03 writes "" for set; true is taken too.
bool FlagMember(const JsonValue& v, std::string_view key, uint32_t flag, uint32_t* flags,
                std::string* error) {
  if (v.kind == JsonValue::Kind::kNull) return true;
  if (v.kind == JsonValue::Kind::kString || v.kind == JsonValue::Kind::kBool) {
    if (v.kind == JsonValue::Kind::kString || v.boolean) *flags |= flag;
    return true;
  }
  *error = "fileOp." + std::string(key) + ": expected \"\" or a boolean, found " +
           JsonKindName(v.kind);
  return false;
}

bool TimeMember(const JsonValue& v, std::string_view key, std::optional<int64_t>* out,
                std::string* error) {
  if (v.kind == JsonValue::Kind::kNull) return true;
  if (v.kind == JsonValue::Kind::kInteger) {
    *out = v.integer;
    return true;
  }
  int64_t ns = 0;
  if (v.kind == JsonValue::Kind::kString && ParseV03Time(v.string, &ns)) {
    *out = ns;
    return true;
  }
  *error = std::string(key) +
           ": expected a v03 time string (YYYYMMDDTHHMMSS.fraction) or integer nanoseconds";
  return false;
}

bool FileOpFromJson(const JsonValue& v, PostFields* f, std::string* error) {
  if (v.kind == JsonValue::Kind::kNull) return true;
  if (v.kind != JsonValue::Kind::kObject) {
    *error = std::string("fileOp: expected an object, found ") + JsonKindName(v.kind);
    return false;
  }
  for (const JsonMember& m : v.members) {
    bool ok;
    if (m.key == "link") ok = StringMember(m.value, "fileOp.link", &f->link, error);
    else if (m.key == "hlink") ok = StringMember(m.value, "fileOp.hlink", &f->hlink, error);
    else if (m.key == "rename") ok = StringMember(m.value, "fileOp.rename", &f->rename, error);
    else if (m.key == "remove") ok = FlagMember(m.value, m.key, POSTSPOOL_OP_REMOVE, &f->op_flags, error);
    else if (m.key == "directory") {
      ok = FlagMember(m.value, m.key, POSTSPOOL_OP_DIRECTORY, &f->op_flags, error);
    } else {
      *error = "fileOp: unknown key \"" + m.key +
               "\" (expected link, hlink, rename, remove or directory)";
      return false;
    }
    if (!ok) return false;
  }
  return true;
}

bool IdentityFromJson(const JsonValue& v, PostFields* f, std::string* error) {
  if (v.kind == JsonValue::Kind::kNull) return true;
  if (v.kind != JsonValue::Kind::kObject) {
    *error = std::string("identity: expected an object, found ") + JsonKindName(v.kind);
    return false;
  }
  for (const JsonMember& m : v.members) {
    if (m.key != "method" && m.key != "value") {
      *error = "identity: unknown key \"" + m.key + "\" (expected method and value)";
      return false;
    }
  }
  const JsonValue* method = v.Find("method");
  const JsonValue* value = v.Find("value");
  if (method == nullptr || method->kind != JsonValue::Kind::kString ||
      !ParseIdentityMethod(method->string, &f->identity_method)) {
    *error = "identity.method: expected one of sha512, md5, cod, random, arbitrary";
    return false;
  }
  if (value == nullptr || value->kind != JsonValue::Kind::kString) {
    *error = "identity.value: expected a string";
    return false;
  }
  if (f->identity_method == POSTSPOOL_IDENTITY_SHA512 ||
      f->identity_method == POSTSPOOL_IDENTITY_MD5) {
    if (!Base64Decode(value->string, &f->identity_value)) {
      *error = "identity.value: expected base64 for method " + method->string;
      return false;
    }
  } else {
    f->identity_value = value->string;
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
    if (!Base64Decode(rest, value)) {
      *error = "the " + std::string(name) + " value must be base64";
      return false;
    }
    return true;
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

std::string RelPathOfFile(std::string_view path, std::string_view cwd) {
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
  std::string out;
  for (const std::string_view c : components) {
    if (!out.empty()) out += '/';
    out += c;
  }
  return out;
}

bool PostFieldsFromJson(const JsonValue& object, PostFields* f, std::string* error) {
  if (object.kind != JsonValue::Kind::kObject) {
    *error = std::string("expected a JSON object, found ") + JsonKindName(object.kind);
    return false;
  }
  for (const JsonMember& m : object.members) {
    const JsonValue& v = m.value;
    bool ok = true;
    if (m.key == "relPath") ok = StringMember(v, m.key, &f->rel_path, error);
    else if (m.key == "baseUrl") ok = StringMember(v, m.key, &f->base_url, error);
    else if (m.key == "retrievePath") ok = StringMember(v, m.key, &f->retrieve_path, error);
    else if (m.key == "fileOp") ok = FileOpFromJson(v, f, error);
    else if (m.key == "identity") ok = IdentityFromJson(v, f, error);
    else if (m.key == "size") {
      if (v.kind == JsonValue::Kind::kInteger) f->size = v.integer;
      else if (v.kind != JsonValue::Kind::kNull) {
        *error = std::string("size: expected an integer, found ") + JsonKindName(v.kind);
        ok = false;
      }
    } else if (m.key == "mode") {
      uint32_t mode = 0;
      if (v.kind == JsonValue::Kind::kString && ParseOctalMode(v.string, &mode)) f->mode = mode;
      else if (v.kind != JsonValue::Kind::kNull) {
        *error = "mode: expected an octal string such as \"644\"";
        ok = false;
      }
    } else if (m.key == "mtime") ok = TimeMember(v, m.key, &f->mtime_ns, error);
    else if (m.key == "atime") ok = TimeMember(v, m.key, &f->atime_ns, error);
    else if (m.key == "pubTime") continue;  // the library stamps the publish time
    else if (v.kind == JsonValue::Kind::kNull) continue;
    else if (v.kind == JsonValue::Kind::kString) {
      if (HasNul(m.key) || HasNul(v.string)) {
        *error = m.key + ": contains a NUL character (\\u0000)";
        return false;
      }
      f->extras.emplace_back(m.key, v.string);
    } else {
      *error = m.key + ": an extra field must be a string, found " + JsonKindName(v.kind);
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
