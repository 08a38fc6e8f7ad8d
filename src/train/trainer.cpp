#include "hone/trainer.h"

#include <chrono>
#include <cmath>

#include "hone/ops.h"
#include "hone/schedule.h"

namespace hone {

nlohmann::ordered_json TrainMetrics::to_json() const {
  nlohmann::ordered_json j;
  j["train_runtime"] = train_runtime;
  j["train_samples_per_second"] = train_samples_per_second;
  j["train_steps_per_second"] = train_steps_per_second;
  j["total_flos"] = total_flos;
  j["train_loss"] = train_loss;
  j["epoch"] = epoch;
  return j;
}

StepCounts count_steps(const TrainingArguments& a, int64_t n) {
  StepCounts s;
  const int64_t B = a.per_device_train_batch_size, GA = a.gradient_accumulation_steps;
  s.micro_per_epoch = (n + B - 1) / B;
  s.updates_per_epoch = std::max<int64_t>(1, (s.micro_per_epoch + GA - 1) / GA);
  if (a.max_steps > 0) {
    s.total_updates = a.max_steps;
    s.epochs = (a.max_steps + s.updates_per_epoch - 1) / s.updates_per_epoch;
    s.num_train_samples = a.max_steps * B * GA;
  } else {
    s.total_updates = int64_t(std::ceil(a.num_train_epochs * double(s.updates_per_epoch)));
    s.epochs = int64_t(std::ceil(a.num_train_epochs));
    s.num_train_samples = int64_t(double(n) * a.num_train_epochs);
  }
  return s;
}

// ---------------------------------------------------------------- TrainingRun

GradientMemory gradient_memory_for(const TrainingArguments& a) {
  return a.gradient_accumulation_steps == 1 ? GradientMemory::StepScoped : GradientMemory::Persistent;
}

TrainingRun::TrainingRun(const TrainingArguments& a, const BertConfig& c, int seq_len, Backend& be,
                         GradientMemory grads, PlanOnly)
    : args_(a),
      seq_(seq_len),
      scoped_grads_(grads == GradientMemory::StepScoped),
      be_(be),
      model_(std::make_unique<BertForSequenceClassification>(c)) {
  if (seq_len > c.max_position_embeddings)
    fail("sequences of {} tokens do not fit the model's max_position_embeddings ({})", seq_len,
         c.max_position_embeddings);
  int_labels_.resize(size_t(a.per_device_train_batch_size));
  grad_list_.reserve(model_->layout().groups().size());
  adamw_list_.reserve(2 * model_->layout().groups().size());
}

TrainingRun::TrainingRun(const TrainingArguments& a, const BertConfig& c, int seq_len, Backend& be,
                         GradientMemory grads)
    : TrainingRun(a, c, seq_len, be, grads, PlanOnly{}) {
  mem_ = std::make_unique<PlannedMemory>(record_plan(), be);
  mem_->begin_phase(Phase::Setup);
  setup(*mem_);
  mem_->end_phase();
  for (Tensor* t : {&adam_m_, &adam_v_, &loss_sum_, &norm_coef_}) ops::fill(be_, *t, 0.0f);
  if (!scoped_grads_)
    for (int k = 0; k < model_->num_groups(); ++k) ops::fill(be_, model_->grad(k), 0.0f);
}

MemoryPlan TrainingRun::plan(const TrainingArguments& a, const BertConfig& c, int seq_len, Backend& be,
                             GradientMemory grads) {
  return TrainingRun(a, c, seq_len, be, grads, PlanOnly{}).record_plan();
}

// Dry-runs setup, one micro-step at the largest batch and one optimizer step against a
// planner: the plan is exactly what the code takes.
MemoryPlan TrainingRun::record_plan() {
  MemoryPlanner planner;
  be_.dry_run = true;
  try {
    planner.begin_phase(Phase::Setup);
    setup(planner);
    planner.end_phase();
    run_micro_step(planner, nullptr, nullptr, nullptr, nullptr, args_.per_device_train_batch_size, 1.0f, 0, nullptr);
    run_optimizer_step(planner, 0.0, 1);
    if (scoped_grads_) planner.share_arena(Category::Gradients, Category::Activations);
  } catch (...) {
    be_.dry_run = false;
    throw;
  }
  be_.dry_run = false;
  return planner.finish();
}

void TrainingRun::setup(BufferSource& mem) {
  model_->bind_parameters(mem, scoped_grads_);
  const int64_t n = model_->layout().count();
  adam_m_ = mem.take(Category::OptimizerState, "adam_exp_avg", -1, DType::F32, {n});
  adam_v_ = mem.take(Category::OptimizerState, "adam_exp_avg_sq", -1, DType::F32, {n});
  loss_sum_ = mem.take(Category::Workspace, "loss_sum", -1, DType::F32, {1});
  sumsq_ = mem.take(Category::Workspace, "grad_sum_squares", -1, DType::F32, {1});
  norm_coef_ = mem.take(Category::Workspace, "grad_norm_and_clip", -1, DType::F32, {2});
}

float* TrainingRun::host_weights() {
  HONE_CHECK(be_.device() == Device::CPU, "host_weights on a {} backend", be_.name());
  return model_->weights().f32();
}

namespace {
Tensor host_tensor(const void* p, DType t, Shape s) { return Tensor{const_cast<void*>(p), t, s, Device::CPU}; }
}  // namespace

// Checked on the host, before any backend sees the batch: kernels then trust their indices.
void TrainingRun::validate_batch(const int32_t* ids, const int32_t* mask, const int32_t* types, const float* labels,
                                 int batch) const {
  const BertConfig& c = model_->config();
  for (int b = 0; b < batch; ++b) {
    for (int t = 0; t < seq_; ++t) {
      const size_t i = size_t(b) * seq_ + t;
      if (ids[i] < 0 || ids[i] >= c.vocab_size)
        fail("batch row {}, position {}: token id {} is out of range for the model's vocab_size {}", b, t, ids[i],
             c.vocab_size);
      if (types[i] < 0 || types[i] >= c.type_vocab_size)
        fail("batch row {}, position {}: token type {} is out of range for type_vocab_size {}", b, t, types[i],
             c.type_vocab_size);
      if (mask[i] != 0 && mask[i] != 1)
        fail("batch row {}, position {}: attention mask value {} is not 0 or 1", b, t, mask[i]);
    }
    if (model_->regression()) {
      if (!std::isfinite(labels[b])) fail("batch row {}: regression target {} is not finite", b, labels[b]);
    } else if (labels[b] != -100.0f && !(labels[b] >= 0 && labels[b] < float(c.num_labels) &&
                                        labels[b] == std::floor(labels[b]))) {
      fail("batch row {}: label {} is not a class id in [0, {})", b, labels[b], c.num_labels);
    }
  }
}

void TrainingRun::write_weights(const float* host) {
  ops::copy(be_, host_tensor(host, DType::F32, model_->weights().shape), model_->weights());
  be_.synchronize();
}

void TrainingRun::read_weights(float* host) {
  Tensor dst = host_tensor(host, DType::F32, model_->weights().shape);
  ops::copy(be_, model_->weights(), dst);
  be_.synchronize();
}

void TrainingRun::read_grads(float* host) {
  HONE_CHECK(!scoped_grads_ || step_open_, "step-scoped gradients exist only between micro_step and optimizer_step");
  for (int k = 0; k < model_->num_groups(); ++k) {
    const ParamGroup& g = model_->layout().groups()[size_t(k)];
    Tensor dst = host_tensor(host + g.begin, DType::F32, {g.size()});
    ops::copy(be_, model_->grad(k), dst);
  }
  be_.synchronize();
}

void TrainingRun::micro_step(const int32_t* ids, const int32_t* mask, const int32_t* types, const float* labels,
                             int batch, float grad_scale, uint64_t dropout_step, float* logits_out) {
  run_micro_step(*mem_, ids, mask, types, labels, batch, grad_scale, dropout_step, logits_out);
}

void TrainingRun::run_micro_step(BufferSource& mem, const int32_t* ids, const int32_t* mask, const int32_t* types,
                                 const float* labels, int batch, float grad_scale, uint64_t dropout_step,
                                 float* logits_out) {
  HONE_CHECK(batch >= 1 && batch <= args_.per_device_train_batch_size, "batch of {} rows", batch);
  const bool regression = model_->regression();
  const int64_t T = int64_t(batch) * seq_;
  // Step-scoped gradients live until the optimizer step: both run in one phase.
  HONE_CHECK(!step_open_, "with step-scoped gradients, each micro_step must be followed by optimizer_step");
  mem.begin_phase(Phase::MicroStep);
  BatchTensors b{batch, seq_, mem.take(Category::Activations, "input_ids", -1, DType::I32, {T}),
                 mem.take(Category::Activations, "attention_mask", -1, DType::I32, {batch, seq_}),
                 mem.take(Category::Activations, "token_type_ids", -1, DType::I32, {T}),
                 mem.take(Category::Activations, "labels", -1, regression ? DType::F32 : DType::I32, {batch})};
  if (!be_.dry_run) {
    validate_batch(ids, mask, types, labels, batch);
    auto host = host_tensor;
    if (!regression)
      for (int i = 0; i < batch; ++i) int_labels_[size_t(i)] = int32_t(labels[i]);
    ops::copy(be_, host(ids, DType::I32, {T}), b.input_ids);
    ops::copy(be_, host(mask, DType::I32, {batch, seq_}), b.attention_mask);
    ops::copy(be_, host(types, DType::I32, {T}), b.token_type_ids);
    ops::copy(be_, regression ? host(labels, DType::F32, {batch}) : host(int_labels_.data(), DType::I32, {batch}),
              b.labels);
  }
  Tensor loss = mem.take(Category::Workspace, "loss", -1, DType::F32, {1});
  model_->forward_backward(be_, mem, b, DropoutState{args_.seed, dropout_step, true}, grad_scale, loss, logits_out);
  ops::add_scaled(be_, loss, grad_scale, loss_sum_);
  mem.release(loss);
  for (Tensor* t : {&b.input_ids, &b.attention_mask, &b.token_type_ids, &b.labels}) mem.release(*t);
  if (scoped_grads_)
    step_open_ = true;
  else
    mem.end_phase();
}

void TrainingRun::optimizer_step(double lr, int64_t step) { run_optimizer_step(*mem_, lr, step); }

void TrainingRun::run_optimizer_step(BufferSource& mem, double lr, int64_t step) {
  if (scoped_grads_) {
    HONE_CHECK(step_open_, "optimizer_step without a micro_step before it");
  } else {
    mem.begin_phase(Phase::OptimizerStep);
  }
  const auto& groups = model_->layout().groups();
  Tensor& weights = model_->weights();
  grad_list_.clear();
  adamw_list_.clear();
  const AdamWStep s{lr, args_.adam_beta1, args_.adam_beta2, args_.adam_epsilon, args_.weight_decay, step};
  for (int k = 0; k < model_->num_groups(); ++k) {
    const ParamGroup& pg = groups[size_t(k)];
    const Tensor& grad = model_->grad(k);
    grad_list_.push_back(grad);
    // [begin, decayed_end) takes weight decay, the rest (biases, LayerNorm) not.
    for (auto [lo, hi, wd] : {std::tuple{pg.begin, pg.decayed_end, s.weight_decay},
                              std::tuple{pg.decayed_end, pg.end, 0.0}})
      if (lo < hi)
        adamw_list_.push_back({weights.rows(lo, hi), grad.rows(lo - pg.begin, hi - pg.begin), adam_m_.rows(lo, hi),
                               adam_v_.rows(lo, hi), wd});
  }
  // One launch each for the norm and the update of every group (per 48 tensors).
  ops::fill(be_, sumsq_, 0.0f);
  ops::sum_squares(be_, grad_list_.data(), int(grad_list_.size()), sumsq_);
  ops::clip_coefficient(be_, sumsq_, float(args_.max_grad_norm), norm_coef_);
  ops::adamw(be_, adamw_list_.data(), int(adamw_list_.size()), s, norm_coef_);
  if (scoped_grads_) {
    model_->release_grads(mem);
    step_open_ = false;
  } else {
    for (int k = 0; k < model_->num_groups(); ++k) ops::fill(be_, model_->grad(k), 0.0f);
  }
  mem.end_phase();
}

double TrainingRun::take_loss_sum() {
  float v = 0;
  be_.read(loss_sum_, &v, 1);
  ops::fill(be_, loss_sum_, 0.0f);
  return v;
}

double TrainingRun::last_grad_norm() {
  float v[2] = {0, 0};
  be_.read(norm_coef_, v, 2);
  return v[0];
}

// ---------------------------------------------------------------- the loop

TrainMetrics train(TrainingRun& run, const TrainingArguments& a, const Dataset& data, const TrainCallbacks& cb) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const StepCounts sc = count_steps(a, data.size());
  const int B = a.per_device_train_batch_size, S = data.seq_len();
  const int64_t GA = a.gradient_accumulation_steps;
  std::vector<int32_t> ids(size_t(B) * S), mask(size_t(B) * S), types(size_t(B) * S);
  std::vector<float> labels(static_cast<size_t>(B));

