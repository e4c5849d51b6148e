#include "post.h"

#include <pthread.h>
#include <sys/random.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "segment_format.h"
#include "v03_fields.h"

namespace postspool {
namespace {

flatbuffers::Offset<flatbuffers::String> OptString(flatbuffers::FlatBufferBuilder* b,
                                                    const std::optional<std::string>& s) {
  return s ? b->CreateString(*s) : 0;
}

std::optional<std::string> OptString(const flatbuffers::String* s) {
  if (s == nullptr) return std::nullopt;
  return s->str();
}

template <typename T>
std::optional<T> OptScalar(flatbuffers::Optional<T> v) {
  if (!v.has_value()) return std::nullopt;
  return *v;
}

Status CheckLength(std::string_view field, size_t bytes, size_t max) {
  if (bytes <= max) return Status::Ok();
  return Status(StatusCode::kInvalidArgument, std::string(field) + " is " +
                                                  std::to_string(bytes) + " bytes, above the " +
                                                  std::to_string(max) + "-byte limit");
}

Status CheckPath(std::string_view field, const std::string& s) {
  if (s.find('\0') != std::string::npos) {
    return Status(StatusCode::kInvalidArgument, std::string(field) + " contains a NUL byte");
  }
  return CheckLength(field, s.size(), kPathBytesMax);
}

// A path in relPath form (rel_path, and the fileOp targets hlink and rename,
// which name another file under the same base): '/'-separated components,
// none of them empty, "." or "..", so that a consumer that joins it to its
// own directory stays inside that directory. One leading '/' is allowed and
// means the same path without it: Sarracenia's posters form relPath from an
// absolute path and strip that '/', and the v03 encoder strips it too.
Status CheckRelPathForm(std::string_view field, std::string_view path) {
  if (path.starts_with('/')) path.remove_prefix(1);
  if (path.empty()) {
    return Status(StatusCode::kInvalidArgument, std::string(field) + " names no file");
  }
  size_t begin = 0;
  for (;;) {
    const size_t end = std::min(path.find('/', begin), path.size());
    const std::string_view component = path.substr(begin, end - begin);
    if (component.empty()) {
      return Status(StatusCode::kInvalidArgument,
                    std::string(field) + " is not normalised: an empty component ('//', a "
                                         "second leading '/' or a trailing '/')");
    }
    if (component == "." || component == "..") {
      return Status(StatusCode::kInvalidArgument,
                    std::string(field) + " is not normalised: a '" + std::string(component) +
                        "' component");
    }
    if (end == path.size()) return Status::Ok();
    begin = end + 1;
  }
}

// The digest length of the binary identity methods, 0 for the text ones.
size_t DigestBytes(fb::IdentityMethod method) {
  switch (method) {
    case fb::IdentityMethod::Sha512: return 64;
    case fb::IdentityMethod::Md5: return 16;
    default: return 0;
  }
}

}  // namespace

namespace {

// Random bytes for ids, taken from getrandom 64 ids at a time: one system
// call per 64 posts rather than one per post (a ring post costs less than
// the call). Ids are unpredictable to other users (the daemon drops a
// spooled post whose id it journaled recently), so the bytes come from the
// kernel, not from a seeded generator. Per thread; a child after fork must
// not reuse its parent's remaining bytes, so fork empties the forking
// thread's buffer (the only thread a child has).
struct IdBytes {
  unsigned char bytes[64 * 16];
  size_t next = sizeof bytes;  // empty
};
thread_local IdBytes id_bytes;

void ForgetIdBytesInChild() { id_bytes.next = sizeof id_bytes.bytes; }

void TakeIdBytes(unsigned char* out) {
  IdBytes& b = id_bytes;
  if (b.next + 16 > sizeof b.bytes) {
    // Registered at the first id rather than by a global constructor.
    static const bool registered = ::pthread_atfork(nullptr, nullptr, ForgetIdBytesInChild) == 0;
    (void)registered;
    size_t got = 0;
    while (got < sizeof b.bytes) {
      const ssize_t n = ::getrandom(b.bytes + got, sizeof b.bytes - got, 0);
      if (n > 0) got += static_cast<size_t>(n);
      else assert(errno == EINTR);
    }
    b.next = 0;
  }
  std::memcpy(out, b.bytes + b.next, 16);
  // Used bytes are not left behind for a later reader of this memory.
  std::memset(b.bytes + b.next, 0, 16);
  b.next += 16;
}

}  // namespace

PostId NewPostId() {
  unsigned char b[16];
  TakeIdBytes(b);
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);  // version 4
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);  // RFC 4122 variant
  PostId id;
  for (int i = 0; i < 8; ++i) {
    id.hi = (id.hi << 8) | b[i];
    id.lo = (id.lo << 8) | b[8 + i];
  }
  return id;
}

