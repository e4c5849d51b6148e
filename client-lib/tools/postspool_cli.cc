// postspool: post file changes from shell scripts, through libpostspool, and
// look inside spool and journal segments.
//
//   postspool post --rel-path a/b.txt [options]
//   postspool post --json < posts.jsonl
//   postspool inspect FILE
//   postspool verify [--repair] DIR|FILE
//
// Exit status (exit_codes.h, docs/client.md): 0 success, 1 the operation
// failed, 2 usage error or bad input, 3 the daemon cannot be reached.
//
// Options are parsed with getopt_long (glibc): no dependency, GNU behaviour
// users know (--opt=value, --opt value, unambiguous prefixes), and every
// message is ours (opterr is off), in the words of the command line.
#include <getopt.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "exit_codes.h"
#include "post_fields.h"
#include "postspool.h"
#include "control_commands.h"
#include "segment_commands.h"

namespace postspool::cli {
namespace {

// A post is at most a few tens of KiB of JSON; anything far longer is not one.
constexpr size_t kJsonLineBytesMax = 1 << 20;

constexpr char kPostUsage[] =
    "usage: postspool post --rel-path PATH [field options] [client options]\n"
    "       postspool post --file PATH [--base-dir DIR] [field options] [client options]\n"
    "       postspool post --json [client options] < lines\n"
    "\n"
    "Posts a file change through postspoold (its shared-memory ring, else its socket,\n"
    "else its spool directory) and prints \"<uuid> ring|socket|spool\" for each post\n"
    "taken.\n"
    "\n"
    "Field options (Sarracenia v03 names in brackets):\n"
    "  --rel-path PATH        path relative to the base URL [relPath]: components\n"
    "                         separated by /, none empty, . or ..\n"
    "  --base-url URL         e.g. file:/ or sftp://host/ [baseUrl]; default: the daemon's\n"
    "  --retrieve-path PATH   where to fetch the file from [retrievePath]\n"
    "  --rename OLD           the file was renamed from OLD [fileOp.rename]: the absolute\n"
    "                         path of the old name (an sr3 subscriber maps it onto its\n"
    "                         tree with baseDir or strip); with --file, OLD is a file\n"
    "                         path taken like --file's PATH and posted as its\n"
    "                         absolute path\n"
    "  --link TARGET          a symbolic link and its target, as readlink shows it\n"
    "                         [fileOp.link]\n"
    "  --remove               the file was removed [fileOp.remove]\n"
    "  --directory            the path is a directory [fileOp.directory]\n"
    "  --size N               bytes [size]\n"
    "  --mode OCTAL           permission bits, e.g. 644 [mode]\n"
    "  --mtime-ns N           modification time, ns since the epoch [mtime]\n"
    "  --atime-ns N           access time, ns since the epoch [atime]\n"
    "  --identity M:V         checksum [identity]: sha512:BASE64, md5:BASE64 (the digest),\n"
    "                         cod:ALGO, random:TEXT, arbitrary:TEXT\n"
    "  --extra KEY=VALUE      a free extra field (repeatable)\n"
    "  --file PATH            fill size, mode, mtime, atime and a sha512 identity from\n"
    "                         PATH (lstat; a symbolic link gives --link TARGET and no\n"
    "                         checksum; a directory gives --directory; a hard link is\n"
    "                         posted as the file it is), and relPath:\n"
    "                         PATH relative to --base-dir, normalised. With --remove,\n"
    "                         PATH must be gone. The options above override it\n"
    "  --base-dir DIR         the directory the base URL stands for (default /): --file\n"
    "                         and --rename paths must be under it\n"
    "\n"
    "  --json                 read posts from stdin, one JSON object per line, with v03\n"
    "                         keys, as the daemon publishes them (and `postspool inspect`\n"
    "                         shows them under \"post\"); pubTime and source are checked\n"
    "                         and replaced (the post is stamped when posted, the daemon\n"
    "                         sets source), which is said once on stderr\n"
    "\n"
    "Client options (defaults from the environment, see docs/client.md):\n"
    "  --socket PATH          daemon socket [$POSTSPOOL_SOCKET, /run/postspool/postspoold.sock]\n"
    "  --spool-dir DIR        spool directory [$POSTSPOOL_SPOOL_DIR, /var/spool/postspool/incoming]\n"
    "  --budget-ms N          time budget of each post [$POSTSPOOL_BUDGET_MS, 5]\n"
    "\n"
    "Exit status: 0 every post was taken, 1 some post was not taken, 2 usage error or\n"
    "bad input (a line that is not a post, a post refused for what it says).\n";

// The subcommands. A command that is not here is a usage error. The control
// commands (status, drain, metrics, reconnect, log-level) are in
// control_commands.h.
struct Command {
  const char* name;
  int (*run)(std::string_view name, int argc, char** argv);
  const char* synopsis;  // after the command name
  const char* summary;
};

int RunPost(std::string_view name, int argc, char** argv);

constexpr Command kCommands[] = {
    {"post", RunPost, "--rel-path PATH | --file PATH | --json", "post file changes"},
    {"inspect", RunInspect, "[--table] FILE", "show a segment's records"},
    {"verify", RunVerify, "[--repair] DIR|FILE", "check segments, like fsck"},
    {"status", RunControlCommand, "[--json]", "the daemon's state; exit 0 if healthy"},
    {"drain", RunControlCommand, "[--timeout DURATION]", "wait until the backlog is confirmed"},
    {"metrics", RunControlCommand, "", "the daemon's metrics (Prometheus text)"},
    {"reconnect", RunControlCommand, "", "connect to the broker now (root, daemon group)"},
    {"log-level", RunControlCommand, "LEVEL", "set the daemon's log level (root, daemon group)"},
};

void PrintUsage(FILE* out) {
  std::fputs("usage: postspool COMMAND [options]   (postspool COMMAND --help for more)\n", out);
  for (const Command& c : kCommands) {
    const std::string usage = std::string(c.name) + " " + c.synopsis;
    std::fprintf(out, "  postspool %-46s %s\n", usage.c_str(), c.summary);
  }
  std::fputs("  postspool --help | --version\n"
             "Exit status: 0 success, 1 operation failed, 2 usage error or bad input,\n"
             "3 daemon unreachable.\n",
             out);
}

int PostUsage(const std::string& message) {
  std::fprintf(stderr, "postspool post: %s\n(usage: postspool post --help)\n", message.c_str());
  return kExitUsage;
}

// Long options of `post`; the value is the index in kPostOptions, found
// back through option_index.
enum PostOption {
  kRelPath, kBaseUrl, kRetrievePath, kRename, kLink, kRemove, kDirectory, kSize, kMode,
  kMtimeNs, kAtimeNs, kIdentity, kExtra, kFile, kBaseDir, kJson, kSocket, kSpoolDir, kBudgetMs,
  kHelp, kPostOptionCount
};
constexpr option kPostOptions[] = {
    {"rel-path", required_argument, nullptr, kRelPath},
    {"base-url", required_argument, nullptr, kBaseUrl},
    {"retrieve-path", required_argument, nullptr, kRetrievePath},
    {"rename", required_argument, nullptr, kRename},
    {"link", required_argument, nullptr, kLink},
    {"remove", no_argument, nullptr, kRemove},
    {"directory", no_argument, nullptr, kDirectory},
    {"size", required_argument, nullptr, kSize},
    {"mode", required_argument, nullptr, kMode},
    {"mtime-ns", required_argument, nullptr, kMtimeNs},
    {"atime-ns", required_argument, nullptr, kAtimeNs},
    {"identity", required_argument, nullptr, kIdentity},
    {"extra", required_argument, nullptr, kExtra},
    {"file", required_argument, nullptr, kFile},
    {"base-dir", required_argument, nullptr, kBaseDir},
    {"json", no_argument, nullptr, kJson},
    {"socket", required_argument, nullptr, kSocket},
    {"spool-dir", required_argument, nullptr, kSpoolDir},
    {"budget-ms", required_argument, nullptr, kBudgetMs},
    {"help", no_argument, nullptr, kHelp},
    {nullptr, 0, nullptr, 0},
};
static_assert(std::size(kPostOptions) == kPostOptionCount + 1);

struct PostArgs {
  bool json = false;
  bool help = false;
  std::optional<std::string> file;
  std::optional<std::string> base_dir;
  std::optional<std::string> socket_path;
  std::optional<std::string> spool_dir;
  std::optional<uint32_t> budget_ms;
  PostFields fields;  // from the field options
  bool any_field_option = false;
};

// The message for the option getopt_long stopped at ('?' or ':').
std::string GetoptError(int result, char** argv, const option* options) {
  const std::string_view arg = argv[optind - 1] != nullptr ? argv[optind - 1] : "";
  if (result == ':') return std::string(arg) + " needs a value";
  if (arg.starts_with("--")) {
    const std::string_view name = arg.substr(2, arg.find('=') - 2);
    for (const option* o = options; o->name != nullptr; ++o) {
      if (name == o->name && o->has_arg == no_argument) return "--" + std::string(name) + " takes no value";
    }
    return "unknown or ambiguous option " + std::string(arg);
  }
  if (optopt != 0) return std::string("unknown option -") + static_cast<char>(optopt);
  return "unknown option " + std::string(arg);
}

// Parses `post`'s options into *args; false with *error for a usage error.
bool ParsePostArgs(int argc, char** argv, PostArgs* args, std::string* error) {
  int seen[kPostOptionCount] = {};
  opterr = 0;
  optind = 0;  // a fresh scan (glibc)
  for (;;) {
    int index = -1;
    const int o = ::getopt_long(argc, argv, ":h", kPostOptions, &index);
    if (o == -1) break;
    if (o == '?' || o == ':') {
      *error = GetoptError(o, argv, kPostOptions);
      return false;
    }
    const int id = o == 'h' ? kHelp : o;
    const std::string name = std::string("--") + kPostOptions[id].name;
    if (++seen[id] > 1 && id != kExtra) {
      *error = name + " is given twice";
      return false;
    }
    const std::string value = optarg != nullptr ? optarg : "";
    PostFields& f = args->fields;
    const bool is_field = id != kJson && id != kHelp && id != kSocket && id != kSpoolDir &&
                          id != kBudgetMs && id != kFile && id != kBaseDir;
    args->any_field_option = args->any_field_option || is_field;
    switch (id) {
      case kHelp: args->help = true; break;
      case kJson: args->json = true; break;
      case kRemove: f.op_flags |= POSTSPOOL_OP_REMOVE; break;
      case kDirectory: f.op_flags |= POSTSPOOL_OP_DIRECTORY; break;
      case kRelPath: f.rel_path = value; break;
      case kBaseUrl: f.base_url = value; break;
      case kRetrievePath: f.retrieve_path = value; break;
      case kRename: f.rename = value; break;
      case kLink: f.link = value; break;
      case kFile: args->file = value; break;
      case kBaseDir: args->base_dir = value; break;
      case kSocket: args->socket_path = value; break;
      case kSpoolDir: args->spool_dir = value; break;
      case kSize: {
        int64_t v;
        if (!ParseInt64(value, &v) || v < 0) {
          *error = "--size: expected a number of bytes (a non-negative integer), got \"" + value + "\"";
          return false;
        }
        f.size = v;
        break;
      }
      case kMode: {
        uint32_t mode;
        if (!ParseOctalMode(value, &mode)) {
          *error = "--mode: expected octal permission bits such as 644, got \"" + value + "\"";
          return false;
        }
        f.mode = mode;
        break;
      }
      case kMtimeNs:
      case kAtimeNs: {
        int64_t v;
        if (!ParseInt64(value, &v)) {
          *error = name + ": expected nanoseconds since the epoch (an integer), got \"" + value + "\"";
          return false;
        }
        (id == kMtimeNs ? f.mtime_ns : f.atime_ns) = v;
        break;
      }
      case kIdentity: {
        std::string why;
        if (!ParseIdentity(value, &f.identity_method, &f.identity_value, &why)) {
          *error = "--identity: " + why;
          return false;
        }
        break;
      }
      case kExtra: {
        const size_t eq = value.find('=');
        if (eq == std::string::npos || eq == 0) {
          *error = "--extra: expected KEY=VALUE, got \"" + value + "\"";
          return false;
        }
        f.extras.emplace_back(value.substr(0, eq), value.substr(eq + 1));
        break;
      }
      case kBudgetMs: {
        int64_t v;
        if (!ParseInt64(value, &v) || v <= 0 || v > UINT32_MAX) {
          *error = "--budget-ms: expected a positive number of milliseconds, got \"" + value + "\"";
          return false;
        }
        args->budget_ms = static_cast<uint32_t>(v);
        break;
      }
      default: *error = "unexpected option"; return false;
    }
  }
  if (optind < argc) {
    const std::string_view extra = argv[optind];
    *error = "unexpected argument \"" + std::string(extra) + "\"" +
             (extra.starts_with('{') ? ": --json reads posts from stdin, one per line" : "");
    return false;
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

// The working directory, for making paths absolute; empty if it cannot be
// had (deleted, or longer than PATH_MAX).
std::string WorkingDirectory() {
  std::string cwd(4096, '\0');
  if (::getcwd(cwd.data(), cwd.size()) == nullptr) return {};
  cwd.resize(std::strlen(cwd.c_str()));
  return cwd;
}

// Says once, on stderr, that a post went to the spool while no daemon
// socket exists at the path in use. postspoold removes its socket when it
// stops, so the usual cause is a daemon stopped or restarting (an upgrade):
// nothing is wrong then, the daemon adopts the post when it starts. The
// other cause is a --socket or $POSTSPOOL_SOCKET that is not the daemon's,
// and then the spool directory may be one no daemon watches. The post
// itself was taken.
class SocketCheck {
 public:
  SocketCheck(std::string socket_path, std::string spool_dir)
      : socket_path_(std::move(socket_path)), spool_dir_(std::move(spool_dir)) {}
  void AfterSpooled() {
    if (said_) return;
    said_ = true;
    struct stat st;
    if (::stat(socket_path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return;
    if (errno == ENOENT || errno == ENOTDIR) {
      std::fprintf(stderr,
                   "postspool: warning: no postspoold socket at %s (postspoold is stopped or "
                   "restarting, or --socket/$POSTSPOOL_SOCKET is not its socket): the post went "
                   "to the spool directory %s, which postspoold adopts when it runs, if it is "
                   "its spool directory\n",
                   socket_path_.c_str(), spool_dir_.c_str());
      return;
    }
    std::fprintf(stderr,
                 "postspool: warning: %s is not a socket: the post went to the spool directory "
                 "%s, which postspoold adopts only if it uses that directory (check --socket or "
                 "$POSTSPOOL_SOCKET)\n",
                 socket_path_.c_str(), spool_dir_.c_str());
  }

 private:
  std::string socket_path_;
  std::string spool_dir_;
  bool said_ = false;
};

// The library's message about a refused post, in the words of the command
// line: its C field names (rel_path, identity_size, ...) become the v03
// names the user wrote (relPath, the identity value's length, ...).
std::string InUserWords(std::string_view message) {
  static constexpr std::pair<std::string_view, std::string_view> kWords[] = {
      {"rel_path", "relPath"},
      {"base_url", "baseUrl"},
      {"retrieve_path", "retrievePath"},
      {"identity_method", "the identity method"},
      {"identity_value", "the identity value"},
      {"identity_size", "the identity value's length"},
      {"op_flags", "fileOp"},
      {"extras_count", "the number of extra fields"},
      {"mtime_ns", "mtime"},
      {"atime_ns", "atime"},
  };
  std::string out;
  size_t i = 0;
  const auto word_char = [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; };
  while (i < message.size()) {
    if (!word_char(message[i])) {
      out += message[i++];
      continue;
    }
    size_t end = i;
    while (end < message.size() && word_char(message[end])) ++end;
    const std::string_view word = message.substr(i, end - i);
    std::string_view replacement = word;
    for (const auto& [from, to] : kWords) {
      if (word == from) replacement = to;
    }
    out += replacement;
    i = end;
  }
  return out;
}

// Posts one; prints its id, or the error. The exit code of this post.
int PostOne(postspool_client* client, const PostFields& fields, const std::string& where,
            SocketCheck* socket_check) {
  struct postspool_post post;
  std::vector<postspool_extra> extras;
  fields.ToPost(&post, &extras);
  postspool_post_result result;
  const int rc = postspool_post(client, &post, &result);
  if (rc != POSTSPOOL_OK) {
    const bool refused = rc == POSTSPOOL_EINVAL;
    std::fprintf(stderr, "postspool: %s%s: %s: %s\n", where.c_str(),
                 fields.rel_path ? fields.rel_path->c_str() : "",
                 refused ? "refused" : postspool_strerror(rc),
                 InUserWords(postspool_last_error()).c_str());
    return refused ? kExitUsage : kExitFailed;
  }
  std::printf("%s %s\n", FormatUuid(result.id).c_str(),
              result.transport == POSTSPOOL_TRANSPORT_SOCKET ? "socket"
              : result.transport == POSTSPOOL_TRANSPORT_RING ? "ring"
                                                             : "spool");
  std::fflush(stdout);
  if (result.transport == POSTSPOOL_TRANSPORT_SPOOL) socket_check->AfterSpooled();
  return kExitOk;
}

// The worse of two exit codes: bad input over a failed post over success.
int Worse(int a, int b) {
  const auto rank = [](int code) { return code == kExitUsage ? 2 : code == kExitFailed ? 1 : 0; };
  return rank(a) >= rank(b) ? a : b;
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

int PostJsonLines(postspool_client* client, SocketCheck* socket_check) {
  int status = kExitOk;
  std::string line;
  bool too_long = false;
  bool said_replaced = false;
  for (size_t number = 1; ReadLine(&line, &too_long); ++number) {
    const std::string where = "stdin line " + std::to_string(number);
    if (too_long) {
      std::fprintf(stderr, "postspool: %s: longer than %zu bytes, not a post\n", where.c_str(),
                   kJsonLineBytesMax);
      status = Worse(status, kExitUsage);
      continue;
    }
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    PostFields fields;
    JsonNotes notes;
    std::string why;
    if (!PostFieldsFromJsonLine(line, &fields, &notes, &why)) {
      std::fprintf(stderr, "postspool: %s%s%s\n", where.c_str(),
                   why.starts_with("column ") ? ", " : ": ", why.c_str());
      status = Worse(status, kExitUsage);
      continue;
    }
    if ((notes.pub_time_replaced || notes.source_replaced) && !said_replaced) {
      said_replaced = true;
      std::fprintf(stderr,
                   "postspool: note: %s (and any later line): %s%s%s replaced: a post made now "
                   "gets the time of posting, and the daemon sets source when it publishes\n",
                   where.c_str(), notes.pub_time_replaced ? "pubTime" : "",
                   notes.pub_time_replaced && notes.source_replaced ? " and " : "",
                   notes.source_replaced ? "source" : "");
    }
    status = Worse(status, PostOne(client, fields, where + ": ", socket_check));
  }
  if (std::ferror(stdin)) {
    std::fprintf(stderr, "postspool: reading stdin failed\n");
    status = Worse(status, kExitFailed);
  }
  return status;
}

// A path option given with --file (--rename OLD): the same
// form as --file's PATH, made a relPath under the base directory.
bool FilePathToRelPath(const std::string& option_name, const std::string& path,
                       const std::string& base_dir, const std::string& cwd, std::string* rel_path,
                       std::string* error) {
  if (!path.starts_with('/') && cwd.empty()) {
    *error = option_name + " " + path +
             ": relative, and the working directory is unknown: give an absolute path";
    return false;
  }
  if (!RelPathUnderBase(path, base_dir, cwd, rel_path)) {
    *error = option_name + " " + path + " is not under the base directory " + base_dir +
             " (--base-dir)";
    return false;
  }
  return true;
}

// The fields of `post --file`: the file's metadata, its relPath under the
// base directory, and --rename taken as a file path. The exit code.
int FieldsOfFile(const PostArgs& args, PostFields* fields) {
  const std::string& path = *args.file;
  const std::string base_dir = args.base_dir.value_or("/");
  const std::string cwd = WorkingDirectory();
  std::string error;
  const bool remove = (args.fields.op_flags & POSTSPOOL_OP_REMOVE) != 0;
  struct stat st;
  const bool exists = ::lstat(path.c_str(), &st) == 0;
  if (!exists && errno != ENOENT && errno != ENOTDIR) {
    std::fprintf(stderr, "postspool: %s: %s\n", path.c_str(), std::strerror(errno));
    return kExitFailed;
  }
  if (remove && exists) {
    return PostUsage("--remove announces that " + path +
                     " was removed, but it still exists: remove it first (or post it without "
                     "--remove)");
  }
  if (!remove && !exists) {
    return PostUsage(path + " does not exist (to announce that it was removed, add --remove)");
  }
  if (exists) {
    if (!FillFromFile(path, fields, &error)) {
      std::fprintf(stderr, "postspool: %s\n", error.c_str());
      return kExitFailed;
    }
  }
  PostFields explicit_fields = args.fields;
  if (!explicit_fields.rel_path) {
    std::string rel_path;
    if (!FilePathToRelPath("--file", path, base_dir, cwd, &rel_path, &error)) {
      return PostUsage(error);
    }
    fields->rel_path = rel_path;
  }
  if (explicit_fields.rename) {
    // Under the base directory, and posted as its absolute path: the form an
    // sr3 subscriber maps onto its tree (FORMAT.md, "fileOp values").
    std::string rel_path;
    std::string from_root;
    if (!FilePathToRelPath("--rename", *explicit_fields.rename, base_dir, cwd, &rel_path,
                           &error) ||
        !FilePathToRelPath("--rename", *explicit_fields.rename, "/", cwd, &from_root, &error)) {
      return PostUsage(error);
    }
    explicit_fields.rename = "/" + from_root;
  }
  Overlay(explicit_fields, fields);
  return kExitOk;
}

int RunPost(std::string_view, int argc, char** argv) {
  PostArgs args;
  std::string error;
  if (!ParsePostArgs(argc, argv, &args, &error)) return PostUsage(error);
  if (args.help) {
    std::fputs(kPostUsage, stdout);
    return kExitOk;
  }
  if (args.json && (args.any_field_option || args.file || args.base_dir)) {
    return PostUsage("--json takes the fields from stdin: no field options or --file with it");
  }
  if (!args.json && !args.fields.rel_path && !args.file) {
    return PostUsage("--rel-path (or --file) is required");
  }
  if (args.base_dir && !args.file) return PostUsage("--base-dir goes with --file");

  PostFields fields;
  if (args.file) {
    if (const int rc = FieldsOfFile(args, &fields); rc != kExitOk) return rc;
  } else if (!args.json) {
    fields = args.fields;
  }

  postspool_options options;
  postspool_options_init(&options);
  if (args.socket_path) options.socket_path = args.socket_path->c_str();
  if (args.spool_dir) options.spool_dir = args.spool_dir->c_str();
  if (args.budget_ms) options.budget_ms = *args.budget_ms;
  postspool_client* client = nullptr;
  if (const int rc = postspool_open(&options, &client); rc != POSTSPOOL_OK) {
    std::fprintf(stderr, "postspool: %s: %s\n", postspool_strerror(rc), postspool_last_error());
    return rc == POSTSPOOL_EINVAL ? kExitUsage : kExitFailed;
  }
  SocketCheck socket_check(options.socket_path, options.spool_dir);
  const int status = args.json ? PostJsonLines(client, &socket_check)
                               : PostOne(client, fields, "", &socket_check);
  postspool_close(client);
  return status;
}

}  // namespace
}  // namespace postspool::cli

int main(int argc, char** argv) {
  using namespace postspool::cli;
  if (argc < 2) {
    std::fputs("postspool: no command given\n(usage: postspool --help)\n", stderr);
    return kExitUsage;
  }
  const std::string_view command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    PrintUsage(stdout);
    return kExitOk;
  }
  if (command == "--version") {
    std::printf("postspool %d.%d\n", POSTSPOOL_VERSION_MAJOR, POSTSPOOL_VERSION_MINOR);
    return kExitOk;
  }
  for (const Command& c : kCommands) {
    if (command == c.name) return c.run(c.name, argc - 1, argv + 1);
  }
  std::fprintf(stderr, "postspool: unknown command \"%s\"\n(usage: postspool --help)\n", argv[1]);
  return kExitUsage;
}
