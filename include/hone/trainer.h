#pragma once
// The training loop with Trainer's semantics: epochs of shuffled micro-batches,
// gradient accumulation (loss divided by the number of micro-batches in the window),
// gradient clipping, the optimizer (--optim) with bias and LayerNorm parameters excluded
// from weight decay, the learning-rate schedule stepped after each update, and logging every
// logging_steps updates.
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "hone/args.h"
#include "hone/config.h"
#include "hone/backend.h"
#include "hone/model.h"
#include "hone/data.h"
#include "hone/distributed.h"
#include "hone/memory.h"
#include "hone/optimizer.h"

namespace hone {

struct TrainMetrics {
  double train_runtime = 0, train_samples_per_second = 0, train_steps_per_second = 0, train_loss = 0, epoch = 0;
  double total_flos = 0;   // Trainer's estimate, 6 x non-embedding parameters x tokens
  double model_flops = 0;  // this process's steps, by SequenceClassifier::training_flops
  SpanSeconds spans{};     // this process's time in forward, backward, optimizer and the rest
  int64_t global_step = 0;
  nlohmann::ordered_json to_json() const;
};

// Steps of one run as Trainer counts them.
struct StepCounts {
  int64_t micro_per_epoch = 0;    // ceil(n / batch)
  int64_t updates_per_epoch = 0;  // ceil(micro_per_epoch / accumulation)
  int64_t total_updates = 0;      // max_steps, or ceil(epochs * updates_per_epoch)
  int64_t epochs = 0;             // epochs the loop enters
  int64_t num_train_samples = 0;  // for train_samples_per_second
};
// With several ranks each micro-step takes world_size micro-batches, one a rank.
StepCounts count_steps(const TrainingArguments& a, int64_t dataset_size, int world_size = 1);

// Whether a training run times its products' candidates (CudaOptions::time_products) for
// the tokens one rank trains on (count_steps' samples times seq_len, a rank's share): timing
// cost bert-large 0.1 s a process and saved 0.45 ms a batch-32 step of 16,384 tokens,
// nothing at batch 4 (H200), so it pays from about 3.6 M tokens; past kTimedRunTokens it is
// worth a few tenths of a percent.
constexpr int64_t kTimedRunTokens = int64_t(1) << 23;
bool times_products(const TrainingArguments& a, int64_t dataset_size, int64_t seq_len, int world_size = 1);

// Where parameter gradients live. Persistent: one buffer for the whole run, needed when
// gradients accumulate over micro-steps (under ZeRO stage 2, for this rank's groups only). StepScoped (one micro-step per update): each
// parameter group's gradients are taken, zeroed, just before its backward and released
// after the optimizer step, in the activations' arena, so they reuse the bytes of
// activations that backward has already consumed. Then each micro_step() must be
// followed by optimizer_step().
enum class GradientMemory { Persistent, StepScoped };
// What a run with these arguments uses: StepScoped without gradient accumulation (and
// without --offload_optimizer, whose gradients stay on the device until the update).
GradientMemory gradient_memory_for(const TrainingArguments& a);
// What --gradient_checkpointing and its policy ask each encoder layer to keep.
Checkpointing checkpointing_for(const TrainingArguments& a);

// The phases a run plans besides setup: training steps (with gradients and optimizer
// state), and inference batches of up to infer_batch rows (0: none), for evaluation and
// prediction.
struct RunPhases {
  bool train = true;
  int infer_batch = 0;
};

// How data-parallel ranks share the training state (ZeRO). Stage 0: every rank keeps
// everything. Stage 1: each rank keeps the optimizer state of a contiguous run of parameter
// groups (shard_bounds), and under mixed precision their fp32 master weights, and updates
// only those; the owners then broadcast the updated weights (the half-precision copy, or
// the fp32 parameters of an fp32 run). Stage 2: each group's summed gradients also live
// only on its owner: the others release them as soon as they are sent (with accumulation,
// every micro-step's are reduced into the owner's, the only ones that persist).
struct Sharding {
  int world_size = 1, rank = 0, stage = 0;
  bool sharded() const { return world_size > 1 && stage > 0; }
};
Sharding sharding_for(const TrainingArguments& a, const ProcessGroup& g);
// The first group of each rank's shard, then the number of groups: contiguous runs of
// groups balanced by parameter count (every rank owns at least one group).
std::vector<int> shard_bounds(const ParamLayout& layout, int world_size);

// Everything a run holds: the model, its planned memory and the optimizer state.
class TrainingRun {
 public:
  // Plans the run (a dry run of setup, one micro-step and one optimizer step at the
  // largest batch and longest sequence, and one inference batch) and allocates its
  // arenas. Weights are uninitialised until init_weights() or write_weights().
  TrainingRun(const TrainingArguments& a, const ModelConfig& c, int seq_len, Backend& be,
              GradientMemory grads = GradientMemory::Persistent, RunPhases phases = {}, Sharding sharding = {});
  ~TrainingRun();
  TrainingRun(const TrainingRun&) = delete;
  TrainingRun& operator=(const TrainingRun&) = delete;