Status ValidatePost(const PostData& p) {
  if (p.rel_path.empty()) return Status(StatusCode::kInvalidArgument, "rel_path is empty");
  if (Status s = CheckLength("base_url", p.base_url.size(), kBaseUrlBytesMax); !s.ok()) return s;
  if (Status s = CheckPath("rel_path", p.rel_path); !s.ok()) return s;
  if (Status s = CheckRelPathForm("rel_path", p.rel_path); !s.ok()) return s;
  for (const auto& [name, field] :
       {std::pair{"retrieve_path", &p.retrieve_path}, std::pair{"link", &p.link},
        std::pair{"hlink", &p.hlink}, std::pair{"rename", &p.rename},
        std::pair{"origin_host", &p.origin_host}}) {
    if (*field) {
      if (Status s = CheckPath(name, **field); !s.ok()) return s;
    }
  }
  // link is a symbolic link's target, which may point anywhere (the consumer
  // makes the same link); hlink and rename name files under the base.
  if (p.hlink) {
    if (Status s = CheckRelPathForm("hlink", *p.hlink); !s.ok()) return s;
  }
  if (p.rename) {
    if (Status s = CheckRelPathForm("rename", *p.rename); !s.ok()) return s;
  }
  if (Status s = CheckLength("identity value", p.identity_value.size(), kIdentityBytesMax);
      !s.ok()) {
    return s;
  }
  if (p.identity_method != fb::IdentityMethod::None) {
    const size_t digest_bytes = DigestBytes(p.identity_method);
    if (digest_bytes != 0 && p.identity_value.size() != digest_bytes) {
      return Status(StatusCode::kInvalidArgument,
                    "identity value is " + std::to_string(p.identity_value.size()) +
                        " bytes, the digest of its method is " + std::to_string(digest_bytes));
    }
    if (p.identity_value.empty()) {
      return Status(StatusCode::kInvalidArgument, "identity value is empty");
    }
  }
  if (p.size && *p.size < 0) {
    return Status(StatusCode::kInvalidArgument, "size is negative (" + std::to_string(*p.size) + ")");
  }
  // Permission bits only: the v03 mode is the octal of mode & 07777.
  if (p.mode && (*p.mode & ~07777u) != 0) {
    return Status(StatusCode::kInvalidArgument, "mode has bits outside 07777");
  }
  if (p.extras.size() > kExtrasMax) {
    return Status(StatusCode::kInvalidArgument, std::to_string(p.extras.size()) +
                                                    " extra fields, above the limit of " +
                                                    std::to_string(kExtrasMax));
  }
  for (size_t i = 0; i < p.extras.size(); ++i) {
    const auto& [key, value] = p.extras[i];
    if (key.empty()) return Status(StatusCode::kInvalidArgument, "extra field with an empty key");
    if (Status s = CheckLength("extra field " + key, key.size() + value.size(), kExtraBytesMax);
        !s.ok()) {
      return s;
    }
    if (key.find('\0') != std::string::npos || value.find('\0') != std::string::npos) {
      return Status(StatusCode::kInvalidArgument,
                    "extra field " + std::to_string(i) + " contains a NUL byte");
    }
    if (v03::IsReservedFieldName(key)) {
      return Status(StatusCode::kInvalidArgument,
                    "extra field \"" + key + "\" is a standard v03 field name");
    }
    // A JSON object with a member twice means different things to different
    // readers (Python keeps the last).
    for (size_t j = 0; j < i; ++j) {
      if (p.extras[j].first == key) {
        return Status(StatusCode::kInvalidArgument,
                      "extra field \"" + key + "\" is given twice");
      }
    }
  }
  // The limits above keep the worst case well inside one record.
  static_assert(kBaseUrlBytesMax + 6 * kPathBytesMax + kIdentityBytesMax +
                    kExtrasMax * (kExtraBytesMax + 64) + 1024 <
                segment::kRecordPayloadMax);
  return Status::Ok();
}

