// The byte layout of segment files and records: constants, the header codec
// and the record codec. FORMAT.md is the specification; this file must agree
// with it, and the tests in tests/segment_format_test.cc pin the bytes.
//
// Used by both the spool (many client processes append) and the daemon's
// journal (one writer). Nothing here does I/O.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "status.h"

namespace postspool::segment {

// "\x89PSSEG\r\n": the high bit and the CR LF catch 7-bit and text-mode
// mangling, as in PNG.
inline constexpr std::array<std::byte, 8> kMagic = {
    std::byte{0x89}, std::byte{'P'}, std::byte{'S'}, std::byte{'S'},
    std::byte{'E'},  std::byte{'G'}, std::byte{'\r'}, std::byte{'\n'}};
inline constexpr uint16_t kFormatVersion = 1;
inline constexpr size_t kHeaderBytes = 128;
inline constexpr size_t kHostBytes = 64;
inline constexpr size_t kHeaderChecksumOffset = 112;
inline constexpr size_t kFlagsOffset = 120;

// Header flags. Flags are not covered by the header checksum: sealing
// rewrites them in place. Unknown flag bits are ignored by readers.
inline constexpr uint32_t kFlagSealed = 1u << 0;

// Record framing: [u64 masked checksum][u32 marker][u32 payload length]
// [payload][zero padding to a multiple of 8]. The checksum covers every byte
// after itself: marker, length, payload and padding.
inline constexpr uint32_t kRecordMarker = 0x43525350;  // bytes "PSRC"
inline constexpr size_t kRecordHeaderBytes = 16;
inline constexpr size_t kRecordAlign = 8;
// The largest payload a writer may produce and a reader accepts.
inline constexpr uint32_t kRecordPayloadMax = 64 * 1024;

struct Header {
  uint16_t format_version = kFormatVersion;
  uint64_t segment_id = 0;
  int64_t created_unix_ns = 0;
  uint32_t creator_uid = 0;
  uint32_t creator_gid = 0;
  uint32_t creator_pid = 0;
  std::string host;  // at most kHostBytes - 1 bytes; longer is cut
  uint32_t flags = 0;

  bool sealed() const { return (flags & kFlagSealed) != 0; }
};

// A header for a new segment written by this process: uid, gid, pid, host
// and creation time filled in, segment_id as given.
Header NewHeader(uint64_t segment_id);

void EncodeHeader(const Header& header, std::span<std::byte, kHeaderBytes> out);
// kCorruption for a bad magic or checksum, kUnsupported for a newer format
// version; the message says which.
Status DecodeHeader(std::span<const std::byte, kHeaderBytes> in, Header* header);

// Masking as in LevelDB: a checksum stored in data that is itself
// checksummed (a segment inside a record, say) would otherwise make
// degenerate checksums likely.
uint64_t MaskChecksum(uint64_t raw);
uint64_t UnmaskChecksum(uint64_t masked);

constexpr size_t PaddedPayloadBytes(size_t payload_bytes) {
  return (payload_bytes + kRecordAlign - 1) & ~(kRecordAlign - 1);
}
// Bytes a record with this payload occupies in a segment.
constexpr size_t RecordBytes(size_t payload_bytes) {
  return kRecordHeaderBytes + PaddedPayloadBytes(payload_bytes);
}

// Appends one framed record to `out`. kTooLarge if the payload exceeds
// kRecordPayloadMax; `out` is then unchanged.
Status AppendRecord(std::span<const std::byte> payload, std::vector<std::byte>* out);

enum class FrameCheck {
  kValid,             // marker, length and checksum are right
  kBadMarker,         // not a record boundary
  kBadLength,         // length above the payload maximum
  kTruncated,         // the record would extend past the available bytes
  kChecksumMismatch,  // framing fits but the bytes are damaged
};
// Checks the framing of the record that starts at `bytes[0]`; `bytes` holds
// everything available from there. On kValid, *payload_bytes is the length.
FrameCheck CheckFrame(std::span<const std::byte> bytes, uint32_t payload_max,
                      uint32_t* payload_bytes);

}  // namespace postspool::segment
