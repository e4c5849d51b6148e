// The harness's report: a table for people (stdout) and every figure as
// JSON for plot.py and for comparing runs. README.md says what each figure
// means.
#pragma once

#include <string>

#include "bench_results.h"

namespace postspool::bench {

// Prints the table, and the notes under it, to stdout.
void PrintTable(const BenchResults& results);

// The JSON document: machine, configuration, every phase's figures, and a
// "summary" with the figures plot.py draws.
std::string ResultsJson(const BenchResults& results);

}  // namespace postspool::bench
