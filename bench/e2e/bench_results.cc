#include "bench_results.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "postspool.h"
#include "sample_post.h"

namespace postspool::bench {

FleetFigures Figures(const ProcessFleet& fleet, double budget_ms) {
  FleetFigures f;
  f.budget_ms = budget_ms;
  f.processes = fleet.processes();
  f.posts_per_process = fleet.posts_per_process();
  f.posts = fleet.total();
  f.failed_processes = fleet.failed_processes();
  f.children_cpu_s = fleet.children_cpu_s();
  std::vector<int64_t> all, socket, spool;
  for (const PostOutcome& o : fleet.outcomes()) {
    if (o.rc == PostOutcome::kNotRun) {
      ++f.not_run;
      continue;
    }
    all.push_back(o.latency_ns);
    if (o.rc != 0) {
      ++f.failed;
      ++f.errors[o.rc];
      continue;
    }
    ++f.ok;
    if (o.transport == POSTSPOOL_TRANSPORT_SOCKET) {
      ++f.via_socket;
      socket.push_back(o.latency_ns);
    } else if (o.transport == POSTSPOOL_TRANSPORT_SPOOL) {
      ++f.via_spool;
      spool.push_back(o.latency_ns);
      if (budget_ms > 0 &&
          static_cast<double>(o.latency_ns) < FleetFigures::kQuickSpoolFraction * budget_ms * 1e6) {
        ++f.via_spool_quick;
      }
    }
  }
  const int64_t first = fleet.first_start_ns();
  auto call = [&](size_t i) {
    const PostOutcome& o = fleet.outcomes()[i];
    FleetFigures::Call c;
    c.process = static_cast<int>(i / static_cast<size_t>(fleet.posts_per_process()));
    c.index = static_cast<int>(i % static_cast<size_t>(fleet.posts_per_process()));
    c.start_ms = static_cast<double>(o.start_ns - first) / 1e6;
    c.latency_ms = static_cast<double>(o.latency_ns) / 1e6;
    c.rc = o.rc;
    c.transport = o.transport;
    c.cpu_ms = static_cast<double>(o.cpu_ns) / 1e6;
    c.voluntary_switches = o.voluntary_switches;
    c.involuntary_switches = o.involuntary_switches;
    c.detail.assign(o.detail, ::strnlen(o.detail, sizeof o.detail));
    return c;
  };
  std::vector<size_t> ran;
  for (size_t i = 0; i < fleet.total(); ++i) {
    const PostOutcome& o = fleet.outcomes()[i];
    if (o.rc == PostOutcome::kNotRun) continue;
    ran.push_back(i);
    if (budget_ms > 0 && static_cast<double>(o.latency_ns) > budget_ms * 1e6) {
      ++f.over_budget;
      if (o.voluntary_switches == 0) ++f.over_budget_not_blocked;
    }
    if (o.rc != 0 && f.first_failures.size() < FleetFigures::kSlowestCalls) {
      f.first_failures.push_back(call(i));
    }
  }
  const size_t n = std::min(ran.size(), FleetFigures::kSlowestCalls);
  std::partial_sort(ran.begin(), ran.begin() + static_cast<std::ptrdiff_t>(n), ran.end(),
                    [&](size_t a, size_t b) {
                      return fleet.outcomes()[a].latency_ns > fleet.outcomes()[b].latency_ns;
                    });
  for (size_t k = 0; k < n; ++k) f.slowest.push_back(call(ran[k]));
  const int64_t span = fleet.last_end_ns() - fleet.first_start_ns();
  f.seconds = Seconds(span);
  f.posts_per_s = PerSecond(f.ok, span);
  f.latency_all = Summarize(std::move(all));
  f.latency_socket = Summarize(std::move(socket));
  f.latency_spool = Summarize(std::move(spool));
  return f;
}

DeliveryFigures CheckDelivery(const ProcessFleet& fleet, const std::string& queue,
                              testing::AmqpTestClient* consumer) {
  DeliveryFigures d;
  std::map<PostId, int> seen;
  std::map<PostId, int> transport;
  std::map<PostId, int> failed;
  for (const PostOutcome& o : fleet.outcomes()) {
    if (o.rc == PostOutcome::kNotRun) continue;
    if (o.rc != 0) {
      failed.emplace(PostIdFromBytes(o.id), 0);
      continue;
    }
    seen.emplace(PostIdFromBytes(o.id), 0);
    transport.emplace(PostIdFromBytes(o.id), o.transport);
  }
  d.expected = seen.size();
  double body_bytes = 0;
  // Everything was confirmed before this is called; a second pass only if
  // something is still missing.
  for (int pass = 0; pass < 3 && d.arrived < d.expected; ++pass) {
    if (pass > 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    std::vector<testing::ReceivedMessage> got;
    if (Status s = consumer->GetAll(queue, &got); !s.ok()) {
      d.drain_error = s.ToString();
      break;
    }
    for (const testing::ReceivedMessage& m : got) {
      ++d.messages;
      body_bytes += static_cast<double>(m.body.size());
      if (d.sample_routing_key.empty()) d.sample_routing_key = m.routing_key;
      PostId id;
      const bool parsed = ParseMessageIdText(m.message_id, &id);
      auto it = parsed ? seen.find(id) : seen.end();
      if (it == seen.end()) {
        ++(parsed && failed.count(id) ? d.of_failed_calls : d.unexpected);
      } else if (++it->second == 1) {
        ++d.arrived;
      } else {
        ++d.duplicates;
      }
    }
  }
  d.missing = d.expected - d.arrived;
  for (const auto& [id, n] : seen) {
    if (n < 2) continue;
    if (transport[id] == POSTSPOOL_TRANSPORT_SPOOL) ++d.duplicated_spool_posts;
    if (transport[id] == POSTSPOOL_TRANSPORT_SOCKET) ++d.duplicated_socket_posts;
  }
  d.body_bytes_mean = d.messages > 0 ? body_bytes / static_cast<double>(d.messages) : 0;
  return d;
}

}  // namespace postspool::bench
