// Micro-benchmarks of the forwarder's basic.publish: rabbitmq-c's
// amqp_basic_publish (three send() calls per post: method, header, body
// frames) against our encoder (daemon/forwarder/publish_frames.h) with one send() per
// forwarder round of kRound posts, as AmqpSession::AppendPublish and Flush
// do it. Both write to a socketpair whose other end a thread reads and
// throws away (a sink like /dev/null, which send() cannot write to).
//
//   build/bench/publish_bench [--benchmark_filter=Ours]
//
// Reports time per post (the iteration is one post) and items/s.
#include <amqp.h>
#include <amqp_tcp_socket.h>
#include <sys/socket.h>
#include <unistd.h>

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>

#include "amqp_properties.h"
#include "publish_frames.h"

namespace postspool::daemon {
namespace {

// The forwarder's posts per round (forwarder.cc, kPublishBatch).
constexpr int kRound = 64;
constexpr uint32_t kFrameMax = 131072;  // what AmqpSession asks for

// A typical v03 post of the LD_PRELOAD shim (about 470 bytes).
constexpr std::string_view kBody =
    R"({"pubTime":"20231114T221320.123456789","baseUrl":"sftp://dd.example.org/",)"
    R"("relPath":"data/model/run12/output/fields_0042.nc","integrity":{"method":"sha512",)"
    R"("value":"z4PhNX7vuL3xVChQ1m2AB9Yg8JdQ7QxZ0BfcdIGpzKeSbk2CJzXwr13mkD2OIQ1MZPjbDOs)"
    R"(Pm6CYlCTNDaQ0ttQ=="},"identity":{"method":"sha512","value":"z4PhNX7vuL3xVChQ1m)"
    R"(2AB9Yg8JdQ7QxZ0BfcdIGpzKeSbk2CJzXwr13mkD2OIQ1MZPjbDOsPm6CYlCTNDaQ0ttQ=="},)"
    R"("size":"1048576","mtime":"20231114T221319.5","atime":"20231114T221319.5",)"
    R"("mode":"644","source":"tsource"})";
constexpr std::string_view kExchange = "xs_tsource";
constexpr std::string_view kRoutingKey = "v03.data.model.run12.output";
constexpr std::string_view kMessageId = "01234567-89ab-4cde-8f01-23456789abcd";

amqp_bytes_t Bytes(std::string_view s) {
  return amqp_bytes_t{s.size(), const_cast<char*>(s.data())};
}

// A socketpair: writes go to fd(); once started, a thread reads the other
// end and drops the bytes.
class Sink {
 public:
  Sink() {
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv_) != 0) {
      std::perror("socketpair");
      std::abort();
    }
  }
  // Starts the thread that reads and drops everything written to fd().
  void Start() {
    reader_ = std::thread([fd = sv_[1]] {
      static char buf[1 << 16];
      while (::read(fd, buf, sizeof buf) > 0) {
      }
    });
  }
  ~Sink() {
    if (sv_[0] >= 0) ::close(sv_[0]);
    if (reader_.joinable()) reader_.join();
    ::close(sv_[1]);
  }
  int fd() const { return sv_[0]; }
  int peer_fd() const { return sv_[1]; }
  // rabbitmq-c closes it with its connection.
  void release() { sv_[0] = -1; }

 private:
  int sv_[2] = {-1, -1};
  std::thread reader_;
};

void BM_AmqpBasicPublish(benchmark::State& state) {
  Sink sink;
  amqp_connection_state_t conn = amqp_new_connection();
  amqp_socket_t* socket = amqp_tcp_socket_new(conn);
  amqp_tcp_socket_set_sockfd(socket, sink.fd());
  sink.release();
  // frame_max as AmqpSession's login negotiates it. rabbitmq-c tunes only a
  // connection that has read something: a protocol header (tests/daemon/
  // publish_frames_test.cc does the same).
  static constexpr char kProtocolHeader[8] = {'A', 'M', 'Q', 'P', 0, 0, 9, 1};
  amqp_frame_t frame;
  if (::write(sink.peer_fd(), kProtocolHeader, sizeof kProtocolHeader) != 8 ||
      amqp_simple_wait_frame(conn, &frame) != AMQP_STATUS_OK ||
      amqp_tune_connection(conn, 0, kFrameMax, 0) != AMQP_STATUS_OK) {
    state.SkipWithError("cannot tune the connection");
  }
  sink.Start();
  amqp_basic_properties_t props;
  std::memset(&props, 0, sizeof props);
  props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_CONTENT_ENCODING_FLAG |
                 AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG;
  props.content_type = Bytes(kPostContentType);
  props.content_encoding = Bytes(kPostContentEncoding);
  props.delivery_mode = kPostDeliveryMode;
  props.message_id = Bytes(kMessageId);
  for (auto _ : state) {
    if (amqp_basic_publish(conn, 1, Bytes(kExchange), Bytes(kRoutingKey), 0, 0, &props,
                           Bytes(kBody)) != AMQP_STATUS_OK) {
      state.SkipWithError("amqp_basic_publish failed");
      break;
    }
  }
  amqp_destroy_connection(conn);
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_AmqpBasicPublish);

PublishFrame Frame() {
  PublishFrame m;
  m.exchange = kExchange;
  m.routing_key = kRoutingKey;
  m.body = kBody;
  m.message_id = kMessageId;
  return m;
}

// Our encoder and one send() per round of kRound posts.
void BM_OursOneWritePerRound(benchmark::State& state) {
  Sink sink;
  sink.Start();
  const PublishFrame m = Frame();
  std::string pending;
  int in_round = 0;
  for (auto _ : state) {
    if (!AppendPublishFrames(m, kFrameMax, &pending).ok()) {
      state.SkipWithError("AppendPublishFrames failed");
      break;
    }
    if (++in_round == kRound) {
      size_t done = 0;
      while (done < pending.size()) {
        const ssize_t n = ::send(sink.fd(), pending.data() + done, pending.size() - done,
                                 MSG_NOSIGNAL);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      pending.clear();
      in_round = 0;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_OursOneWritePerRound);

// The encoding alone (no system call).
void BM_OursEncodeOnly(benchmark::State& state) {
  const PublishFrame m = Frame();
  std::string pending;
  int in_round = 0;
  for (auto _ : state) {
    if (!AppendPublishFrames(m, kFrameMax, &pending).ok()) {
      state.SkipWithError("AppendPublishFrames failed");
      break;
    }
    if (++in_round == kRound) {
      benchmark::DoNotOptimize(pending.data());
      pending.clear();
      in_round = 0;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_OursEncodeOnly);

}  // namespace
}  // namespace postspool::daemon

BENCHMARK_MAIN();
