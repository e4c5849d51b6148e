// A main() for the fuzz targets in builds without libFuzzer: runs every file
// named on the command line, and every file in every directory named (not
// recursively, in name order), through LLVMFuzzerTestOneInput once. So the
// ordinary and sanitizer builds replay the seed corpus as a regression test,
// and a crash-* file saved by a fuzz run can be reproduced without clang:
//   replay_fuzz_segment_reader /tmp/crash-0123abcd
// Exits 1 if it found no input at all (a missing corpus must not pass).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <system_error>
#include <vector>

#include "fuzz_check.h"

namespace {

bool ReadFile(const std::filesystem::path& path, std::vector<uint8_t>* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return !in.bad();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::error_code ec;
    if (std::filesystem::is_directory(arg, ec)) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::directory_iterator(arg, ec)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      if (ec) {
        std::fprintf(stderr, "cannot list %s: %s\n", argv[i], ec.message().c_str());
        return 1;
      }
      std::sort(files.begin(), files.end());
      inputs.insert(inputs.end(), files.begin(), files.end());
    } else {
      inputs.push_back(arg);
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "usage: %s <corpus dir or input file>...: no inputs found\n", argv[0]);
    return 1;
  }
  std::vector<uint8_t> data;
  for (const auto& path : inputs) {
    if (!ReadFile(path, &data)) {
      std::fprintf(stderr, "cannot read %s\n", path.c_str());
      return 1;
    }
    std::fprintf(stderr, "running %s (%zu bytes)\n", path.c_str(), data.size());
    // Each input in a buffer of its exact size, as libFuzzer does, so that
    // AddressSanitizer catches a read one past the end.
    const std::unique_ptr<uint8_t[]> exact(new uint8_t[data.size()]);
    std::copy(data.begin(), data.end(), exact.get());
    LLVMFuzzerTestOneInput(exact.get(), data.size());
  }
  std::printf("%zu inputs ran\n", inputs.size());
  return 0;
}