  // The plan alone, allocating nothing: what `hone estimate` prints.
  static MemoryPlan plan(const TrainingArguments& a, const ModelConfig& c, int seq_len, Backend& be,
                         GradientMemory grads = GradientMemory::Persistent, RunPhases phases = {},
                         Sharding sharding = {});

  // Data parallel over comm's ranks, as the run was planned (Sharding): from now on each
  // update's gradients are summed over the ranks as backward finishes each layer's (the
  // caller scales each rank's micro-steps by one over the world size), and so are the
  // losses read. comm outlives the run.
  void distribute(Communicator& comm);
  const Sharding& sharding() const { return sharding_; }
  // ZeRO: where rank r's share of each of the optimizer's state tensors starts in the state
  // one process would keep (every optimizer lays its state out group by group, so the ranks'
  // shares, in rank order, are the whole), and (r = world size) the whole's size.
  std::vector<int64_t> state_offsets(int rank) const;
  Communicator& communicator() { return *comm_; }
  // Every rank's weights (and half copies) become root's. With sharded master weights, the
  // half copy becomes root's and each rank keeps its master shard (all loaded the same).
  void broadcast_weights(int root = 0);
  // Whether any rank says yes (a collective: every rank asks at the same update).
  bool any_rank(bool mine);
  // Sums n host floats over the ranks in place (a collective), through planned device
  // memory; nothing with one rank.
  void all_reduce_host(float* host, int64_t n);

  SequenceClassifier& model() { return *model_; }
  Backend& backend() { return be_; }
  PlannedMemory& memory() { return *mem_; }
  float* host_weights();  // the flat weight buffer itself (CPU backend only)
  // Copies between the flat parameter buffers and host memory of layout().count() floats.
  // When the master weights are sharded (master_sharded()) read_weights is a collective:
  // every rank calls it, and those that pass nullptr only send their share.
  void write_weights(const float* host);
  void read_weights(float* host);
  // ZeRO under mixed precision: each rank keeps the fp32 master weights of its shard alone.
  bool master_sharded() const { return master_sharded_; }
  // save_pretrained of the weights, streamed from the device in page-locked chunks so that
  // copying one overlaps writing the last, without a host copy of the whole model (with
  // sharded master weights, gathered by read_weights: the other ranks call it meanwhile).
  void save_model(const std::string& dir, int64_t chunk_floats = int64_t(16) << 20);
  // Random weights as init_weights (hone/weights.h) writes them on the host, bit for bit,
  // drawn on the backend's device: nothing to draw on one core or to copy.
  void init_weights(uint64_t seed);
  void read_grads(float* host);  // the gradients of the loss (unscaled under fp16)
  // The optimizer (--optim); its state lives in this run's memory.
  const Optimizer& optimizer() const;
  // Copies between a tensor of this run (the optimizer's state) and host memory of
  // t.bytes() bytes, for checkpoints.
  void copy_to_host(const Tensor& t, void* host);
  void copy_from_host(const void* host, const Tensor& t);
  int max_seq_len() const { return seq_; }

