// Fixed-width little-endian loads and stores for on-disk structures. Written
// byte by byte so they are correct on any host and on unaligned addresses;
// compilers turn them into single moves on little-endian machines.
#pragma once

#include <cstddef>
#include <cstdint>

namespace postspool {

inline void StoreLe16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = std::byte(v >> (8 * i));
}
inline void StoreLe32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = std::byte(v >> (8 * i));
}
inline void StoreLe64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = std::byte(v >> (8 * i));
}
inline uint16_t LoadLe16(const std::byte* p) {
  return uint16_t(uint16_t(p[0]) | uint16_t(uint16_t(p[1]) << 8));
}
inline uint32_t LoadLe32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(p[i]) << (8 * i);
  return v;
}
inline uint64_t LoadLe64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

}  // namespace postspool
