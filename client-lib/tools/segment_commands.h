// `postspool inspect` and `postspool verify`: looking inside spool and
// journal segments (format/FORMAT.md) without the daemon. Both read through
// SegmentReader, so they see exactly what the daemon would: the same valid
// records, the same damaged ranges with the same reasons, the same torn tail.
#pragma once

#include <string_view>

namespace postspool::cli {

// postspool inspect [--table] FILE: every record with its offset, as a v03
// JSON line (the default) or a table row, and every damaged range with its
// reason. Exit 0 when the file was read (damage or not: it is shown), 1 when
// it could not be read, 2 for a usage error.
int RunInspect(std::string_view name, int argc, char** argv);

// postspool verify [--json] [--repair [--quarantine-dir DIR] [--force]]
// DIR|FILE: for every segment, the good records, the damaged ranges, sealed
// or not. Exit 0 when nothing is damaged, 1 when something is (repaired or
// not), 2 for a usage error.
int RunVerify(std::string_view name, int argc, char** argv);

}  // namespace postspool::cli