  // One micro-batch from host rows (batch x seq); accumulates gradients and the loss.
  // If logits_out is given, receives the logits.
  void micro_step(const int32_t* ids, const int32_t* mask, const int32_t* types, const float* labels, int batch,
                  float grad_scale, uint64_t dropout_step, float* logits_out = nullptr);
  // The same for a collated batch, whose sequences may be shorter than planned.
  void micro_step(const Batch& b, float grad_scale, uint64_t dropout_step);
  // Inference on a collated batch (dropout off, no gradients).
  void infer(const Batch& b, const ForwardOutputs& out);
  // Inference once at each count of tokens, up to a full inference batch of the longest
  // sequences, at which the backend times its products' algorithms (Backend::
  // timed_row_counts): a server's first requests then wait for none of it. Returns those
  // counts; none on the CPU.
  std::vector<int64_t> warm_up_inference();
  // Clip, the optimizer's update at this learning rate (update number `step`, 1-based,
  // counting applied updates only), zero gradients. Under fp16 a step whose gradients overflow is skipped
  // on the device, and the loss scale backs off.
  void optimizer_step(double lr, int64_t step);
  // fp16: optimizer steps skipped so far (waits for the last queued step's outcome, which
  // costs nothing once the next micro-step is queued); 0 otherwise.
  int64_t skipped_steps();
  double loss_scale();  // fp16: the current scale (after skipped_steps()); 1 otherwise
  bool loss_scaling() const { return args_.fp16; }
  // Checkpoints: the scaler's scale, clean-step count and skipped steps.
  std::array<double, 3> scaler_state();
  void set_scaler_state(const std::array<double, 3>& s);
  // Host reads of the accumulators (a synchronisation on a GPU).
  double take_loss_sum();   // sum of the micro-step losses times their grad_scale; resets it
  double last_grad_norm();  // before clipping, of the last optimizer step
  // Micro-steps and optimizer steps replayed from recordings (CUDA graphs) so far.
  int64_t replayed_steps() const { return replayed_; }
  // Inference batches replayed from recordings (on a GPU, those in the padded layout).
  int64_t replayed_inferences() const { return replayed_inferences_; }

 private:
  struct PlanOnly {};
  TrainingRun(const TrainingArguments& a, const ModelConfig& c, int seq_len, Backend& be, GradientMemory grads,
              RunPhases phases, Sharding sharding, PlanOnly);
  MemoryPlan record_plan();
  void setup(BufferSource& mem);
  void run_micro_step(BufferSource& mem, const int32_t* ids, const int32_t* mask, const int32_t* types,
                      const float* labels, int batch, int seq, float grad_scale, uint64_t dropout_step,
                      float* logits_out);
  void run_infer(BufferSource& mem, const int32_t* ids, const int32_t* mask, const int32_t* types, int batch, int seq,
                 const ForwardOutputs& out);
  // packed: the encoder on the batch's `tokens` attended tokens alone, as packed_rows_ and
  // row_start_ (filled by pack_rows) say.
  void run_infer_as(BufferSource& mem, const int32_t* ids, const int32_t* mask, const int32_t* types, int batch,
                    int seq, const ForwardOutputs& out, bool packed, int64_t tokens);
  // For a right-padded batch (each row's attended tokens first, at least one) with some
  // padding, fills packed_rows_ and row_start_ and returns its attended tokens; 0 for any
  // other mask.
  int64_t pack_rows(const int32_t* mask, int batch, int seq);
  // Training's packing: pack_rows', or every row of the batch where that gives 0 (a mask it
  // cannot pack, or no padding), so that every micro-step runs the planned packed path.
  int64_t pack_training_rows(const int32_t* mask, int batch, int seq);
  // The batch's ids, mask and token types in activation memory (labels too when given).
  BatchTensors take_batch(BufferSource& mem, bool with_labels, int batch, int seq);
  // Inference: copied straight from the host.
  void upload(const int32_t* ids, const int32_t* mask, const int32_t* types, BatchTensors& b);
  // Training: staged (copied ahead on a GPU), with the micro-step that keys dropout.
  void stage_batch(const int32_t* ids, const int32_t* mask, const int32_t* types, const float* labels,
                   uint64_t dropout_step, const BatchTensors& b, const Tensor& step);
  void run_optimizer_step(BufferSource& mem, double lr, int64_t step);
  void optimizer_body(BufferSource& mem);

