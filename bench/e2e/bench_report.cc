#include "bench_report.h"

#include <cstdarg>
#include <cstdio>
#include <string>
#include <string_view>

#include "json_writer.h"
#include "postspool.h"

namespace postspool::bench {
namespace {

// One row of the table; a negative `seconds` or `rate`, or no latency,
// prints "-" in its columns.
void PrintRow(const char* what, uint64_t n, double seconds, double rate,
              const LatencySummary* latency) {
  // `decimals` digits after the point; "-" for a negative value.
  auto cell = [](double v, int decimals) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
    return std::string(v < 0 ? "-" : buf);
  };
  const bool has_latency = latency != nullptr && latency->count > 0;
  std::printf("%-44s %8llu %8s %10s %9s %9s %9s\n", what, static_cast<unsigned long long>(n),
              cell(seconds, 2).c_str(), cell(rate, 0).c_str(),
              cell(has_latency ? latency->p50_ms : -1, 3).c_str(),
              cell(has_latency ? latency->p99_ms : -1, 3).c_str(),
              cell(has_latency ? latency->max_ms : -1, 3).c_str());
}

std::string Label(const char* format, ...) __attribute__((format(printf, 1, 2)));
std::string Label(const char* format, ...) {
  char buf[128];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buf, sizeof buf, format, args);
  va_end(args);
  return buf;
}

uint64_t Metric(const std::map<std::string, uint64_t>& m, const char* name) {
  const auto it = m.find(name);
  return it == m.end() ? 0 : it->second;
}

void PrintDelivery(const char* phase, const DeliveryFigures& d,
                   const std::map<std::string, uint64_t>& metrics) {
  std::printf(
      "  %s: %llu of %llu acknowledged posts reached the queue, %llu missing, %llu duplicates "
      "(of %llu socket and %llu spool posts), %llu of failed calls, %llu unexpected; body "
      "%.0f bytes; daemon published %llu, confirmed %llu, republished %llu, nacked %llu%s%s\n",
      phase, static_cast<unsigned long long>(d.arrived),
      static_cast<unsigned long long>(d.expected), static_cast<unsigned long long>(d.missing),
      static_cast<unsigned long long>(d.duplicates),
      static_cast<unsigned long long>(d.duplicated_socket_posts),
      static_cast<unsigned long long>(d.duplicated_spool_posts),
      static_cast<unsigned long long>(d.of_failed_calls),
      static_cast<unsigned long long>(d.unexpected), d.body_bytes_mean,
      static_cast<unsigned long long>(Metric(metrics, "published_total")),
      static_cast<unsigned long long>(Metric(metrics, "confirmed_total")),
      static_cast<unsigned long long>(Metric(metrics, "republished_total")),
      static_cast<unsigned long long>(Metric(metrics, "nacked_total")),
      d.drain_error.empty() ? "" : "; drain error: ", d.drain_error.c_str());
}

const char* TransportName(int transport) {
  switch (transport) {
    case POSTSPOOL_TRANSPORT_SOCKET: return "socket";
    case POSTSPOOL_TRANSPORT_SPOOL: return "spool";
    default: return "none";
  }
}

void PrintCalls(const char* what, const std::vector<FleetFigures::Call>& calls) {
  if (calls.empty()) return;
  std::printf("  %s:", what);
  for (const FleetFigures::Call& c : calls) {
    std::printf(" [%.1f ms (cpu %.1f ms, %d/%d vol/invol switches), %s, rc %d, process %d "
                "call %d at +%.0f ms%s%s]",
                c.latency_ms, c.cpu_ms, c.voluntary_switches, c.involuntary_switches,
                TransportName(c.transport), c.rc, c.process, c.index, c.start_ms,
                c.detail.empty() ? "" : ": ", c.detail.c_str());
  }
  std::printf("\n");
}

