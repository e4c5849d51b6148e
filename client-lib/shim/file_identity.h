// The identity (checksum) of a file's content, with nettle: no global state,
// no exit handlers, linked statically and hidden, so it is safe inside any
// host program.
#pragma once

#include <cstddef>
#include <cstdint>

namespace postspool::shim {

inline constexpr size_t kSha512Bytes = 64;
inline constexpr size_t kMd5Bytes = 16;

// Reads the file open on `fd` from offset 0 with pread and writes its
// SHA-512 or MD5 digest to `digest` (kSha512Bytes or kMd5Bytes). False if a
// read failed. Allocates nothing (a small stack buffer, then an anonymous
// mapping for files larger than it).
bool Sha512OfFd(int fd, uint8_t digest[kSha512Bytes]);
bool Md5OfFd(int fd, uint8_t digest[kMd5Bytes]);

}  // namespace postspool::shim
