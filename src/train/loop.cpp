// The training loop with Trainer's order of events after each update: log, evaluate,
// save (then rotate checkpoints), and at the end optionally reload the best checkpoint.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>

#include "hone/checkpoint.h"
#include "hone/deepspeed.h"
#include "hone/schedule.h"
#include "hone/trainer.h"
#include "hone/weights.h"

namespace hone {

namespace {

void check_finite(double loss, int64_t step) {
  if (!std::isfinite(loss))
    fail("the loss became {} by update {}: training diverged (try a lower --learning_rate)", loss, step);
}

// Model FLOPs as Trainer estimates them: 6 x non-embedding parameters x tokens.
double flos(TrainingRun& run, int64_t tokens) {
  double non_embedding = double(run.model().layout().count());
  for (const ParamEntry& e : run.model().layout().entries())
    if (e.kind == ParamKind::Embedding) non_embedding -= double(e.shape.numel());
  return 6.0 * non_embedding * double(tokens);
}

}  // namespace

TrainMetrics train(TrainingRun& run, const TrainingArguments& a, const TrainData& data, const ModelFiles& files,
                   const TrainCallbacks& cb, TrainerState* state_out) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const Dataset& ds = data.train;
  Communicator& comm = run.communicator();
  const int world = comm.world_size(), rank = comm.rank();
  const bool main_process = rank == 0;  // writes checkpoints
  const StepCounts sc = count_steps(a, ds.size(), world);

  const int B = a.per_device_train_batch_size;
  const int64_t GA = a.gradient_accumulation_steps;
  const int64_t eval_every = a.eval_steps > 0 ? a.eval_steps : a.logging_steps;
  const std::string best_key = best_metric_key(a);
  const bool greater = best_metric_greater(a);
  auto notice = [&](const std::string& m) {
    if (cb.on_notice) cb.on_notice(m);
  };

  TrainerState st;
  if (!a.resume_from_checkpoint.empty()) {
    const std::string dir = resolve_checkpoint(a.resume_from_checkpoint, a.output_dir);
    st = load_checkpoint(dir, run);
    if (st.global_step > sc.total_updates)
      fail("{} is at step {}, past this run's {} steps", dir, st.global_step, sc.total_updates);
    notice(fmt::format("resumed from {} at step {} (epoch {:.2f})", dir, st.global_step, st.epoch));
  }
  std::vector<int> lengths;
  if (a.group_by_length) {
    lengths.resize(size_t(ds.size()));
#pragma omp parallel for schedule(dynamic, 64)
    for (int64_t i = 0; i < ds.size(); ++i) lengths[size_t(i)] = ds.length(i);
  }

  auto log = [&] {
    st.loss_since_log += run.take_loss_sum();
    check_finite(st.loss_since_log, st.global_step);
    nlohmann::ordered_json e;
    e["loss"] = st.loss_since_log / double(st.global_step - st.last_logged_step);
    e["grad_norm"] = run.last_grad_norm();
    const int64_t skipped = run.skipped_steps();
    // What the next update uses: as Trainer, the schedule holds on steps fp16 skipped.
    e["learning_rate"] = learning_rate_at(a, st.global_step - skipped, sc.total_updates);
    if (run.loss_scaling()) {
      e["loss_scale"] = run.loss_scale();
      e["skipped_steps"] = skipped;
    }
    e["epoch"] = st.epoch;
    e["step"] = st.global_step;
    st.total_loss += st.loss_since_log;
    st.loss_since_log = 0;
    st.last_logged_step = st.global_step;
    st.log_history.push_back(e);
    if (cb.on_log) cb.on_log(e);
  };
  // Returns whether this evaluation gave a new best metric.
  auto eval = [&] {
    nlohmann::ordered_json m = evaluate(run, *data.eval, a);
    m["epoch"] = st.epoch;
    m["step"] = st.global_step;
    st.log_history.push_back(m);
    if (cb.on_log) cb.on_log(m);
    if (!m.contains(best_key)) fail("--metric_for_best_model: the evaluation has no {}", best_key);
    const double v = m[best_key].get<double>();
    const bool better = !st.best_metric || (greater ? v > *st.best_metric : v < *st.best_metric);
    if (better) st.best_metric = v;
    return better;
  };
  auto save = [&](bool best_now) {
    const std::string dir = checkpoint_path(a.output_dir, st.global_step);
    if (best_now) st.best_model_checkpoint = dir;
    // The loss accumulated on the device since the last log belongs to the saved state.
    st.loss_since_log += run.take_loss_sum();
    st.total_flos = flos(run, st.tokens);
    if (run.sharding().sharded()) {  // rank 0 writes the optimizer state of every rank's share
      if (!main_process) save_optimizer_share(dir, run);
      comm.barrier(run.backend());
    }
    // Sharded master weights reach rank 0 through a collective that its save_checkpoint
    // starts: the others take part here.
    if (!main_process && run.master_sharded()) run.read_weights(nullptr);
    if (main_process) {
      save_checkpoint(dir, run, files, st, a, sc);
      notice("saved " + dir);
      for (const std::string& p : rotate_checkpoints(a.output_dir, a.save_total_limit, st.best_model_checkpoint))
        notice("deleted older checkpoint " + p + " (--save_total_limit " + std::to_string(a.save_total_limit) + ")");
    }
    comm.barrier(run.backend());  // no rank reads a checkpoint before it is whole
  };