void PrintOverBudget(const FleetFigures& f) {
  if (f.budget_ms <= 0) return;
  if (f.via_socket > 0 && f.via_spool > 0) {
    std::printf("  spooled posts: %llu after waiting for the socket, %llu at once (under "
                "%.1f ms: the socket skipped or refused)\n",
                static_cast<unsigned long long>(f.via_spool - f.via_spool_quick),
                static_cast<unsigned long long>(f.via_spool_quick),
                FleetFigures::kQuickSpoolFraction * f.budget_ms);
  }
  std::printf("  calls over the %.0f ms budget: %llu (%llu of them never blocked: CPU and "
              "waiting for a CPU)\n",
              f.budget_ms, static_cast<unsigned long long>(f.over_budget),
              static_cast<unsigned long long>(f.over_budget_not_blocked));
}

void PrintErrors(const FleetFigures& f) {
  if (f.failed == 0 && f.not_run == 0 && f.failed_processes == 0) return;
  std::printf("  failures: %llu failed calls, %llu never made, %d processes exited badly;",
              static_cast<unsigned long long>(f.failed),
              static_cast<unsigned long long>(f.not_run), f.failed_processes);
  for (const auto& [rc, n] : f.errors) {
    std::printf(" %s x%llu", postspool_strerror(rc), static_cast<unsigned long long>(n));
  }
  std::printf("\n");
  PrintCalls("first failures", f.first_failures);
}

void LatencyJson(JsonWriter* j, std::string_view key, const LatencySummary& l) {
  j->Key(key).BeginObject();
  j->Field("count", l.count);
  j->Field("mean", l.mean_ms);
  j->Field("p50", l.p50_ms);
  j->Field("p90", l.p90_ms);
  j->Field("p99", l.p99_ms);
  j->Field("p999", l.p999_ms);
  j->Field("max", l.max_ms);
  j->EndObject();
}

void FleetJson(JsonWriter* j, std::string_view key, const FleetFigures& f) {
  j->Key(key).BeginObject();
  j->Field("processes", f.processes);
  j->Field("posts_per_process", f.posts_per_process);
  j->Field("posts", f.posts);
  j->Field("ok", f.ok);
  j->Field("failed", f.failed);
  j->Field("not_run", f.not_run);
  j->Field("failed_processes", f.failed_processes);
  j->Key("transports").BeginObject();
  j->Field("socket", f.via_socket);
  j->Field("spool", f.via_spool);
  j->Field("spool_quick", f.via_spool_quick);
  j->EndObject();
  j->Key("errors").BeginObject();
  for (const auto& [rc, n] : f.errors) j->Field(postspool_strerror(rc), n);
  j->EndObject();
  j->Field("seconds", f.seconds);
  j->Field("posts_per_s", f.posts_per_s);
  j->Field("children_cpu_s", f.children_cpu_s);
  j->Field("budget_ms", f.budget_ms);
  j->Field("over_budget", f.over_budget);
  j->Field("over_budget_not_blocked", f.over_budget_not_blocked);
  for (const auto& [name, calls] : {std::pair{"slowest_calls", &f.slowest},
                                    std::pair{"first_failures", &f.first_failures}}) {
    j->Key(name).BeginArray();
    for (const FleetFigures::Call& c : *calls) {
      j->BeginObject();
      j->Field("process", c.process);
      j->Field("index", c.index);
      j->Field("start_ms", c.start_ms);
      j->Field("latency_ms", c.latency_ms);
      j->Field("rc", c.rc);
      j->Field("transport", TransportName(c.transport));
      j->Field("cpu_ms", c.cpu_ms);
      j->Field("voluntary_switches", c.voluntary_switches);
      j->Field("involuntary_switches", c.involuntary_switches);
      j->Field("detail", c.detail);
      j->EndObject();
    }
    j->EndArray();
  }
  j->Key("latency_ms").BeginObject();
  LatencyJson(j, "all", f.latency_all);
  LatencyJson(j, "socket", f.latency_socket);
  LatencyJson(j, "spool", f.latency_spool);
  j->EndObject();
  j->EndObject();
}

