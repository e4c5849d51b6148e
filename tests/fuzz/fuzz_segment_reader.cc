// Fuzz target: the input is a whole segment file. Most random inputs fail
// the header checksum; this target pins down that such files are rejected
// cleanly, and reads the ones that open (the seed corpus holds valid
// segments) to the end under every reader invariant. fuzz_segment_records
// explores the records behind a valid header.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_check.h"
#include "segment_invariants.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  postspool::fuzz::ReadSegmentChecked(file, postspool::fuzz::SegmentReadOptions{});
  return 0;
}
