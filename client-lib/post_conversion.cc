#include "post_conversion.h"

#include <cstring>
#include <set>
#include <string_view>

namespace postspool::client {
namespace {

// The size of struct postspool_post in ABI version 0.1 (see options.cc).
constexpr size_t kPostBytesMin = sizeof(struct postspool_post);
constexpr size_t kSha512Bytes = 64;
constexpr size_t kMd5Bytes = 16;
constexpr uint32_t kKnownOpFlags = POSTSPOOL_OP_REMOVE | POSTSPOOL_OP_DIRECTORY;
constexpr uint32_t kModeBits = 07777;

int TooBig(std::string_view field, size_t max, std::string* detail) {
  *detail = std::string(field) + " is longer than " + std::to_string(max) + " bytes";
  return POSTSPOOL_ETOOBIG;
}

int Invalid(std::string detail_text, std::string* detail) {
  *detail = std::move(detail_text);
  return POSTSPOOL_EINVAL;
}

// Copies an optional string of at most `max` bytes.
int CopyString(std::string_view field, const char* s, size_t max, std::string* out,
               std::string* detail) {
  const size_t n = ::strnlen(s, max + 1);
  if (n > max) return TooBig(field, max, detail);
  out->assign(s, n);
  return POSTSPOOL_OK;
}

int CopyOptional(std::string_view field, const char* s, size_t max,
                 std::optional<std::string>* out, std::string* detail) {
  if (s == nullptr) return POSTSPOOL_OK;
  return CopyString(field, s, max, &out->emplace(), detail);
}

}  // namespace

int ConvertPost(const struct postspool_post* in, PostData* out, std::string* detail) {
  if (in == nullptr) return Invalid("post is NULL", detail);
  if (in->struct_size < kPostBytesMin) {
    return Invalid("post.struct_size is " + std::to_string(in->struct_size) +
                       ", below sizeof(struct postspool_post) = " +
                       std::to_string(kPostBytesMin) + ": initialise with postspool_post_init",
                   detail);
  }
  struct postspool_post p;
  std::memcpy(&p, in, sizeof p);

  if (p.rel_path == nullptr) return Invalid("rel_path is NULL", detail);
  if (*p.rel_path == '\0') return Invalid("rel_path is empty", detail);
  int rc = CopyString("rel_path", p.rel_path, kPathBytesMax, &out->rel_path, detail);
  if (rc == POSTSPOOL_OK && p.base_url != nullptr) {
    rc = CopyString("base_url", p.base_url, kBaseUrlBytesMax, &out->base_url, detail);
  }
  if (rc == POSTSPOOL_OK) {
    rc = CopyOptional("retrieve_path", p.retrieve_path, kPathBytesMax, &out->retrieve_path,
                      detail);
  }
  if (rc == POSTSPOOL_OK) rc = CopyOptional("link", p.link, kPathBytesMax, &out->link, detail);
  if (rc == POSTSPOOL_OK) rc = CopyOptional("hlink", p.hlink, kPathBytesMax, &out->hlink, detail);
  if (rc == POSTSPOOL_OK) {
    rc = CopyOptional("rename", p.rename, kPathBytesMax, &out->rename, detail);
  }
  if (rc != POSTSPOOL_OK) return rc;

  if ((p.op_flags & ~kKnownOpFlags) != 0) {
    return Invalid("op_flags has unknown bits " + std::to_string(p.op_flags & ~kKnownOpFlags),
                   detail);
  }
  out->remove = (p.op_flags & POSTSPOOL_OP_REMOVE) != 0;
  out->directory = (p.op_flags & POSTSPOOL_OP_DIRECTORY) != 0;

  switch (p.identity_method) {
    case POSTSPOOL_IDENTITY_NONE:
      if (p.identity_value != nullptr || p.identity_size != 0) {
        return Invalid("identity_value is set but identity_method is NONE", detail);
      }
      break;
    case POSTSPOOL_IDENTITY_SHA512:
    case POSTSPOOL_IDENTITY_MD5:
    case POSTSPOOL_IDENTITY_COD:
    case POSTSPOOL_IDENTITY_RANDOM:
    case POSTSPOOL_IDENTITY_ARBITRARY: {
      if (p.identity_value == nullptr) return Invalid("identity_value is NULL", detail);
      if (p.identity_size == 0) return Invalid("identity_size is 0", detail);
      if (p.identity_size > kIdentityBytesMax) {
        return TooBig("identity_value", kIdentityBytesMax, detail);
      }
      const size_t want = p.identity_method == POSTSPOOL_IDENTITY_SHA512 ? kSha512Bytes
                          : p.identity_method == POSTSPOOL_IDENTITY_MD5  ? kMd5Bytes
                                                                         : 0;
      if (want != 0 && p.identity_size != want) {
        return Invalid("identity_size is " + std::to_string(p.identity_size) + ", a " +
                           (want == kSha512Bytes ? "sha512" : "md5") + " digest is " +
                           std::to_string(want) + " bytes",
                       detail);
      }
      out->identity_method = static_cast<fb::IdentityMethod>(p.identity_method);
      out->identity_value.assign(static_cast<const char*>(p.identity_value), p.identity_size);
      break;
    }
    default:
      return Invalid("identity_method " + std::to_string(p.identity_method) + " is unknown",
                     detail);
  }

  if (p.has_size) {
    if (p.size < 0) return Invalid("size is negative", detail);
    out->size = p.size;
  }
  // Permission bits only; the file type bits of an st_mode are dropped.
  if (p.has_mode) out->mode = p.mode & kModeBits;
  if (p.has_mtime) out->mtime_ns = p.mtime_ns;
  if (p.has_atime) out->atime_ns = p.atime_ns;

  if (p.extras_count > 0 && p.extras == nullptr) {
    return Invalid("extras is NULL but extras_count is " + std::to_string(p.extras_count),
                   detail);
  }
  if (p.extras_count > kExtrasMax) {
    *detail = std::to_string(p.extras_count) + " extra fields, above the limit of " +
              std::to_string(kExtrasMax);
    return POSTSPOOL_ETOOBIG;
  }
  std::set<std::string_view> keys;
  out->extras.reserve(p.extras_count);
  for (size_t i = 0; i < p.extras_count; ++i) {
    const postspool_extra& e = p.extras[i];
    const std::string index = "extras[" + std::to_string(i) + "]";
    if (e.key == nullptr) return Invalid(index + ".key is NULL", detail);
    if (e.value == nullptr) return Invalid(index + ".value is NULL", detail);
    if (*e.key == '\0') return Invalid(index + ".key is empty", detail);
    const size_t key_bytes = ::strnlen(e.key, kExtraBytesMax + 1);
    const size_t value_bytes = ::strnlen(e.value, kExtraBytesMax + 1);
    if (key_bytes + value_bytes > kExtraBytesMax) {
      return TooBig(index + " (key plus value)", kExtraBytesMax, detail);
    }
    const std::string_view key(e.key, key_bytes);
    if (!keys.insert(key).second) {
      return Invalid("extra field \"" + std::string(key) + "\" is given twice", detail);
    }
    out->extras.emplace_back(std::string(key), std::string(e.value, value_bytes));
  }
  return POSTSPOOL_OK;
}

int ValidationErrorCode(const Status& status) {
  return status.code() == StatusCode::kTooLarge ? POSTSPOOL_ETOOBIG : POSTSPOOL_EINVAL;
}

}  // namespace postspool::client