void DeliveryJson(JsonWriter* j, const DeliveryFigures& d) {
  j->Key("delivery").BeginObject();
  j->Field("expected", d.expected);
  j->Field("arrived", d.arrived);
  j->Field("missing", d.missing);
  j->Field("duplicates", d.duplicates);
  j->Field("duplicated_socket_posts", d.duplicated_socket_posts);
  j->Field("duplicated_spool_posts", d.duplicated_spool_posts);
  j->Field("of_failed_calls", d.of_failed_calls);
  j->Field("unexpected", d.unexpected);
  j->Field("messages", d.messages);
  j->Field("body_bytes_mean", d.body_bytes_mean);
  j->Field("sample_routing_key", d.sample_routing_key);
  j->Field("drain_error", d.drain_error);
  j->EndObject();
}

void MetricsJson(JsonWriter* j, const std::map<std::string, uint64_t>& metrics) {
  j->Key("daemon_metrics").BeginObject();
  for (const auto& [name, value] : metrics) j->Field(name, value);
  j->EndObject();
}

}  // namespace

void PrintTable(const BenchResults& r) {
  const MachineInfo& m = r.machine;
  std::printf("\npostspool end-to-end benchmark: %ld cores (%s), %s, RabbitMQ %s, "
              "postspoold ingest backend %s, durability %s, post budget %u ms\n\n",
              m.nproc, m.cpu_model.c_str(), m.kernel.c_str(), m.rabbitmq_version.c_str(),
              m.daemon_io_backend.empty() ? "?" : m.daemon_io_backend.c_str(),
              r.flags.durability.c_str(), r.flags.budget_ms);
  std::printf("%-44s %8s %8s %10s %9s %9s %9s\n", "", "posts", "seconds", "posts/s", "p50 ms",
              "p99 ms", "max ms");
  if (r.ceiling.ran) {
    PrintRow(Label("broker ceiling (1 publisher, window %u)", r.ceiling.window).c_str(),
             r.ceiling.counters.acked, r.ceiling.seconds, r.ceiling.messages_per_s, nullptr);
    if (r.ceiling.like_for_like_messages != r.ceiling.messages) {
      PrintRow(Label("  same, its first %llu messages",
                     static_cast<unsigned long long>(r.ceiling.like_for_like_messages))
                   .c_str(),
               r.ceiling.like_for_like_messages, r.ceiling.like_for_like_seconds,
               r.ceiling.like_for_like_messages_per_s, nullptr);
    }
  }
  if (r.e2e.ran) {
    const FleetFigures& f = r.e2e.fleet;
    PrintRow(Label("postspool accept (%d procs x %d)", f.processes, f.posts_per_process).c_str(),
             f.ok, f.seconds, f.posts_per_s, &f.latency_all);
    PrintRow("  of which over the socket", f.via_socket, -1, -1, &f.latency_socket);
    PrintRow("  of which over the spool", f.via_spool, -1, -1, &f.latency_spool);
    PrintRow("postspool end to end (first post->in queue)", f.ok, r.e2e.queue_seconds,
             r.e2e.queue_posts_per_s, nullptr);
    PrintRow("  same, to daemon's confirmed_total (+100ms)", f.ok, r.e2e.confirmed_seconds,
             r.e2e.confirmed_posts_per_s, nullptr);
  }
  if (r.spool.ran) {
    const FleetFigures& f = r.spool.fleet;
    PrintRow(Label("spool fallback accept (%d procs x %d)", f.processes, f.posts_per_process)
                 .c_str(),
             f.ok, f.seconds, f.posts_per_s, &f.latency_all);
    PrintRow("spool adoption (daemon start->in queue)", f.ok, r.spool.queue_seconds,
             r.spool.queue_posts_per_s, nullptr);
    PrintRow("  same, to daemon's adopted_total (+100ms)", f.ok, r.spool.adopted_seconds,
             r.spool.adopted_posts_per_s, nullptr);
    PrintRow("  same, to daemon's confirmed_total (+100ms)", f.ok, r.spool.confirmed_seconds,
             r.spool.confirmed_posts_per_s, nullptr);
  }
  if (r.baseline.ran) {
    const FleetFigures& f = r.baseline.fleet;
    PrintRow(Label("connection per post (%d procs x %d)", f.processes, f.posts_per_process)
                 .c_str(),
             f.ok, f.seconds, f.posts_per_s, &f.latency_all);
  }
  std::printf("\n");
  if (r.ceiling.ran || !r.ceiling.error.empty()) {
    std::printf("  ceiling: %llu published, %llu acked, %llu nacked, %llu returned; queue held "
                "%u; body %.0f bytes, routing key %s%s%s\n",
                static_cast<unsigned long long>(r.ceiling.counters.published),
                static_cast<unsigned long long>(r.ceiling.counters.acked),
                static_cast<unsigned long long>(r.ceiling.counters.nacked),
                static_cast<unsigned long long>(r.ceiling.counters.returned),
                r.ceiling.queue_depth, r.ceiling.body_bytes_mean, r.ceiling.routing_key.c_str(),
                r.ceiling.error.empty() ? "" : "; error: ", r.ceiling.error.c_str());
  }
  if (r.e2e.ran || !r.e2e.error.empty()) {
    PrintDelivery("end to end", r.e2e.delivery, r.e2e.metrics);
    std::printf("  end to end: in the queue when the last client finished: %llu of %llu; "
                "daemon CPU %.2f s, clients CPU %.2f s; daemon start %.0f ms, exit status "
                "%d%s%s\n",
                static_cast<unsigned long long>(r.e2e.queued_at_last_post),
                static_cast<unsigned long long>(r.e2e.fleet.ok), r.e2e.daemon_cpu_s,
                r.e2e.fleet.children_cpu_s, r.e2e.daemon_start_ms, r.e2e.daemon_exit,
                r.e2e.error.empty() ? "" : "; error: ", r.e2e.error.c_str());
    PrintErrors(r.e2e.fleet);
    PrintOverBudget(r.e2e.fleet);
    PrintCalls("slowest calls", r.e2e.fleet.slowest);
  }
  if (r.spool.ran || !r.spool.error.empty()) {
    std::printf("  spool: %llu files, %llu bytes after the clients; %llu files left after "
                "adoption; daemon CPU %.2f s; daemon start %.0f ms, exit status %d%s%s\n",
                static_cast<unsigned long long>(r.spool.spool_files),
                static_cast<unsigned long long>(r.spool.spool_bytes),
                static_cast<unsigned long long>(r.spool.spool_files_left), r.spool.daemon_cpu_s,
                r.spool.daemon_start_ms, r.spool.daemon_exit,
                r.spool.error.empty() ? "" : "; error: ", r.spool.error.c_str());
    PrintDelivery("spool", r.spool.delivery, r.spool.metrics);
    PrintErrors(r.spool.fleet);
    PrintOverBudget(r.spool.fleet);
    PrintCalls("slowest calls", r.spool.fleet.slowest);
  }
  if (r.baseline.ran || !r.baseline.error.empty()) {
    std::printf("  connection per post: %llu acked, queue held %u%s%s\n",
                static_cast<unsigned long long>(r.baseline.fleet.ok), r.baseline.queue_depth,
                r.baseline.error.empty() ? "" : "; error: ", r.baseline.error.c_str());
    PrintErrors(r.baseline.fleet);
  }
  std::printf("  whole run %.1f s (RabbitMQ start %.1f s, warm-up %d messages at %.0f/s); "
              "load average before %s, after %s; JSON in %s\n",
              r.total_seconds, m.broker_start_s, r.flags.warmup_messages,
              r.ceiling.warmup_messages_per_s, m.loadavg_before.c_str(), m.loadavg_after.c_str(),
              r.flags.json_path.c_str());
}

