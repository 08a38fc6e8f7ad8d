#include "hone/trainer.h"

#include <algorithm>
#include <numeric>
#include <cstring>
#include <cmath>

#include "hone/cpu_backend.h"
#include "hone/dtype.h"
#include "hone/ops.h"
#include "hone/schedule.h"
#include "hone/weights.h"
#include "train/run_as.h"

namespace hone {

nlohmann::ordered_json TrainMetrics::to_json() const {
  nlohmann::ordered_json j;
  j["train_runtime"] = train_runtime;
  j["train_samples_per_second"] = train_samples_per_second;
  j["train_steps_per_second"] = train_steps_per_second;
  j["total_flos"] = total_flos;
  j["train_loss"] = train_loss;
  j["epoch"] = epoch;
  j["train_forward_seconds"] = spans[size_t(StepSpan::Forward)];
  j["train_backward_seconds"] = spans[size_t(StepSpan::Backward)];
  j["train_optimizer_seconds"] = spans[size_t(StepSpan::Optimizer)];
  j["model_flops"] = model_flops;
  return j;
}

StepCounts count_steps(const TrainingArguments& a, int64_t n, int world_size) {
  HONE_CHECK(world_size >= 1, "a world of {} ranks", world_size);
  StepCounts s;
  const int64_t B = a.per_device_train_batch_size, GA = a.gradient_accumulation_steps;
  s.micro_per_epoch = (n + B * world_size - 1) / (B * world_size);
  s.updates_per_epoch = std::max<int64_t>(1, (s.micro_per_epoch + GA - 1) / GA);
  if (a.max_steps > 0) {
    s.total_updates = a.max_steps;
    s.epochs = (a.max_steps + s.updates_per_epoch - 1) / s.updates_per_epoch;
    s.num_train_samples = a.max_steps * B * GA * world_size;
  } else {
    s.total_updates = int64_t(std::ceil(a.num_train_epochs * double(s.updates_per_epoch)));
    s.epochs = int64_t(std::ceil(a.num_train_epochs));
    s.num_train_samples = int64_t(double(n) * a.num_train_epochs);
  }
  return s;
}

bool times_products(const TrainingArguments& a, int64_t n, int64_t seq_len, int world_size) {
  return count_steps(a, n, world_size).num_train_samples * seq_len / world_size >= kTimedRunTokens;
}

// ---------------------------------------------------------------- TrainingRun

GradientMemory gradient_memory_for(const TrainingArguments& a) {
  return a.gradient_accumulation_steps == 1 ? GradientMemory::StepScoped : GradientMemory::Persistent;
}

Checkpointing checkpointing_for(const TrainingArguments& a) {
  if (!a.gradient_checkpointing) return Checkpointing::None;
  return a.gradient_checkpointing_policy == "selective" ? Checkpointing::Selective : Checkpointing::Full;
}

TrainingRun::TrainingRun(const TrainingArguments& a, const ModelConfig& c, int seq_len, Backend& be,
                         GradientMemory grads, RunPhases phases, Sharding sharding, PlanOnly)
    : args_(a),
      seq_(seq_len),
      phases_(phases),
      scoped_grads_(grads == GradientMemory::StepScoped),
      be_(be),
      model_(std::make_unique<SequenceClassifier>(c)),
      optimizer_(make_optimizer(a)),
      own_comm_(make_single_communicator()),
      comm_(own_comm_.get()),
      sharding_(sharding),
      offload_(a.offload_optimizer && phases.train) {
  if (seq_len > c.max_sequence_length())
    fail("sequences of {} tokens do not fit the model's max_position_embeddings ({}{})", seq_len,
         c.max_position_embeddings,
         c.max_sequence_length() == c.max_position_embeddings
             ? ""
             : fmt::format(", {} tokens after the padding index", c.max_sequence_length()));
  model_->set_checkpointing(checkpointing_for(a));
  grad_list_.reserve(model_->layout().groups().size());
  packs_training_ = phases_.train && be_.packs_training() &&
                    (!be_.can_record() || int64_t(a.per_device_train_batch_size) * seq_len >= kPackedTrainingTokens);
  if (packs_training_) packing_batch_ = a.per_device_train_batch_size;
  if (phases_.infer_batch > 0) {
    const AttentionDims widest{phases_.infer_batch, seq_len, c.num_attention_heads, c.head_dim(), 1.0f};
    packs_ = be_.packs_attention(widest, compute_dtype(a, be_));
    if (packs_) packing_batch_ = std::max(packing_batch_, phases_.infer_batch);
  }
  if (sharding_.world_size > 1 && phases_.train) plan_ranks();
  if (offload_) {
    if (be_.device() == Device::CPU) {
      host_be_ = &be_;
    } else {
      own_host_be_ = std::make_unique<CpuBackend>();
      host_be_ = own_host_be_.get();
    }
  }
}

TrainingRun::TrainingRun(const TrainingArguments& a, const ModelConfig& c, int seq_len, Backend& be,
                         GradientMemory grads, RunPhases phases, Sharding sharding)
    : TrainingRun(a, c, seq_len, be, grads, phases, sharding, PlanOnly{}) {
  mem_ = std::make_unique<PlannedMemory>(record_plan(), be);
  mem_->begin_phase(Phase::Setup);
  setup(*mem_);
  mem_->end_phase();
  if (phases_.infer_batch > 0 && be_.can_record()) {
    infer_logits_host_ = Tensor{nullptr, compute_dtype(a, be_), {phases_.infer_batch, c.num_labels}, Device::CPU};
    infer_logits_host_.data = be_.allocate_host(infer_logits_host_.bytes());
  }
  if (packing_batch_ > 0 && !be_.dry_run) {
    packing_rows_ = int64_t(packing_batch_) * seq_;
    packed_rows_ = static_cast<int32_t*>(be_.allocate_host(sizeof(int32_t) * size_t(packing_rows_)));
    row_start_ = static_cast<int32_t*>(be_.allocate_host(sizeof(int32_t) * size_t(packing_batch_ + 1)));
  }
  if (phases_.train) {
    const size_t labels_at = sizeof(int64_t) + sizeof(float) * kOptimizerScalarsSize;
    host_staging_ = be_.allocate_host(labels_at + sizeof(int32_t) * size_t(a.per_device_train_batch_size));
    host_step_ = static_cast<int64_t*>(host_staging_);
    host_scalars_ = reinterpret_cast<float*>(static_cast<char*>(host_staging_) + sizeof(int64_t));
    host_labels_ = reinterpret_cast<int32_t*>(static_cast<char*>(host_staging_) + labels_at);
    optimizer_->reset_state(offload_ ? *host_be_ : be_);
    for (Tensor* t : {&loss_sum_, &norm_coef_}) ops::fill(be_, *t, 0.0f);
    for (int k = 0; k < model_->num_groups(); ++k)  // the persistent ones
      if (model_->grad(k).data) ops::fill(be_, model_->grad(k), 0.0f);
    if (loss_scaling()) {
      scaler_host_ = static_cast<float*>(be_.allocate_host(3 * sizeof(float)));
      set_scaler_state({LossScaling{}.init_scale, 0, 0});
    }
  }
}

TrainingRun::~TrainingRun() {
  for (auto& [key, g] : micro_graphs_) {
    be_.free_recording(g.micro);
    be_.free_recording(g.optimizer);
  }
  for (auto& [key, g] : infer_graphs_) be_.free_recording(g.micro);
  be_.free_recording(optimizer_graphs_.optimizer);
  try {
    be_.wait_for_copies();  // staged copies may still read host_staging_
  } catch (...) {  // a destructor does not throw; the device is failing anyway
  }
  if (scaler_host_) be_.deallocate_host(scaler_host_);
  if (infer_logits_host_.data) be_.deallocate_host(infer_logits_host_.data);
  if (host_staging_) be_.deallocate_host(host_staging_);
  if (packed_rows_) be_.deallocate_host(packed_rows_);
  if (row_start_) be_.deallocate_host(row_start_);
}

MemoryPlan TrainingRun::plan(const TrainingArguments& a, const ModelConfig& c, int seq_len, Backend& be,
                             GradientMemory grads, RunPhases phases, Sharding sharding) {
  return TrainingRun(a, c, seq_len, be, grads, phases, sharding, PlanOnly{}).record_plan();
}

// Dry-runs setup, one micro-step at the largest batch and one optimizer step against a
// planner: the plan is exactly what the code takes.
MemoryPlan TrainingRun::record_plan() {
  MemoryPlanner planner;
  be_.dry_run = true;
  if (host_be_) host_be_->dry_run = true;
  try {
    planner.begin_phase(Phase::Setup);
    setup(planner);
    planner.end_phase();
    if (phases_.train) {
      run_micro_step(planner, nullptr, nullptr, nullptr, nullptr, args_.per_device_train_batch_size, seq_, 1.0f, 0,
                     nullptr);
      run_optimizer_step(planner, 0.0, 1);
      if (scoped_grads_) planner.share_arena(Category::Gradients, Category::Activations);
    }
    if (phases_.infer_batch > 0) {
      run_infer(planner, nullptr, nullptr, nullptr, phases_.infer_batch, seq_, {});
      float unread = 0.0f;  // a dry run reads nothing back: this only asks for the hidden states
      ForwardOutputs hidden;
      hidden.last_hidden_state = &unread;
      run_infer(planner, nullptr, nullptr, nullptr, phases_.infer_batch, seq_, hidden);
    }
    if (packs_)  // planned with every token attended: the most a packed batch holds
      run_infer_as(planner, nullptr, nullptr, nullptr, phases_.infer_batch, seq_, {}, true,
                   int64_t(phases_.infer_batch) * seq_);
  } catch (...) {
    be_.dry_run = false;
    if (host_be_) host_be_->dry_run = false;
    throw;
  }
  be_.dry_run = false;
  if (host_be_) host_be_->dry_run = false;
  return planner.finish();
}

void TrainingRun::setup(BufferSource& mem) {
  // A run that only infers keeps no master weights: its half-precision copy is the model.
  // Without training no gradient is ever taken; accumulated ones persist (under ZeRO stage
  // 2 only this rank's groups': the others' go to their owners each micro-step).
  SequenceClassifier::GroupRange persistent;
  if (phases_.train && !scoped_grads_)
    persistent = shards_grads() ? SequenceClassifier::GroupRange{bounds_[size_t(sharding_.rank)],
                                                                            bounds_[size_t(sharding_.rank) + 1]}
                                : SequenceClassifier::GroupRange{0, model_->num_groups()};
  model_->bind_parameters(mem, persistent, compute_dtype(args_, be_),
                          offload_ ? Category::HostMasterWeights : Category::MasterWeights,
                          phases_.train && !master_sharded_);
  // Sharded runs keep every parameter's half copy (rank_range): no rank holds all the master
  // weights for the lookup to read.
  HONE_CHECK(model_->half_begin() == 0 || !master_sharded_,
             "a sharded run planned without a half copy of the embedding tables");
  if (sharding_.world_size > 1) {
    const int64_t chunk = int64_t(4) << 20;  // 16 MiB a collective: large enough to run at NVLink's speed
    exchange_ =
        mem.take(Category::Workspace, "rank_exchange", -1, DType::F32, {std::min(chunk, model_->layout().count())});
  }
  if (!phases_.train) return;
  if (master_sharded_)
    master_shard_ = mem.take(Category::MasterWeights, "parameters_shard", -1, DType::F32, {shard_layout_->count()});
  if (offload_) {
    HostCategories host(mem);
    optimizer_->take_state(host, model_->layout());
    const int64_t n = model_->layout().count();
    if (model_->mixed())
      host_half_ = mem.take(Category::HostMasterWeights, "parameters_rounded", -1, model_->compute_dtype(),
                            {n - model_->half_begin()});
    else
      host_master_ = mem.take(Category::HostMasterWeights, "parameters", -1, DType::F32, {n});
    host_grads_ = mem.take(Category::HostGradients, "parameter_grads", -1, DType::F32, {n});
    host_norm_coef_ = mem.take(Category::HostWorkspace, "grad_norm_and_clip", -1, DType::F32, {kNormCoefSize});
    host_group_grads_.clear();
    for (const ParamGroup& g : model_->layout().groups())
      host_group_grads_.push_back(host_grads_.rows(g.begin, g.begin + g.size()));
    host_sumsq_ = mem.take(Category::HostWorkspace, "grad_sum_squares", -1, DType::F32, {1});
    // Gradients leave for the host as backward finishes each group: step-scoped ones on the
    // compute stream, which then reuses their memory for activations; accumulated ones on
    // a transfer stream, beside the window's last backward.
    sent_grads_.reserve(size_t(model_->num_groups()));
    model_->on_group_grads_done([this](Backend& be, BufferSource& m, int k) {
      Tensor& g = model_->grad(k);
      if (scoped_grads_) {
        ops::copy(be, g, host_group_grads_[size_t(k)]);
        m.release(g);
        g = Tensor{};
      } else if (sending_grads_) {
        sent_grads_.push_back({k, be.transfer_to_host(g, host_group_grads_[size_t(k)])});
      }
    });
  } else {
    optimizer_->take_state(mem, sharding_.sharded() ? *shard_layout_ : model_->layout());
  }
  loss_sum_ = mem.take(Category::Workspace, "loss_sum", -1, DType::F32, {1});
  vote_ = mem.take(Category::Workspace, "rank_vote", -1, DType::F32, {1});
  sumsq_ = mem.take(Category::Workspace, "grad_sum_squares", -1, DType::F32, {1});
  norm_coef_ = mem.take(Category::Workspace, "grad_norm_and_clip", -1, DType::F32, {kNormCoefSize});
  if (loss_scaling()) scaler_ = mem.take(Category::Workspace, "loss_scaler", -1, DType::F32, {kScalerSize});
  const int B = args_.per_device_train_batch_size;
  const int64_t T = int64_t(B) * seq_;
  staged_ids_ = mem.take(Category::Workspace, "staged_input_ids", -1, DType::I32, {T});
  staged_mask_ = mem.take(Category::Workspace, "staged_attention_mask", -1, DType::I32, {T});
  staged_types_ = mem.take(Category::Workspace, "staged_token_type_ids", -1, DType::I32, {T});
  staged_labels_ =
      mem.take(Category::Workspace, "staged_labels", -1, model_->regression() ? DType::F32 : DType::I32, {B});
  staged_step_ = mem.take(Category::Workspace, "staged_dropout_step", -1, DType::I64, {1});
  staged_scalars_ = mem.take(Category::Workspace, "staged_optimizer_scalars", -1, DType::F32, {kOptimizerScalarsSize});
  optimizer_scalars_ = mem.take(Category::Workspace, "optimizer_scalars", -1, DType::F32, {kOptimizerScalarsSize});
}

float* TrainingRun::host_weights() {
  HONE_CHECK(be_.device() == Device::CPU, "host_weights on a {} backend", be_.name());
  HONE_CHECK(!host_master_.data, "host_weights with an offloaded optimizer: write_weights keeps its master copy");
  HONE_CHECK(!master_sharded_, "host_weights of a run whose master weights are sharded over {} ranks",
             sharding_.world_size);
  return model_->weights().f32();
}

namespace {

// Whether every id, token type and mask value lies in range, and (where asked) every row's
// mask is right-padded: one pass of unsigned compares without a branch, which the compiler
// vectorizes (a 64 x 512 batch on a 2-core VM: 7 us against 36 for the loop that names the
// bad element, which runs only when this says no).
bool batch_in_range(const int32_t* ids, const int32_t* mask, const int32_t* types, int batch, int seq,
                    const ModelConfig& c, bool right_padding_only) {
  const size_t n = size_t(batch) * size_t(seq);
  const uint32_t vocab = uint32_t(c.vocab_size), type_vocab = uint32_t(c.type_vocab_size);
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    bad |= uint32_t(uint32_t(ids[i]) >= vocab) | uint32_t(uint32_t(types[i]) >= type_vocab) |
           uint32_t(uint32_t(mask[i]) > 1u);
  if (right_padding_only)
    for (int b = 0; b < batch; ++b) {
      const int32_t* row = mask + size_t(b) * size_t(seq);
      for (int t = 1; t < seq; ++t) bad |= uint32_t(row[t] > row[t - 1]);
    }
  return bad == 0;
}

}  // namespace

// Checked on the host, before any backend sees the batch: kernels then trust their indices.
void TrainingRun::validate_batch(const int32_t* ids, const int32_t* mask, const int32_t* types, const float* labels,
                                 int batch, int seq) const {
  const ModelConfig& c = model_->config();
  // cuDNN's fused attention takes each row's length, not its mask.
  const bool right_padding_only = be_.attention_needs_right_padding(model_->compute_weights().dtype);
  const bool in_range = batch_in_range(ids, mask, types, batch, seq, c, right_padding_only);
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < seq && !in_range; ++t) {  // names the first bad element
      const size_t i = size_t(b) * seq + t;
      if (ids[i] < 0 || ids[i] >= c.vocab_size)
        fail("batch row {}, position {}: token id {} is out of range for the model's vocab_size {}", b, t, ids[i],
             c.vocab_size);
      if (types[i] < 0 || types[i] >= c.type_vocab_size)
        fail("batch row {}, position {}: token type {} is out of range for type_vocab_size {}", b, t, types[i],
             c.type_vocab_size);
      if (mask[i] != 0 && mask[i] != 1)
        fail("batch row {}, position {}: attention mask value {} is not 0 or 1", b, t, mask[i]);
      if (right_padding_only && t > 0 && mask[i] == 1 && mask[i - 1] == 0)
        fail("batch row {}: the attention mask is not right-padded (a 1 at position {} after a 0); cuDNN's "
             "attention (HONE_ATTENTION=cudnn) under --bf16 and --fp16 needs padding at the end of each sequence",
             b, t);
    }
    if (!labels) continue;
    if (model_->regression()) {
      if (!std::isfinite(labels[b])) fail("batch row {}: regression target {} is not finite", b, labels[b]);
    } else if (labels[b] != -100.0f && !(labels[b] >= 0 && labels[b] < float(c.num_labels) &&
                                        labels[b] == std::floor(labels[b]))) {
      fail("batch row {}: label {} is not a class id in [0, {})", b, labels[b], c.num_labels);
    }
  }
}

