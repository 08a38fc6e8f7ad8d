// The data-parallel part of a training run: which parameter groups each rank owns under
// ZeRO, the reductions of gradients as backward finishes each group, the updates of a
// rank's shard, and the broadcasts that share what the owners updated.
#include <algorithm>

#include "hone/ops.h"
#include "hone/trainer.h"

namespace hone {

Sharding sharding_for(const TrainingArguments& a, const ProcessGroup& g) {
  return {g.world_size, g.rank, a.zero_stage};
}

std::vector<int> shard_bounds(const ParamLayout& layout, int world) {
  const std::vector<ParamGroup>& groups = layout.groups();
  const int n = int(groups.size());
  if (world > n) fail("ZeRO over {} ranks: the model has only {} parameter groups to share out", world, n);
  // Rank r's shard ends at the first group boundary past r + 1 world-ths of the parameters,
  // leaving every later rank a group at least.
  std::vector<int> bounds{0};
  for (int r = 1; r < world; ++r) {
    const double target = double(layout.count()) * r / world;
    int k = bounds.back() + 1;
    while (k < n - (world - r) && double(groups[size_t(k)].end) <= target) ++k;
    bounds.push_back(k);
  }
  bounds.push_back(n);
  return bounds;
}

// Several ranks: what this rank owns, and the hook that sums each group's gradients over
// the ranks as backward finishes it (under stage 2, on its owner alone, the others then
// giving the memory back at once; the plan's dry run releases it as the run does).
void TrainingRun::plan_ranks() {
  const Sharding& s = sharding_;
  HONE_CHECK(s.rank >= 0 && s.rank < s.world_size && s.stage >= 0 && s.stage <= 2, "rank {} of {} at ZeRO stage {}",
             s.rank, s.world_size, s.stage);
  if (offload_)
    fail("--offload_optimizer (ZeRO-Offload) runs on one GPU: with {} ranks, leave it out", s.world_size);
  const ParamLayout& layout = model_->layout();
  bounds_ = shard_bounds(layout, s.world_size);
  owner_.assign(layout.groups().size(), 0);
  for (int r = 0; r < s.world_size; ++r)
    for (int k = bounds_[size_t(r)]; k < bounds_[size_t(r) + 1]; ++k) owner_[size_t(k)] = r;
  if (s.sharded()) {
    shard_layout_ = std::make_unique<ParamLayout>(layout.shard(bounds_[size_t(s.rank)], bounds_[size_t(s.rank) + 1]));
    shard_grads_.reserve(shard_layout_->groups().size());
    // Forward reads the half copy alone, so the fp32 master weights shard with the
    // optimizer state (as DeepSpeed's stage 1 does); an fp32 run's weights are what forward reads.
    master_sharded_ = compute_dtype(args_, be_) != DType::F32;
  }
  // Stage 2: another owner's group is released once the next group is done (its embeddings,
  // the last, at once): its reduce ran beside that group's backward, and the compute stream
  // waits for it (the planner hands its bytes on) without waiting for the one just queued.
  model_->on_group_grads_done([this](Backend& be, BufferSource& m, int k) {
    auto release_sent = [&] {
      if (sent_group_ < 0) return;
      if (reducing_grads_) comm_->wait_collectives(be);
      m.release(model_->grad(sent_group_));
      model_->grad(sent_group_) = Tensor{};
      sent_group_ = -1;
    };
    release_sent();
    if (reducing_grads_) reduce_group(be, k);
    if (!keeps_grads(k)) sent_group_ = k;
    if (k == 0) release_sent();  // backward's last group
  });
}

void TrainingRun::distribute(Communicator& comm) {
  if (!comm.group().distributed() && sharding_.world_size == 1) return;
  if (comm.world_size() != sharding_.world_size || comm.rank() != sharding_.rank)
    fail("a run planned as rank {} of {} given rank {} of {}", sharding_.rank, sharding_.world_size, comm.rank(),
         comm.world_size());
  comm_ = &comm;
}

std::vector<int64_t> TrainingRun::state_offsets(int rank) const {
  HONE_CHECK(sharding_.sharded() && rank >= 0 && rank <= sharding_.world_size, "state offsets of rank {}", rank);
  std::vector<int64_t> at(optimizer_->state().size(), 0);
  for (int r = 0; r < rank; ++r) {
    // Rank r's optimizer, planned: its state tensors' sizes.
    const ParamLayout shard = model_->layout().shard(bounds_[size_t(r)], bounds_[size_t(r) + 1]);
    std::unique_ptr<Optimizer> theirs = make_optimizer(args_);
    MemoryPlanner planner;
    planner.begin_phase(Phase::Setup);
    theirs->take_state(planner, shard);
    planner.end_phase();
    const std::vector<StateTensor> state = theirs->state();
    HONE_CHECK(state.size() == at.size(), "rank {}'s optimizer keeps {} state tensors, this one {}", r, state.size(),
               at.size());
    for (size_t i = 0; i < at.size(); ++i) at[i] += state[i].tensor.numel();
  }
  return at;
}

void TrainingRun::reduce_group(Backend& be, int k) {
  if (shards_grads())
    comm_->reduce_sum(be, model_->grad(k), owner_[size_t(k)]);
  else
    comm_->all_reduce_sum(be, model_->grad(k));
}

void TrainingRun::broadcast_weights(int root) {
  if (!comm_->group().distributed()) return;
  const bool master_too = model_->weights().data && model_->mixed();
  Tensor& w = model_->weights().data ? model_->weights() : model_->compute_weights();
  comm_->broadcast(be_, w, root);
  comm_->wait_collectives(be_);
  if (master_too) model_->round_weights(be_);
  be_.synchronize();
}

void TrainingRun::all_reduce_host(float* host, int64_t n) {
  if (!comm_->group().distributed()) return;
  HONE_CHECK(exchange_.data, "all_reduce_host on a run planned for one rank");
  const int64_t chunk = exchange_.numel();
  for (int64_t at = 0; at < n; at += chunk) {
    const int64_t m = std::min(chunk, n - at);
    Tensor dev = exchange_.rows(0, m), h = host_tensor(host + at, DType::F32, {m});
    ops::copy(be_, h, dev);
    comm_->all_reduce_sum(be_, dev);
    comm_->wait_collectives(be_);
    ops::copy(be_, dev, h);
  }
  be_.synchronize();
}

bool TrainingRun::any_rank(bool mine) {
  if (!comm_->group().distributed()) return mine;
  const float v = mine ? 1.0f : 0.0f;
  ops::copy(be_, host_tensor(&v, DType::F32, {1}), vote_);
  comm_->all_reduce_sum(be_, vote_);
  comm_->wait_collectives(be_);
  float sum = 0;
  be_.read(vote_, &sum, 1);
  return sum > 0;
}

void TrainingRun::reduce_grads() {
  if (!comm_->group().distributed() || be_.dry_run) return;
  if (!grads_reduced_)
    for (int k = 0; k < model_->num_groups(); ++k) reduce_group(be_, k);
  comm_->wait_collectives(be_);
  grads_reduced_ = false;
}

std::pair<int64_t, int64_t> TrainingRun::rank_span(int r) const {
  const std::vector<ParamGroup>& groups = model_->layout().groups();
  return {groups[size_t(bounds_[size_t(r)])].begin, groups[size_t(bounds_[size_t(r) + 1] - 1)].end};
}

Tensor TrainingRun::rank_range(const Tensor& flat, int r) const {
  const auto [begin, end] = rank_span(r);
  return flat.rows(begin, end);
}

void TrainingRun::update_shard(BufferSource& mem) {
  const int first = bounds_[size_t(sharding_.rank)], end = bounds_[size_t(sharding_.rank) + 1];
  shard_grads_.clear();
  for (int k = first; k < end; ++k) shard_grads_.push_back(model_->grad(k));
  const OptimizerTarget target{*shard_layout_,
                               master_sharded_ ? master_shard_ : rank_range(model_->weights(), sharding_.rank),
                               master_sharded_ ? rank_range(model_->compute_weights(), sharding_.rank) : Tensor{},
                               shard_grads_,
                               norm_coef_,
                               optimizer_scalars_};
  optimizer_->update(be_, mem, target);
  share_updated_weights();
}

// What forward reads goes from each owner to every rank: the half copy its update rounded
// (half the bytes of the master weights, which stay with their owner), or an fp32 run's
// parameters.
void TrainingRun::share_updated_weights() {
  if (be_.dry_run) return;
  for (int r = 0; r < sharding_.world_size; ++r) {
    Tensor w = rank_range(model_->compute_weights(), r);
    comm_->broadcast(be_, w, r);
  }
  comm_->wait_collectives(be_);
}

}  // namespace hone
