#pragma once
// Serving a sequence classifier over HTTP (`hone serve`): requests shaped as Hugging Face
// text-embeddings-inference's /predict takes them, and the dynamic batching that runs the
// sequences of concurrent requests through the model together.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "hone/error.h"
#include "hone/tokenizer.h"

namespace hone {

// A request the client got wrong (4xx) or one the server cannot take now (503).
class ApiError : public Error {
 public:
  ApiError(int status, const std::string& message) : Error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

struct PredictInput {
  std::string text;
  std::optional<std::string> pair;
};

// TEI's /predict body: {"inputs": ..., "raw_scores": false, "truncate": false}, where inputs
// is a text, a [text, text_pair] pair, or a batch: a list of texts and pairs.
struct PredictRequest {
  std::vector<PredictInput> inputs;
  bool batch = false;       // the answer is a list per input
  bool raw_scores = false;  // logits instead of probabilities
  bool truncate = false;    // cut inputs longer than the model takes, rather than refuse them
};

// Throws ApiError: 400 for a body that is not such JSON (naming the field), 413 for more
// than max_inputs inputs, 422 for an empty text.
PredictRequest parse_predict_request(const std::string& body, int max_inputs);

// Each input's labels with their scores, highest first (a regression: its one value), as
// TEI answers: [{"score": s, "label": l}, ...], or a list of those for a batch. logits holds
// inputs x labels.size() values.
std::string predict_response(const PredictRequest& r, const std::vector<float>& logits,
                             const std::vector<std::string>& labels, bool regression);

// Runs the sequences of concurrent requests through the model together: a batch starts when
// it holds max_rows sequences or when its first request has waited max_delay, whichever
// comes first. Requests stay whole (none has more than max_rows sequences).
class Batcher {
 public:
  // Fills logits (rows x labels) for the encodings, in order; run in the batcher's thread.
  using Run = std::function<void(const std::vector<const Encoding*>& rows, std::vector<float>& logits)>;
  Batcher(Run run, int max_rows, std::chrono::microseconds max_delay, int max_queued_rows);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  // The logits of these encodings, once their batch has run (the model's errors come out of
  // get()). Throws ApiError 503 when max_queued_rows sequences wait already, or after stop().
  std::future<std::vector<float>> submit(std::vector<Encoding> rows);
  // Runs what is queued, then ends the thread.
  void stop();

  struct Stats {
    int64_t requests = 0, batches = 0, rows = 0;
  };
  Stats stats() const;

 private:
  struct Pending {
    std::vector<Encoding> rows;
    std::promise<std::vector<float>> done;
    std::chrono::steady_clock::time_point since;
  };
  void loop();

  Run run_;
  const int max_rows_, max_queued_;
  const std::chrono::microseconds max_delay_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Pending> queue_;
  int queued_rows_ = 0;
  bool stopping_ = false;
  Stats stats_;
  std::thread thread_;
};

}  // namespace hone