void TrainingRun::write_weights(const float* host) {
  if (master_sharded_) {
    // This rank's master shard, and the half copy of every weight rounded on the device
    // (as cast rounds), the host's weights going up a chunk at a time.
    ops::copy(be_, host_tensor(host + rank_span(sharding_.rank).first, DType::F32, master_shard_.shape), master_shard_);
    const Tensor& half = model_->compute_weights();
    const int64_t n = half.numel(), chunk = exchange_.numel();
    for (int64_t at = 0; at < n; at += chunk) {
      const int64_t m = std::min(chunk, n - at);
      Tensor staging = exchange_.rows(0, m), dst = half.rows(at, at + m);
      ops::copy(be_, host_tensor(host + at, DType::F32, {m}), staging);
      ops::cast(be_, staging, dst);
    }
    be_.synchronize();
    return;
  }
  if (!model_->weights().data) {  // inference only, in half precision: rounded here, as cast rounds
    const Tensor& dst = model_->compute_weights();
    std::vector<uint16_t> rounded(size_t(dst.numel()));
    const bool bf16 = dst.dtype == DType::BF16;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < dst.numel(); ++i) rounded[size_t(i)] = bf16 ? float_to_bf16(host[i]) : float_to_f16(host[i]);
    copy_from_host(rounded.data(), dst);
    return;
  }
  ops::copy(be_, host_tensor(host, DType::F32, model_->weights().shape), model_->weights());
  model_->round_weights(be_);
  sync_host_master();
  be_.synchronize();
}

