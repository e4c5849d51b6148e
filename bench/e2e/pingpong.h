// The anchor of the post-call latency figures: a bare SOCK_SEQPACKET
// request/reply of the same sizes as a post and its ack, between client
// processes and one server process (as postspoold is one process), with the
// same CPU placement as the run it anchors. What the kernel alone costs for a
// round trip; a post call cannot be cheaper than this. It also reports the
// server's own CPU per round trip: the anchor of the daemon's CPU per post.
#pragma once

#include <string>

namespace postspool::bench {

struct PingPongOptions {
  int clients = 1;
  int round_trips = 10000;  // per client
  int request_bytes = 400;  // a post as the client sends it
  int reply_bytes = 32;     // the daemon's ack
  // "same": server and clients on CPU 0; "cross": clients on CPU 0, the
  // server on CPU 1; "none": wherever the scheduler puts them.
  std::string placement = "none";
};

// Runs it and returns its figures as a JSON object (latency percentiles in
// microseconds, round trips per second over all clients). Forks; call it
// before starting any thread.
std::string RunPingPong(const PingPongOptions& options);

}  // namespace postspool::bench