  // Recorded steps (CUDA graphs, --cuda_graphs): a micro-step shape runs eagerly the first
  // time (cuBLASLt and cuDNN choose their algorithms by timing then), is recorded the
  // second time, and is replayed after that. What a replay needs that changes from step
  // to step is staged into memory it reads: the batch, the dropout step, the optimizer's
  // scalars.
  enum class StepMode : uint8_t { Eager, Record, Replay };
  struct StepGraphs {
    int seen = 0;
    bool recorded = false;  // recordings made (or being made): replay from now on
    bool failed = false;    // recording failed: eager from now on
    int micro = -1;         // recording ids
    int optimizer = -1;     // with step-scoped gradients, recorded with its micro-step
    BatchTensors inputs;    // where the recorded micro-step reads its batch
    Tensor step;            // and its dropout step
  };
  // Recordings are made for this many shapes at most (dynamic padding can make dozens);
  // the others run eagerly.
  static constexpr int kMaxRecordedShapes = 16;
  int recorded_shapes_ = 0;
  // Eager on a shape's first sighting (which also lets the products time their algorithms),
  // recorded on its second while `recorded` < `cap`, replayed after.
  StepMode next_mode(StepGraphs& g, int& recorded, int cap = kMaxRecordedShapes);
  // Inference batches in the padded layout (every batch without padding; packed ones change
  // their number of rows) replay recordings: up to kMaxInferShapes (batch, seq) shapes of them (a server sees many
  // lengths). Small batches' launches would outlast their work; larger ones gain the gaps
  // between kernels (bert-large bf16 on an H200: 64 x 128 +4.4%, 64 x 512 +0.7%). The
  // recorded forward reads its logits into infer_logits_host_.
  static constexpr int kMaxInferShapes = 64;
  int infer_recorded_shapes_ = 0;
  std::map<std::pair<int, int>, StepGraphs> infer_graphs_;
  Tensor infer_logits_host_;  // page-locked, [infer batch, num_labels] of the compute dtype
  void logits_from_host(int batch, float* out);  // after wait_for_reads, as floats
  // Runs body as `mode` says: eagerly, or recorded into g.*recording and then replayed.
  template <typename F>
  void run_as(StepMode mode, StepGraphs* g, int StepGraphs::*recording, F&& body);
  std::map<std::tuple<int, int, float>, StepGraphs> micro_graphs_;  // by (rows, seq, grad_scale)
  StepGraphs optimizer_graphs_;  // persistent gradients: one optimizer recording
  StepGraphs* last_micro_ = nullptr;
  StepMode last_micro_mode_ = StepMode::Eager;
  int64_t replayed_ = 0, replayed_inferences_ = 0;
  void validate_batch(const int32_t* ids, const int32_t* mask, const int32_t* types, const float* labels, int batch,
                      int seq) const;

