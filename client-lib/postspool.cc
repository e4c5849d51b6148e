// The C ABI (include/postspool.h). Every entry point catches everything: no
// C++ exception crosses into the caller's frames.
#include "postspool.h"

#include <cstring>
#include <exception>
#include <new>

#include "client.h"
#include "last_error.h"
#include "options.h"

// Only these definitions are exported (the library is built with hidden
// visibility; libpostspool.map is the second guard).
#define POSTSPOOL_EXPORT extern "C" __attribute__((visibility("default")))

struct postspool_client {
  explicit postspool_client(postspool::client::ClientOptions options)
      : client(std::move(options)) {}
  postspool::client::Client client;
};

namespace {

int OutOfMemory() {
  postspool::client::SetLastError("out of memory");
  return POSTSPOOL_ENOMEM;
}

int InternalError(const char* what) {
  std::string detail = "internal error: ";
  detail += what;
  postspool::client::SetLastError(detail);
  return POSTSPOOL_EIO;
}

}  // namespace

POSTSPOOL_EXPORT void postspool_options_init(struct postspool_options* options) {
  if (options == nullptr) return;
  postspool::client::InitOptions(options);
}

POSTSPOOL_EXPORT int postspool_open(const struct postspool_options* options,
                                    postspool_client** client) {
  try {
    if (client == nullptr) {
      postspool::client::SetLastError("client is NULL");
      return POSTSPOOL_EINVAL;
    }
    *client = nullptr;
    postspool::client::ClientOptions copied;
    std::string detail;
    if (const int rc = postspool::client::CopyOptions(options, &copied, &detail);
        rc != POSTSPOOL_OK) {
      postspool::client::SetLastError(detail);
      return rc;
    }
    *client = new postspool_client(std::move(copied));
    return POSTSPOOL_OK;
  } catch (const std::bad_alloc&) {
    return OutOfMemory();
  } catch (const std::exception& e) {
    return InternalError(e.what());
  } catch (...) {
    return InternalError("unknown exception");
  }
}

POSTSPOOL_EXPORT void postspool_close(postspool_client* client) {
  try {
    delete client;
  } catch (...) {
    // Destructors here do not throw; nothing may escape regardless.
  }
}

POSTSPOOL_EXPORT void postspool_post_init(struct postspool_post* post) {
  if (post == nullptr) return;
  std::memset(post, 0, sizeof *post);
  post->struct_size = sizeof *post;
}

POSTSPOOL_EXPORT int postspool_post(postspool_client* client, const struct postspool_post* post,
                                    struct postspool_post_result* result) {
  try {
    if (client == nullptr) {
      if (result != nullptr) std::memset(result, 0, sizeof *result);
      postspool::client::SetLastError("client is NULL");
      return POSTSPOOL_EINVAL;
    }
    return client->client.Post(post, result);
  } catch (const std::bad_alloc&) {
    return OutOfMemory();
  } catch (const std::exception& e) {
    return InternalError(e.what());
  } catch (...) {
    return InternalError("unknown exception");
  }
}

POSTSPOOL_EXPORT int postspool_report_dropped(postspool_client* client, uint32_t count) {
  try {
    if (client == nullptr) {
      postspool::client::SetLastError("client is NULL");
      return POSTSPOOL_EINVAL;
    }
    return client->client.ReportDropped(count);
  } catch (const std::bad_alloc&) {
    return OutOfMemory();
  } catch (const std::exception& e) {
    return InternalError(e.what());
  } catch (...) {
    return InternalError("unknown exception");
  }
}

POSTSPOOL_EXPORT const char* postspool_strerror(int error) {
  switch (error) {
    case POSTSPOOL_OK: return "success";
    case POSTSPOOL_EINVAL: return "invalid argument";
    case POSTSPOOL_ENOMEM: return "out of memory";
    case POSTSPOOL_ETIMEDOUT: return "timed out: the budget ran out before a transport took the post";
    case POSTSPOOL_ENODAEMON: return "daemon unreachable and no spool directory";
    case POSTSPOOL_ENOSPACE: return "daemon unreachable or full, and the spool's disk is full";
    case POSTSPOOL_EPERM: return "daemon unreachable, and the spool directory is not writable";
    case POSTSPOOL_ETOOBIG: return "a post field is above its limit";
    case POSTSPOOL_EIO: return "daemon unreachable, and the spool write failed";
    case POSTSPOOL_ECLOSED: return "the client was closed";
  }
  return "unknown postspool error";
}

POSTSPOOL_EXPORT const char* postspool_last_error(void) {
  return postspool::client::LastError();
}