void TrainingRun::sync_host_master() {
  if (host_master_.data) ops::copy(be_, model_->weights(), host_master_);
}

void TrainingRun::init_weights(uint64_t seed) {
  HONE_CHECK(master().data, "a run planned for inference in half precision keeps no F32 weights");
  HONE_CHECK(!master_sharded_ || comm_->world_size() == sharding_.world_size,
             "init_weights of a run whose master weights are sharded over {} ranks, before distribute()",
             sharding_.world_size);
  const ParamLayout& layout = model_->layout();
  // With sharded master weights each rank draws its own groups' (every parameter has a
  // stream of its own, so the draws are those of one process) and the owners share them.
  const int64_t base = master_sharded_ ? rank_span(sharding_.rank).first : 0;
  for (size_t i = 0; i < layout.entries().size(); ++i) {
    ParamEntry e = layout.entries()[i];
    if (master_sharded_ && owner_[size_t(e.group)] != sharding_.rank) continue;
    e.offset -= base;
    Tensor t = model_->param(master(), e);
    const ParamInit init = param_init(model_->config(), e, i);
    if (!init.normal) {
      ops::fill(be_, t, init.value);
      continue;
    }
    ops::fill_normal(be_, t, init.value, seed, init.stream);
    if (init.zero_end > init.zero_begin) {
      Tensor pad = t;
      pad.data = t.f32() + init.zero_begin;
      pad.shape = Shape{init.zero_end - init.zero_begin};
      ops::fill(be_, pad, 0.0f);
    }
  }
  if (master_sharded_) {
    Tensor half = rank_range(model_->compute_weights(), sharding_.rank);
    ops::cast(be_, master_shard_, half);
    share_updated_weights();
  } else {
    model_->round_weights(be_);
  }
  sync_host_master();
  be_.synchronize();
}

