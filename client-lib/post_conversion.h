// From the caller's struct postspool_post to a checked PostData: every
// pointer, count and limit of the C struct is checked here, before anything
// is encoded or sent.
#pragma once

#include <string>

#include "post.h"
#include "postspool.h"

namespace postspool::client {

// Fills *out (id and pub_time are left for the caller to stamp). Returns
// POSTSPOOL_OK, or POSTSPOOL_EINVAL / POSTSPOOL_ETOOBIG with *detail naming
// the field, e.g. "rel_path is empty" or "rel_path is longer than 4096
// bytes". Strings are measured with a bound, so a huge or unterminated-
// looking string is not scanned past its limit.
int ConvertPost(const struct postspool_post* in, PostData* out, std::string* detail);

// The error code for a ValidatePost / AppendRecord status: kTooLarge ->
// POSTSPOOL_ETOOBIG, anything else -> POSTSPOOL_EINVAL.
int ValidationErrorCode(const Status& status);

}  // namespace postspool::client