  // A DeepSpeed scheduler's explicit step counts must agree with this run's (as Trainer
  // checks them when training starts), before the first step.
  if (a.deepspeed_config && a.deepspeed_config->scheduler)
    deepspeed_schedule_steps(*a.deepspeed_config, a, sc.total_updates);
  bool stopped = false;
  double model_flops = 0;
  run.backend().take_span_seconds();  // the time split counts this run's steps
  for (int64_t epoch = st.global_step / sc.updates_per_epoch; epoch < sc.epochs && st.global_step < sc.total_updates;
       ++epoch) {
    const std::vector<int64_t> order = a.group_by_length ? length_grouped_order(lengths, B, a.seed, epoch)
                                                         : epoch_order(ds.size(), a.seed, epoch);
    // A resumed epoch starts after the micro-batches its finished updates consumed.
    const int64_t first_micro = std::max<int64_t>(0, (st.global_step - epoch * sc.updates_per_epoch) * GA);
    // Micro-step k takes micro-batches k * world .. k * world + world - 1 of the epoch's
    // order, this rank's the rank-th; with several ranks, the last ones are filled from the
    // start of the order so that every rank takes as many steps (accelerate's even_batches).
    std::vector<std::vector<int64_t>> batches;
    const int64_t n = ds.size();
    for (int64_t k = first_micro; k < sc.micro_per_epoch; ++k) {
      const int64_t lo = (k * world + rank) * B;
      std::vector<int64_t>& rows = batches.emplace_back();
      for (int64_t i = lo; i < lo + B && (world > 1 || i < n); ++i) rows.push_back(order[size_t(i % n)]);
    }
    BatchLoader loader(ds, std::move(batches), {a.dataloader_num_workers, a.dataloader_pin_memory, 8, B},
                       run.backend());
    for (int64_t first = first_micro; first < sc.micro_per_epoch && st.global_step < sc.total_updates;
         first += GA) {
      const int64_t window = std::min(GA, sc.micro_per_epoch - first);
      for (int64_t k = 0; k < window; ++k) {
        const Batch* b = loader.next();
        st.tokens += int64_t(b->rows) * b->seq;
        model_flops += run.model().training_flops(b->mask, b->rows, b->seq);
        // Each rank's dropout masks are its own: the stream is keyed by micro-step and rank.
        run.micro_step(*b, 1.0f / float(window * world), uint64_t(st.micro_steps++ * world + rank));
      }
      // Under fp16 the schedule and AdamW's step count only advance on applied updates.
      const int64_t applied = st.global_step - run.skipped_steps();
      run.optimizer_step(learning_rate_at(a, applied, sc.total_updates), applied + 1);
      ++st.global_step;
      st.epoch = double(epoch) + double(first + window) / double(sc.micro_per_epoch);
      const bool epoch_end = first + window >= sc.micro_per_epoch, last = st.global_step == sc.total_updates;
      if (cb.on_step) cb.on_step(st.global_step, sc.total_updates, st);
      if (st.global_step % a.logging_steps == 0 || (st.global_step == 1 && a.logging_first_step)) log();
      bool best_now = false;
      if ((a.eval_strategy == "steps" && st.global_step % eval_every == 0) ||
          (a.eval_strategy == "epoch" && epoch_end))
        best_now = eval();
      const bool saved = (a.save_strategy == "steps" && (st.global_step % a.save_steps == 0 || last)) ||
                         (a.save_strategy == "epoch" && epoch_end) || (a.save_strategy == "best" && best_now);
      if (saved) save(best_now);
      // With several ranks, all stop at the same update when any is asked to.
      if (cb.should_stop && run.any_rank(cb.should_stop(st.global_step))) {
        if (cb.save_when_stopped && a.save_strategy != "no" && !saved) save(false);
        stopped = true;
        break;
      }
    }
    if (stopped) break;
  }
  if (!stopped) {
    st.loss_since_log += run.take_loss_sum();
    check_finite(st.loss_since_log, st.global_step);
    st.total_loss += st.loss_since_log;
    st.loss_since_log = 0;
  }

  if (!stopped && a.load_best_model_at_end && !st.best_model_checkpoint.empty()) {
    const ParamLayout& layout = run.model().layout();
    std::vector<float> host(size_t(layout.count()));
    load_weights((std::filesystem::path(st.best_model_checkpoint) / "model.safetensors").string(),
                 run.model().config(), layout, host.data(), a.seed);
    run.write_weights(host.data());
    notice(fmt::format("loaded the best model from {} ({} = {})", st.best_model_checkpoint, best_key,
                       *st.best_metric));
  }

  TrainMetrics m;
  m.spans = run.backend().take_span_seconds();
  m.model_flops = model_flops;
  m.train_runtime = std::chrono::duration<double>(clock::now() - start).count();
  m.global_step = st.global_step;
  m.train_loss = st.global_step > 0 ? st.total_loss / double(st.global_step) : 0.0;
  m.epoch = st.epoch;
  // As Trainer reports a resumed run: the samples of the whole run over this process's time.
  m.train_samples_per_second = double(sc.num_train_samples) / m.train_runtime;
  m.train_steps_per_second = double(sc.total_updates) / m.train_runtime;
  st.total_flos = flos(run, st.tokens);
  m.total_flos = st.total_flos;
  if (!stopped) {
    nlohmann::ordered_json e = m.to_json();
    e["step"] = st.global_step;
    st.log_history.push_back(e);
  }
  if (state_out) *state_out = std::move(st);
  return m;
}

}  // namespace hone
