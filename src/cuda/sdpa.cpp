// The cuDNN SDPA graphs of sdpa.h, built through the backend descriptor API. The recipe
// (operations, data types, strides) is the one cudnn-frontend emits for its composite SDPA
// node with a padding mask and Philox dropout; docs/design/fused-attention.md describes it.
#include "cuda/sdpa.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "hone/error.h"

#ifdef HONE_HAVE_CUDNN
#include <cudnn.h>

#include <array>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "cuda/check.h"
#endif

namespace hone::cuda {

namespace {

// What a user can get wrong, checked before anything touches cuDNN.
void validate(const SdpaProblem& p, bool backward) {
  if (p.dtype != DType::BF16 && p.dtype != DType::F16)
    fail("fused attention runs in BF16 or F16, not {}", dtype_name(p.dtype));
  if (p.batch < 1 || p.seq < 1 || p.heads < 1)
    fail("fused attention: batch {}, sequence length {} and heads {} must be positive", p.batch, p.seq, p.heads);
  if (p.head_dim < 8 || p.head_dim > 128 || p.head_dim % 8 != 0)
    fail("fused bf16/fp16 attention (cuDNN) needs a head size that is a multiple of 8 and at most 128; "
         "this model's is {} (run it in fp32)",
         p.head_dim);
  if (backward && p.seq < 2)
    fail("fused bf16/fp16 attention backward needs sequences of at least 2 tokens (cuDNN does not "
         "support s_q = s_kv = 1); got {}",
         p.seq);
  if (!(p.dropout_p >= 0.0f && p.dropout_p < 1.0f))
    fail("attention dropout probability {} is not in [0, 1)", p.dropout_p);
}

}  // namespace

namespace {

// HONE_ATTENTION: unset or "flash" (hone's kernels, Hopper's where the GPU has them),
// "flash2" (hone's mma.sync kernels on every GPU) or "cudnn".
std::string attention_choice() {
  const char* v = std::getenv("HONE_ATTENTION");
  const std::string choice = v ? v : "";
  if (choice.empty() || choice == "flash" || choice == "flash2" || choice == "cudnn") return choice;
  fail("HONE_ATTENTION={} is not a choice: unset or \"flash\" for hone's attention kernels, \"flash2\" for its "
       "FlashAttention-2 kernels on every GPU (no Hopper ones), \"cudnn\" for cuDNN's fused attention",
       choice);
}

}  // namespace

bool cudnn_attention_selected() { return attention_choice() == "cudnn"; }
bool hopper_attention_allowed() { return attention_choice() != "flash2"; }

#ifdef HONE_HAVE_CUDNN

namespace {

using Desc = cudnnBackendDescriptor_t;
using Dims = std::array<int64_t, 4>;

// Every cuDNN failure names the call, the problem, cuDNN's status and its last error message.
[[noreturn]] void cudnn_fail(const std::string& context, const std::string& call, cudnnStatus_t s) {
  char last[2048] = {};
  cudnnGetLastErrorString(last, sizeof last);
  fail("cuDNN fused attention ({}): {} failed: {} ({}){}{}", context, call, cudnnGetErrorString(s), int(s),
       last[0] ? "; cuDNN says: " : "", last);
}

#define HONE_CUDNN_CHECK(context, call)                                                \
  do {                                                                                 \
    const cudnnStatus_t hone_cudnn_st_ = (call);                                       \
    if (hone_cudnn_st_ != CUDNN_STATUS_SUCCESS) cudnn_fail((context), #call, hone_cudnn_st_); \
  } while (0)

// Owns backend descriptors and destroys them, newest first. Everything a plan was built
// from stays alive as long as the plan.
class Descriptors {
 public:
  explicit Descriptors(std::string context) : context_(std::move(context)) {}
  ~Descriptors() {
    for (auto it = descs_.rbegin(); it != descs_.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
  }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

  const std::string& context() const { return context_; }

  Desc make(cudnnBackendDescriptorType_t type, const char* type_name) {
    Desc d = nullptr;
    const cudnnStatus_t s = cudnnBackendCreateDescriptor(type, &d);
    if (s != CUDNN_STATUS_SUCCESS) cudnn_fail(context_, fmt::format("cudnnBackendCreateDescriptor({})", type_name), s);
    descs_.push_back(d);
    return d;
  }

  void set(Desc d, cudnnBackendAttributeName_t attr, const char* attr_name, cudnnBackendAttributeType_t type,
           int64_t count, const void* value) {
    const cudnnStatus_t s = cudnnBackendSetAttribute(d, attr, type, count, value);
    if (s != CUDNN_STATUS_SUCCESS) cudnn_fail(context_, fmt::format("cudnnBackendSetAttribute({})", attr_name), s);
  }
  void set_desc(Desc d, cudnnBackendAttributeName_t attr, const char* attr_name, Desc value) {
    set(d, attr, attr_name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  void finalize(Desc d, const char* what) {
    const cudnnStatus_t s = cudnnBackendFinalize(d);
    if (s != CUDNN_STATUS_SUCCESS) cudnn_fail(context_, fmt::format("cudnnBackendFinalize({})", what), s);
  }

 private:
  std::string context_;
  std::vector<Desc> descs_;
};

#define HONE_MAKE(pool, type) (pool).make(type, #type)
#define HONE_SET(pool, d, attr, type, count, value) (pool).set(d, attr, #attr, type, count, value)
#define HONE_SET_DESC(pool, d, attr, value) (pool).set_desc(d, attr, #attr, value)

// The tensors that can reach the variant pack. Virtual tensors are numbered from kFirstVirtual.
enum Uid : int64_t {
  kQ = 1,
  kK,          // K^T view [B, heads, D, S]
  kV,          // V view [B, heads, S, D] (forward)
  kVt,         // V^T view [B, heads, D, S] (backward): same memory as kV
  kO,
  kStats,
  kSeqQ,
  kSeqKv,
  kSeed,
  kOffset,
  kScale,         // by value
  kNegInf,        // by value
  kDropScale,     // by value: 1 / (1 - p)
  kDropScaleInv,  // by value: 1 - p, or 1 without dropout (the backward's softmax_sum factor)
  kDO,
  kDQ,
  kDK,
  kDV,
  kSoftmaxSum,
  kDQAccum,
  kNumUids,
  kFirstVirtual = 1000
};

struct TensorRef {
  Desc desc = nullptr;
  int64_t uid = 0;
  bool is_virtual = false;
};

// One operation graph under construction. Every non-virtual tensor that an operation reads
// or writes is recorded: those, and only those, go into the variant pack. (A tensor
// descriptor that no operation uses is not part of the graph, and a variant pack naming it
// fails cudnnBackendExecute with BAD_PARAM_NULL_POINTER, "isCompatibleVariantPack".)
class GraphBuilder {
 public:
  explicit GraphBuilder(Descriptors& pool) : pool_(pool) {}

  TensorRef tensor(int64_t uid, cudnnDataType_t t, Dims dims, Dims strides) {
    return make_tensor(uid, t, dims, strides, false, false);
  }
  TensorRef by_value(int64_t uid) {  // a FLOAT scalar the variant pack passes as a host pointer
    return make_tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
  }
  TensorRef virt(cudnnDataType_t t, Dims dims, Dims strides) {
    return make_tensor(next_virtual_++, t, dims, strides, true, false);
  }

  // y = mode(x[, b][, t]); the math precision is FLOAT unless given (INT32 for GEN_INDEX,
  // BOOLEAN for comparisons and logic).
  void pointwise(cudnnPointwiseMode_t mode, const TensorRef& x, const TensorRef* b, const TensorRef* t,
                 const TensorRef& y, cudnnDataType_t precision = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    Desc pw = HONE_MAKE(pool_, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    HONE_SET(pool_, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    HONE_SET(pool_, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &precision);
    if (mode == CUDNN_POINTWISE_GEN_INDEX) HONE_SET(pool_, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pool_.finalize(pw, "POINTWISE_DESCRIPTOR");
    Desc op = HONE_MAKE(pool_, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, use(x));
    if (b) HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, use(*b));
    if (t) HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, use(*t));
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, use(y));
    const float one = 1.0f;
    HONE_SET(pool_, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    HONE_SET(pool_, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    pool_.finalize(op, "OPERATION_POINTWISE_DESCRIPTOR");
    ops_.push_back(op);
  }
  void unary(cudnnPointwiseMode_t mode, const TensorRef& x, const TensorRef& y) {
    pointwise(mode, x, nullptr, nullptr, y);
  }
  void binary(cudnnPointwiseMode_t mode, const TensorRef& x, const TensorRef& b, const TensorRef& y) {
    pointwise(mode, x, &b, nullptr, y);
  }

  // y = reduction of x over the dimensions where y has extent 1, computed in FLOAT.
  void reduction(cudnnReduceTensorOp_t r, const TensorRef& x, const TensorRef& y) {
    Desc rd = HONE_MAKE(pool_, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    HONE_SET(pool_, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    HONE_SET(pool_, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &r);
    pool_.finalize(rd, "REDUCTION_DESCRIPTOR");
    Desc op = HONE_MAKE(pool_, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, rd);
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, use(x));
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, use(y));
    pool_.finalize(op, "OPERATION_REDUCTION_DESCRIPTOR");
    ops_.push_back(op);
  }

  // c = a b (batched over the first two dimensions), FLOAT accumulation; the overrides are
  // per-batch I32 [B,1,1,1] extents of M, N or K (null: the full extent).
  void matmul(const TensorRef& a, const TensorRef& b, const TensorRef& c, const TensorRef* m_override,
              const TensorRef* n_override, const TensorRef* k_override) {
    Desc md = HONE_MAKE(pool_, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t f = CUDNN_DATA_FLOAT;
    HONE_SET(pool_, md, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &f);
    pool_.finalize(md, "MATMUL_DESCRIPTOR");
    Desc op = HONE_MAKE(pool_, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, use(a));
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, use(b));
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, use(c));
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, md);
    if (m_override) HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, use(*m_override));
    if (n_override) HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, use(*n_override));
    if (k_override) HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, use(*k_override));
    pool_.finalize(op, "OPERATION_MATMUL_DESCRIPTOR");
    ops_.push_back(op);
  }

  // y = x with y's dimensions and strides (a transposed view, or a cast).
  void reshape(const TensorRef& x, const TensorRef& y) {
    Desc op = HONE_MAKE(pool_, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, use(x));
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, use(y));
    pool_.finalize(op, "OPERATION_RESHAPE_DESCRIPTOR");
    ops_.push_back(op);
  }

  // y = Bernoulli(keep_probability) from Philox with the given seed and offset tensors.
  void rng(const TensorRef& seed, const TensorRef& offset, const TensorRef& y, double keep_probability) {
    Desc r = HONE_MAKE(pool_, CUDNN_BACKEND_RNG_DESCRIPTOR);
    const cudnnRngDistribution_t dist = CUDNN_RNG_DISTRIBUTION_BERNOULLI;
    HONE_SET(pool_, r, CUDNN_ATTR_RNG_DISTRIBUTION, CUDNN_TYPE_RNG_DISTRIBUTION, 1, &dist);
    HONE_SET(pool_, r, CUDNN_ATTR_RNG_BERNOULLI_DIST_PROBABILITY, CUDNN_TYPE_DOUBLE, 1, &keep_probability);
    pool_.finalize(r, "RNG_DESCRIPTOR");
    Desc op = HONE_MAKE(pool_, CUDNN_BACKEND_OPERATION_RNG_DESCRIPTOR);
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_RNG_YDESC, use(y));
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_RNG_DESC, r);
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_RNG_SEED, use(seed));
    HONE_SET_DESC(pool_, op, CUDNN_ATTR_OPERATION_RNG_OFFSET_DESC, use(offset));
    pool_.finalize(op, "OPERATION_RNG_DESCRIPTOR");
    ops_.push_back(op);
  }

  const std::vector<Desc>& ops() const { return ops_; }
  std::vector<int64_t> used_uids() const { return {used_.begin(), used_.end()}; }

 private:
  TensorRef make_tensor(int64_t uid, cudnnDataType_t t, const Dims& dims, const Dims& strides, bool is_virtual,
                        bool by_value) {
    Desc d = HONE_MAKE(pool_, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    HONE_SET(pool_, d, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &t);
    HONE_SET(pool_, d, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    HONE_SET(pool_, d, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    HONE_SET(pool_, d, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    const int64_t alignment = 16;
    HONE_SET(pool_, d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    const bool yes = true;
    if (is_virtual) HONE_SET(pool_, d, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes);
    if (by_value) HONE_SET(pool_, d, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes);
    pool_.finalize(d, "TENSOR_DESCRIPTOR");
    return {d, uid, is_virtual};
  }
  Desc use(const TensorRef& t) {
    HONE_CHECK(t.desc != nullptr, "fused attention graph: an operation uses a tensor that was never made");
    if (!t.is_virtual) used_.insert(t.uid);
    return t.desc;
  }

  Descriptors& pool_;
  std::vector<Desc> ops_;
  std::set<int64_t> used_;
  int64_t next_virtual_ = kFirstVirtual;
};

// What a plan depends on. The attention scale is passed by value at execution, so it is not
// part of it; the dropout probability is (the RNG's keep probability is a graph attribute).
struct PlanKey {
  bool backward = false;
  DType dtype = DType::BF16;
  int batch = 0, seq = 0, heads = 0, head_dim = 0;
  float dropout_p = 0.0f;
  bool dropout = false;
  auto operator<=>(const PlanKey&) const = default;
};

PlanKey plan_key(const SdpaProblem& p, bool backward) {
  const bool dropout = p.dropout_p > 0.0f;
  return {backward, p.dtype, p.batch, p.seq, p.heads, p.head_dim, dropout ? p.dropout_p : 0.0f, dropout};
}

std::string describe(const PlanKey& k) {
  return fmt::format("{} {}, batch {}, seq {}, heads {}, head_dim {}, {}", k.dtype == DType::BF16 ? "bf16" : "fp16",
                     k.backward ? "backward" : "forward", k.batch, k.seq, k.heads, k.head_dim,
                     k.dropout ? fmt::format("dropout {}", k.dropout_p) : std::string("no dropout"));
}

// The shapes of one problem, in elements.
struct Shapes {
  cudnnDataType_t io;  // BFLOAT16 or HALF
  int64_t B, H, S, D;
  Dims bhsd;            // [B, heads, S, D]
  Dims bhds;            // [B, heads, D, S]
  Dims qkv_strides;     // Q, V, dQ, dK, dV: views of [B*S, 3*heads*D]
  Dims qkv_t_strides;   // K^T, V^T: the same views transposed
  Dims ctx_strides;     // O, dO: views of [B*S, heads*D]
  Dims packed_bhsd;     // a contiguous [B, heads, S, D] (dO*O, dQ_accum)
  Dims scores, score_strides, score_t_strides;  // [B, heads, S, S] and its transpose
  Dims rows, row_strides;                        // [B, heads, S, 1]: stats, softmax_sum
  Dims scalar{1, 1, 1, 1};
  Dims per_batch;  // [B, 1, 1, 1]: seq_q, seq_kv
};

Shapes shapes(const PlanKey& k) {
  Shapes s;
  s.io = k.dtype == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  s.B = k.batch, s.H = k.heads, s.S = k.seq, s.D = k.head_dim;
  const int64_t B = s.B, H = s.H, S = s.S, D = s.D, HD = H * D, LD = 3 * HD;
  s.bhsd = {B, H, S, D};
  s.bhds = {B, H, D, S};
  s.qkv_strides = {S * LD, D, LD, 1};
  s.qkv_t_strides = {S * LD, D, 1, LD};
  s.ctx_strides = {S * HD, D, HD, 1};
  s.packed_bhsd = {H * S * D, S * D, D, 1};
  s.scores = {B, H, S, S};
  s.score_strides = {H * S * S, S * S, S, 1};
  s.score_t_strides = {H * S * S, S * S, 1, S};
  s.rows = {B, H, S, 1};
  s.row_strides = {H * S, S, 1, 1};
  s.per_batch = {B, 1, 1, 1};
  return s;
}

// The inputs both directions share.
struct Common {
  TensorRef q, kt, seq_q, seq_kv, scale, neg_inf;
};

Common common_inputs(GraphBuilder& g, const Shapes& s) {
  Common c;
  c.q = g.tensor(kQ, s.io, s.bhsd, s.qkv_strides);
  c.kt = g.tensor(kK, s.io, s.bhds, s.qkv_t_strides);
  c.seq_q = g.tensor(kSeqQ, CUDNN_DATA_INT32, s.per_batch, {1, 1, 1, 1});
  c.seq_kv = g.tensor(kSeqKv, CUDNN_DATA_INT32, s.per_batch, {1, 1, 1, 1});
  c.scale = g.by_value(kScale);
  c.neg_inf = g.by_value(kNegInf);
  return c;
}

// scale * Q K^T, with -inf where the row is at or past seq_q or the column at or past seq_kv.
TensorRef masked_scores(GraphBuilder& g, const Shapes& s, const Common& c) {
  const TensorRef qk = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
  g.matmul(c.q, c.kt, qk, &c.seq_q, &c.seq_kv, nullptr);
  const TensorRef scaled = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
  g.binary(CUDNN_POINTWISE_MUL, qk, c.scale, scaled);
  const TensorRef row = g.virt(CUDNN_DATA_INT32, s.scores, s.score_strides);
  const TensorRef col = g.virt(CUDNN_DATA_INT32, s.scores, s.score_strides);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, nullptr, row, CUDNN_DATA_INT32, 2);
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, scaled, nullptr, nullptr, col, CUDNN_DATA_INT32, 3);
  const TensorRef row_ok = g.virt(CUDNN_DATA_BOOLEAN, s.scores, s.score_strides);
  const TensorRef col_ok = g.virt(CUDNN_DATA_BOOLEAN, s.scores, s.score_strides);
  const TensorRef live = g.virt(CUDNN_DATA_BOOLEAN, s.scores, s.score_strides);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, row, &c.seq_q, nullptr, row_ok, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_CMP_LT, col, &c.seq_kv, nullptr, col_ok, CUDNN_DATA_BOOLEAN);
  g.pointwise(CUDNN_POINTWISE_LOGICAL_AND, row_ok, &col_ok, nullptr, live, CUDNN_DATA_BOOLEAN);
  const TensorRef masked = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, scaled, &c.neg_inf, &live, masked);  // live ? scaled : -inf
  return masked;
}

