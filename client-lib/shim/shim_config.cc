#include "shim_config.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace postspool::shim {

Config::~Config() {
  for (Pattern& p : patterns) ::regfree(&p.regex);
}

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

bool ParseBool(std::string_view v, bool* out) {
  if (v.empty() || v == "on" || v == "true" || v == "yes" || v == "1" || v == "True") {
    *out = true;  // Sarracenia: a flag with no value means on
  } else if (v == "off" || v == "false" || v == "no" || v == "0" || v == "False") {
    *out = false;
  } else {
    return false;
  }
  return true;
}

// Sarracenia durations: seconds, with an optional s, m, h or d suffix.
bool ParseDurationNs(std::string_view v, int64_t* ns) {
  if (v.empty()) return false;
  double unit = 1;
  switch (v.back()) {
    case 's': unit = 1; v.remove_suffix(1); break;
    case 'm': unit = 60; v.remove_suffix(1); break;
    case 'h': unit = 3600; v.remove_suffix(1); break;
    case 'd': unit = 86400; v.remove_suffix(1); break;
    default: break;
  }
  const std::string text(v);
  char* end = nullptr;
  const double seconds = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(seconds >= 0) ||
      seconds * unit > 1e9) {
    return false;
  }
  *ns = static_cast<int64_t>(std::llround(seconds * unit * 1e9));
  return true;
}

bool ParseLine(std::string_view line, Config* c, std::string* error) {
  line = Trim(line);
  if (line.empty() || line.front() == '#') return true;
  const size_t space = line.find_first_of(" \t");
  const std::string_view name = line.substr(0, space);
  const std::string_view value =
      space == std::string_view::npos ? std::string_view() : Trim(line.substr(space));
  const auto bad = [&](const char* what) {
    *error = std::string(name) + ": " + what;
    return false;
  };
  if (name == "post_baseUrl") {
    if (value.empty()) return bad("expected a URL");
    c->post_baseUrl = value;
  } else if (name == "post_baseDir") {
    if (value.empty() || value.front() != '/') return bad("expected an absolute directory");
    char normal[4096];
    const std::string text(value);
    if (!NormalisePath(text.c_str(), normal, sizeof normal)) return bad("too long");
    c->post_baseDir = normal;
    if (c->post_baseDir == "/") c->post_baseDir.clear();
  } else if (name == "accept" || name == "reject") {
    if (value.empty()) return bad("expected a regular expression");
    Pattern p;
    p.accept = name == "accept";
    p.text = value;
    if (const int rc = ::regcomp(&p.regex, p.text.c_str(), REG_EXTENDED | REG_NOSUB); rc != 0) {
      char why[256];
      ::regerror(rc, &p.regex, why, sizeof why);
      *error = std::string(name) + " " + p.text + ": " + why;
      return false;
    }
    c->patterns.push_back(std::move(p));
  } else if (name == "acceptUnmatched") {
    if (!ParseBool(value, &c->acceptUnmatched)) return bad("expected on or off");
  } else if (name == "realpathPost") {
    if (!ParseBool(value, &c->realpathPost)) return bad("expected on or off");
  } else if (name == "shim_post_minterval" || name == "nodupe_ttl") {
    if (!ParseDurationNs(value, &c->shim_post_minterval_ns)) {
      return bad("expected a duration in seconds (suffix s, m, h or d allowed)");
    }
  } else if (name == "identity") {
    // Sarracenia also writes "cod,sha512" for checksum-on-download.
    if (value == "sha512") c->identity = Identity::kSha512;
    else if (value == "md5") c->identity = Identity::kMd5;
    else if (value == "cod" || value.starts_with("cod,")) c->identity = Identity::kCod;
    else if (value == "none") c->identity = Identity::kNone;
    else return bad("expected sha512, md5, cod or none");
  } else if (name == "shim_debug") {
    if (!ParseBool(value, &c->shim_debug)) return bad("expected on or off");
  } else {
    *error = "unknown option " + std::string(name);
    return false;
  }
  c->configured = true;
  return true;
}

}  // namespace

bool ParseOptions(std::string_view text, bool semicolons, Config* config, std::string* error) {
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = semicolons ? text.find_first_of("\n;", begin) : text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    if (!ParseLine(text.substr(begin, end - begin), config, error)) return false;
    begin = end + 1;
  }
  return true;
}

namespace {

bool UnderBaseDir(const Config& c, const char* path) {
  if (c.post_baseDir.empty()) return true;
  const size_t n = c.post_baseDir.size();
  return std::strncmp(path, c.post_baseDir.c_str(), n) == 0 && path[n] == '/' && path[n + 1] != 0;
}

}  // namespace

bool Accepts(const Config& c, const char* path) {
  if (!UnderBaseDir(c, path)) return false;
  for (const Pattern& p : c.patterns) {
    if (::regexec(&p.regex, path, 0, nullptr, 0) == 0) return p.accept;
  }
  return c.acceptUnmatched;
}

const char* RelPathOf(const Config& c, const char* path) {
  return UnderBaseDir(c, path) ? path + c.post_baseDir.size() : path;
}

bool NormalisePath(const char* path, char* out, size_t out_size) {
  if (out_size < 2 || path[0] != '/') return false;
  size_t len = 0;  // out[0..len) is the normalised prefix, without trailing '/'
  const char* p = path;
  while (*p != 0) {
    while (*p == '/') ++p;
    const char* end = p;
    while (*end != 0 && *end != '/') ++end;
    const size_t n = static_cast<size_t>(end - p);
    if (n == 0 || (n == 1 && p[0] == '.')) {
      // nothing
    } else if (n == 2 && p[0] == '.' && p[1] == '.') {
      while (len > 0 && out[len - 1] != '/') --len;
      if (len > 0) --len;  // the '/' before the dropped component
    } else {
      if (len + 1 + n + 1 > out_size) return false;
      out[len++] = '/';
      std::memcpy(out + len, p, n);
      len += n;
    }
    p = end;
  }
  if (len == 0) out[len++] = '/';
  out[len] = 0;
  return true;
}

}  // namespace postspool::shim
