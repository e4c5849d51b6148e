// Fuzz target: the input is one record payload. Whatever VerifyPostPayload
// accepts must be safe to read and encode (CheckVerifiedPost), and must
// survive ReadPost -> BuildPost -> VerifyPostPayload -> ReadPost unchanged.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz_check.h"
#include "post.h"
#include "post_invariants.h"
#include "segment_format.h"

namespace {

// Payloads are 8-byte aligned in memory when they come from SegmentReader;
// give the verifier the same (libFuzzer's buffer need not be).
std::span<const std::byte> CopyAligned(std::span<const std::byte> bytes,
                                       std::vector<uint64_t>* storage) {
  storage->assign((bytes.size() + 7) / 8, 0);
  if (!bytes.empty()) std::memcpy(storage->data(), bytes.data(), bytes.size());
  return {reinterpret_cast<const std::byte*>(storage->data()), bytes.size()};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace postspool;
  static std::vector<uint64_t> input_storage;
  const auto payload =
      CopyAligned({reinterpret_cast<const std::byte*>(data), size}, &input_storage);
  if (!VerifyPostPayload(payload)) return 0;
  fuzz::CheckVerifiedPost(payload);

  const PostData first = ReadPost(PostFromPayload(payload));
  flatbuffers::FlatBufferBuilder builder;
  BuildPost(first, &builder);
  const auto built = builder.GetBufferSpan();
  // A verified buffer may share one string between many fields, so its
  // rebuilt form can exceed a record; a Post that ValidatePost accepts never
  // does (post.h).
  if (ValidatePost(first).ok()) FUZZ_CHECK(built.size() <= segment::kRecordPayloadMax);
  if (built.size() > segment::kRecordPayloadMax) return 0;

  static std::vector<uint64_t> rebuilt_storage;
  const auto rebuilt = CopyAligned(std::as_bytes(built), &rebuilt_storage);
  FUZZ_CHECK(VerifyPostPayload(rebuilt));
  const PostData second = ReadPost(PostFromPayload(rebuilt));
  FUZZ_CHECK(first == second);
  fuzz::CheckVerifiedPost(rebuilt);
  return 0;
}
