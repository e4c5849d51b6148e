// postspoold: the ingest loop (socket requests and adopted spool segments
// into the journal, group-committed, acknowledged once journaled at the
// configured durability) and its forwarder thread (journal to broker).
#pragma once

#include <memory>

#include "config.h"
#include "status.h"

namespace postspool::daemon {

// Runs until SIGTERM or SIGINT: then stops accepting, journals and
// acknowledges what it has, lets the forwarder publish what is journaled (up
// to shutdown_drain_ms), and returns ok. Errors that stop it from starting
// are returned with a message that says what to fix.
Status RunDaemon(const Config& config);

}  // namespace postspool::daemon