std::string ResultsJson(const BenchResults& r) {
  JsonWriter j;
  j.BeginObject();
  j.Field("benchmark", "postspool e2e_bench");
  j.Key("machine").BeginObject();
  j.Field("nproc", r.machine.nproc);
  j.Field("kernel", r.machine.kernel);
  j.Field("cpu_model", r.machine.cpu_model);
  j.Field("mem_total", r.machine.mem_total);
  j.Field("rabbitmq_version", r.machine.rabbitmq_version);
  j.Field("rabbitmq_platform", r.machine.rabbitmq_platform);
  j.Field("librabbitmq_version", r.machine.librabbitmq_version);
  j.Field("postspoold", r.machine.postspoold_path);
  j.Field("daemon_io_backend", r.machine.daemon_io_backend);
  j.Field("started_utc", r.machine.started_utc);
  j.Field("broker_start_s", r.machine.broker_start_s);
  j.Field("loadavg_before", r.machine.loadavg_before);
  j.Field("loadavg_after", r.machine.loadavg_after);
  j.EndObject();

  j.Key("config").BeginObject();
  j.Field("ceiling_messages", r.flags.ceiling_messages);
  j.Field("ceiling_window", r.flags.ceiling_window);
  j.Field("warmup_messages", r.flags.warmup_messages);
  j.Field("clients", r.flags.clients);
  j.Field("posts_per_client", r.flags.posts_per_client);
  j.Field("spool_clients", r.flags.spool_clients);
  j.Field("spool_posts_per_client", r.flags.spool_posts_per_client);
  j.Field("baseline_processes", r.flags.baseline_processes);
  j.Field("baseline_posts_per_process", r.flags.baseline_posts_per_process);
  j.Field("budget_ms", r.flags.budget_ms);
  j.Field("io_backend", r.flags.io_backend);
  j.Field("durability", r.flags.durability);
  j.Key("daemon_config").BeginArray();
  for (const std::string& line : r.flags.daemon_config) j.Value(line);
  j.EndArray();
  j.Field("drain_timeout_s", r.flags.drain_timeout_s);
  j.Field("poll_interval_ms", r.poll_interval_ms);
  j.Field("metrics_resolution_ms", r.metrics_resolution_ms);
  j.EndObject();

  j.Key("broker_ceiling").BeginObject();
  j.Field("ran", r.ceiling.ran);
  j.Field("error", r.ceiling.error);
  j.Field("messages", r.ceiling.messages);
  j.Field("window", r.ceiling.window);
  j.Field("published", r.ceiling.counters.published);
  j.Field("acked", r.ceiling.counters.acked);
  j.Field("nacked", r.ceiling.counters.nacked);
  j.Field("returned", r.ceiling.counters.returned);
  j.Field("queue_depth", r.ceiling.queue_depth);
  j.Field("seconds", r.ceiling.seconds);
  j.Field("messages_per_s", r.ceiling.messages_per_s);
  j.Field("body_bytes_mean", r.ceiling.body_bytes_mean);
  j.Field("routing_key", r.ceiling.routing_key);
  j.Field("warmup_messages", r.flags.warmup_messages);
  j.Field("warmup_messages_per_s", r.ceiling.warmup_messages_per_s);
  j.Field("like_for_like_messages", r.ceiling.like_for_like_messages);
  j.Field("like_for_like_seconds", r.ceiling.like_for_like_seconds);
  j.Field("like_for_like_messages_per_s", r.ceiling.like_for_like_messages_per_s);
  j.Key("progress_columns").BeginArray(true).Value("confirmed").Value("seconds").EndArray();
  j.Key("progress").BeginArray();
  for (const auto& [n, seconds] : r.ceiling.progress) {
    j.BeginArray(true).Value(n).Value(seconds).EndArray();
  }
  j.EndArray();
  j.EndObject();

  j.Key("postspool_end_to_end").BeginObject();
  j.Field("ran", r.e2e.ran);
  j.Field("error", r.e2e.error);
  j.Field("complete", r.e2e.complete);
  j.Field("daemon_start_ms", r.e2e.daemon_start_ms);
  FleetJson(&j, "accept", r.e2e.fleet);
  j.Field("confirmed_seconds", r.e2e.confirmed_seconds);
  j.Field("confirmed_posts_per_s", r.e2e.confirmed_posts_per_s);
  j.Field("queue_seconds", r.e2e.queue_seconds);
  j.Field("queue_posts_per_s", r.e2e.queue_posts_per_s);
  j.Field("queued_at_last_post", r.e2e.queued_at_last_post);
  j.Field("daemon_cpu_s", r.e2e.daemon_cpu_s);
  j.Field("daemon_exit_status", r.e2e.daemon_exit);
  DeliveryJson(&j, r.e2e.delivery);
  MetricsJson(&j, r.e2e.metrics);
  // [ms since the first post, accepted, adopted, confirmed, queue depth],
  // at most ~400 rows.
  j.Key("series_columns").BeginArray(true);
  for (const char* c : {"t_ms", "accepted", "adopted", "confirmed", "queue_depth"}) j.Value(c);
  j.EndArray();
  j.Key("series").BeginArray();
  const size_t step = std::max<size_t>(1, r.e2e.series.size() / 400);
  for (size_t i = 0; i < r.e2e.series.size(); i += step) {
    const ProgressSample& s = r.e2e.series[i];
    j.BeginArray(true);
    j.Value(Seconds(s.t_ns - r.e2e.series_origin_ns) * 1e3);
    j.Value(s.accepted).Value(s.adopted).Value(s.confirmed).Value(s.queue_depth);
    j.EndArray();
  }
  j.EndArray();
  j.EndObject();

  j.Key("spool_fallback").BeginObject();
  j.Field("ran", r.spool.ran);
  j.Field("error", r.spool.error);
  j.Field("complete", r.spool.complete);
  FleetJson(&j, "accept", r.spool.fleet);
  j.Field("spool_files", r.spool.spool_files);
  j.Field("spool_bytes", r.spool.spool_bytes);
  j.Field("daemon_start_ms", r.spool.daemon_start_ms);
  j.Field("adopted_seconds", r.spool.adopted_seconds);
  j.Field("adopted_posts_per_s", r.spool.adopted_posts_per_s);
  j.Field("confirmed_seconds", r.spool.confirmed_seconds);
  j.Field("confirmed_posts_per_s", r.spool.confirmed_posts_per_s);
  j.Field("queue_seconds", r.spool.queue_seconds);
  j.Field("queue_posts_per_s", r.spool.queue_posts_per_s);
  j.Field("daemon_cpu_s", r.spool.daemon_cpu_s);
  j.Field("spool_files_left", r.spool.spool_files_left);
  j.Field("daemon_exit_status", r.spool.daemon_exit);
  DeliveryJson(&j, r.spool.delivery);
  MetricsJson(&j, r.spool.metrics);
  j.EndObject();

  j.Key("per_post_connection").BeginObject();
  j.Field("ran", r.baseline.ran);
  j.Field("error", r.baseline.error);
  FleetJson(&j, "posts", r.baseline.fleet);
  j.Field("queue_depth", r.baseline.queue_depth);
  j.EndObject();

  // The figures plot.py draws.
  j.Key("summary").BeginObject();
  j.Key("posts_per_s").BeginObject();
  j.Field("broker_ceiling", r.ceiling.messages_per_s);
  j.Field("broker_ceiling_like_for_like", r.ceiling.like_for_like_messages_per_s);
  j.Field("postspool_end_to_end", r.e2e.queue_posts_per_s);
  j.Field("postspool_accept", r.e2e.fleet.posts_per_s);
  j.Field("spool_accept", r.spool.fleet.posts_per_s);
  j.Field("spool_adopt_and_publish", r.spool.queue_posts_per_s);
  j.Field("per_post_connection", r.baseline.fleet.posts_per_s);
  j.EndObject();
  j.Key("latency_ms").BeginObject();
  LatencyJson(&j, "postspool_socket", r.e2e.fleet.latency_socket);
  LatencyJson(&j, "postspool_all", r.e2e.fleet.latency_all);
  LatencyJson(&j, "spool", r.spool.fleet.latency_spool);
  LatencyJson(&j, "per_post_connection", r.baseline.fleet.latency_all);
  j.EndObject();
  j.EndObject();
  j.EndObject();

  return j.text();
}

}  // namespace postspool::bench
