// The two measurements of bench/shim/run.sh that need a program of their
// own:
//   shim_bench_tool write DIR FILES BYTES   writes FILES files of BYTES bytes
//                                           (open, write, close) in DIR, one
//                                           process; prints the wall seconds
//   shim_bench_tool checksum FILE           SHA-512 and MD5 of FILE with the
//                                           shim's own code (nettle); prints
//                                           milliseconds per MiB of each
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "file_identity.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

int Write(const std::string& dir, int files, size_t bytes) {
  const std::string content(bytes, 'x');
  const auto start = Clock::now();
  for (int i = 0; i < files; ++i) {
    const std::string path = dir + "/f" + std::to_string(i);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || ::write(fd, content.data(), content.size()) != static_cast<ssize_t>(bytes) ||
        ::close(fd) != 0) {
      std::perror(path.c_str());
      return 1;
    }
  }
  std::printf("%.6f\n", Seconds(start));
  return 0;
}

int Checksum(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size == 0) {
    std::perror(path);
    return 1;
  }
  const double mib = static_cast<double>(st.st_size) / (1 << 20);
  uint8_t digest[postspool::shim::kSha512Bytes];
  (void)postspool::shim::Md5OfFd(fd, digest);  // warm the page cache
  auto start = Clock::now();
  if (!postspool::shim::Sha512OfFd(fd, digest)) return 1;
  const double sha512_ms = Seconds(start) * 1000 / mib;
  start = Clock::now();
  if (!postspool::shim::Md5OfFd(fd, digest)) return 1;
  const double md5_ms = Seconds(start) * 1000 / mib;
  ::close(fd);
  std::printf("sha512 %.3f ms/MiB\nmd5 %.3f ms/MiB\n", sha512_ms, md5_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "write" && argc == 5) {
    return Write(argv[2], std::atoi(argv[3]), static_cast<size_t>(std::atol(argv[4])));
  }
  if (mode == "checksum" && argc == 3) return Checksum(argv[2]);
  std::fprintf(stderr, "usage: shim_bench_tool write DIR FILES BYTES | checksum FILE\n");
  return 2;
}