void BuildPost(const PostData& p, flatbuffers::FlatBufferBuilder* b) {
  b->Clear();
  const auto base_url = b->CreateString(p.base_url);
  const auto rel_path = b->CreateString(p.rel_path);
  const auto retrieve_path = OptString(b, p.retrieve_path);
  flatbuffers::Offset<fb::FileOp> file_op = 0;
  if (p.link || p.hlink || p.rename || p.remove || p.directory) {
    const auto link = OptString(b, p.link);
    const auto hlink = OptString(b, p.hlink);
    const auto rename = OptString(b, p.rename);
    file_op = fb::CreateFileOp(*b, link, hlink, rename, p.remove, p.directory);
  }
  flatbuffers::Offset<fb::Identity> identity = 0;
  if (p.identity_method != fb::IdentityMethod::None) {
    const auto value = b->CreateVector(
        reinterpret_cast<const uint8_t*>(p.identity_value.data()), p.identity_value.size());
    identity = fb::CreateIdentity(*b, p.identity_method, value);
  }
  flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<fb::Extra>>> extras = 0;
  if (!p.extras.empty()) {
    std::vector<flatbuffers::Offset<fb::Extra>> v;
    v.reserve(p.extras.size());
    for (const auto& [key, value] : p.extras) {
      const auto k = b->CreateString(key);
      const auto val = b->CreateString(value);
      v.push_back(fb::CreateExtra(*b, k, val));
    }
    extras = b->CreateVector(v);
  }
  // Always an origin table, empty if nothing is known: the daemon stamps
  // the origin by pointing this slot at a new table (post_stamp.h), which
  // keeps fields of newer schemas that a rebuild would drop.
  flatbuffers::Offset<fb::Origin> origin = 0;
  {
    const auto host = OptString(b, p.origin_host);
    fb::OriginBuilder ob(*b);
    if (p.origin_uid) ob.add_uid(*p.origin_uid);
    if (p.origin_gid) ob.add_gid(*p.origin_gid);
    if (p.origin_pid) ob.add_pid(*p.origin_pid);
    ob.add_host(host);
    origin = ob.Finish();
  }
  const fb::PostId id(p.id.hi, p.id.lo);
  fb::PostBuilder pb(*b);
  pb.add_id(&id);
  pb.add_pub_time_ns(p.pub_time_ns);
  pb.add_base_url(base_url);
  pb.add_rel_path(rel_path);
  pb.add_retrieve_path(retrieve_path);
  pb.add_file_op(file_op);
  pb.add_identity(identity);
  if (p.size) pb.add_size(*p.size);
  if (p.mode) pb.add_mode(*p.mode);
  if (p.mtime_ns) pb.add_mtime_ns(*p.mtime_ns);
  if (p.atime_ns) pb.add_atime_ns(*p.atime_ns);
  pb.add_extras(extras);
  pb.add_origin(origin);
  b->Finish(pb.Finish(), fb::PostIdentifier());
}

PostData ReadPost(const fb::Post& post) {
  PostData p;
  p.id = PostId{post.id()->hi(), post.id()->lo()};
  p.pub_time_ns = post.pub_time_ns();
  p.base_url = post.base_url()->str();
  p.rel_path = post.rel_path()->str();
  p.retrieve_path = OptString(post.retrieve_path());
  if (const fb::FileOp* op = post.file_op()) {
    p.link = OptString(op->link());
    p.hlink = OptString(op->hlink());
    p.rename = OptString(op->rename());
    p.remove = op->remove();
    p.directory = op->directory();
  }
  // An identity whose method is None is no identity (BuildPost writes none).
  if (const fb::Identity* identity = post.identity();
      identity != nullptr && identity->method() != fb::IdentityMethod::None) {
    p.identity_method = identity->method();
    if (identity->value()) {
      p.identity_value.assign(reinterpret_cast<const char*>(identity->value()->data()),
                              identity->value()->size());
    }
  }
  p.size = OptScalar(post.size());
  p.mode = OptScalar(post.mode());
  p.mtime_ns = OptScalar(post.mtime_ns());
  p.atime_ns = OptScalar(post.atime_ns());
  if (post.extras()) {
    for (const fb::Extra* e : *post.extras()) p.extras.emplace_back(e->key()->str(), e->value()->str());
  }
  if (const fb::Origin* o = post.origin()) {
    p.origin_uid = OptScalar(o->uid());
    p.origin_gid = OptScalar(o->gid());
    p.origin_pid = OptScalar(o->pid());
    p.origin_host = OptString(o->host());
  }
  return p;
}

bool VerifyPostPayload(std::span<const std::byte> payload) {
  if (payload.size() < 8 || payload.size() > segment::kRecordPayloadMax) return false;
  // FlatBuffers checks alignment relative to the buffer start; scalars are
  // then read in place, so the buffer itself must be aligned too.
  if (reinterpret_cast<uintptr_t>(payload.data()) % alignof(uint64_t) != 0) return false;
  flatbuffers::Verifier::Options options;
  // Far above what BuildPost produces, far below what could make
  // verification slow.
  options.max_depth = 16;
  options.max_tables = 1024;
  flatbuffers::Verifier verifier(reinterpret_cast<const uint8_t*>(payload.data()),
                                 payload.size(), options);
  return fb::VerifyPostBuffer(verifier);
}

}  // namespace postspool