void TrainingRun::save_model(const std::string& dir, int64_t chunk_floats) {
  HONE_CHECK(master().data, "a run planned for inference in half precision keeps no F32 weights");
  HONE_CHECK(chunk_floats > 0, "save_model with chunks of {} floats", chunk_floats);
  const ParamLayout& layout = model_->layout();
  if (master_sharded_) {
    std::vector<float> host(size_t(layout.count()));
    read_weights(host.data());
    save_pretrained(dir, model_->config(), layout, host.data());
    return;
  }
  std::vector<std::pair<int64_t, int64_t>> pieces;  // (first parameter, count), in file order
  int64_t largest = 0;
  for (const ParamEntry& e : layout.entries())
    for (int64_t at = 0, n = e.shape.numel(); at < n; at += chunk_floats) {
      pieces.push_back({e.offset + at, std::min(chunk_floats, n - at)});
      largest = std::max(largest, pieces.back().second);
    }
  struct HostChunk {
    Backend& be;
    void* p;
    ~HostChunk() { be.deallocate_host(p); }
  };
  const size_t bytes = size_t(std::max<int64_t>(largest, 1)) * sizeof(float);
  HostChunk chunk[2] = {{be_, be_.allocate_host(bytes)}, {be_, be_.allocate_host(bytes)}};
  auto start = [&](size_t i) {
    Tensor src = model_->weights();
    src.data = src.f32() + pieces[i].first;
    src.shape = Shape{pieces[i].second};
    Tensor dst = host_tensor(chunk[i % 2].p, DType::F32, src.shape);
    ops::copy(be_, src, dst);
  };
  save_pretrained(dir, model_->config(), layout, [&](const ByteWriter& write) {
    if (!pieces.empty()) start(0);
    for (size_t i = 0; i < pieces.size(); ++i) {
      be_.wait_for_reads();  // piece i has landed; its other buffer's piece was written
      if (i + 1 < pieces.size()) start(i + 1);
      write(chunk[i % 2].p, size_t(pieces[i].second) * sizeof(float));
    }
  });
}