// The dropout keep mask [B, heads, S, S] (1 = kept), from the INT64 seed and offset.
TensorRef keep_mask(GraphBuilder& g, const Shapes& s, float p) {
  const TensorRef seed = g.tensor(kSeed, CUDNN_DATA_INT64, s.scalar, s.scalar);
  const TensorRef offset = g.tensor(kOffset, CUDNN_DATA_INT64, s.scalar, s.scalar);
  const TensorRef mask = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
  g.rng(seed, offset, mask, 1.0 - double(p));
  return mask;
}

// O = dropout(softmax(masked scores)) V; Stats = max + log(sum of exponentials).
void build_forward(GraphBuilder& g, const PlanKey& k) {
  const Shapes s = shapes(k);
  const Common c = common_inputs(g, s);
  const TensorRef v = g.tensor(kV, s.io, s.bhsd, s.qkv_strides);
  const TensorRef scores = masked_scores(g, s, c);
  const TensorRef max = g.virt(CUDNN_DATA_FLOAT, s.rows, s.row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, scores, max);
  const TensorRef shifted = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
  g.binary(CUDNN_POINTWISE_SUB, scores, max, shifted);
  const TensorRef e = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
  g.unary(CUDNN_POINTWISE_EXP, shifted, e);
  const TensorRef sum = g.virt(CUDNN_DATA_FLOAT, s.rows, s.row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, sum);
  const TensorRef log_sum = g.virt(CUDNN_DATA_FLOAT, s.rows, s.row_strides);
  g.unary(CUDNN_POINTWISE_LOG, sum, log_sum);
  const TensorRef stats = g.tensor(kStats, CUDNN_DATA_FLOAT, s.rows, s.row_strides);
  g.binary(CUDNN_POINTWISE_ADD, max, log_sum, stats);
  // The probabilities go into the second product in the I/O type.
  const TensorRef probs = g.virt(s.io, s.scores, s.score_strides);
  if (k.dropout) {
    const TensorRef p = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
    g.binary(CUDNN_POINTWISE_DIV, e, sum, p);
    const TensorRef mask = keep_mask(g, s, k.dropout_p);
    const TensorRef kept = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
    g.binary(CUDNN_POINTWISE_MUL, p, mask, kept);
    const TensorRef drop_scale = g.by_value(kDropScale);
    g.binary(CUDNN_POINTWISE_MUL, kept, drop_scale, probs);
  } else {
    g.binary(CUDNN_POINTWISE_DIV, e, sum, probs);
  }
  const TensorRef o = g.tensor(kO, s.io, s.bhsd, s.ctx_strides);
  g.matmul(probs, v, o, &c.seq_q, nullptr, &c.seq_kv);
}

