#include "post_stamp.h"

#include <cstring>

#include "little_endian.h"
#include "post.h"
#include "segment_format.h"

namespace postspool {
namespace {

// FlatBuffers' binary layout (flatbuffers.dev, "Internals"), the parts used
// here: a table starts with a signed 32-bit offset to its vtable (vtable =
// table - soffset); a vtable is uint16 vtable bytes, uint16 table bytes,
// then one uint16 per field slot: the field's offset in the table, 0 when
// absent. An offset field holds an unsigned 32-bit offset, forward from the
// field's own position. All little-endian.
uint32_t Read32(const std::vector<std::byte>& b, size_t at) { return LoadLe32(b.data() + at); }
uint16_t Read16(const std::vector<std::byte>& b, size_t at) {
  return static_cast<uint16_t>(std::to_integer<uint16_t>(b[at]) |
                               (std::to_integer<uint16_t>(b[at + 1]) << 8));
}
void Write16(std::vector<std::byte>& b, size_t at, uint16_t v) {
  b[at] = static_cast<std::byte>(v & 0xff);
  b[at + 1] = static_cast<std::byte>(v >> 8);
}
void Append32(std::vector<std::byte>& b, uint32_t v) {
  const size_t at = b.size();
  b.resize(at + 4);
  StoreLe32(b.data() + at, v);
}
void Align(std::vector<std::byte>& b, size_t alignment) {
  b.resize((b.size() + alignment - 1) / alignment * alignment);
}

struct TableView {
  size_t table = 0;
  size_t vtable = 0;
  uint16_t vtable_bytes = 0;
  // The offset of the field in vtable slot `vt_offset` (a generated VT_*
  // constant) from the table's start, 0 if absent.
  uint16_t Field(const std::vector<std::byte>& b, uint16_t vt_offset) const {
    return vt_offset + 2u <= vtable_bytes ? Read16(b, vtable + vt_offset) : 0;
  }
};

TableView RootTable(const std::vector<std::byte>& b) {
  TableView t;
  t.table = Read32(b, 0);
  t.vtable = static_cast<size_t>(static_cast<int64_t>(t.table) -
                                 static_cast<int32_t>(Read32(b, t.table)));
  t.vtable_bytes = Read16(b, t.vtable);
  return t;
}

// Appends a string; returns its position.
size_t AppendString(std::vector<std::byte>& b, std::string_view s) {
  Align(b, 4);
  const size_t at = b.size();
  Append32(b, static_cast<uint32_t>(s.size()));
  const size_t data = b.size();
  b.resize(data + s.size() + 1);  // and the terminating NUL
  std::memcpy(b.data() + data, s.data(), s.size());
  return at;
}

// Points the offset field at `field_pos` forward to `target`.
void PointAt(std::vector<std::byte>& b, size_t field_pos, size_t target) {
  StoreLe32(b.data() + field_pos, static_cast<uint32_t>(target - field_pos));
}

// Appends an Origin table (vtable first, then the table, then the host
// string); returns the table's position.
size_t AppendOrigin(std::vector<std::byte>& b, const StampedOrigin& o) {
  // Table layout: soffset, uid, gid, pid, host offset (each 4 bytes).
  constexpr uint16_t kTableBytes = 20;
  Align(b, 4);
  const size_t vtable = b.size();
  b.resize(vtable + 12);
  Write16(b, vtable, 12);  // 4 field slots
  Write16(b, vtable + 2, kTableBytes);
  Write16(b, vtable + 4 + 2 * 0, o.uid ? 4 : 0);
  Write16(b, vtable + 4 + 2 * 1, o.gid ? 8 : 0);
  Write16(b, vtable + 4 + 2 * 2, o.pid ? 12 : 0);
  Write16(b, vtable + 4 + 2 * 3, o.host.empty() ? 0 : 16);
  const size_t table = b.size();
  b.resize(table + kTableBytes);
  StoreLe32(b.data() + table, static_cast<uint32_t>(static_cast<int32_t>(table - vtable)));
  StoreLe32(b.data() + table + 4, o.uid.value_or(0));
  StoreLe32(b.data() + table + 8, o.gid.value_or(0));
  StoreLe32(b.data() + table + 12, static_cast<uint32_t>(o.pid.value_or(0)));
  if (!o.host.empty()) {
    const size_t host = AppendString(b, o.host);
    PointAt(b, table + 16, host);
  }
  return table;
}

}  // namespace

bool PostHasUnknownFields(std::span<const std::byte> payload) {
  std::vector<std::byte> b(payload.begin(), payload.end());
  return RootTable(b).vtable_bytes > fb::Post::VT_ORIGIN + 2;
}

bool StampPostInPlace(std::span<const std::byte> payload, const StampedOrigin& origin,
                      std::string_view default_base_url, std::vector<std::byte>* out) {
  std::vector<std::byte>& b = *out;
  b.assign(payload.begin(), payload.end());
  const TableView post = RootTable(b);
  const uint16_t origin_field = post.Field(b, fb::Post::VT_ORIGIN);
  if (origin_field == 0) return false;
  const size_t origin_table = AppendOrigin(b, origin);
  PointAt(b, post.table + origin_field, origin_table);
  if (PostFromPayload(payload).base_url()->size() == 0) {
    const uint16_t base_url_field = post.Field(b, fb::Post::VT_BASE_URL);  // required: present
    const size_t s = AppendString(b, default_base_url);
    PointAt(b, post.table + base_url_field, s);
  }
  Align(b, 8);
  return b.size() <= segment::kRecordPayloadMax;
}

}  // namespace postspool
