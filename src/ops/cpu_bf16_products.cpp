#include "ops/cpu_bf16_products.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "hone/cpu_backend.h"
#include "hone/error.h"

#ifdef HONE_HAVE_ONEDNN
#include <dnnl.hpp>
#endif

namespace hone {

bool cpu_has_amx() {
#if defined(__x86_64__) && defined(__GNUC__)
  unsigned a, b, c, d;
  // CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
  __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  return (d >> 22 & 1u) && (d >> 24 & 1u);
#else
  return false;
#endif
}

bool cpu_bf16_products_available(std::string* why) {
#ifdef HONE_HAVE_ONEDNN
  (void)why;
  return true;
#else
  if (why) *why = "this build of hone has no oneDNN (install libdnnl-dev and rebuild)";
  return false;
#endif
}

namespace cpu_bf16 {

namespace {

uint16_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // NaN: quiet, never rounded to inf
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

}  // namespace

float round_to_bf16(float x) {
  const uint32_t u = uint32_t(bf16_bits(x)) << 16;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

#ifdef HONE_HAVE_ONEDNN

namespace {

using dnnl::memory;

// A matrix's bf16 copy in its stored layout, rows of `cols` contiguous (the ld dropped).
void to_bf16(const float* src, int rows, int cols, int ld, std::vector<uint16_t>& dst) {
  dst.resize(size_t(rows) * size_t(cols));
  uint16_t* out = dst.data();
#pragma omp parallel for schedule(static)
  for (int r = 0; r < rows; ++r) {
    const float* in = src + int64_t(r) * ld;
    uint16_t* o = out + int64_t(r) * cols;
#pragma omp simd
    for (int c = 0; c < cols; ++c) o[c] = bf16_bits(in[c]);
  }
}

// The products' primitives by shape, and the operands' bf16 copies. The backend runs its
// ops from one host thread.
struct Products {
  struct Entry {
    dnnl::matmul::primitive_desc pd;
    dnnl::matmul primitive;
  };
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<std::tuple<bool, bool, int, int, int, int, bool>, Entry> entries;
  std::vector<uint16_t> a16, b16;

  Entry& entry(bool ta, bool tb, int m, int n, int k, int ldc, bool accumulate) {
    const auto key = std::make_tuple(ta, tb, m, n, k, ldc, accumulate);
    if (auto it = entries.find(key); it != entries.end()) return it->second;
    // Packed batches change m every step: bound what the shapes seen hold (oneDNN keeps its
    // own cache of recent primitives, so a shape seen again soon is not compiled again).
    constexpr size_t kMaxShapes = 256;
    if (entries.size() >= kMaxShapes) entries.clear();
    // a16 holds op(a) as stored: [m, k] rows, or [k, m] rows read transposed; b16 likewise.
    const memory::desc a({m, k}, memory::data_type::bf16, ta ? memory::dims{1, m} : memory::dims{k, 1});
    const memory::desc b({k, n}, memory::data_type::bf16, tb ? memory::dims{1, k} : memory::dims{n, 1});
    const memory::desc c({m, n}, memory::data_type::f32, memory::dims{ldc, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
#if DNNL_VERSION_MAJOR >= 3
    dnnl::matmul::primitive_desc pd(engine, a, b, c, attr);
#else
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine);
#endif
    dnnl::matmul primitive(pd);
    return entries.emplace(key, Entry{std::move(pd), std::move(primitive)}).first->second;
  }
};

Products& products() {
  static Products p;
  return p;
}

}  // namespace

void product(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, bool accumulate,
             float* c, int ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // an empty sum
    if (!accumulate)
      for (int r = 0; r < m; ++r) std::memset(c + int64_t(r) * ldc, 0, size_t(n) * sizeof(float));
    return;
  }
  Products& p = products();
  try {
    Products::Entry& e = p.entry(ta, tb, m, n, k, ldc, accumulate);
    to_bf16(a, ta ? k : m, ta ? m : k, lda, p.a16);
    to_bf16(b, tb ? n : k, tb ? k : n, ldb, p.b16);
    dnnl::memory am(e.pd.src_desc(), p.engine, p.a16.data()), bm(e.pd.weights_desc(), p.engine, p.b16.data()),
        cm(e.pd.dst_desc(), p.engine, c);
    e.primitive.execute(p.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    p.stream.wait();
  } catch (const dnnl::error& err) {
    fail("oneDNN's bf16 product {}x{}x{} failed: {} (status {})", m, n, k, err.what(), int(err.status));
  }
}

#else

void product(bool, bool, int, int, int, const float*, int, const float*, int, bool, float*, int) {
  fail("bf16 products on the CPU need oneDNN, which this build of hone does not have");
}

#endif

}  // namespace cpu_bf16
}  // namespace hone
