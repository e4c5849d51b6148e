// postspool: post file changes from shell scripts, through libpostspool.
//
//   postspool post --rel-path a/b.txt [options]
//   postspool post --json < posts.jsonl
//
// Prints "<uuid> socket|spool" per post on stdout, errors on stderr.
// Exit status: 0 every post was taken, 1 some post failed, 2 usage error.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "json_reader.h"
#include "post_fields.h"
#include "postspool.h"
#include "control_commands.h"

namespace {

using postspool::cli::PostFields;

constexpr int kExitOk = 0;
constexpr int kExitPostFailed = 1;
constexpr int kExitUsage = 2;
// A post is at most a few tens of KiB of JSON; anything far longer is not one.
constexpr size_t kJsonLineBytesMax = 1 << 20;

constexpr char kUsage[] =
    "usage: postspool post --rel-path PATH [options]   post one file change\n"
    "       postspool post --json [options] < lines    post one JSON object per line\n"
    "       postspool --help | post --help\n";

constexpr char kPostUsage[] =
    "usage: postspool post --rel-path PATH [field options] [client options]\n"
    "       postspool post --file PATH [field options] [client options]\n"
    "       postspool post --json [client options] < lines\n"
    "\n"
    "Posts a file change through postspoold (its socket, else its spool directory)\n"
    "and prints \"<uuid> socket|spool\" for each post taken.\n"
    "\n"
    "Field options (Sarracenia v03 names in brackets):\n"
    "  --rel-path PATH        path relative to the base URL [relPath]; with --file,\n"
    "                         defaults to the file's absolute path, normalised (., ..\n"
    "                         and // resolved without following links), without the\n"
    "                         leading /\n"
    "  --base-url URL         e.g. file:/ or sftp://host/ [baseUrl]; default: the daemon's\n"
    "  --retrieve-path PATH   where to fetch the file from [retrievePath]\n"
    "  --rename OLD           the name the file had before [fileOp.rename]\n"
    "  --link TARGET          a symbolic link and its target [fileOp.link]\n"
    "  --hlink OTHER          a hard link to OTHER [fileOp.hlink]\n"
    "  --remove               the file was removed [fileOp.remove]\n"
    "  --directory            the path is a directory [fileOp.directory]\n"
    "  --size N               bytes [size]\n"
    "  --mode OCTAL           permission bits, e.g. 644 [mode]\n"
    "  --mtime-ns N           modification time, ns since the epoch [mtime]\n"
    "  --atime-ns N           access time, ns since the epoch [atime]\n"
    "  --identity M:V         checksum [identity]: sha512:BASE64, md5:BASE64, cod:ALGO,\n"
    "                         random:TEXT, arbitrary:TEXT\n"
    "  --extra KEY=VALUE      a free extra field (repeatable)\n"
    "  --file PATH            fill size, mode, mtime, atime and a sha512 identity from\n"
    "                         PATH (lstat; a symbolic link gives --link TARGET and no\n"
    "                         checksum; a directory gives --directory); the options\n"
    "                         above override what it fills in\n"
    "\n"
    "  --json                 read posts from stdin, one JSON object per line, with v03\n"
    "                         keys: relPath, baseUrl, retrievePath, fileOp {link, hlink,\n"
    "                         rename, remove, directory}, identity {method, value},\n"
    "                         size, mode (octal string), mtime, atime (v03 time strings\n"
    "                         or integer ns); other string members are extra fields;\n"
    "                         pubTime is ignored (the post is stamped when posted)\n"
    "\n"
    "Client options (defaults from the environment, see docs/client.md):\n"
    "  --socket PATH          daemon socket [$POSTSPOOL_SOCKET, /run/postspool/postspoold.sock]\n"
    "  --spool-dir DIR        spool directory [$POSTSPOOL_SPOOL_DIR, /var/spool/postspool/incoming]\n"
    "  --budget-ms N          time budget of each post [$POSTSPOOL_BUDGET_MS, 5]\n"
    "\n"
    "Exit status: 0 every post was taken, 1 some post failed, 2 usage error.\n";

int Usage(const std::string& message) {
  std::fprintf(stderr, "postspool: %s\n%s", message.c_str(), kUsage);
  return kExitUsage;
}

struct PostArgs {
  bool json = false;
  bool help = false;
  std::optional<std::string> file;
  std::optional<std::string> socket_path;
  std::optional<std::string> spool_dir;
  std::optional<uint32_t> budget_ms;
  PostFields fields;           // from the field options
  bool any_field_option = false;
};

// Options that take a value; the rest are flags.
const std::map<std::string_view, bool>& KnownOptions() {
  static const std::map<std::string_view, bool> options = {
      {"--rel-path", true},  {"--base-url", true}, {"--retrieve-path", true},
      {"--rename", true},    {"--link", true},     {"--hlink", true},
      {"--remove", false},   {"--directory", false}, {"--size", true},
      {"--mode", true},      {"--mtime-ns", true}, {"--atime-ns", true},
      {"--identity", true},  {"--extra", true},    {"--budget-ms", true},
      {"--socket", true},    {"--spool-dir", true}, {"--file", true},
      {"--json", false},     {"--help", false},
  };
  return options;
}

bool ParsePostArgs(int argc, char** argv, PostArgs* args, std::string* error) {
  std::map<std::string_view, int> seen;
  for (int i = 0; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::optional<std::string> inline_value;
    if (const size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      inline_value = std::string(arg.substr(eq + 1));
      arg = arg.substr(0, eq);
    }
    if (arg == "-h") arg = "--help";
    const auto known = KnownOptions().find(arg);
    if (known == KnownOptions().end()) {
      *error = "unknown option " + std::string(argv[i]);
      return false;
    }
    const std::string_view name = known->first;
    if (++seen[name] > 1 && name != "--extra") {
      *error = std::string(name) + " is given twice";
      return false;
    }
    std::string value;
    if (known->second) {
      if (inline_value) {
        value = *inline_value;
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        *error = std::string(name) + " needs a value";
        return false;
      }
    } else if (inline_value) {
      *error = std::string(name) + " takes no value";
      return false;
    }
    const bool is_field = name != "--json" && name != "--help" && name != "--socket" &&
                          name != "--spool-dir" && name != "--budget-ms";
    args->any_field_option = args->any_field_option || is_field;
    PostFields& f = args->fields;
    if (name == "--help") args->help = true;
    else if (name == "--json") args->json = true;
    else if (name == "--remove") f.op_flags |= POSTSPOOL_OP_REMOVE;
    else if (name == "--directory") f.op_flags |= POSTSPOOL_OP_DIRECTORY;
    else if (name == "--rel-path") f.rel_path = value;
    else if (name == "--base-url") f.base_url = value;
    else if (name == "--retrieve-path") f.retrieve_path = value;
    else if (name == "--rename") f.rename = value;
    else if (name == "--link") f.link = value;
    else if (name == "--hlink") f.hlink = value;
    else if (name == "--file") args->file = value;
    else if (name == "--socket") args->socket_path = value;
    else if (name == "--spool-dir") args->spool_dir = value;
    else if (name == "--size") {
      int64_t v;
      if (!postspool::cli::ParseInt64(value, &v) || v < 0) {
        *error = "--size: expected a non-negative integer, got \"" + value + "\"";
        return false;
      }
      f.size = v;
    } else if (name == "--mode") {
      uint32_t mode;
      if (!postspool::cli::ParseOctalMode(value, &mode)) {
        *error = "--mode: expected octal permission bits such as 644, got \"" + value + "\"";
        return false;
      }
      f.mode = mode;
    } else if (name == "--mtime-ns" || name == "--atime-ns") {
      int64_t v;
      if (!postspool::cli::ParseInt64(value, &v)) {
        *error = std::string(name) + ": expected an integer, got \"" + value + "\"";
        return false;
      }
      (name == "--mtime-ns" ? f.mtime_ns : f.atime_ns) = v;
    } else if (name == "--identity") {
      std::string why;
      if (!postspool::cli::ParseIdentity(value, &f.identity_method, &f.identity_value, &why)) {
        *error = "--identity: " + why;
        return false;
      }
    } else if (name == "--extra") {
      const size_t eq = value.find('=');
      if (eq == std::string::npos || eq == 0) {
        *error = "--extra: expected KEY=VALUE, got \"" + value + "\"";
        return false;
      }
      f.extras.emplace_back(value.substr(0, eq), value.substr(eq + 1));
    } else if (name == "--budget-ms") {
      int64_t v;
      if (!postspool::cli::ParseInt64(value, &v) || v <= 0 || v > UINT32_MAX) {
        *error = "--budget-ms: expected a positive integer, got \"" + value + "\"";
        return false;
      }
      args->budget_ms = static_cast<uint32_t>(v);
    }
  }
  return true;
}

// Explicit field options over what --file filled in.
void Overlay(const PostFields& explicit_fields, PostFields* f) {
  const auto take = [](const std::optional<std::string>& from, std::optional<std::string>* to) {
    if (from) *to = from;
  };
  take(explicit_fields.base_url, &f->base_url);
  take(explicit_fields.rel_path, &f->rel_path);
  take(explicit_fields.retrieve_path, &f->retrieve_path);
  take(explicit_fields.link, &f->link);
  take(explicit_fields.hlink, &f->hlink);
  take(explicit_fields.rename, &f->rename);
  f->op_flags |= explicit_fields.op_flags;
  if (explicit_fields.identity_method != POSTSPOOL_IDENTITY_NONE) {
    f->identity_method = explicit_fields.identity_method;
    f->identity_value = explicit_fields.identity_value;
  }
  if (explicit_fields.size) f->size = explicit_fields.size;
  if (explicit_fields.mode) f->mode = explicit_fields.mode;
  if (explicit_fields.mtime_ns) f->mtime_ns = explicit_fields.mtime_ns;
  if (explicit_fields.atime_ns) f->atime_ns = explicit_fields.atime_ns;
  for (const auto& e : explicit_fields.extras) f->extras.push_back(e);
}

// The working directory, for making --file's path absolute; empty if it
// cannot be had (deleted, or longer than PATH_MAX).
std::string WorkingDirectory() {
  std::string cwd(4096, '\0');
  if (::getcwd(cwd.data(), cwd.size()) == nullptr) return {};
  cwd.resize(std::strlen(cwd.c_str()));
  return cwd;
}

// Posts one; prints its id, or the error. True if a transport took it.
bool PostOne(postspool_client* client, const PostFields& fields, const std::string& where) {
  struct postspool_post post;
  std::vector<postspool_extra> extras;
  fields.ToPost(&post, &extras);
  postspool_post_result result;
  const int rc = postspool_post(client, &post, &result);
  if (rc != POSTSPOOL_OK) {
    std::fprintf(stderr, "postspool: %s%s: %s: %s\n", where.c_str(),
                 fields.rel_path ? fields.rel_path->c_str() : "", postspool_strerror(rc),
                 postspool_last_error());
    return false;
  }
  std::printf("%s %s\n", postspool::cli::FormatUuid(result.id).c_str(),
              result.transport == POSTSPOOL_TRANSPORT_SOCKET ? "socket" : "spool");
  std::fflush(stdout);
  return true;
}

// Reads one line of stdin without its '\n' into *line, keeping at most
// kJsonLineBytesMax bytes (*too_long says whether more were dropped). False
// at the end of input.
bool ReadLine(std::string* line, bool* too_long) {
  line->clear();
  *too_long = false;
  bool any = false;
  for (;;) {
    const int c = getc_unlocked(stdin);
    if (c == EOF) return any;
    any = true;
    if (c == '\n') return true;
    if (line->size() < kJsonLineBytesMax) {
      line->push_back(static_cast<char>(c));
    } else {
      *too_long = true;
    }
  }
}

int PostJsonLines(postspool_client* client) {
  int status = kExitOk;
  std::string line;
  bool too_long = false;
  for (size_t number = 1; ReadLine(&line, &too_long); ++number) {
    const std::string where = "stdin line " + std::to_string(number) + ": ";
    if (too_long) {
      std::fprintf(stderr, "postspool: %slonger than %zu bytes\n", where.c_str(),
                   kJsonLineBytesMax);
      status = kExitPostFailed;
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    postspool::cli::JsonValue value;
    postspool::cli::JsonError error;
    if (!postspool::cli::ParseJson(line, &value, &error)) {
      std::fprintf(stderr, "postspool: stdin line %zu, column %zu: %s\n", number, error.column,
                   error.message.c_str());
      status = kExitPostFailed;
      continue;
    }
    PostFields fields;
    std::string why;
    if (!postspool::cli::PostFieldsFromJson(value, &fields, &why)) {
      std::fprintf(stderr, "postspool: %s%s\n", where.c_str(), why.c_str());
      status = kExitPostFailed;
      continue;
    }
    if (!PostOne(client, fields, where)) status = kExitPostFailed;
  }
  if (std::ferror(stdin)) {
    std::fprintf(stderr, "postspool: reading stdin failed\n");
    status = kExitPostFailed;
  }
  return status;
}

int RunPost(int argc, char** argv) {
  PostArgs args;
  std::string error;
  if (!ParsePostArgs(argc, argv, &args, &error)) return Usage(error);
  if (args.help) {
    std::fputs(kPostUsage, stdout);
    return kExitOk;
  }
  if (args.json && (args.any_field_option || args.file)) {
    return Usage("--json takes the fields from stdin: no field options or --file with it");
  }
  if (!args.json && !args.fields.rel_path && !args.file) {
    return Usage("--rel-path (or --file) is required");
  }

  postspool_options options;
  postspool_options_init(&options);
  if (args.socket_path) options.socket_path = args.socket_path->c_str();
  if (args.spool_dir) options.spool_dir = args.spool_dir->c_str();
  if (args.budget_ms) options.budget_ms = *args.budget_ms;
  postspool_client* client = nullptr;
  if (const int rc = postspool_open(&options, &client); rc != POSTSPOOL_OK) {
    std::fprintf(stderr, "postspool: %s: %s\n", postspool_strerror(rc), postspool_last_error());
    return rc == POSTSPOOL_EINVAL ? kExitUsage : kExitPostFailed;
  }

  int status = kExitOk;
  if (args.json) {
    status = PostJsonLines(client);
  } else {
    PostFields fields;
    bool ok = true;
    if (args.file) {
      ok = postspool::cli::FillFromFile(*args.file, &fields, &error);
      if (!ok) std::fprintf(stderr, "postspool: %s\n", error.c_str());
      if (ok && !args.fields.rel_path) {
        const std::string cwd = args.file->starts_with('/') ? "/" : WorkingDirectory();
        if (cwd.empty()) {
          std::fprintf(stderr, "postspool: %s is relative and the working directory is "
                               "unknown: give an absolute path or --rel-path\n",
                       args.file->c_str());
          ok = false;
        } else {
          fields.rel_path = postspool::cli::RelPathOfFile(*args.file, cwd);
        }
      }
    }
    if (ok) {
      Overlay(args.fields, &fields);
      ok = PostOne(client, fields, "");
    }
    status = ok ? kExitOk : kExitPostFailed;
  }
  postspool_close(client);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return Usage("no command given");
  const std::string_view command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    std::fputs("\n", stdout);
    std::fputs(kPostUsage, stdout);
    return kExitOk;
  }
  if (command == "--version") {
    std::printf("postspool %d.%d\n", POSTSPOOL_VERSION_MAJOR, POSTSPOOL_VERSION_MINOR);
    return kExitOk;
  }
  if (command == "post") return RunPost(argc - 2, argv + 2);
  if (postspool::cli::IsControlCommand(command)) {
    return postspool::cli::RunControlCommand(command, argc - 1, argv + 1);
  }
  return Usage("unknown command \"" + std::string(command) + "\"");
}