void TrainingRun::read_weights(float* host) {
  HONE_CHECK(master().data, "a run planned for inference in half precision keeps no F32 weights");
  if (master_sharded_) {
    HONE_CHECK(comm_->world_size() == sharding_.world_size,
               "read_weights of a run whose master weights are sharded over {} ranks, before distribute()",
               sharding_.world_size);
    // Each owner's share in chunks through the staging buffer, to every rank.
    const int64_t chunk = exchange_.numel();
    for (int r = 0; r < sharding_.world_size; ++r) {
      const auto [begin, end] = rank_span(r);
      for (int64_t at = begin; at < end; at += chunk) {
        const int64_t m = std::min(chunk, end - at);
        Tensor staging = exchange_.rows(0, m);
        if (r == sharding_.rank) ops::copy(be_, master_shard_.rows(at - begin, at - begin + m), staging);
        comm_->broadcast(be_, staging, r);
        comm_->wait_collectives(be_);  // before the staging buffer is read or refilled
        Tensor dst = host_tensor(host + at, DType::F32, {m});
        if (host) ops::copy(be_, staging, dst);
      }
    }
    be_.synchronize();
    return;
  }
  HONE_CHECK(host, "read_weights without a destination");
  Tensor dst = host_tensor(host, DType::F32, model_->weights().shape);
  ops::copy(be_, model_->weights(), dst);
  be_.synchronize();
}

const Optimizer& TrainingRun::optimizer() const {
  HONE_CHECK(phases_.train, "a run planned for inference has no optimizer");
  return *optimizer_;
}

void TrainingRun::copy_to_host(const Tensor& t, void* host) {
  Tensor dst = host_tensor(host, t.dtype, t.shape);
  ops::copy(be_, t, dst);
  be_.synchronize();
}

void TrainingRun::copy_from_host(const void* host, const Tensor& t) {
  Tensor dst = t;
  ops::copy(be_, host_tensor(host, t.dtype, t.shape), dst);
  be_.synchronize();
}

void TrainingRun::read_grads(float* host) {
  HONE_CHECK(!scoped_grads_ || step_open_, "step-scoped gradients exist only between micro_step and optimizer_step");
  for (int k = 0; k < model_->num_groups(); ++k) {
    const ParamGroup& g = model_->layout().groups()[size_t(k)];
    Tensor dst = host_tensor(host + g.begin, DType::F32, {g.size()});
    // Offloaded step-scoped gradients have left the device for the host buffer.
    ops::copy(be_, offload_ && scoped_grads_ ? host_group_grads_[size_t(k)] : model_->grad(k), dst);
  }
  be_.synchronize();
  // Under fp16 the buffers hold the gradients times the loss scale, as torch's .grad
  // before GradScaler.unscale_; the caller gets the gradients of the loss.
  if (loss_scaling()) {
    const double inv = 1.0 / loss_scale();
    const int64_t n = model_->layout().count();
    for (int64_t i = 0; i < n; ++i) host[i] = float(host[i] * inv);
  }
}

void TrainingRun::micro_step(const int32_t* ids, const int32_t* mask, const int32_t* types, const float* labels,
                             int batch, float grad_scale, uint64_t dropout_step, float* logits_out) {
  run_micro_step(*mem_, ids, mask, types, labels, batch, seq_, grad_scale, dropout_step, logits_out);
}

void TrainingRun::micro_step(const Batch& b, float grad_scale, uint64_t dropout_step) {
  run_micro_step(*mem_, b.ids, b.mask, b.types, b.labels, b.rows, b.seq, grad_scale, dropout_step, nullptr);
}

BatchTensors TrainingRun::take_batch(BufferSource& mem, bool with_labels, int batch, int seq) {
  const int64_t T = int64_t(batch) * seq;
  BatchTensors b;
  b.batch = batch, b.seq = seq;
  b.input_ids = mem.take(Category::Activations, "input_ids", -1, DType::I32, {T});
  b.attention_mask = mem.take(Category::Activations, "attention_mask", -1, DType::I32, {batch, seq});
  b.token_type_ids = mem.take(Category::Activations, "token_type_ids", -1, DType::I32, {T});
  if (with_labels)
    b.labels =
        mem.take(Category::Activations, "labels", -1, model_->regression() ? DType::F32 : DType::I32, {batch});
  return b;
}

void TrainingRun::upload(const int32_t* ids, const int32_t* mask, const int32_t* types, BatchTensors& b) {
  const int64_t T = int64_t(b.batch) * b.seq;
  ops::copy(be_, host_tensor(ids, DType::I32, {T}), b.input_ids);
  ops::copy(be_, host_tensor(mask, DType::I32, {b.batch, b.seq}), b.attention_mask);
  ops::copy(be_, host_tensor(types, DType::I32, {T}), b.token_type_ids);
}

