#include "segment_format.h"

#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstring>

#include "little_endian.h"

namespace postspool::segment {
namespace {

constexpr uint64_t kMaskDelta = 0xa282ead85f8f8c1dULL;

uint64_t HeaderChecksum(std::span<const std::byte, kHeaderBytes> h) {
  return MaskChecksum(XXH3_64bits(h.data(), kHeaderChecksumOffset));
}

}  // namespace

uint64_t MaskChecksum(uint64_t raw) {
  return ((raw >> 17) | (raw << 47)) + kMaskDelta;
}

uint64_t UnmaskChecksum(uint64_t masked) {
  uint64_t rot = masked - kMaskDelta;
  return (rot << 17) | (rot >> 47);
}

Header NewHeader(uint64_t segment_id) {
  Header h;
  h.segment_id = segment_id;
  h.created_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  h.creator_uid = ::geteuid();
  h.creator_gid = ::getegid();
  h.creator_pid = static_cast<uint32_t>(::getpid());
  char host[kHostBytes] = {};
  if (::gethostname(host, sizeof host - 1) == 0) h.host = host;
  return h;
}

void EncodeHeader(const Header& header, std::span<std::byte, kHeaderBytes> out) {
  std::fill(out.begin(), out.end(), std::byte{0});
  std::byte* p = out.data();
  std::memcpy(p, kMagic.data(), kMagic.size());
  StoreLe16(p + 8, header.format_version);
  StoreLe16(p + 10, static_cast<uint16_t>(kHeaderBytes));
  StoreLe64(p + 16, header.segment_id);
  StoreLe64(p + 24, static_cast<uint64_t>(header.created_unix_ns));
  StoreLe32(p + 32, header.creator_uid);
  StoreLe32(p + 36, header.creator_gid);
  StoreLe32(p + 40, header.creator_pid);
  std::memcpy(p + 48, header.host.data(), std::min(header.host.size(), kHostBytes - 1));
  StoreLe64(p + kHeaderChecksumOffset, HeaderChecksum(out));
  StoreLe32(p + kFlagsOffset, header.flags);
}

Status DecodeHeader(std::span<const std::byte, kHeaderBytes> in, Header* header) {
  const std::byte* p = in.data();
  if (std::memcmp(p, kMagic.data(), kMagic.size()) != 0) {
    return Status(StatusCode::kCorruption, "not a postspool segment (bad magic)");
  }
  if (LoadLe64(p + kHeaderChecksumOffset) != HeaderChecksum(in)) {
    return Status(StatusCode::kCorruption, "segment header checksum mismatch");
  }
  const uint16_t version = LoadLe16(p + 8);
  if (version != kFormatVersion) {
    return Status(StatusCode::kUnsupported,
                  "segment format version " + std::to_string(version) +
                      " is not supported (this reader knows version " +
                      std::to_string(kFormatVersion) + ")");
  }
  if (LoadLe16(p + 10) != kHeaderBytes) {
    return Status(StatusCode::kCorruption, "segment header size field is wrong");
  }
  header->format_version = version;
  header->segment_id = LoadLe64(p + 16);
  header->created_unix_ns = static_cast<int64_t>(LoadLe64(p + 24));
  header->creator_uid = LoadLe32(p + 32);
  header->creator_gid = LoadLe32(p + 36);
  header->creator_pid = LoadLe32(p + 40);
  const char* host = reinterpret_cast<const char*>(p + 48);
  header->host.assign(host, strnlen(host, kHostBytes - 1));
  header->flags = LoadLe32(p + kFlagsOffset);
  return Status::Ok();
}

Status AppendRecord(std::span<const std::byte> payload, std::vector<std::byte>* out) {
  if (payload.size() > kRecordPayloadMax) {
    return Status(StatusCode::kTooLarge, "record payload of " + std::to_string(payload.size()) +
                                             " bytes exceeds the maximum of " +
                                             std::to_string(kRecordPayloadMax));
  }
  const size_t start = out->size();
  out->resize(start + RecordBytes(payload.size()), std::byte{0});
  std::byte* rec = out->data() + start;
  StoreLe32(rec + 8, kRecordMarker);
  StoreLe32(rec + 12, static_cast<uint32_t>(payload.size()));
  if (!payload.empty()) std::memcpy(rec + kRecordHeaderBytes, payload.data(), payload.size());
  const size_t covered = RecordBytes(payload.size()) - 8;
  StoreLe64(rec, MaskChecksum(XXH3_64bits(rec + 8, covered)));
  return Status::Ok();
}

FrameCheck CheckFrame(std::span<const std::byte> bytes, uint32_t payload_max,
                      uint32_t* payload_bytes) {
  if (bytes.size() < kRecordHeaderBytes) return FrameCheck::kTruncated;
  const std::byte* rec = bytes.data();
  if (LoadLe32(rec + 8) != kRecordMarker) return FrameCheck::kBadMarker;
  const uint32_t len = LoadLe32(rec + 12);
  if (len > payload_max) return FrameCheck::kBadLength;
  const size_t total = RecordBytes(len);
  if (bytes.size() < total) return FrameCheck::kTruncated;
  if (UnmaskChecksum(LoadLe64(rec)) != XXH3_64bits(rec + 8, total - 8)) {
    return FrameCheck::kChecksumMismatch;
  }
  *payload_bytes = len;
  return FrameCheck::kValid;
}

}  // namespace postspool::segment
