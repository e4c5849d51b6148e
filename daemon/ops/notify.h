// systemd's notification protocol (sd_notify), without libsystemd: a
// datagram to $NOTIFY_SOCKET. Does nothing when not started by systemd.
#pragma once

#include <cstdint>

namespace postspool::daemon {

void NotifySystemd(const char* state);
// The watchdog interval systemd asked for ($WATCHDOG_USEC), 0 if none.
uint64_t WatchdogUsec();

}  // namespace postspool::daemon
