// The client <-> daemon protocol on the SOCK_SEQPACKET socket: one request
// per packet, one acknowledgement per request. FORMAT.md ("Socket
// protocol") is the specification.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "segment_format.h"

namespace postspool::wire {

inline constexpr uint32_t kRequestMagic = 0x51525350;  // bytes "PSRQ"
inline constexpr uint32_t kAckMagic = 0x4b415350;      // bytes "PSAK"
inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kRequestHeaderBytes = 16;
inline constexpr size_t kAckBytes = 24;
// The largest request packet the daemon receives; larger ones are refused.
inline constexpr size_t kRequestBytesMax = 256 * 1024;
inline constexpr uint16_t kRecordsPerRequestMax = 1024;

enum class AckStatus : uint16_t {
  kAccepted = 0,      // journaled at the daemon's durability level
  kMalformed = 1,     // the request or one of its records is damaged; nothing of it was taken
  kFull = 2,          // disk_bytes_max is reached: fail the post (do not spool it)
  kShuttingDown = 3,  // the daemon is stopping; use the spool
  kUnavailable = 4,   // the journal cannot be written (I/O error); use the spool
  kBusy = 5,          // the group-commit batch is full (the journal is slow); use the spool
};

struct RequestHeader {
  uint16_t version = kProtocolVersion;
  uint16_t record_count = 0;
  uint64_t request_id = 0;
};

struct Ack {
  AckStatus status = AckStatus::kAccepted;
  uint64_t request_id = 0;
  uint32_t records = 0;  // records taken from the request (all or none)
  // An accepted ring request: the System V shared memory id of the ring.
  uint32_t ring_id = 0;
};

void EncodeRequestHeader(const RequestHeader& h, std::span<std::byte, kRequestHeaderBytes> out);
// False if the packet is too short, the magic is wrong or the version unknown.
bool DecodeRequestHeader(std::span<const std::byte> packet, RequestHeader* h);

void EncodeAck(const Ack& ack, std::span<std::byte, kAckBytes> out);
bool DecodeAck(std::span<const std::byte> packet, Ack* ack);

const char* AckStatusName(AckStatus status);

}  // namespace postspool::wire
