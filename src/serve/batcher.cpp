#include <algorithm>

#include "hone/serve.h"

namespace hone {

Batcher::Batcher(Run run, int max_rows, std::chrono::microseconds max_delay, int max_queued_rows)
    : run_(std::move(run)), max_rows_(max_rows), max_queued_(max_queued_rows), max_delay_(max_delay) {
  HONE_CHECK(max_rows >= 1 && max_queued_rows >= max_rows, "a batcher of {} rows with {} queued", max_rows,
             max_queued_rows);
  thread_ = std::thread([this] { loop(); });
}

Batcher::~Batcher() { stop(); }

std::future<std::vector<float>> Batcher::submit(std::vector<Encoding> rows) {
  HONE_CHECK(!rows.empty() && int(rows.size()) <= max_rows_, "a request of {} sequences in batches of {}",
             rows.size(), max_rows_);
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopping_) throw ApiError(503, "the server is shutting down");
  if (queued_rows_ + int(rows.size()) > max_queued_)
    throw ApiError(503, fmt::format("overloaded: {} sequences wait already; try again", queued_rows_));
  queued_rows_ += int(rows.size());
  ++stats_.requests;
  queue_.push_back({std::move(rows), {}, std::chrono::steady_clock::now()});
  std::future<std::vector<float>> f = queue_.back().done.get_future();
  wake_.notify_one();
  return f;
}

void Batcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

Batcher::Stats Batcher::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void Batcher::loop() {
  std::vector<Pending> batch;
  std::vector<const Encoding*> rows;
  std::vector<float> logits;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      // Wait for more sequences until the batch is full or its first request's time is up.
      const auto deadline = queue_.front().since + max_delay_;
      wake_.wait_until(lock, deadline, [&] { return stopping_ || queued_rows_ >= max_rows_; });
      int taken = 0;
      while (!queue_.empty() && taken + int(queue_.front().rows.size()) <= max_rows_) {
        taken += int(queue_.front().rows.size());
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      queued_rows_ -= taken;
      ++stats_.batches;
      stats_.rows += taken;
    }
    rows.clear();
    for (const Pending& p : batch)
      for (const Encoding& e : p.rows) rows.push_back(&e);
    try {
      run_(rows, logits);
      const size_t per_row = logits.size() / rows.size();
      size_t at = 0;
      for (Pending& p : batch) {
        const size_t n = p.rows.size() * per_row;
        p.done.set_value(std::vector<float>(logits.begin() + ptrdiff_t(at), logits.begin() + ptrdiff_t(at + n)));
        at += n;
      }
    } catch (...) {
      for (Pending& p : batch) p.done.set_exception(std::current_exception());
    }
    batch.clear();
  }
}

}  // namespace hone
