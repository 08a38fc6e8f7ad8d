// The host side of the Hopper attention kernels: their TMA map of qkv, built through the
// driver's cuTensorMapEncodeTiled (reached through the runtime, so hone links no libcuda).
#include <cudaTypedefs.h>

#include "cuda/check.h"
#include "cuda/flash_hopper.h"
#include "hone/error.h"

namespace hone::cuda::flash {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    HONE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || f == nullptr)
      fail("the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a driver for CUDA 12.0 or later)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

}  // namespace

CUtensorMap hopper_tile_map(const void* base, bool bf16, int64_t rows, int64_t cols, int box_rows, int box_cols) {
  HONE_CHECK(box_cols == 64 || box_cols == 32, "TMA: tiles of 64 or 32 columns, not {}", box_cols);
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t row_stride[1] = {cuuint64_t(cols * 2)};
  const cuuint32_t box[2] = {cuuint32_t(box_cols), cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2,
                                    const_cast<void*>(base), dims, row_stride, box, element_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    box_cols == 64 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail("TMA: cuTensorMapEncodeTiled for a [{}, {}] matrix at {} failed (CUresult {})", rows, cols, base,
         int(r));
  return map;
}

CUtensorMap hopper_bits_map(const uint32_t* bits, int64_t rows, int words, int box_rows) {
  CUtensorMap map{};
  const cuuint64_t dims[2] = {cuuint64_t(words), cuuint64_t(rows)};
  const cuuint64_t row_stride[1] = {cuuint64_t(words) * 4};
  const cuuint32_t box[2] = {4, cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT32, 2, const_cast<uint32_t*>(bits), dims,
                                    row_stride, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    fail("attention: cuTensorMapEncodeTiled for the dropout bits [{}, {}] failed (CUresult {})", rows, words, int(r));
  return map;
}

}  // namespace hone::cuda::flash
