// sim_run: the simulation from the command line, for long runs and replays.
//   sim_run --seeds N [--first S]   seeds S..S+N-1 (S defaults to 1)
//   sim_run --seed S [--verbose]    one seed, with its events on stderr
//   --checkpoint-every-move         store the checkpoint at every watermark
//                                   move (measures the coming forwarder)
//   --no-disk-full                  no full-disk periods (they stop the
//                                   checkpoint, which needs a new file)
// Exit status 1 if any seed failed an invariant other than the duplicate
// bound, 2 if only the duplicate bound failed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "simulation.h"

int main(int argc, char** argv) {
  using postspool::sim::SimOptions;
  uint64_t first = 1;
  uint64_t count = 100;
  bool every_move = false;
  bool verbose = false;
  bool no_disk_full = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> uint64_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(64);
      }
      return std::strtoull(argv[++i], nullptr, 10);
    };
    if (a == "--seeds") {
      count = value();
    } else if (a == "--seed") {
      first = value();
      count = 1;
    } else if (a == "--first") {
      first = value();
    } else if (a == "--checkpoint-every-move") {
      every_move = true;
    } else if (a == "--no-disk-full") {
      no_disk_full = true;
    } else if (a == "--verbose") {
      verbose = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--seeds N [--first S] | --seed S] [--checkpoint-every-move] "
                   "[--no-disk-full] [--verbose]\n",
                   argv[0]);
      return 64;
    }
  }
  std::vector<postspool::sim::SimResult> results;
  bool other = false;
  bool dups = false;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t s = first; s < first + count; ++s) {
    SimOptions o;
    o.seed = s;
    o.checkpoint_every_move = every_move;
    o.verbose = verbose;
    o.no_disk_full = no_disk_full;
    results.push_back(postspool::sim::RunSimulation(o));
    const auto& r = results.back();
    if (!r.ok()) {
      std::printf("%s", postspool::sim::DescribeFailure(r, o).c_str());
      std::fflush(stdout);
      if (!r.ok_except_duplicates()) other = true; else dups = true;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s(%.1f s of wall time%s)\n", postspool::sim::Summarize(results).c_str(), seconds,
              every_move ? "; checkpoint at every watermark move" : "");
  return other ? 1 : dups ? 2 : 0;
}
