#include "socket_protocol.h"

#include "little_endian.h"

namespace postspool::wire {

void EncodeRequestHeader(const RequestHeader& h, std::span<std::byte, kRequestHeaderBytes> out) {
  StoreLe32(out.data(), kRequestMagic);
  StoreLe16(out.data() + 4, h.version);
  StoreLe16(out.data() + 6, h.record_count);
  StoreLe64(out.data() + 8, h.request_id);
}

bool DecodeRequestHeader(std::span<const std::byte> packet, RequestHeader* h) {
  if (packet.size() < kRequestHeaderBytes) return false;
  if (LoadLe32(packet.data()) != kRequestMagic) return false;
  h->version = LoadLe16(packet.data() + 4);
  if (h->version != kProtocolVersion) return false;
  h->record_count = LoadLe16(packet.data() + 6);
  h->request_id = LoadLe64(packet.data() + 8);
  return true;
}

void EncodeAck(const Ack& ack, std::span<std::byte, kAckBytes> out) {
  StoreLe32(out.data(), kAckMagic);
  StoreLe16(out.data() + 4, kProtocolVersion);
  StoreLe16(out.data() + 6, static_cast<uint16_t>(ack.status));
  StoreLe64(out.data() + 8, ack.request_id);
  StoreLe32(out.data() + 16, ack.records);
  StoreLe32(out.data() + 20, ack.ring_id);
}

bool DecodeAck(std::span<const std::byte> packet, Ack* ack) {
  if (packet.size() != kAckBytes) return false;
  if (LoadLe32(packet.data()) != kAckMagic) return false;
  if (LoadLe16(packet.data() + 4) != kProtocolVersion) return false;
  const uint16_t status = LoadLe16(packet.data() + 6);
  if (status > static_cast<uint16_t>(AckStatus::kBusy)) return false;
  ack->status = static_cast<AckStatus>(status);
  ack->request_id = LoadLe64(packet.data() + 8);
  ack->records = LoadLe32(packet.data() + 16);
  ack->ring_id = LoadLe32(packet.data() + 20);
  return true;
}

const char* AckStatusName(AckStatus status) {
  switch (status) {
    case AckStatus::kAccepted: return "accepted";
    case AckStatus::kMalformed: return "malformed request";
    case AckStatus::kFull: return "daemon full (disk_bytes_max, or this user's disk_bytes_per_uid_max, reached)";
    case AckStatus::kShuttingDown: return "daemon shutting down";
    case AckStatus::kUnavailable: return "daemon journal unavailable";
    case AckStatus::kBusy: return "daemon busy";
  }
  return "unknown";
}

}  // namespace postspool::wire
