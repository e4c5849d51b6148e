// One post's fields as the command-line tool collects them (from options,
// from a file's metadata, or from a JSON line), owning their strings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "postspool.h"

namespace postspool::cli {

struct PostFields {
  std::optional<std::string> base_url;
  std::optional<std::string> rel_path;
  std::optional<std::string> retrieve_path;
  std::optional<std::string> link;
  std::optional<std::string> hlink;
  std::optional<std::string> rename;
  uint32_t op_flags = 0;  // POSTSPOOL_OP_*
  int identity_method = POSTSPOOL_IDENTITY_NONE;
  std::string identity_value;  // raw digest bytes or text
  std::optional<int64_t> size;
  std::optional<uint32_t> mode;
  std::optional<int64_t> mtime_ns;
  std::optional<int64_t> atime_ns;
  std::vector<std::pair<std::string, std::string>> extras;

  // Points *post (and the array in *extras) into these fields: valid while
  // the fields live unchanged.
  void ToPost(struct postspool_post* post, std::vector<postspool_extra>* extras) const;
};

// "sha512", "md5", "cod", "random", "arbitrary" (v03's identity.method).
bool ParseIdentityMethod(std::string_view name, int* method);
// "METHOD:VALUE" (--identity): sha512 and md5 values in base64 (as in v03),
// the others as text.
bool ParseIdentity(std::string_view text, int* method, std::string* value, std::string* error);
// Octal permission bits, e.g. "644" or "0755"; at most 07777.
bool ParseOctalMode(std::string_view text, uint32_t* mode);
// A decimal integer, optionally negative, that fits in 64 bits.
bool ParseInt64(std::string_view text, int64_t* value);
// A v03 time, UTC: "YYYYMMDDTHHMMSS[.fraction]" as Sarracenia writes it, or
// the ISO 8601 form "YYYY-MM-DDTHH:MM:SS[.fraction][Z]". Fraction digits
// beyond nanoseconds are dropped.
bool ParseV03Time(std::string_view text, int64_t* unix_ns);

// Fills size, mode, mtime, atime and a sha512 identity from the file at
// `path` (lstat: a symbolic link gives fileOp link with its target and no
// checksum; a directory gives fileOp directory).
bool FillFromFile(const std::string& path, PostFields* fields, std::string* error);

// The relPath that `postspool post --file PATH` gives a file: PATH made
// absolute against `cwd` (an absolute directory) and normalised lexically,
// as `realpath --no-symlinks` does ("." and empty components dropped, ".."
// removes the component before it and stays at "/" at the top), then
// without its leading '/' (Sarracenia's relPath for base URL file:/). So
// "../../x/f.txt" run in /home/u/work gives "home/x/f.txt". Symbolic links
// are not resolved: the path posted is the one the file was given under.
// Empty for "/" itself.
std::string RelPathOfFile(std::string_view path, std::string_view cwd);

// The relPath of the file at `path` under the base directory `base` (the
// directory that the base URL stands for): both made absolute against `cwd`
// and normalised lexically as RelPathOfFile does, then `base`'s components
// taken off the front. So the result never holds ".", ".." or an empty
// component. False when `path` is not strictly under `base`.
bool RelPathUnderBase(std::string_view path, std::string_view base, std::string_view cwd,
                      std::string* rel_path);

// Objects nested deeper than this in a JSON line are refused.
inline constexpr int kJsonDepthMax = 8;

// Parses one line of JSON (nlohmann-json), strictly: a repeated key or
// objects nested deeper than kJsonDepthMax are refused, and so is a \u0000
// escape (no post field may hold a NUL). A lone \udcXX escape (XX from 80
// to ff: how the v03 encoder, like Python's surrogateescape, writes a byte
// of a name that is not UTF-8) is taken as that raw byte; strings read
// through PostFieldsFromJson get the byte back. On failure *error says
// where ("column 19: syntax error ...") and what.
bool ParseJsonLine(std::string_view line, nlohmann::json* value, std::string* error);

// What PostFieldsFromJson read but did not carry into the post.
struct JsonNotes {
  bool pub_time_replaced = false;  // a pubTime: the library stamps the time of posting
  bool source_replaced = false;    // a source: the daemon sets the broker user
};

// A post from one JSON object with v03 keys, as the daemon publishes them:
// relPath, baseUrl, retrievePath, fileOp {link, hlink, rename, remove,
// directory}, identity {method, value (base64 for sha512 and md5)}, size,
// mode (octal string), mtime and atime (v03 time strings or integer
// nanoseconds). pubTime (checked to be a v03 time) and source (a string) are
// accepted and replaced, and *notes says so; any other key with a string
// value is an extra field. null means absent.
bool PostFieldsFromJson(const nlohmann::json& object, PostFields* fields, JsonNotes* notes,
                        std::string* error);
// ParseJsonLine then PostFieldsFromJson.
bool PostFieldsFromJsonLine(std::string_view line, PostFields* fields, JsonNotes* notes,
                            std::string* error);

// "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lower case.
std::string FormatUuid(const uint8_t id[16]);

}  // namespace postspool::cli
