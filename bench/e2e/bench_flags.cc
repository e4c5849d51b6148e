#include "bench_flags.h"

#include <charconv>
#include <functional>
#include <map>
#include <string_view>

namespace postspool::bench {
namespace {

template <typename T>
bool ParseNumber(std::string_view text, T min, T* out) {
  T v{};
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || v < min) return false;
  *out = v;
  return true;
}

}  // namespace

bool ParseFlags(int argc, char** argv, BenchFlags* f, std::string* error) {
  using Setter = std::function<bool(std::string_view)>;
  const std::map<std::string_view, Setter> setters = {
      {"--ceiling-messages", [&](auto v) { return ParseNumber(v, 1, &f->ceiling_messages); }},
      {"--ceiling-window", [&](auto v) { return ParseNumber(v, 1u, &f->ceiling_window); }},
      {"--warmup-messages", [&](auto v) { return ParseNumber(v, 0, &f->warmup_messages); }},
      {"--clients", [&](auto v) { return ParseNumber(v, 1, &f->clients); }},
      {"--posts-per-client", [&](auto v) { return ParseNumber(v, 1, &f->posts_per_client); }},
      {"--spool-clients", [&](auto v) { return ParseNumber(v, 1, &f->spool_clients); }},
      {"--spool-posts-per-client",
       [&](auto v) { return ParseNumber(v, 1, &f->spool_posts_per_client); }},
      {"--baseline-processes", [&](auto v) { return ParseNumber(v, 1, &f->baseline_processes); }},
      {"--baseline-posts-per-process",
       [&](auto v) { return ParseNumber(v, 1, &f->baseline_posts_per_process); }},
      {"--budget-ms", [&](auto v) { return ParseNumber(v, 1u, &f->budget_ms); }},
      {"--io-backend", [&](std::string_view v) {
         f->io_backend = v;
         return v == "auto" || v == "io_uring" || v == "epoll";
       }},
      {"--durability", [&](std::string_view v) {
         f->durability = v;
         return v == "accepted" || v == "synced";
       }},
      {"--daemon-config", [&](std::string_view v) {
         f->daemon_config.emplace_back(v);
         return v.find('=') != std::string_view::npos;
       }},
      {"--drain-timeout-s", [&](auto v) { return ParseNumber(v, 1, &f->drain_timeout_s); }},
      {"--json", [&](std::string_view v) {
         f->json_path = v;
         return !v.empty();
       }},
  };
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      f->help = true;
      continue;
    }
    std::string_view name = arg, value;
    bool has_value = false;
    if (const size_t eq = arg.find('='); eq != std::string_view::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    const auto it = setters.find(name);
    if (it == setters.end()) {
      *error = "unknown flag " + std::string(name);
      return false;
    }
    if (!has_value) {
      if (i + 1 >= argc) {
        *error = std::string(name) + " needs a value";
        return false;
      }
      value = argv[++i];
    }
    if (!it->second(value)) {
      *error = "bad value for " + std::string(name) + ": '" + std::string(value) + "'";
      return false;
    }
  }
  return true;
}

std::string Usage(const char* program) {
  const BenchFlags d;
  auto n = [](auto v) { return std::to_string(v); };
  return std::string("usage: ") + program + " [flags]\n" +
         "Starts its own RabbitMQ and postspoold and measures, one after the other:\n"
         "the broker's ceiling, postspool end to end, the spool fallback and the naive\n"
         "one-connection-per-post baseline. Prints a table; writes every figure as JSON.\n\n"
         "  --ceiling-messages N           messages of the long-lived publisher (" +
         n(d.ceiling_messages) + ")\n" +
         "  --ceiling-window N             its unconfirmed messages in flight (" +
         n(d.ceiling_window) + ")\n" +
         "  --warmup-messages N            thrown away before any phase (" +
         n(d.warmup_messages) + ")\n" +
         "  --clients N                    client processes through the daemon (" +
         n(d.clients) + ")\n" +
         "  --posts-per-client N           posts each (" + n(d.posts_per_client) + ")\n" +
         "  --spool-clients N              client processes while no daemon runs (" +
         n(d.spool_clients) + ")\n" +
         "  --spool-posts-per-client N     posts each (" + n(d.spool_posts_per_client) + ")\n" +
         "  --baseline-processes N         processes with a connection per post (" +
         n(d.baseline_processes) + ")\n" +
         "  --baseline-posts-per-process N posts each (" + n(d.baseline_posts_per_process) +
         ")\n" +
         "  --budget-ms N                  libpostspool's budget per post call (" +
         n(d.budget_ms) + ")\n" +
         "  --io-backend auto|io_uring|epoll  postspoold's ingest backend (" + d.io_backend +
         ")\n" +
         "  --durability accepted|synced   postspoold's durability (" + d.durability + ")\n" +
         "  --daemon-config 'KEY = VALUE'  another line for postspoold's configuration\n" +
         "                                 (repeatable)\n" +
         "  --drain-timeout-s N            wait at most this for the broker's confirms (" +
         n(d.drain_timeout_s) + ")\n" +
         "  --json PATH                    where to write the figures (" + d.json_path + ")\n" +
         "Environment: POSTSPOOLD overrides the daemon binary (default: the one built\n"
         "with this harness).\n";
}

}  // namespace postspool::bench
