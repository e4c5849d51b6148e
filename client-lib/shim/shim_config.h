// The shim's configuration: Sarracenia's option names where they exist, one
// option per line ("name value"), from the file named by
// $POSTSPOOL_SHIM_CONFIG and then from $POSTSPOOL_SHIM_OPTIONS (lines, or
// options separated by ';'). Parsed once, at the shim's first use; read-only
// afterwards.
#pragma once

#include <regex.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace postspool::shim {

// The identity (checksum) the shim puts in file posts.
enum class Identity { kSha512, kMd5, kCod, kNone };

struct Pattern {
  bool accept = true;     // accept or reject
  std::string text;       // the regular expression as written
  regex_t regex{};        // compiled (POSIX extended), owned by the Config
};

struct Config {
  // True once any option was given: without configuration the shim does
  // nothing at all.
  bool configured = false;
  std::string post_baseUrl;          // empty: the daemon's post_baseUrl
  std::string post_baseDir;          // stripped from paths; only paths under it are posted
  std::vector<Pattern> patterns;     // accept/reject, first match decides
  bool acceptUnmatched = true;       // what a path no pattern matches gets
  bool realpathPost = false;         // resolve symbolic links in directory names
  int64_t shim_post_minterval_ns = 0;  // between two write posts of the same path
  Identity identity = Identity::kSha512;
  bool shim_debug = false;           // libpostspool logs failed posts on stderr

  Config() = default;
  Config(const Config&) = delete;
  Config& operator=(const Config&) = delete;
  ~Config();
};

// Adds the options in `text` (one per line, or separated by ';' when
// `semicolons`). False with *error naming the line on the first bad one.
[[nodiscard]] bool ParseOptions(std::string_view text, bool semicolons, Config* config,
                                std::string* error);

// Whether an absolute, normalised path is posted: under post_baseDir (when
// set), then accept/reject in order, else acceptUnmatched.
bool Accepts(const Config& config, const char* path);

// The relPath of an accepted absolute path: post_baseDir stripped.
const char* RelPathOf(const Config& config, const char* path);

// Normalises an absolute path lexically into `out` (size `out_size`): no
// empty, "." or ".." components, no trailing '/'. False if it does not fit.
bool NormalisePath(const char* path, char* out, size_t out_size);

}  // namespace postspool::shim
