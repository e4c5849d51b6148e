// What every fuzz target shares: the libFuzzer entry point it defines, and
// FUZZ_CHECK, the always-on assertion for an invariant of the code under test.
//
// A violated invariant is a bug in format/, so FUZZ_CHECK traps (libFuzzer
// then saves the input as crash-<sha1>); it is never used to reject input.
// Bad input is simply read and must be handled by the code under test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#define FUZZ_CHECK(cond)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "%s:%d: invariant violated: %s\n", __FILE__, __LINE__, \
                   #cond);                                                      \
      __builtin_trap();                                                         \
    }                                                                           \
  } while (0)