  TrainingArguments args_;
  int seq_;
  RunPhases phases_;
  bool scoped_grads_;
  bool step_open_ = false;  // StepScoped: a micro-step awaits its optimizer step
  Backend& be_;
  std::unique_ptr<SequenceClassifier> model_;
  std::unique_ptr<PlannedMemory> mem_;
  std::unique_ptr<Optimizer> optimizer_;
  Tensor loss_sum_, sumsq_, norm_coef_;
  // Data parallel: the ranks' communicator (a single process's unless distribute() said
  // otherwise); whether this micro-step sums each group's gradients as backward finishes
  // it, and whether this update's gradients have been summed.
  std::unique_ptr<Communicator> own_comm_;
  Communicator* comm_ = nullptr;
  bool reducing_grads_ = false, grads_reduced_ = false;
  Tensor vote_;  // any_rank's flag
  // ZeRO: this rank's groups [bounds_[rank], bounds_[rank + 1]), the layout its optimizer
  // sees, each group's owner, and the shard's gradients (refilled within capacity).
  Sharding sharding_;
  std::vector<int> bounds_, owner_;
  std::unique_ptr<ParamLayout> shard_layout_;
  std::vector<Tensor> shard_grads_;
  int sent_group_ = -1;  // stage 2: a group sent to its owner, released after the next
  bool shards_grads() const { return sharding_.sharded() && sharding_.stage == 2; }
  // Sharded master weights: this rank's groups' fp32 parameters.
  bool master_sharded_ = false;
  Tensor master_shard_;
  Tensor exchange_;  // several ranks: what crosses between them in chunks (weights, evaluation)
  std::pair<int64_t, int64_t> rank_span(int rank) const;  // [begin, end) of rank's groups
  Tensor rank_range(const Tensor& flat, int rank) const;  // those elements of a flat buffer
  Tensor master() const { return master_sharded_ ? master_shard_ : model_->weights(); }
  void share_updated_weights();  // each owner's updated weights to every rank
  bool keeps_grads(int group) const { return !shards_grads() || owner_[size_t(group)] == sharding_.rank; }
  void reduce_group(Backend& be, int group);  // all-reduce, or (stage 2) a reduce to its owner
  void reduce_grads();  // those not summed in backward, then the compute stream waits for all
  void update_shard(BufferSource& mem);
  void plan_ranks();  // ZeRO: this rank's update, then every rank's weights from their owners
  // fp16 loss scaling: the device state, and a page-locked host copy of
  // {norm_coef[2] (skipped), scale, clean steps} read back one step late.
  Tensor scaler_;
  float* scaler_host_ = nullptr;
  bool scaler_read_pending_ = false;
  int64_t skipped_steps_ = 0;
  // Page-locked host sources of staged values (the dropout step, the optimizer's scalars,
  // class ids as I32), their staging buffers on the device, and the optimizer's scalars as
  // it reads them.
  void* host_staging_ = nullptr;
  int64_t* host_step_ = nullptr;
  float* host_scalars_ = nullptr;
  int32_t* host_labels_ = nullptr;
  // Packed inference: whether the backend packs attention here, and the host's packing of
  // the batch in flight (reserved for the largest batch).
  bool packs_ = false;
  // Training runs the attended tokens alone (Backend::packs_training). A recorded step
  // replays a fixed number of rows, so a backend that records packs the runs whose
  // micro-steps hold at least kPackedTrainingTokens (where a step's launches cost little
  // beside its work) and records the others: decided by shape alone, so that eager and
  // replayed steps of a shape draw the same dropout masks.
  static constexpr int64_t kPackedTrainingTokens = 4096;
  bool packs_training_ = false;
  // The host's packing (pack_rows) in page-locked memory, for the largest batch a run packs:
  // copied from pageable vectors, the five input copies of a packed inference batch took
  // 0.40 ms of a 23 ms batch on an H100 (bert-large, 64 x 512, lengths 16..512).
  int32_t* packed_rows_ = nullptr;  // [packing_rows_]
  int32_t* row_start_ = nullptr;    // [packing_batch_ + 1]
  int64_t packing_rows_ = 0;
  int packing_batch_ = 0;
  Tensor staged_ids_, staged_mask_, staged_types_, staged_labels_, staged_step_, staged_scalars_, optimizer_scalars_;
  // The gradients of each group (the multi-tensor norm's list and the optimizer's
  // target), refilled each step within their reserved capacity (no allocation).
  std::vector<Tensor> grad_list_;

