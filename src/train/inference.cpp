// TrainingRun's inference: batches run padded or packed, small ones replayed from CUDA graphs,
// and the warm-up that a server runs before its first request.
#include <algorithm>
#include <cstring>
#include <vector>

#include "hone/dtype.h"
#include "hone/family.h"
#include "hone/ops.h"
#include "hone/trainer.h"
#include "train/run_as.h"

namespace hone {

void TrainingRun::infer(const Batch& b, const ForwardOutputs& out) {
  run_infer(*mem_, b.ids, b.mask, b.types, b.rows, b.seq, out);
}

std::vector<int64_t> TrainingRun::warm_up_inference() {
  const ModelConfig& c = model_->config();
  // The widest of a layer's products (the up projection, [2I, H] in a gated one): the
  // others are timed from as many rows or more.
  const int64_t up_rows = int64_t(c.intermediate_size) * (c.family().gated_ffn ? 2 : 1);
  const std::vector<int64_t> counts =
      be_.timed_row_counts(int64_t(phases_.infer_batch) * seq_, up_rows, c.hidden_size, model_->compute_dtype());
  const int32_t token = c.pad_token_id == 0 ? 1 : 0;  // any token but padding
  std::vector<int32_t> ids, mask, types;
  std::vector<float> logits;
  for (const int64_t tokens : counts) {
    // Rows of seq_ attended tokens, the last one shorter where the count says so.
    const int rows = int((tokens + seq_ - 1) / seq_);
    const size_t n = size_t(rows) * size_t(seq_);
    ids.assign(n, token);
    types.assign(n, 0);
    mask.assign(n, 0);
    std::fill_n(mask.begin(), tokens, 1);
    logits.resize(size_t(rows) * size_t(c.num_labels));
    const Batch b{.rows = rows, .seq = seq_, .ids = ids.data(), .mask = mask.data(), .types = types.data(),
                  .indices = {}};
    infer(b, ForwardOutputs{logits.data()});
  }
  return counts;
}

void TrainingRun::run_infer(BufferSource& mem, const int32_t* ids, const int32_t* mask, const int32_t* types,
                            int batch, int seq, const ForwardOutputs& out) {
  HONE_CHECK(batch >= 1 && batch <= phases_.infer_batch, "inference batch of {} rows in a run planned for {}",
             batch, phases_.infer_batch);
  HONE_CHECK(seq >= 1 && seq <= seq_, "sequences of {} tokens in a run planned for {}", seq, seq_);
  HONE_CHECK(!step_open_, "inference between a micro_step and its optimizer_step");
  if (!be_.dry_run) validate_batch(ids, mask, types, nullptr, batch, seq);
  // Packed when the backend packs attention and the batch is right-padded (as hone's
  // collation pads), unless the caller wants the hidden states in the padded layout.
  if (packs_ && !be_.dry_run) be_.wait_for_copies();  // the last batch's packing has left the host buffers
  const int64_t tokens = packs_ && !be_.dry_run && !out.last_hidden_state ? pack_rows(mask, batch, seq) : 0;
  run_infer_as(mem, ids, mask, types, batch, seq, out, tokens > 0, tokens);
}

void TrainingRun::logits_from_host(int batch, float* out) {
  be_.wait_for_reads();
  const size_t n = size_t(batch) * size_t(infer_logits_host_.shape[1]);
  const DType t = infer_logits_host_.dtype;
  if (t == DType::F32) {
    std::memcpy(out, infer_logits_host_.data, n * sizeof(float));
    return;
  }
  const uint16_t* raw = infer_logits_host_.ptr<uint16_t>();
  std::transform(raw, raw + n, out, t == DType::BF16 ? bf16_to_float : f16_to_float);
}

void TrainingRun::run_infer_as(BufferSource& mem, const int32_t* ids, const int32_t* mask, const int32_t* types,
                               int batch, int seq, const ForwardOutputs& out, bool packed, int64_t tokens) {
  // Batches in the padded layout, of logits alone, replay a recording of their shape.
  StepGraphs* g = nullptr;
  StepMode mode = StepMode::Eager;
  if (!packed && infer_logits_host_.data && args_.cuda_graphs && !be_.dry_run && out.logits && !out.pooled &&
      !out.last_hidden_state) {
    g = &infer_graphs_[{batch, seq}];
    mode = next_mode(*g, infer_recorded_shapes_, kMaxInferShapes);
  }
  if (mode == StepMode::Replay) {
    upload(ids, mask, types, g->inputs);
    be_.replay(g->micro);
    ++replayed_inferences_;
    logits_from_host(batch, out.logits);
    return;
  }
  mem.begin_phase(packed ? Phase::PackedInference : out.last_hidden_state ? Phase::HiddenStates : Phase::Inference);
  BatchTensors b = take_batch(mem, false, batch, seq);
  if (packed) {
    b.tokens = tokens;
    b.packed_rows = mem.take(Category::Activations, "packed_rows", -1, DType::I32, {tokens});
    b.row_start = mem.take(Category::Activations, "row_start", -1, DType::I32, {batch + 1});
  }
  if (!be_.dry_run) {
    upload(ids, mask, types, b);
    if (packed) {
      b.host_row_start = row_start_;
      ops::copy(be_, host_tensor(packed_rows_, DType::I32, {tokens}), b.packed_rows);
      ops::copy(be_, host_tensor(row_start_, DType::I32, {batch + 1}), b.row_start);
    }
  }
  if (g) {  // recorded (or about to be): the logits land in page-locked memory
    ForwardOutputs copied;
    copied.logits_copy = &infer_logits_host_;
    run_as(mode, g, &StepGraphs::micro, [&] { model_->forward(be_, mem, b, copied); });
    g->inputs = b;
    logits_from_host(batch, out.logits);
  } else {
    model_->forward(be_, mem, b, out);
  }
  if (packed) {
    mem.release(b.packed_rows);
    mem.release(b.row_start);
  }
  for (Tensor* t : {&b.input_ids, &b.attention_mask, &b.token_type_ids}) mem.release(*t);
  mem.end_phase();
}

}  // namespace hone
