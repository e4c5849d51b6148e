#include "file_identity.h"

#include <nettle/md5.h>
#include <nettle/sha2.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

namespace postspool::shim {
namespace {

// Small files are read through a buffer on the stack (host threads may have
// small stacks, so it stays small); larger ones through a mapping of their
// own, never malloc (the host may have replaced it).
constexpr size_t kStackBufferBytes = 4096;
constexpr size_t kLargeBufferBytes = 256 * 1024;

template <typename Update>
bool ForEachChunk(int fd, Update update) {
  uint8_t small[kStackBufferBytes];
  uint8_t* buffer = small;
  size_t buffer_bytes = sizeof small;
  void* mapped = MAP_FAILED;
  off_t offset = 0;
  bool ok = true;
  for (;;) {
    const ssize_t n = ::pread(fd, buffer, buffer_bytes, offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ok = false;
      break;
    }
    if (n == 0) break;
    update(buffer, static_cast<size_t>(n));
    offset += n;
    if (mapped == MAP_FAILED && static_cast<size_t>(n) == buffer_bytes) {
      mapped = ::mmap(nullptr, kLargeBufferBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (mapped != MAP_FAILED) {
        buffer = static_cast<uint8_t*>(mapped);
        buffer_bytes = kLargeBufferBytes;
      }
    }
  }
  if (mapped != MAP_FAILED) ::munmap(mapped, kLargeBufferBytes);
  return ok;
}

}  // namespace

bool Sha512OfFd(int fd, uint8_t digest[kSha512Bytes]) {
  sha512_ctx ctx;
  sha512_init(&ctx);
  if (!ForEachChunk(fd, [&](const uint8_t* p, size_t n) { sha512_update(&ctx, n, p); })) {
    return false;
  }
  sha512_digest(&ctx, kSha512Bytes, digest);
  return true;
}

bool Md5OfFd(int fd, uint8_t digest[kMd5Bytes]) {
  md5_ctx ctx;
  md5_init(&ctx);
  if (!ForEachChunk(fd, [&](const uint8_t* p, size_t n) { md5_update(&ctx, n, p); })) {
    return false;
  }
  md5_digest(&ctx, kMd5Bytes, digest);
  return true;
}

}  // namespace postspool::shim