  // --offload_optimizer: the update runs on host_be_ (this run's backend on the CPU, else a
  // CPU backend of its own) over page-locked host buffers. Each group's gradients come
  // down as backward finishes them (step-scoped ones on the compute stream, which then
  // reuses their memory; accumulated ones on a transfer stream during the window's last
  // micro-step), the clip coefficient after backward; the host updates group by group as
  // their gradients land, and each group's updated weights go up while the host updates
  // the next: the rounded copy the update writes under mixed precision (whose master
  // weights, the model's F32 parameters, then live on the host), else the host's F32
  // master copy. The next forward waits for the last of them.
  bool offload_ = false;
  std::unique_ptr<Backend> own_host_be_;
  Backend* host_be_ = nullptr;
  Tensor host_master_, host_half_, host_grads_, host_sumsq_, host_norm_coef_;
  std::vector<Tensor> host_group_grads_;
  int micro_in_window_ = 0;    // micro-steps since the last optimizer step
  bool sending_grads_ = false;  // this micro-step sends accumulated gradients as they are final
  // Groups whose gradients are on their way to the host, in backward's order, with their
  // transfers (reserved: no allocation in the step).
  std::vector<std::pair<int, Backend::Transfer>> sent_grads_;
  void drop_sent_grads();  // another micro-step adds to gradients already sent
  Backend::Transfer offload_update(BufferSource& mem);
  void sync_host_master();  // fp32 offload: the host master copy from the device's weights
};

// ---------------------------------------------------------------- the loop

class Tokenizer;

// Trainer's state, as trainer_state.json holds it, plus what an exact resumption needs.
struct TrainerState {
  int64_t global_step = 0;
  double epoch = 0;
  nlohmann::ordered_json log_history = nlohmann::ordered_json::array();
  std::optional<double> best_metric;
  std::string best_model_checkpoint;
  double total_flos = 0;
  // Resumption: the micro-step counter (it keys the dropout streams), the loss summed
  // since the last log and over the run, the step of the last log, tokens seen.
  int64_t micro_steps = 0, last_logged_step = 0, tokens = 0;
  double loss_since_log = 0, total_loss = 0;
  nlohmann::ordered_json to_json(const TrainingArguments& a, const StepCounts& sc) const;
  static TrainerState from_json(const nlohmann::json& j, const std::string& source);
};

// What a saved model directory holds besides the weights: config.json (with the label
// names) and, for text models, the tokenizer files.
struct ModelFiles {
  ModelConfig config;
  const Tokenizer* tokenizer = nullptr;
};

struct TrainCallbacks {
  std::function<void(int64_t step, int64_t total, const TrainerState& st)> on_step;  // after each update
  std::function<void(const nlohmann::ordered_json& entry)> on_log;  // each logged entry and evaluation
  std::function<void(const std::string& message)> on_notice;        // checkpoints saved, loaded, removed
  // Asked after each update (and its log, evaluation and checkpoint); true stops the run
  // there, as an interruption would.
  std::function<bool(int64_t step)> should_stop;
  // A stop asked for (Ctrl-C) rather than a crash simulated: save a checkpoint of the
  // step it stops after, unless saving is off or that step was just saved.
  bool save_when_stopped = false;
};

struct TrainData {
  const Dataset& train;
  const Dataset* eval = nullptr;  // for --eval_strategy, --load_best_model_at_end
};

// Runs the training loop on `run`: resumes from --resume_from_checkpoint, evaluates and
// saves checkpoints (into output_dir/checkpoint-N) as the arguments say, and loads the
// best checkpoint's weights at the end when asked. `state` receives the final state.
TrainMetrics train(TrainingRun& run, const TrainingArguments& a, const TrainData& data, const ModelFiles& files,
                   const TrainCallbacks& cb, TrainerState* state = nullptr);

// One pass over `data` without dropout. Returns Trainer's metric keys with `prefix`:
// loss, then accuracy, f1 (macro) and matthews_correlation, or mse, pearson and
// spearman for a regression; runtime, samples_per_second, steps_per_second. If `logits`
// is given, it receives every example's logits (size x num_labels).
nlohmann::ordered_json evaluate(TrainingRun& run, const Dataset& data, const TrainingArguments& a,
                                const std::string& prefix = "eval", std::vector<float>* logits = nullptr);

}  // namespace hone