// dQ, dK, dV from Q, K, V, O, dO and Stats, recomputing the probabilities (and the dropout
// mask, from the same seed and offset):
//   softmax_sum = rowsum(dO * O) * (1 - p)
//   E = exp(masked scores - Stats);  Pd = E * mask / (1 - p);  dV = Pd^T dO
//   dS = (dO V^T * mask - softmax_sum) * E / (1 - p) * scale;  dK = dS^T Q;  dQ = dS K
void build_backward(GraphBuilder& g, const PlanKey& k) {
  const Shapes s = shapes(k);
  const Common c = common_inputs(g, s);
  const TensorRef vt = g.tensor(kVt, s.io, s.bhds, s.qkv_t_strides);
  const TensorRef o = g.tensor(kO, s.io, s.bhsd, s.ctx_strides);
  const TensorRef d_o = g.tensor(kDO, s.io, s.bhsd, s.ctx_strides);
  const TensorRef stats = g.tensor(kStats, CUDNN_DATA_FLOAT, s.rows, s.row_strides);
  TensorRef mask, drop_scale;
  if (k.dropout) {
    mask = keep_mask(g, s, k.dropout_p);
    drop_scale = g.by_value(kDropScale);
  }

  const TensorRef do_o = g.virt(CUDNN_DATA_FLOAT, s.bhsd, s.packed_bhsd);
  g.binary(CUDNN_POINTWISE_MUL, d_o, o, do_o);
  const TensorRef row_sum = g.virt(CUDNN_DATA_FLOAT, s.rows, s.row_strides);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, do_o, row_sum);
  const TensorRef drop_scale_inv = g.by_value(kDropScaleInv);
  const TensorRef softmax_sum = g.tensor(kSoftmaxSum, CUDNN_DATA_FLOAT, s.rows, s.row_strides);
  g.binary(CUDNN_POINTWISE_MUL, row_sum, drop_scale_inv, softmax_sum);

  const TensorRef scores = masked_scores(g, s, c);
  const TensorRef shifted = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
  g.binary(CUDNN_POINTWISE_SUB, scores, stats, shifted);
  const TensorRef e = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
  g.unary(CUDNN_POINTWISE_EXP, shifted, e);
  TensorRef pd = e;
  if (k.dropout) {
    const TensorRef kept = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
    g.binary(CUDNN_POINTWISE_MUL, e, mask, kept);
    pd = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
    g.binary(CUDNN_POINTWISE_MUL, kept, drop_scale, pd);
  }
  const TensorRef pd_t = g.virt(s.io, s.scores, s.score_t_strides);
  g.reshape(pd, pd_t);
  const TensorRef dv = g.tensor(kDV, s.io, s.bhsd, s.qkv_strides);
  g.matmul(pd_t, d_o, dv, &c.seq_kv, nullptr, &c.seq_q);

  const TensorRef dp = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
  g.matmul(d_o, vt, dp, &c.seq_q, &c.seq_kv, nullptr);
  TensorRef x = dp;
  if (k.dropout) {
    const TensorRef y = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
    g.binary(CUDNN_POINTWISE_MUL, x, mask, y);
    x = y;
  }
  const TensorRef centered = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
  g.binary(CUDNN_POINTWISE_SUB, x, softmax_sum, centered);
  x = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
  g.binary(CUDNN_POINTWISE_MUL, centered, e, x);
  if (k.dropout) {
    const TensorRef y = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
    g.binary(CUDNN_POINTWISE_MUL, x, drop_scale, y);
    x = y;
  }
  const TensorRef ds = g.virt(CUDNN_DATA_FLOAT, s.scores, s.score_strides);
  g.binary(CUDNN_POINTWISE_MUL, x, c.scale, ds);

  const TensorRef ds_t = g.virt(s.io, s.scores, s.score_t_strides);
  g.reshape(ds, ds_t);
  const TensorRef dk = g.tensor(kDK, s.io, s.bhsd, s.qkv_strides);
  g.matmul(ds_t, c.q, dk, &c.seq_kv, nullptr, &c.seq_q);

  const TensorRef k_view = g.virt(s.io, s.bhsd, s.qkv_strides);
  g.reshape(c.kt, k_view);
  const TensorRef dq_accum = g.tensor(kDQAccum, CUDNN_DATA_FLOAT, s.bhsd, s.packed_bhsd);
  g.matmul(ds, k_view, dq_accum, &c.seq_q, nullptr, &c.seq_kv);
  const TensorRef dq = g.tensor(kDQ, s.io, s.bhsd, s.qkv_strides);
  g.unary(CUDNN_POINTWISE_IDENTITY, dq_accum, dq);
}