void TrainingRun::stage_batch(const int32_t* ids, const int32_t* mask, const int32_t* types, const float* labels,
                              uint64_t dropout_step, const BatchTensors& b, const Tensor& step) {
  const int64_t T = int64_t(b.batch) * b.seq;
  const bool regression = model_->regression();
  be_.wait_for_copies();  // the last staged values have left the host buffers
  *host_step_ = int64_t(dropout_step);
  if (!regression)
    for (int i = 0; i < b.batch; ++i) host_labels_[i] = int32_t(labels[i]);
  const auto host = host_tensor;
  struct Move {
    Tensor src, staging, dst;
  };
  Move moves[] = {
      {host(ids, DType::I32, {T}), staged_ids_.rows(0, T), b.input_ids},
      {host(mask, DType::I32, {T}), staged_mask_.rows(0, T), b.attention_mask},
      {host(types, DType::I32, {T}), staged_types_.rows(0, T), b.token_type_ids},
      {regression ? host(labels, DType::F32, {b.batch}) : host(host_labels_, DType::I32, {b.batch}),
       staged_labels_.rows(0, b.batch), b.labels},
      {host(host_step_, DType::I64, {1}), staged_step_, step}};
  // Every copy from the host first, so that one wait covers them all.
  for (Move& m : moves) be_.stage(m.src, m.staging);
  for (Move& m : moves) be_.take_staged(m.staging, m.dst);
}

TrainingRun::StepMode TrainingRun::next_mode(StepGraphs& g, int& recorded, int cap) {
  if (g.failed) return StepMode::Eager;
  if (g.recorded) return StepMode::Replay;
  if (g.seen++ == 0 || recorded == cap) return StepMode::Eager;
  ++recorded;
  g.recorded = true;
  return StepMode::Record;
}

void TrainingRun::run_micro_step(BufferSource& mem, const int32_t* ids, const int32_t* mask, const int32_t* types,
                                 const float* labels, int batch, int seq, float grad_scale, uint64_t dropout_step,
                                 float* logits_out) {
  HONE_CHECK(phases_.train, "micro_step on a run planned for inference only");
  HONE_CHECK(batch >= 1 && batch <= args_.per_device_train_batch_size, "batch of {} rows", batch);
  HONE_CHECK(seq >= 1 && seq <= seq_, "sequences of {} tokens in a run planned for {}", seq, seq_);
  // Step-scoped gradients live until the optimizer step: both run in one phase.
  HONE_CHECK(!step_open_, "with step-scoped gradients, each micro_step must be followed by optimizer_step");
  // Before the phase opens, so that a refused batch leaves the run usable.
  if (!be_.dry_run) validate_batch(ids, mask, types, labels, batch, seq);
  HONE_CHECK(be_.dry_run || comm_->world_size() == sharding_.world_size,
             "a run planned for {} ranks trains without distribute()", sharding_.world_size);
  last_micro_ = nullptr;
  last_micro_mode_ = StepMode::Eager;
  drop_sent_grads();
  // Offloaded accumulation: the window's last micro-step sends the gradients (eagerly:
  // transfers are not recorded).
  const bool window_ends = scoped_grads_ || ++micro_in_window_ == args_.gradient_accumulation_steps;
  sending_grads_ = offload_ && !scoped_grads_ && !be_.dry_run && window_ends;
  // Data parallel: the window's last backward sums each group's gradients over the ranks
  // as it finishes them (eagerly: collectives are not recorded). Under ZeRO stage 2 every
  // backward does, into the owner's accumulated gradients (the others keep none).
  reducing_grads_ = comm_->group().distributed() && !be_.dry_run && (window_ends || shards_grads());
  // Logits for the host are read eagerly; so are shapes past the recordings' cap.
  // An offloaded update after each micro-step runs on the host: no recordings then.
  // Packed steps change their number of rows: never recorded.
  if (args_.cuda_graphs && be_.can_record() && !be_.dry_run && !logits_out && !(offload_ && scoped_grads_) &&
      !sending_grads_ && !reducing_grads_ && !packs_training_) {
    last_micro_ = &micro_graphs_[std::tuple{batch, seq, grad_scale}];
    last_micro_mode_ = next_mode(*last_micro_, recorded_shapes_);
  }
  if (last_micro_mode_ == StepMode::Replay) {
    be_.mark(StepSpan::Forward);
    stage_batch(ids, mask, types, labels, dropout_step, last_micro_->inputs, last_micro_->step);
    run_as(StepMode::Replay, last_micro_, &StepGraphs::micro, [] {});
    step_open_ = scoped_grads_;
    return;
  }
  mem.begin_phase(Phase::MicroStep);
  be_.mark(StepSpan::Forward);
  BatchTensors b = take_batch(mem, true, batch, seq);
  Tensor step = mem.take(Category::Activations, "dropout_step", -1, DType::I64, {1});
  if (!be_.dry_run) stage_batch(ids, mask, types, labels, dropout_step, b, step);
  if (packs_training_) {  // planned with every row: the most a packed batch holds
    b.tokens = be_.dry_run ? int64_t(batch) * seq : pack_training_rows(mask, batch, seq);
    b.packed_rows = mem.take(Category::Activations, "packed_rows", -1, DType::I32, {b.tokens});
    b.row_start = mem.take(Category::Activations, "row_start", -1, DType::I32, {batch + 1});
    if (!be_.dry_run) {
      b.host_row_start = row_start_;
      ops::copy(be_, host_tensor(packed_rows_, DType::I32, {b.tokens}), b.packed_rows);
      ops::copy(be_, host_tensor(row_start_, DType::I32, {batch + 1}), b.row_start);
    }
  }
  Tensor loss = mem.take(Category::Workspace, "loss", -1, DType::F32, {1});
  run_as(last_micro_mode_, last_micro_, &StepGraphs::micro, [&] {
    model_->forward_backward(be_, mem, b, DropoutState{args_.seed, true, step.ptr<int64_t>()},
                             grad_scale, loss_scaling() ? &scaler_ : nullptr, loss, logits_out);
    ops::add_scaled(be_, loss, grad_scale, loss_sum_);
  });
  sending_grads_ = false;
  grads_reduced_ = reducing_grads_;
  reducing_grads_ = false;
  if (last_micro_) last_micro_->inputs = b, last_micro_->step = step;
  mem.release(loss);
  if (packs_training_) {
    mem.release(b.packed_rows);
    mem.release(b.row_start);
  }
  for (Tensor* t : {&b.input_ids, &b.attention_mask, &b.token_type_ids, &b.labels, &step}) mem.release(*t);
  if (scoped_grads_)
    step_open_ = true;
  else
    mem.end_phase();
}

