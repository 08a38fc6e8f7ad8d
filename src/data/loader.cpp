// The batch loader: staging buffers allocated once, filled in order by the caller or
// ahead of it by worker threads.
#include <algorithm>
#include <utility>

#include "hone/backend.h"
#include "hone/data.h"
#include "hone/error.h"

namespace hone {

// One staging buffer: ids, mask and types of batch_size x max_seq_len, and the labels,
// in one host allocation; freed with the call that matches how it was allocated.
struct BatchLoader::Slot {
  Backend* be = nullptr;
  bool pinned = false;
  void* memory = nullptr;
  Batch batch;
  size_t index = 0;          // the batch it holds, once ready
  bool ready = false;        // filled (or failed), not yet handed out
  std::exception_ptr error;  // the batch could not be prepared

  Slot(Backend& b, bool pin, int batch_size, int max_len) : be(&b), pinned(pin) {
    constexpr size_t kAlign = 64;
    auto round = [](size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; };
    const size_t tokens = round(size_t(batch_size) * size_t(max_len) * sizeof(int32_t));
    const size_t labels = round(size_t(batch_size) * sizeof(float));
    const size_t bytes = 3 * tokens + labels;
    memory = pinned ? be->allocate_host(bytes) : be->Backend::allocate_host(bytes);
    char* p = static_cast<char*>(memory);
    batch.ids = reinterpret_cast<int32_t*>(p);
    batch.mask = reinterpret_cast<int32_t*>(p + tokens);
    batch.types = reinterpret_cast<int32_t*>(p + 2 * tokens);
    batch.labels = reinterpret_cast<float*>(p + 3 * tokens);
    batch.indices.reserve(size_t(batch_size));  // collate then assigns without allocating
  }
  ~Slot() {
    if (!memory) return;
    if (pinned) be->deallocate_host(memory);
    else be->Backend::deallocate_host(memory);
  }
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
};

BatchLoader::BatchLoader(const Dataset& d, std::vector<std::vector<int64_t>> batches, const LoaderOptions& o,
                         Backend& be)
    : data_(d), batches_(std::move(batches)), opt_(o), be_(be), pinned_(o.pin_memory) {
  HONE_CHECK(opt_.batch_size > 0, "batch loader with batch size {}", opt_.batch_size);
  HONE_CHECK(opt_.num_workers >= 0, "batch loader with {} workers", opt_.num_workers);
  HONE_CHECK(data_.max_seq_len() > 0, "batch loader over a dataset with max_seq_len {}", data_.max_seq_len());
  for (size_t b = 0; b < batches_.size(); ++b)
    HONE_CHECK(!batches_[b].empty() && batches_[b].size() <= size_t(opt_.batch_size),
               "batch {} has {} examples, the loader's batch size is {}", b, batches_[b].size(), opt_.batch_size);
  // Without workers: the batch being filled and the previous one, which stays valid (and
  // may still be copied from) until the fill is done. With workers: two ahead per worker
  // and the one handed out.
  const int count = opt_.num_workers == 0 ? 2 : 2 * opt_.num_workers + 1;
  slots_.reserve(size_t(count));
  for (int s = 0; s < count; ++s) {
    slots_.push_back(std::make_unique<Slot>(be_, pinned_, opt_.batch_size, data_.max_seq_len()));
    free_.push_back(slots_.back().get());
  }
  workers_.reserve(size_t(opt_.num_workers));
  try {
    for (int w = 0; w < opt_.num_workers; ++w) workers_.emplace_back([this] { work(); });
  } catch (...) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
    throw;
  }
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  // A worker in the middle of a batch finishes it, then sees stop_.
  for (auto& t : workers_) t.join();
  // The consumer may have queued a copy from the last batch it got: the buffers are
  // freed only once the backend has read them.
  try {
    be_.wait_for_copies();
  } catch (...) {
  }
}

void BatchLoader::work() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || error_ || next_to_fill_ >= batches_.size() || !free_.empty(); });
    if (stop_ || error_ || next_to_fill_ >= batches_.size()) return;
    // Batches are taken in order, so the slots in use always hold the next batches to
    // hand out: the consumer never waits for a batch that has no slot.
    const size_t index = next_to_fill_++;
    Slot* s = free_.front();
    free_.pop_front();
    lk.unlock();
    std::exception_ptr err;
    try {
      collate(data_, batches_[index], opt_.pad_to_multiple_of, s->batch);
    } catch (...) {
      err = std::current_exception();
    }
    lk.lock();
    s->index = index;
    s->error = err;
    s->ready = true;
    if (err && !error_) error_ = err;  // the other workers take no further batches
    cv_.notify_all();
    if (err) return;
  }
}

void BatchLoader::release(Slot* s) {
  // The caller's copies from this buffer must have read it before it is refilled.
  be_.wait_for_copies();
  std::lock_guard<std::mutex> lk(mu_);
  free_.push_back(s);
  cv_.notify_all();
}

const Batch* BatchLoader::next() {
  if (opt_.num_workers == 0) {
    if (next_to_hand_ >= batches_.size()) {
      if (handed_) release(std::exchange(handed_, nullptr));
      return nullptr;
    }
    // Fill the free slot first, while the previous batch may still be being copied.
    Slot* s = free_.front();
    collate(data_, batches_[next_to_hand_], opt_.pad_to_multiple_of, s->batch);
    free_.pop_front();
    if (handed_) release(handed_);
    handed_ = s;
    ++next_to_hand_;
    return &s->batch;
  }

  if (handed_) {
    release(handed_);
    handed_ = nullptr;
  }
  std::unique_lock<std::mutex> lk(mu_);
  if (next_to_hand_ >= batches_.size()) return nullptr;
  Slot* s = nullptr;
  cv_.wait(lk, [&] {
    for (auto& slot : slots_)
      if (slot->ready && slot->index == next_to_hand_) {
        s = slot.get();
        return true;
      }
    return false;
  });
  // In order: the batches before the failed one were all handed out. The slot stays,
  // so that a further call throws the same error.
  if (s->error) std::rethrow_exception(s->error);
  s->ready = false;
  handed_ = s;
  ++next_to_hand_;
  return &s->batch;
}

}  // namespace hone