struct Plan {
  explicit Plan(std::string context) : descs(std::move(context)) {}
  Descriptors descs;           // the graph, the heuristics' configs and the plans
  Desc plan = nullptr;         // the fastest of the candidates, once timed
  // Every plan of the heuristics' list that finalizes within the workspace, in its order;
  // the first execution times them all and keeps the fastest in `plan`.
  std::vector<Desc> candidates;
  std::vector<int64_t> uids;   // exactly the variant pack's: the non-virtual tensors of the ops
};

std::string last_error() {
  char last[1024] = {};
  cudnnGetLastErrorString(last, sizeof last);
  return last;
}

int64_t get_int64(Descriptors& d, Desc desc, cudnnBackendAttributeName_t attr, const char* name) {
  int64_t value = 0, count = 0;
  const cudnnStatus_t s = cudnnBackendGetAttribute(desc, attr, CUDNN_TYPE_INT64, 1, &count, &value);
  if (s != CUDNN_STATUS_SUCCESS) cudnn_fail(d.context(), fmt::format("cudnnBackendGetAttribute({})", name), s);
  return value;
}

// Builds the graph and the execution plans that the heuristics (mode A, or else the
// fallback list) offer, finalize and fit the reserved workspace.
std::unique_ptr<Plan> build_plan(cudnnHandle_t handle, const PlanKey& k) {
  auto plan = std::make_unique<Plan>(describe(k));
  Descriptors& d = plan->descs;
  GraphBuilder g(d);
  if (k.backward)
    build_backward(g, k);
  else
    build_forward(g, k);
  plan->uids = g.used_uids();

  Desc graph = HONE_MAKE(d, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  HONE_SET(d, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(g.ops().size()),
           g.ops().data());
  HONE_SET(d, graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
  d.finalize(graph, "OPERATIONGRAPH_DESCRIPTOR");

  std::string tried;  // why each candidate was passed over, for the error
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "heuristics A" : "fallback";
    Desc heur = HONE_MAKE(d, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    HONE_SET_DESC(d, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    HONE_SET(d, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    if (const cudnnStatus_t s = cudnnBackendFinalize(heur); s != CUDNN_STATUS_SUCCESS) {
      tried += fmt::format("\n  {}: {} ({})", mode_name, cudnnGetErrorString(s), last_error());
      continue;
    }
    int64_t n = 0;
    HONE_CUDNN_CHECK(d.context(), cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr));
    if (n <= 0) {
      tried += fmt::format("\n  {}: no engine configurations ({})", mode_name, last_error());
      continue;
    }
    std::vector<Desc> configs(size_t(n), nullptr);
    for (Desc& cfg : configs) cfg = HONE_MAKE(d, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
    int64_t got = 0;
    HONE_CUDNN_CHECK(d.context(), cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                           CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, configs.data()));
    for (int64_t i = 0; i < got && i < n; ++i) {
      Desc ep = HONE_MAKE(d, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
      HONE_SET_DESC(d, ep, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[size_t(i)]);
      HONE_SET(d, ep, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
      if (const cudnnStatus_t s = cudnnBackendFinalize(ep); s != CUDNN_STATUS_SUCCESS) {
        tried += fmt::format("\n  {} config {}: plan finalize: {} ({})", mode_name, i, cudnnGetErrorString(s),
                             last_error());
        continue;
      }
      const int64_t ws = get_int64(d, ep, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, "EXECUTION_PLAN_WORKSPACE_SIZE");
      if (ws > kSdpaWorkspaceBytes) {
        tried += fmt::format("\n  {} config {}: needs {} bytes of workspace, more than the {} reserved", mode_name, i,
                             ws, kSdpaWorkspaceBytes);
        continue;
      }
      plan->candidates.push_back(ep);
    }
    if (!plan->candidates.empty()) return plan;
  }
  fail("cuDNN fused attention ({}): no usable execution plan (cuDNN {}):{}", describe(k), cudnnGetVersion(), tried);
}

// The device pointers of one call, by uid (host pointers for the by-value scalars).
using Bindings = std::array<const void*, kNumUids>;

bool is_by_value(int64_t uid) {
  return uid == kScale || uid == kNegInf || uid == kDropScale || uid == kDropScaleInv;
}

// The tensors declare 16-byte alignment (as cudnn-frontend's do); the by-value scalars are host values.
void check_aligned(const Bindings& b, const std::string& context) {
  for (int64_t uid = 1; uid < kNumUids; ++uid)
    if (!is_by_value(uid) && b[size_t(uid)] && reinterpret_cast<uintptr_t>(b[size_t(uid)]) % 16 != 0)
      fail("cuDNN fused attention ({}): tensor {} at {} is not 16-byte aligned", context, uid, b[size_t(uid)]);
}

const void* advance(const void* p, int64_t elements, DType t) {
  return static_cast<const char*>(p) + elements * int64_t(dtype_size(t));
}

}  // namespace

struct SdpaCache {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;

  ~SdpaCache() {
    plans.clear();  // the plans' descriptors before the handle they were built with
    if (handle) cudnnDestroy(handle);
  }

  Plan& plan(const PlanKey& k) {
    auto it = plans.find(k);
    if (it == plans.end()) it = plans.emplace(k, build_plan(handle, k)).first;
    return *it->second;
  }

  // On a plan's first call: each candidate runs on this call's own tensors (every output
  // is overwritten, so the chosen plan's run below is what remains) and the fastest is kept.
  void execute(Plan& p, const Bindings& b, void* workspace) {
    if (!p.plan) {
      p.plan = p.candidates.front();
      if (p.candidates.size() > 1) {
        cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
        HONE_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
        HONE_CHECK(capturing == cudaStreamCaptureStatusNone, "{}: first used while recording a CUDA graph; its plan is "
                   "chosen by timing, which a recording cannot do (--cuda_graphs false runs without graphs)",
                   p.descs.context());
        cudaEvent_t start = nullptr, stop = nullptr;
        HONE_CUDA_CHECK(cudaEventCreate(&start));
        HONE_CUDA_CHECK(cudaEventCreate(&stop));
        float best = std::numeric_limits<float>::infinity();
        for (Desc c : p.candidates) {
          run(p, c, b, workspace);  // warm-up
          HONE_CUDA_CHECK(cudaEventRecord(start, stream));
          for (int i = 0; i < 3; ++i) run(p, c, b, workspace);
          HONE_CUDA_CHECK(cudaEventRecord(stop, stream));
          HONE_CUDA_CHECK(cudaEventSynchronize(stop));
          float ms = 0;
          HONE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
          if (ms < best) best = ms, p.plan = c;
        }
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
      }
    }
    run(p, p.plan, b, workspace);
  }

  void run(const Plan& p, Desc exec_plan, const Bindings& b, void* workspace) {
    const std::string& context = p.descs.context();
    check_aligned(b, context);
    HONE_CHECK(reinterpret_cast<uintptr_t>(workspace) % 16 == 0, "fused attention workspace {} not aligned", workspace);
    std::vector<void*> data;
    data.reserve(p.uids.size());
    for (int64_t uid : p.uids) {
      HONE_CHECK(uid > 0 && uid < kNumUids && b[size_t(uid)] != nullptr,
                 "fused attention ({}): the graph uses tensor {}, which the call does not bind", context, uid);
      data.push_back(const_cast<void*>(b[size_t(uid)]));
    }
    Descriptors pack(context);
    Desc vp = HONE_MAKE(pack, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    HONE_SET(pack, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(p.uids.size()), p.uids.data());
    HONE_SET(pack, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(data.size()), data.data());
    HONE_SET(pack, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    pack.finalize(vp, "VARIANT_PACK_DESCRIPTOR");
    HONE_CUDNN_CHECK(context, cudnnBackendExecute(handle, exec_plan, vp));
  }
};

SdpaCache* make_sdpa_cache(cudaStream_t stream) {
  const size_t v = cudnnGetVersion();
  if (v < 91002)
    fail("fused bf16/fp16 attention needs cuDNN 9.10.2 or newer (9.10.0 and 9.10.1 have known SDPA bugs, and "
         "older versions need other graphs); the loaded libcudnn is {}.{}.{}",
         v / 10000, v / 100 % 100, v % 100);
  int device = 0, major = 0, minor = 0;
  HONE_CUDA_CHECK(cudaGetDevice(&device));
  HONE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  HONE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (major < 8)
    fail("fused bf16/fp16 attention needs a GPU of compute capability 8.0 or newer; device {} has {}.{}", device,
         major, minor);
  auto cache = std::make_unique<SdpaCache>();
  cache->stream = stream;
  HONE_CUDNN_CHECK("creating the handle", cudnnCreate(&cache->handle));
  HONE_CUDNN_CHECK("creating the handle", cudnnSetStream(cache->handle, stream));
  return cache.release();
}

void destroy_sdpa_cache(SdpaCache* cache) noexcept { delete cache; }

// The by-value scalars of both directions; they must outlive the execution call.
struct Scalars {
  float scale, neg_inf, drop_scale, drop_scale_inv;
  explicit Scalars(const SdpaProblem& p)
      : scale(p.scale),
        neg_inf(-std::numeric_limits<float>::infinity()),
        drop_scale(p.dropout_p > 0.0f ? 1.0f / (1.0f - p.dropout_p) : 1.0f),
        drop_scale_inv(p.dropout_p > 0.0f ? 1.0f - p.dropout_p : 1.0f) {}
};

// What forward and backward share: Q and K (views into qkv), O, the statistics, the
// lengths, the Philox state and the scalars. A graph's pack takes only the uids it uses.
Bindings shared_bindings(const SdpaProblem& p, const void* qkv, const void* ctx, const float* lse,
                         const int32_t* seq_q, const int32_t* seq_kv, const int64_t* seed, const int64_t* offset,
                         const Scalars& s) {
  const int64_t H = int64_t(p.heads) * p.head_dim;
  Bindings b{};
  b[kQ] = qkv;
  b[kK] = advance(qkv, H, p.dtype);
  b[kO] = ctx;
  b[kStats] = lse;
  b[kSeqQ] = seq_q;
  b[kSeqKv] = seq_kv;
  b[kSeed] = seed;
  b[kOffset] = offset;
  b[kScale] = &s.scale;
  b[kNegInf] = &s.neg_inf;
  b[kDropScale] = &s.drop_scale;
  b[kDropScaleInv] = &s.drop_scale_inv;
  return b;
}

void sdpa_forward(SdpaCache& cache, const SdpaProblem& p, const SdpaForward& a) {
  validate(p, false);
  Plan& plan = cache.plan(plan_key(p, false));
  const Scalars s(p);
  Bindings b = shared_bindings(p, a.qkv, a.ctx, a.lse, a.seq_q, a.seq_kv, a.seed, a.offset, s);
  b[kV] = advance(a.qkv, 2 * int64_t(p.heads) * p.head_dim, p.dtype);
  cache.execute(plan, b, a.workspace);
}

void sdpa_backward(SdpaCache& cache, const SdpaProblem& p, const SdpaBackward& a) {
  validate(p, true);
  Plan& plan = cache.plan(plan_key(p, true));
  const int64_t H = int64_t(p.heads) * p.head_dim;
  const Scalars s(p);
  Bindings b = shared_bindings(p, a.qkv, a.ctx, a.lse, a.seq_q, a.seq_kv, a.seed, a.offset, s);
  b[kVt] = advance(a.qkv, 2 * H, p.dtype);
  b[kDO] = a.dctx;
  b[kSoftmaxSum] = a.softmax_sum;
  b[kDQAccum] = a.dq_accum;
  b[kDQ] = a.dqkv;
  b[kDK] = advance(a.dqkv, H, p.dtype);
  b[kDV] = advance(a.dqkv, 2 * H, p.dtype);
  cache.execute(plan, b, a.workspace);
}

#else  // no cuDNN in this build

struct SdpaCache {};

SdpaCache* make_sdpa_cache(cudaStream_t) {
  fail("fused attention for bf16/fp16 needs cuDNN, and this build of hone has none: install cuDNN 9.10.2 or "
       "newer (e.g. libcudnn9-dev-cuda-13) and reconfigure, or train in fp32");
}

void destroy_sdpa_cache(SdpaCache* cache) noexcept { delete cache; }

void sdpa_forward(SdpaCache&, const SdpaProblem& p, const SdpaForward&) {
  validate(p, false);
  make_sdpa_cache(nullptr);
}

void sdpa_backward(SdpaCache&, const SdpaProblem& p, const SdpaBackward&) {
  validate(p, true);
  make_sdpa_cache(nullptr);
}

#endif

}  // namespace hone::cuda