int64_t TrainingRun::pack_rows(const int32_t* mask, int batch, int seq) {
  HONE_CHECK(int64_t(batch) * seq <= packing_rows_ && batch <= packing_batch_,
             "packing {} x {} tokens into buffers for {} rows of {}", batch, seq, packing_batch_, seq_);
  int64_t rows = 0;
  row_start_[0] = 0;
  for (int b = 0; b < batch; ++b) {
    // The row's attended tokens, and whether one follows padding: counted without a branch,
    // so that the loop vectorizes (a scan to the first 0 did not).
    const int32_t* row = mask + int64_t(b) * seq;
    int len = row[0] != 0;
    uint32_t hole = 0;
    for (int j = 1; j < seq; ++j) {
      len += row[j] != 0;
      hole |= uint32_t((row[j] != 0) > (row[j - 1] != 0));
    }
    if (hole) return 0;      // a hole in the mask: padded attention keeps HF's semantics
    if (len == 0) return 0;  // no attended token: HF attends to every key
    int32_t* out = packed_rows_ + rows;
    for (int j = 0; j < len; ++j) out[j] = b * seq + j;
    rows += len;
    row_start_[b + 1] = int32_t(rows);
  }
  // No padding to leave out: the padded kernels run the same rows.
  return rows < int64_t(batch) * seq ? rows : 0;
}

int64_t TrainingRun::pack_training_rows(const int32_t* mask, int batch, int seq) {
  const int64_t tokens = pack_rows(mask, batch, seq);
  if (tokens > 0) return tokens;
  std::iota(packed_rows_, packed_rows_ + int64_t(batch) * seq, 0);
  for (int b = 0; b <= batch; ++b) row_start_[b] = b * seq;
  return int64_t(batch) * seq;
}

void TrainingRun::optimizer_step(double lr, int64_t step) { run_optimizer_step(*mem_, lr, step); }

void TrainingRun::run_optimizer_step(BufferSource& mem, double lr, int64_t step) {
  // With step-scoped gradients the optimizer step runs as its micro-step did (a replayed
  // micro-step opened no memory phase); otherwise it is recorded on its own.
  StepGraphs* graphs = scoped_grads_ ? last_micro_ : nullptr;
  StepMode mode = scoped_grads_ ? last_micro_mode_ : StepMode::Eager;
  if (scoped_grads_) {
    HONE_CHECK(step_open_, "optimizer_step without a micro_step before it");
  } else if (args_.cuda_graphs && be_.can_record() && !be_.dry_run && !offload_ &&
             !comm_->group().distributed()) {  // host work or collectives: eager
    graphs = &optimizer_graphs_;
    mode = next_mode(*graphs, recorded_shapes_);
  }
  if (!scoped_grads_ && mode != StepMode::Replay) mem.begin_phase(Phase::OptimizerStep);
  be_.mark(StepSpan::Optimizer);
  HONE_CHECK(step >= 1, "optimizer step {}: updates count from 1", step);
  if (!be_.dry_run) {
    be_.wait_for_copies();  // the last step's scalars have left the host buffer
    std::fill_n(host_scalars_, kOptimizerScalarsSize, 0.0f);
    optimizer_->scalars(lr, step, host_scalars_);
    be_.stage(host_tensor(host_scalars_, DType::F32, {kOptimizerScalarsSize}), staged_scalars_);
    be_.take_staged(staged_scalars_, optimizer_scalars_);
  }
  run_as(mode, graphs, &StepGraphs::optimizer, [&] { optimizer_body(mem); });
  micro_in_window_ = 0;
  // Whether this step was skipped, and the new scale: read back once the next micro-step
  // is queued (skipped_steps), so the GPU never idles waiting on the host.
  if (loss_scaling() && !be_.dry_run) scaler_read_pending_ = true;
  step_open_ = false;
  be_.mark(StepSpan::Other);
  if (mode != StepMode::Replay) mem.end_phase();
}