  int64_t step = 0, micro_total = 0, last_logged = 0, tokens = 0;
  double loss_since_log = 0, total_loss = 0, epoch_progress = 0;
  auto log = [&](double loss_sum) {
    if (!std::isfinite(loss_sum))
      fail("the loss became {} by update {}: training diverged (try a lower --learning_rate)", loss_sum, step);
    loss_since_log += loss_sum;
    nlohmann::ordered_json e;
    e["loss"] = loss_since_log / double(step - last_logged);
    e["grad_norm"] = run.last_grad_norm();
    e["learning_rate"] = learning_rate_at(a, step, sc.total_updates);  // what the next update uses
    e["epoch"] = epoch_progress;
    e["step"] = step;
    total_loss += loss_since_log;
    loss_since_log = 0;
    last_logged = step;
    if (cb.on_log) cb.on_log(e);
  };

  for (int64_t epoch = 0; epoch < sc.epochs && step < sc.total_updates; ++epoch) {
    const std::vector<int64_t> order = epoch_order(data.size(), a.seed, epoch);
    for (int64_t first = 0; first < sc.micro_per_epoch && step < sc.total_updates; first += GA) {
      const int64_t window = std::min(GA, sc.micro_per_epoch - first);
      for (int64_t k = first; k < first + window; ++k) {
        const int64_t lo = k * B, rows = std::min<int64_t>(B, data.size() - lo);
        for (int64_t r = 0; r < rows; ++r) {
          const size_t o = size_t(r) * S;
          data.example(order[size_t(lo + r)], &ids[o], &mask[o], &types[o], &labels[size_t(r)]);
        }
        tokens += rows * S;
        run.micro_step(ids.data(), mask.data(), types.data(), labels.data(), int(rows), 1.0f / float(window),
                       uint64_t(micro_total++));
      }
      run.optimizer_step(learning_rate_at(a, step, sc.total_updates), step + 1);
      ++step;
      epoch_progress = double(epoch) + double(first + window) / double(sc.micro_per_epoch);
      if (cb.on_step) cb.on_step(step, sc.total_updates);
      if (step % a.logging_steps == 0 || (step == 1 && a.logging_first_step)) log(run.take_loss_sum());
    }
  }
  const double rest = run.take_loss_sum();
  if (!std::isfinite(rest))
    fail("the loss became {} by update {}: training diverged (try a lower --learning_rate)", rest, step);
  loss_since_log += rest;
  total_loss += loss_since_log;

  TrainMetrics m;
  m.train_runtime = std::chrono::duration<double>(clock::now() - start).count();
  m.global_step = step;
  m.train_loss = step > 0 ? total_loss / double(step) : 0.0;
  m.epoch = epoch_progress;
  m.train_samples_per_second = double(sc.num_train_samples) / m.train_runtime;
  m.train_steps_per_second = double(sc.total_updates) / m.train_runtime;
  const auto& c = run.model().config();
  const double non_embedding = double(run.model().layout().count()) -
                               double(c.vocab_size + c.max_position_embeddings + c.type_vocab_size) * c.hidden_size;
  m.total_flos = 6.0 * non_embedding * double(tokens);  // Trainer's estimate
  return m;
}

}  // namespace hone
