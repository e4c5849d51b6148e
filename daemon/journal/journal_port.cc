#include "journal_port.h"

namespace postspool::daemon {

std::function<int64_t()> WriterJournalPort::NewSegmentTask() {
  // The task runs on the loop's worker thread: it gets copies, and leaves
  // its result where SegmentDone() (on the loop's thread, after the
  // loop's completion handoff) takes it.
  auto made = std::make_shared<NewJournalSegment>();
  made_ = made;
  return [made, dirfd = writer_->dirfd(), seq = writer_->next_seq(), sync = writer_->sync(),
          storage = writer_->storage()] {
    *made = CreateJournalSegment(dirfd, seq, sync, storage);
    return made->status.ok() ? int64_t{0} : int64_t{-1};
  };
}

Status WriterJournalPort::SegmentDone() {
  std::shared_ptr<NewJournalSegment> made = std::move(made_);
  return writer_->Install(std::move(*made));
}

Status WriterJournalPort::Reserve(uint64_t bytes, Slot* slot) {
  JournalWriter::Slot s;
  if (Status st = writer_->Reserve(bytes, &s); !st.ok()) return st;
  slot->fd = s.fd;
  slot->position = s.position;
  return Status::Ok();
}

}  // namespace postspool::daemon