// Clip, the optimizer's update and zeroed gradients: everything an optimizer step queues
// on the device.
void TrainingRun::optimizer_body(BufferSource& mem) {
  if (offload_ && scoped_grads_) {
    // The gradients left for the host in backward: their norm is summed there, in the
    // groups' order as the device would sum them, and goes up for the clip coefficient.
    if (!be_.dry_run) be_.wait_for_reads();
    ops::fill(*host_be_, host_sumsq_, 0.0f);
    ops::sum_squares(*host_be_, host_group_grads_.data(), int(host_group_grads_.size()), host_sumsq_);
    ops::copy(be_, host_sumsq_, sumsq_);
  } else {
    reduce_grads();
    grad_list_.clear();
    for (int k = 0; k < model_->num_groups(); ++k)
      if (keeps_grads(k)) grad_list_.push_back(model_->grad(k));
    // One launch for the norm of every group (per 48 tensors).
    ops::fill(be_, sumsq_, 0.0f);
    ops::sum_squares(be_, grad_list_.data(), int(grad_list_.size()), sumsq_);
    if (shards_grads() && !be_.dry_run) {  // each rank summed its own groups' squares
      comm_->all_reduce_sum(be_, sumsq_);
      comm_->wait_collectives(be_);
    }
  }
  ops::clip_coefficient(be_, sumsq_, float(args_.max_grad_norm), norm_coef_, loss_scaling() ? &scaler_ : nullptr);
  Backend::Transfer weights_up;  // offloaded: the next forward waits for it, not the zeroing below
  if (offload_) {
    weights_up = offload_update(mem);
  } else if (sharding_.sharded()) {
    update_shard(mem);
  } else {
    const OptimizerTarget target{model_->layout(),
                                 model_->weights(),
                                 model_->mixed() ? model_->compute_weights() : Tensor{},
                                 grad_list_,
                                 norm_coef_,
                                 optimizer_scalars_,
                                 -1,
                                 model_->half_begin()};
    optimizer_->update(be_, mem, target);
  }
  if (loss_scaling() && !be_.dry_run) {
    Tensor skipped = host_tensor(scaler_host_, DType::F32, {1}), state = host_tensor(scaler_host_ + 1, DType::F32, {2});
    ops::copy(be_, norm_coef_.rows(2, 3), skipped);
    ops::copy(be_, scaler_, state);
  }
  if (scoped_grads_)
    model_->release_grads(mem);
  else
    for (int k = 0; k < model_->num_groups(); ++k)  // ZeRO stage 2: the others' left with their reduce
      if (model_->grad(k).data) ops::fill(be_, model_->grad(k), 0.0f);
  be_.compute_waits_for(weights_up);
}

// The offloaded update: the clip coefficient down (and the gradients, unless backward sent
// them), the optimizer's own update on the host backend over the host buffers, group by
// group as their gradients land, each group's updated weights up as soon as it is done.
Backend::Transfer TrainingRun::offload_update(BufferSource& mem) {
  ops::copy(be_, norm_coef_, host_norm_coef_);
  const int groups = model_->num_groups();
  if (int(sent_grads_.size()) != groups) {  // step-scoped, or a window shorter than the accumulation
    drop_sent_grads();
    for (int k = 0; k < groups; ++k) {
      if (!scoped_grads_) ops::copy(be_, model_->grad(k), host_group_grads_[size_t(k)]);
      sent_grads_.push_back({k, Backend::Transfer{}});
    }
  }
  if (!be_.dry_run) be_.wait_for_reads();
  const bool mixed = model_->mixed();
  const Tensor& updated = mixed ? host_half_ : host_master_;
  HostCategories host(mem);
  Backend::Transfer up;
  for (const auto& [k, grads] : sent_grads_) {
    const OptimizerTarget target{model_->layout(),
                                 mixed ? model_->weights() : host_master_,
                                 mixed ? host_half_ : Tensor{},
                                 host_group_grads_,
                                 host_norm_coef_,
                                 host_tensor(host_scalars_, DType::F32, {kOptimizerScalarsSize}),
                                 k,
                                 mixed ? model_->half_begin() : 0};
    if (!be_.dry_run) be_.wait_transfer(grads);
    optimizer_->update(*host_be_, host, target);
    // What forward reads of the group goes up: under mixed precision its rounded copy,
    // which starts after the embedding tables (forward reads those from the host).
    const ParamGroup& g = model_->layout().groups()[size_t(k)];
    const int64_t shift = mixed ? model_->half_begin() : 0, begin = std::max(g.begin, shift) - shift,
                  end = g.end - shift;
    if (end <= begin) continue;
    Tensor dst = model_->compute_weights().rows(begin, end);
    if (!be_.dry_run) up = be_.transfer_to_device(updated.rows(begin, end), dst);
  }
  sent_grads_.clear();
  return up;
}

void TrainingRun::drop_sent_grads() {
  for (const auto& [k, t] : sent_grads_) be_.wait_transfer(t);
  sent_grads_.clear();
}

double TrainingRun::take_loss_sum() {
  if (comm_->group().distributed()) {
    comm_->all_reduce_sum(be_, loss_sum_);
    comm_->wait_collectives(be_);
  }
  float v = 0;
  be_.read(loss_sum_, &v, 1);
  ops::fill(be_, loss_sum_, 0.0f);
  return v;
}

int64_t TrainingRun::skipped_steps() {
  if (scaler_read_pending_) {
    be_.wait_for_reads();
    if (scaler_host_[0] != 0.0f) ++skipped_steps_;
    scaler_read_pending_ = false;
  }
  return skipped_steps_;
}

double TrainingRun::loss_scale() {
  if (!loss_scaling()) return 1.0;
  skipped_steps();
  return scaler_host_[1];
}

std::array<double, 3> TrainingRun::scaler_state() {
  if (!loss_scaling()) return {1.0, 0, 0};
  const int64_t skipped = skipped_steps();
  return {scaler_host_[1], scaler_host_[2], double(skipped)};
}

void TrainingRun::set_scaler_state(const std::array<double, 3>& st) {
  HONE_CHECK(loss_scaling(), "a loss scaler state for a run without --fp16");
  skipped_steps();
  const float device[kScalerSize] = {float(st[0]), float(st[1])};
  ops::copy(be_, host_tensor(device, DType::F32, {kScalerSize}), scaler_);
  be_.synchronize();
  scaler_host_[0] = 0.0f;
  scaler_host_[1] = device[0];
  scaler_host_[2] = device[1];
  skipped_steps_ = int64_t(st[2]);
}

double TrainingRun::last_grad_norm() {
  float v = 0;
  be_.read(norm_coef_, &v, 1);
  return v;
}

}  // namespace hone
